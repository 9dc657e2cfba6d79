//! `drover-sim demo N`: the real hub (the `hub` library, as `drover-hub serve` runs it) and,
//! in the same process, the fleet it shows: simulated imported clusters (a simulated API
//! server each, not a real Kubernetes) with their real cluster-agent and a real node-agent per
//! node, and simulated hosts (real system-agents on a paused custom cluster, so nothing is
//! installed). The agents are the real code and reach the hub over
//! its real tunnel; only the clusters and machines are stand-ins (every "host" and "node"
//! reports the machine the hub runs on).

use std::{path::PathBuf, time::Duration};

use tokio_util::sync::CancellationToken;
use tunnel::Secret;

use crate::cluster::{SimCluster, SimConfig};

/// `drover-sim demo N [serve flags]`: the hub as `drover-hub serve` with those flags would
/// run it, with N simulated imported clusters and three simulated hosts; until SIGINT or
/// SIGTERM.
pub async fn serve(config: hub::Config, clusters: usize) -> anyhow::Result<()> {
    let data_dir = config.data_dir.clone();
    hub::serve(config, |hub, shutdown| {
        // The agents reach the hub at its listening address, so the demo works whatever the
        // server URL says.
        let demo = DemoHub {
            url: format!("https://127.0.0.1:{}", hub.local_addr().port()),
            ca_checksum: hub.ca_checksum().to_owned(),
            dir: data_dir.join("demo"),
        };
        start(hub.store().clone(), demo, clusters, shutdown)
    })
    .await
}

/// Registers `clusters` imported clusters (demo-1…) and the paused custom cluster
/// `demo-hosts` in `store`, and starts their simulated clusters and agents.
async fn start(
    store: std::sync::Arc<dyn hub::store::Store>,
    demo: DemoHub,
    clusters: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    for i in 1..=clusters {
        let name = format!("demo-{i}");
        let spec =
            serde_json::json!({"type": "imported", "description": "simulated (drover-sim demo)"});
        let token = hub::registration::ensure_cluster(store.as_ref(), &name, &spec).await?;
        let manifest = hub::registration::agents_manifest(
            store.as_ref(),
            &demo.url,
            &demo.ca_checksum,
            &name,
            &serde_json::from_value(spec)?,
            &token,
        )
        .await?;
        // Two to five nodes, so the clusters differ.
        let nodes = 2 + (i - 1) % 4;
        tokio::spawn(log_failure(
            name.clone(),
            imported_cluster(demo.clone(), name, token, manifest, nodes, shutdown.clone()),
        ));
    }
    let name = "demo-hosts".to_owned();
    let spec = serde_json::json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
        "paused": true, "description": "simulated hosts (drover-sim demo); paused: nothing is installed"});
    let token = hub::registration::ensure_cluster(store.as_ref(), &name, &spec).await?;
    tokio::spawn(log_failure(
        name.clone(),
        hosts(demo, name, token, 3, shutdown),
    ));
    #[allow(clippy::print_stdout)]
    {
        println!(
            "Demo: {clusters} simulated clusters (demo-1…) and 3 simulated hosts (demo-hosts) are \
             connecting; they are stand-ins from `sim`, not real Kubernetes."
        );
    }
    Ok(())
}

async fn log_failure(name: String, run: impl std::future::Future<Output = anyhow::Result<()>>) {
    if let Err(e) = run.await {
        tracing::error!(cluster = %name, error = %e, "the demo's simulated cluster stopped");
    }
}

/// Where the demo's agents reach the hub, and where they keep their state.
#[derive(Debug, Clone)]
pub struct DemoHub {
    pub url: String,
    pub ca_checksum: String,
    /// Each agent's state goes in a directory of its own under this one.
    pub dir: PathBuf,
}

