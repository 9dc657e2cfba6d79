//! Plans end to end: the real hub and the real `drover-system-agent` process. A plan written
//! through the API reaches the host at once, is applied exactly once per checksum (also across
//! `kill -9` and restarts), failures show on the Host with the instruction's stderr and stop at
//! max-failures, a plan written while the agent is away arrives when it reconnects, and one too
//! large to send as a session message arrives all the same.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::json;
use tests::{
    HubProcess, api, login,
    system_agent::{Host, applied, counted, create_paused_edge, put_plan, runs, until},
    temp_dir,
};

/// Whether process `pid` runs (a zombie waiting to be reaped does not).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the command, which is in parentheses and may hold spaces.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// What the system-agent logs when the hub sends it the plan it already has (applied or not).
const ALREADY_HAS: &str = "the hub's plan is the one this agent already has";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_reach_the_host_apply_once_and_report_back() {
    let dir = temp_dir("plans");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let registration = create_paused_edge(hub.addr, &admin).await;
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
    let had = host.log_lines(ALREADY_HAS);
    host.kill().await;
    host.start();
    host.until_logged(ALREADY_HAS, had + 1, Duration::from_secs(30))
        .await;
    assert_eq!(runs(&installs), 1, "an applied checksum never runs again");

    // kill -9 in the middle of a plan: the instruction it left running is stopped, the plan
    // runs again from the start, and the step after the interrupted one runs exactly once.
    // (The first run of the first step would run for ten minutes; the second, at once.)
    let (started, upgrades, pid) = (dir.join("started"), dir.join("upgrades"), dir.join("pid"));
    let first_long = format!(
        "if [ ! -f {pid} ]; then echo $$ > {pid}; sleep 600; fi",
        pid = pid.display()
    );
    put_plan(
        &hub,
        &admin,
        &name,
        json!({"instructions": [
            counted("stop-service", &started, &first_long),
            counted("upgrade", &upgrades, "true"),
        ]}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !pid.exists() {
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
    let leftover = std::fs::read_to_string(&pid).unwrap();
    assert!(
        !running(leftover.trim()),
        "the instruction the crash left running (pid {}) was stopped",
        leftover.trim()
    );

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

    // A plan too large for one session message (its base64 past an agent's 1 MiB WebSocket
    // message): the hub announces it without its body and the agent takes it with a call.
    use base64::Engine as _;
    let (large, large_runs) = (dir.join("host-root/opt/large.bin"), dir.join("large"));
    let content: Vec<u8> = (0..900 * 1024).map(|i| (i % 251) as u8).collect();
    put_plan(
        &hub,
        &admin,
        &name,
        json!({
            "files": [{"path": large.display().to_string(),
                       "content": base64::engine::general_purpose::STANDARD.encode(&content)}],
            "instructions": [counted("large", &large_runs, "true")],
        }),
    )
    .await;
    until(&hub, &admin, &plan_path, Duration::from_secs(30), applied).await;
    assert_eq!(std::fs::read(&large).unwrap(), content);
    assert_eq!(runs(&large_runs), 1);
    host.kill().await;
}
