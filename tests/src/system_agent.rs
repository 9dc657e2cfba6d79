//! A real `drover-system-agent` process on the test machine, and the plan helpers the plan and
//! replica tests share.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::{HubProcess, api, binary};

#[derive(Debug)]
pub struct Host {
    dir: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Host {
    /// A host registering with `token` at `hub`, its state in `dir`.
    pub fn new(hub: &HubProcess, token: &str, dir: &Path) -> Host {
        Self::with_servers(&hub.url(), &hub.ca_checksum, token, dir)
    }

    /// As [`Host::new`], for hub replicas: `servers` is their URLs, comma-separated.
    pub fn with_servers(servers: &str, ca_checksum: &str, token: &str, dir: &Path) -> Host {
        let env = [
            ("DROVER_SERVER", servers.to_owned()),
            ("DROVER_TOKEN", token.to_owned()),
            ("DROVER_CA_CHECKSUM", ca_checksum.to_owned()),
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

    /// Starts `drover-system-agent`; its log goes to `agent.log` in the host's directory.
    pub fn start(&mut self) {
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

    /// How many lines of the agent's log (every start's) contain `text`.
    pub fn log_lines(&self, text: &str) -> usize {
        std::fs::read_to_string(self.dir.join("agent.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    /// Waits until `count` lines of the agent's log contain `text`; panics after `within`.
    pub async fn until_logged(&self, text: &str, count: usize, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.log_lines(text) < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent never logged {text:?} {count} times"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL, as a crash or power cut would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }
}

/// Runs of an instruction that appends a line to `file` each time.
pub fn runs(file: &Path) -> usize {
    std::fs::read_to_string(file)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// An instruction that appends a line to `file` each time it runs, then runs `then`.
pub fn counted(name: &str, file: &Path, then: &str) -> Value {
    json!({"name": name, "script": format!("echo run >> {}; {then}", file.display())})
}

/// Polls `path` as `token` until `done` accepts it; panics with the last answer after `within`.
pub async fn until(
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
pub fn applied(plan: &Value) -> bool {
    plan["status"]["state"] == "applied"
        && plan["status"]["appliedChecksum"] == plan["status"]["planChecksum"]
}

/// Creates the custom K3s cluster `edge` the plan helpers write for, paused: the planner must
/// not install a distribution on the machine running the tests (the tests write the plans).
/// Returns its registration (`token`, `hostCommand`).
pub async fn create_paused_edge(addr: std::net::SocketAddr, admin: &str) -> Value {
    crate::create_custom_cluster(
        addr,
        admin,
        "edge",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1", "paused": true}),
    )
    .await
}

/// Writes `plan` as host `host`'s plan (of cluster `edge`), creating or replacing it.
pub async fn put_plan(hub: &HubProcess, admin: &str, host: &str, plan: Value) -> Value {
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