impl DemoHub {
    /// An agent's settings: this hub, `token`, its state in `state_dir`.
    fn settings(&self, token: &str, state_dir: PathBuf) -> system_agent::HubSettings {
        system_agent::HubSettings {
            server: self.url.clone(),
            token: Secret::new(token),
            ca_checksum: self.ca_checksum.clone(),
            state_dir,
            local_address: None,
            proxy: Default::default(),
        }
    }
}

/// Runs imported cluster `name`: a simulated API server with `nodes` nodes (and ten pods a
/// node) into which the hub's import `manifest` is applied (the agent's RBAC among it), its
/// cluster-agent registering with `registration`, and a node-agent on each node; until
/// `shutdown`.
pub async fn imported_cluster(
    hub: DemoHub,
    name: String,
    registration: String,
    manifest: String,
    nodes: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let sim = SimCluster::start(
        SimConfig {
            nodes,
            pods: nodes * 10,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await?;
    sim.apply_manifest(&manifest)
        .map_err(|e| anyhow::anyhow!("applying the import manifest to {name}: {e}"))?;
    // The agent's pod would be given its service account's token: the manifest's RBAC is
    // what lets it do its work.
    let token = sim
        .service_account_token("drover-system", "drover-agent")
        .map_err(|e| anyhow::anyhow!("the import manifest applied to {name}: {e}"))?;
    let kube = cluster_agent::KubeTarget::from_kubeconfig_text(
        &sim.kubeconfig(&token),
        &format!("the simulated cluster {name}"),
    )?;
    let dir = hub.dir.join(&name);
    let agent = cluster_agent::Config {
        hub: hub.settings(&registration, dir.join("cluster-agent")),
        cluster: name.clone(),
        name: "drover-cluster-agent-0".into(),
        kube: kube.clone(),
        lease: cluster_agent::lease::LeaseConfig {
            namespace: "default".into(),
            name: "drover-cluster-agent".into(),
            identity: "drover-cluster-agent-0".into(),
            duration: Duration::from_secs(15),
        },
    };
    let mut tasks = tokio::task::JoinSet::new();
    let stop = shutdown.clone();
    tasks.spawn(async move {
        cluster_agent::run(agent, stop)
            .await
            .map_err(anyhow::Error::from)
    });
    for i in 0..nodes {
        let node = format!("node-{i}");
        let config = node_agent::Config {
            hub: hub.settings(&registration, dir.join(&node)),
            cluster: name.clone(),
            node: node.clone(),
            kube: kube.clone(),
        };
        let stop = shutdown.clone();
        tasks.spawn(async move {
            node_agent::run(config, stop)
                .await
                .map_err(anyhow::Error::from)
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Runs `hosts` system-agents registering to custom cluster `name` with `registration`, with
/// every role on the first and worker on the rest; until `shutdown`. The cluster should be
/// paused: these hosts are this machine, where nothing is to be installed.
pub async fn hosts(
    hub: DemoHub,
    name: String,
    registration: String,
    hosts: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut agents = Vec::with_capacity(hosts);
    for i in 0..hosts {
        let roles = if i == 0 {
            system_agent::Roles {
                etcd: true,
                control_plane: true,
                worker: true,
            }
        } else {
            system_agent::Roles {
                worker: true,
                ..system_agent::Roles::default()
            }
        };
        let dir = hub.dir.join(&name).join(format!("host-{i}"));
        let config = system_agent::Config {
            hub: Some(system_agent::HubSettings {
                server: hub.url.clone(),
                token: Secret::new(registration.clone()),
                ca_checksum: hub.ca_checksum.clone(),
                state_dir: dir.clone(),
                local_address: None,
                proxy: Default::default(),
            }),
            dir,
            host: system_agent::HostSpec {
                roles,
                node_name: format!("{name}-{i}"),
                ..system_agent::HostSpec::default()
            },
            local_plans: None,
            machine: None,
            retry: system_agent::Retry::default(),
        };
        agents.push(system_agent::Agent::start(config, shutdown.clone()).await?);
    }
    shutdown.cancelled().await;
    drop(agents);
    Ok(())
}
