//! `drover-sim demo N`: the real hub (the `hub` library, as `drover-hub serve` runs it) and,
//! in the same process, the fleet it shows: simulated imported clusters (a simulated API
//! server each, not a real Kubernetes) with their real cluster-agent and a real node-agent per
//! node, and a custom cluster the hub's planner provisions on three simulated hosts (real
//! system-agents, each a [`crate::host`] with its own root directory and loopback address,
//! installing the stand-in distribution from the hub's artifacts). The agents are the real
//! code and reach the hub over its real tunnel; only the clusters and machines are stand-ins
//! (every "host" and "node" reports the machine the hub runs on, but for its CPU and memory
//! use, which are its own and made up, so that they differ as a fleet's would).

use std::{path::PathBuf, time::Duration};

use tokio_util::sync::CancellationToken;
use tunnel::Secret;

use crate::cluster::{SimCluster, SimConfig};

/// `drover-sim demo N [serve flags]`: the hub as `drover-hub serve` with those flags would
/// run it, with N simulated imported clusters and a custom cluster on three simulated hosts;
/// until SIGINT or SIGTERM.
pub async fn serve(config: hub::Config, clusters: usize) -> anyhow::Result<()> {
    let data_dir = config.data_dir.clone();
    hub::serve(config, |hub, shutdown| {
        // The agents reach the hub at its listening address, so the demo works whatever the
        // server URL says.
        let port = hub.local_addr().port();
        let demo = DemoHub {
            url: format!("https://127.0.0.1:{port}"),
            ca_checksum: hub.ca_checksum().to_owned(),
            dir: data_dir.join("demo"),
            artifacts: data_dir.join("artifacts"),
            // A loopback network of this hub's own (its port is its alone), so that two demos,
            // or a demo and the provisioning guide's hosts, never share the hosts' ports.
            loopback: [127, (port >> 8) as u8, (port & 0xff) as u8],
        };
        start(hub.store().clone(), demo, clusters, shutdown)
    })
    .await
}

/// The demo's custom cluster, the version it runs, and its hosts' roles.
pub const CUSTOM_CLUSTER: &str = "demo-edge";
const CUSTOM_VERSION: &str = "v1.33.4+k3s1";

/// Registers `clusters` imported clusters (demo-1…) and the custom cluster `demo-edge` in
/// `store`, and starts their simulated clusters, hosts and agents.
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
    // The custom cluster: the hub installs the stand-in distribution from its own artifacts,
    // as it would for air-gapped machines.
    let sim = std::env::current_exe()?;
    crate::standin::artifacts::write(&demo.artifacts, CUSTOM_VERSION, &sim)
        .map_err(anyhow::Error::msg)?;
    hub::model::set_setting(store.as_ref(), "install-source", "hub").await?;
    let spec = serde_json::json!({"type": "custom", "distribution": "k3s", "version": CUSTOM_VERSION,
        "description": "provisioned by the hub on three simulated hosts (drover-sim demo)"});
    let token = hub::registration::ensure_cluster(store.as_ref(), CUSTOM_CLUSTER, &spec).await?;
    tokio::spawn(log_failure(
        CUSTOM_CLUSTER.to_owned(),
        hosts(demo, CUSTOM_CLUSTER.to_owned(), token, 3, shutdown),
    ));
    #[allow(clippy::print_stdout)]
    {
        println!(
            "Demo: {clusters} simulated clusters (demo-1…) are connecting, and the hub is \
             provisioning {CUSTOM_CLUSTER} on 3 simulated hosts; they are stand-ins from `sim`, \
             not real Kubernetes."
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
    /// The hub's artifacts directory.
    pub artifacts: PathBuf,
    /// The first three bytes of the simulated hosts' loopback addresses.
    pub loopback: [u8; 3],
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

/// What the demo's imported clusters run besides the agents.
const WORKLOADS: &str = include_str!("demo_workloads.yaml");

/// Runs imported cluster `name`: a simulated API server with `nodes` nodes into which the
/// hub's import `manifest` is applied (the agent's RBAC among it) and the demo's
/// [`WORKLOADS`], with the pods their controllers would have started; its cluster-agent
/// registering with `registration`, and a node-agent on each node; until `shutdown`.
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
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await?;
    sim.apply_manifest(&manifest)
        .map_err(|e| anyhow::anyhow!("applying the import manifest to {name}: {e}"))?;
    sim.apply_manifest(WORKLOADS)
        .map_err(|e| anyhow::anyhow!("applying the demo's workloads to {name}: {e}"))?;
    sim.settle_workloads();
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
        drift: std::time::Duration::from_secs(30),
        lease: cluster_agent::lease::LeaseConfig {
            namespace: "default".into(),
            name: "drover-cluster-agent".into(),
            identity: "drover-cluster-agent-0".into(),
            duration: Duration::from_secs(15),
        },
    };
    let machine = agentkit::Sampler::new();
    // Different nodes in every cluster: the cluster's name picks where its loads start.
    let seed = name
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
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
            // Each stand-in node shows a load of its own, not this machine's.
            machine: machine
                .as_ref()
                .map(|m| m.simulated(seed.wrapping_add(i as u32))),
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

/// Runs `hosts` simulated hosts registering to custom cluster `name` with `registration`,
/// every role on the first and worker on the rest, each with its own root directory and
/// loopback address; until `shutdown` (which stops their services too).
pub async fn hosts(
    hub: DemoHub,
    name: String,
    registration: String,
    hosts: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut running = tokio::task::JoinSet::new();
    for i in 0..hosts {
        let roles = system_agent::Roles {
            etcd: i == 0,
            control_plane: i == 0,
            worker: true,
        };
        let [a, b, c] = hub.loopback;
        let host = crate::host::HostConfig {
            server: hub.url.clone(),
            token: Secret::new(registration.clone()),
            ca_checksum: hub.ca_checksum.clone(),
            name: format!("{name}-{i}"),
            roles,
            address: std::net::Ipv4Addr::new(a, b, c, 1 + i as u8),
            dir: std::path::absolute(hub.dir.join(&name).join(format!("host-{i}")))?,
        };
        running.spawn(crate::host::run(host, shutdown.clone()));
    }
    while let Some(done) = running.join_next().await {
        done??;
    }
    Ok(())
}
