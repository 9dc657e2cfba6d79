//! The fleet `drover-hub serve --demo N` shows: simulated imported clusters (a simulated API
//! server each, not a real Kubernetes) with their real cluster-agent and a real node-agent per
//! node, and simulated hosts (real system-agents on a paused custom cluster, so nothing is
//! installed), all in the hub's process. The agents are the real code and reach the hub over
//! its real tunnel; only the clusters and machines are stand-ins (every "host" and "node"
//! reports the machine the hub runs on).

use std::{path::PathBuf, time::Duration};

use tokio_util::sync::CancellationToken;
use tunnel::Secret;

use crate::cluster::{Identity, SimCluster, SimConfig};

/// Where the demo's agents reach the hub, and where they keep their state.
#[derive(Debug, Clone)]
pub struct DemoHub {
    pub url: String,
    pub ca_checksum: String,
    /// Each agent's state goes in a directory of its own under this one.
    pub dir: PathBuf,
}

const AGENT_TOKEN: &str = "drover-demo-agent";

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
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: "system:serviceaccount:drover-system:drover-agent".into(),
            groups: vec!["system:serviceaccounts".into()],
            impersonator: true,
        },
    );
    sim.apply_manifest(&manifest)
        .map_err(|e| anyhow::anyhow!("applying the import manifest to {name}: {e}"))?;
    let kube = cluster_agent::KubeTarget::from_kubeconfig_text(
        &sim.kubeconfig(AGENT_TOKEN),
        &format!("the simulated cluster {name}"),
    )?;
    let dir = hub.dir.join(&name);
    let agent = cluster_agent::Config {
        server: hub.url.clone(),
        token: Secret::new(registration.clone()),
        ca_checksum: hub.ca_checksum.clone(),
        cluster: name.clone(),
        name: "drover-cluster-agent-0".into(),
        kube: kube.clone(),
        state_dir: dir.join("cluster-agent"),
        lease: cluster_agent::lease::LeaseConfig {
            namespace: "default".into(),
            name: "drover-cluster-agent".into(),
            identity: "drover-cluster-agent-0".into(),
            duration: Duration::from_secs(15),
        },
        local_address: None,
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
            server: hub.url.clone(),
            token: Secret::new(registration.clone()),
            ca_checksum: hub.ca_checksum.clone(),
            cluster: name.clone(),
            node: node.clone(),
            kube: kube.clone(),
            state_dir: dir.join(&node),
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
        let config = system_agent::Config {
            server: Some(hub.url.clone()),
            token: Secret::new(registration.clone()),
            ca_checksum: hub.ca_checksum.clone(),
            dir: hub.dir.join(&name).join(format!("host-{i}")),
            host: system_agent::HostSpec {
                roles,
                node_name: format!("{name}-{i}"),
                ..system_agent::HostSpec::default()
            },
            local_plans: None,
            local_address: None,
            machine: None,
            retry: system_agent::Retry::default(),
        };
        agents.push(system_agent::Agent::start(config, shutdown.clone()).await?);
    }
    shutdown.cancelled().await;
    drop(agents);
    Ok(())
}
