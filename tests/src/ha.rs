//! Hub replicas on etcd, for the HA tests and `bench ha`: three replicas with an imported
//! simulated cluster whose agent knows all three, and the load a user puts on them (API writes
//! and reads through every replica, kubectl through each) measured while something fails.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use serde_json::json;
use sim::cluster::SimConfig;

use crate::{
    HubProcess, api, https_get,
    imported::{Imported, kubectl, kubectl_ok, until_allowed, user_kubeconfig},
};

/// An imported simulated cluster of three pods on a hub started with `flags`.
pub async fn imported_on(label: &str, flags: &[&str]) -> Imported {
    let sim = SimConfig {
        pods: 3,
        ..SimConfig::default()
    };
    Imported::start_with(label, sim, flags).await
}

/// The kubeconfig at `path`, aimed at another replica (same CA, same token).
pub fn via(path: &Path, from: &HubProcess, to: &HubProcess, label: &str) -> PathBuf {
    let text = std::fs::read_to_string(path).unwrap();
    let other = path.with_file_name(format!("{label}.kubeconfig"));
    std::fs::write(&other, text.replace(&from.url(), &to.url())).unwrap();
    other
}

/// Whether `hub` says it leads (its `/metrics`).
pub async fn leads(hub: &HubProcess) -> bool {
    let (_, metrics) = https_get(hub.addr, "/metrics").await;
    String::from_utf8_lossy(&metrics)
        .lines()
        .any(|line| line == "drover_replica_leader 1")
}

/// The index of the one replica of `hubs` that leads, waiting up to `within` for one to.
pub async fn leader_of(hubs: &[&HubProcess], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let mut leading = Vec::new();
        for (i, hub) in hubs.iter().enumerate() {
            if leads(hub).await {
                leading.push(i);
            }
        }
        assert!(leading.len() <= 1, "two replicas lead at once: {leading:?}");
        if let [one] = leading[..] {
            return one;
        }
        assert!(
            Instant::now() < deadline,
            "no replica leads after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three replicas on the etcd `store` names, the first with an imported simulated cluster
/// whose cluster-agent knows all three, and a cluster member's kubeconfig through each.
#[derive(Debug)]
pub struct Replicas {
    pub hubs: [HubProcess; 3],
    pub admin: String,
    pub kubeconfigs: [PathBuf; 3],
    shutdown: tokio_util::sync::CancellationToken,
    agent: tokio::task::JoinHandle<()>,
}

impl Replicas {
    pub async fn start(label: &str, store: &str) -> Replicas {
        let flags = ["--listen", "127.0.0.1:0", "--store", store];
        let imported = imported_on(label, &flags).await;
        let dir = imported.dir.clone();
        let second = HubProcess::start_with(&dir.join("hub-2"), &flags).await;
        let third = HubProcess::start_with(&dir.join("hub-3"), &flags).await;
        let servers = [&imported.hub, &second, &third]
            .map(HubProcess::url)
            .join(",");
        let mut env = imported.agent_env("drover-cluster-agent-0").await;
        env.insert("DROVER_SERVER".into(), servers);
        let config = cluster_agent::Config::from_env(&env).unwrap();
        let stop = imported.shutdown.clone();
        let agent = tokio::spawn(async move {
            let _ = cluster_agent::run(config, stop).await;
        });
        let Imported {
            hub: first,
            admin,
            shutdown,
            ..
        } = imported;
        let member = user_kubeconfig(&first, &admin, &dir, "mia", Some("cluster-member")).await;
        until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
        let kubeconfigs = [
            member.clone(),
            via(&member, &first, &second, &format!("{label}-2")),
            via(&member, &first, &third, &format!("{label}-3")),
        ];
        for kubeconfig in &kubeconfigs {
            kubectl_ok(kubeconfig, &["get", "pods", "-A", "--no-headers"]).await;
        }
        Replicas {
            hubs: [first, second, third],
            admin,
            kubeconfigs,
            shutdown,
            agent,
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.agent.await;
    }
}

/// What the load met while one thing failed.
#[derive(Debug, Default)]
pub struct Window {
    /// API writes (a cluster created) answered 201.
    pub writes: usize,
    /// Writes, and reads of what was written, that failed: what each said.
    pub failed: Vec<String>,
    /// kubectl requests (a list of every pod) that worked.
    pub kubectl: usize,
    pub kubectl_failed: Vec<String>,
    /// The longest stretch no replica said it led (polled every 200 ms).
    pub leaderless: Duration,
    pub elapsed: Duration,
}

impl Replicas {
    /// Writes and reads through every replica in turn, kubectl through each in turn, and
    /// watches for a leader, until `during` is over: what that met.
    pub async fn load_while(&self, label: &str, during: impl Future<Output = ()>) -> Window {
        let stop = AtomicBool::new(false);
        let hubs: Vec<&HubProcess> = self.hubs.iter().collect();
        let started = Instant::now();
        let writes = async {
            let (mut done, mut failed) = (0, Vec::new());
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let hub = hubs[i % hubs.len()];
                let name = format!("{label}-{i}");
                let (code, body) = api(
                    hub.addr,
                    "POST",
                    "/v1/clusters",
                    Some(&self.admin),
                    Some(json!({"metadata": {"name": name}, "spec": {"type": "imported"}})),
                )
                .await;
                if code == 201 {
                    done += 1;
                } else {
                    failed.push(format!("POST {name} via {}: {code} {body}", hub.addr));
                }
                let path = format!("/v1/clusters/{name}");
                let (code, body) = api(hub.addr, "GET", &path, Some(&self.admin), None).await;
                if code >= 500 {
                    failed.push(format!("GET {name} via {}: {code} {body}", hub.addr));
                }
            }
            (done, failed)
        };
        let kubectl_runs = async {
            let (mut done, mut failed) = (0, Vec::new());
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let kubeconfig = &self.kubeconfigs[i % self.kubeconfigs.len()];
                let (ok, _, err) =
                    kubectl(kubeconfig, &["get", "pods", "-A", "--no-headers"]).await;
                if ok {
                    done += 1;
                } else {
                    failed.push(format!("kubectl via replica {}: {}", i % 3 + 1, err.trim()));
                }
            }
            (done, failed)
        };
        let vacancy = async {
            let (mut longest, mut since) = (Duration::ZERO, None::<Instant>);
            while !stop.load(Ordering::Relaxed) {
                let mut any = false;
                for hub in &hubs {
                    any |= leads(hub).await;
                }
                match (any, since) {
                    (false, None) => since = Some(Instant::now()),
                    (true, Some(at)) => {
                        longest = longest.max(at.elapsed());
                        since = None;
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            longest.max(since.map_or(Duration::ZERO, |at| at.elapsed()))
        };
        let chaos = async {
            during.await;
            stop.store(true, Ordering::Relaxed);
        };
        let ((writes, failed), (kubectl, kubectl_failed), leaderless, ()) =
            tokio::join!(writes, kubectl_runs, vacancy, chaos);
        Window {
            writes,
            failed,
            kubectl,
            kubectl_failed,
            leaderless,
            elapsed: started.elapsed(),
        }
    }
}
