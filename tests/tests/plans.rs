//! Plans end to end: the real hub and the real `drover-system-agent` process. A plan written
//! through the API reaches the host at once, is applied exactly once per checksum (also across
//! `kill -9` and restarts), failures show on the Host with the instruction's stderr and stop at
//! max-failures, and a plan written while the agent is away arrives when it reconnects.

#![allow(clippy::unwrap_used)]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::{Value, json};
use tests::{HubProcess, api, binary, create_custom_cluster, login, temp_dir};
use tokio::process::{Child, Command};

struct Host {
    dir: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Host {
    fn new(hub: &HubProcess, token: &str, dir: &Path) -> Host {
        let env = [
            ("DROVER_SERVER", hub.url()),
            ("DROVER_TOKEN", token.to_owned()),
            ("DROVER_CA_CHECKSUM", hub.ca_checksum.clone()),
            ("DROVER_DIR", dir.join("agent").display().to_string()),
            ("DROVER_ROLES", "all".into()),
            ("DROVER_NODE_NAME", "node-1".into()),
            ("DROVER_RETRY_SECONDS", "1".into()),
            ("DROVER_LOG", "info".into()),
        ];
        Host {
            dir: dir.to_owned(),
            env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            child: None,
        }
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let child = Command::new(binary("drover-system-agent"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGKILL, as a crash or power cut would.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }
}

/// Runs of an instruction that appends a line to `file` each time.
fn runs(file: &Path) -> usize {
    std::fs::read_to_string(file)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn counted(name: &str, file: &Path, then: &str) -> Value {
    json!({"name": name, "script": format!("echo run >> {}; {then}", file.display())})
}

/// Polls `path` as `token` until `done` accepts it; panics with the last answer after `within`.
async fn until(
    hub: &HubProcess,
    token: &str,
    path: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (_, value) = api(hub.addr, "GET", path, Some(token), None).await;
        if done(&value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} not as wanted within {within:?}: {value:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The plan as it stands now is applied (not an earlier one).
fn applied(plan: &Value) -> bool {
    plan["status"]["state"] == "applied"
        && plan["status"]["appliedChecksum"] == plan["status"]["planChecksum"]
}

async fn put_plan(hub: &HubProcess, admin: &str, host: &str, plan: Value) -> Value {
    let path = format!("/v1/plans/{host}");
    let (status, current) = api(hub.addr, "GET", &path, Some(admin), None).await;
    let mut body = json!({
        "metadata": {"name": host},
        "spec": {"host": host, "cluster": "edge", "plan": plan},
    });
    if status != 404 {
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    }
    let (code, written) = if status == 404 {
        api(hub.addr, "POST", "/v1/plans", Some(admin), Some(body)).await
    } else {
        api(hub.addr, "PUT", &path, Some(admin), Some(body)).await
    };
    assert!(code == 200 || code == 201, "{written}");
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_reach_the_host_apply_once_and_report_back() {
    let dir = temp_dir("plans");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    // Paused: the planner must not install a distribution on the machine running the tests.
    let registration = create_custom_cluster(
        hub.addr,
        &admin,
        "edge",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1", "paused": true}),
    )
    .await;
    let token = registration["token"].as_str().unwrap().to_owned();

    let mut host = Host::new(&hub, &token, &dir);
    host.start();
    let hosts = until(&hub, &admin, "/v1/hosts", Duration::from_secs(30), |v| {
        v["items"].as_array().is_some_and(|items| {
            items.iter().any(|h| {
                h["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Connected" && c["status"] == "True")
                })
            })
        })
    })
    .await;
    let item = &hosts["items"][0];
    let name = item["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(item["spec"]["cluster"], "edge");
    assert_eq!(item["spec"]["nodeName"], "node-1");
    assert_eq!(
        item["spec"]["roles"],
        json!({"etcd": true, "controlPlane": true, "worker": true})
    );
    let plan_path = format!("/v1/plans/{name}");

    // The system-agent's first beat brings the machine's facts to the Host, and its usage
    // starts the host's chart.
    let with_facts = until(
        &hub,
        &admin,
        &format!("/v1/hosts/{name}"),
        Duration::from_secs(30),
        |h| h["status"]["facts"]["cpus"].as_u64() >= Some(1),
    )
    .await;
    let facts = &with_facts["status"]["facts"];
    assert!(facts["memoryBytes"].as_u64() > Some(0), "{facts}");
    assert!(!facts["kernel"].as_str().unwrap().is_empty(), "{facts}");
    let (code, usage) = api(
        hub.addr,
        "GET",
        &format!("/v1/hosts/{name}/usage"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(code, 200, "{usage}");
    assert_eq!(usage["state"], "active", "{usage}");
    assert!(!usage["points"].as_array().unwrap().is_empty(), "{usage}");

    // A bad plan is refused with what to fix, and nothing is stored.
    let (code, refused) = api(
        hub.addr,
        "POST",
        "/v1/plans",
        Some(&admin),
        Some(json!({"metadata": {"name": name},
                    "spec": {"host": name, "cluster": "edge", "plan": {"instructions": [{"nmae": "x"}]}}})),
    )
    .await;
    assert_eq!(code, 422, "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("nmae"),
        "{refused}"
    );

    // A plan: a file, then two instructions, the second's output kept.
    let installs = dir.join("installs");
    let config = dir.join("host-root/etc/edge/config.yaml");
    let first = json!({
        "files": [{"path": config.display().to_string(), "content": "dG9rZW46IGFiYwo=", "permissions": "0600"}],
        "instructions": [
            {"name": "check", "command": "/bin/cat", "args": [config.display().to_string()]},
            {"name": "install", "script": format!("echo run >> {}; echo node-token-42", installs.display()), "saveOutput": true},
        ],
    });
    put_plan(&hub, &admin, &name, first).await;
    let plan = until(&hub, &admin, &plan_path, Duration::from_secs(30), applied).await;
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "token: abc\n");
    assert_eq!(runs(&installs), 1);
    assert_eq!(plan["status"]["results"][1]["stdout"], "node-token-42\n");
    assert_eq!(plan["state"]["state"], "active");
    let (_, h) = api(
        hub.addr,
        "GET",
        &format!("/v1/hosts/{name}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(h["state"]["state"], "active", "{h:#}");

    // kill -9 and start again: the plan arrives again and does not run again.
    host.kill().await;
    host.start();
    until(
        &hub,
        &admin,
        &format!("/v1/hosts/{name}"),
        Duration::from_secs(30),
        |h| h["state"]["state"] == "active",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runs(&installs), 1, "an applied checksum never runs again");

    // kill -9 in the middle of a plan: it runs again from the start, and the step after the
    // interrupted one runs exactly once.
    let (started, upgrades) = (dir.join("started"), dir.join("upgrades"));
    put_plan(
        &hub,
        &admin,
        &name,
        json!({"instructions": [
            counted("stop-service", &started, "sleep 3"),
            counted("upgrade", &upgrades, "true"),
        ]}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while runs(&started) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plan never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host.kill().await;
    assert_eq!(runs(&upgrades), 0);
    host.start();
    until(&hub, &admin, &plan_path, Duration::from_secs(30), applied).await;
    assert_eq!(
        runs(&started),
        2,
        "the interrupted plan ran again from the start"
    );
    assert_eq!(runs(&upgrades), 1);

    // A failing instruction: failed with its stderr on the Host, retried, stops at max.
    let failures = dir.join("failures");
    put_plan(
        &hub,
        &admin,
        &name,
        json!({"maxFailures": 2, "instructions": [
            counted("format-disk", &failures, "echo 'mkfs: /dev/sdz: no such device' >&2; exit 1"),
        ]}),
    )
    .await;
    let h = until(
        &hub,
        &admin,
        &format!("/v1/hosts/{name}"),
        Duration::from_secs(30),
        |h| {
            h["state"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("gave up"))
        },
    )
    .await;
    assert_eq!(h["state"]["state"], "error");
    let message = h["state"]["message"].as_str().unwrap();
    assert!(
        message.contains("format-disk") && message.contains("no such device"),
        "{message}"
    );
    let (_, plan) = api(hub.addr, "GET", &plan_path, Some(&admin), None).await;
    assert_eq!(plan["status"]["state"], "failed");
    assert_eq!(plan["status"]["failureCount"], 2);
    assert_eq!(plan["status"]["results"][0]["exitCode"], 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(runs(&failures), 2, "no attempt after max-failures");

    // Written while the agent is away: it arrives on reconnect.
    host.kill().await;
    let later = dir.join("later");
    put_plan(
        &hub,
        &admin,
        &name,
        json!({"instructions": [counted("later", &later, "true")]}),
    )
    .await;
    host.start();
    until(&hub, &admin, &plan_path, Duration::from_secs(30), applied).await;
    assert_eq!(runs(&later), 1);
    host.kill().await;
}
