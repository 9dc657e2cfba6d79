//! `drover-sim fleet`: many agents in one process, each the real agent code with its own
//! tunnel session to the hub, for capacity planning (how much memory and CPU a hub needs for
//! so many machines or clusters) and for the `fleet` benchmark.
//!
//! - `system`: N system-agents registering with a custom cluster's registration token as hosts
//!   `<prefix>-<i>`; each keeps its records under the fleet's directory (tmpfs by default:
//!   real hosts each write to their own disk) and applies the plans the hub sends, for real.
//! - `cluster`: N imported clusters `<prefix>-<i>` created with an API token that may create
//!   clusters, each with its cluster-agent; all of them talk to one simulated Kubernetes API
//!   server in this process (each with a namespace of its own for its Lease and credential,
//!   and its own watch-driven caches, so a process holds fewer of these than of
//!   system-agents).
//!
//! Agents connect from addresses spread over 127.0.0.0/8 (2,000 per address) when the hub is
//! on loopback, so one address's ephemeral ports do not run out, and the process raises its
//! own open-files limit to the hard limit (one socket per agent).

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use anyhow::Context;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tunnel::{Connector, ConnectorConfig, Peer, Secret, tls::Trust};

use crate::cluster::{ADMIN_TOKEN, SimCluster, SimConfig};

/// What kind of agent a fleet runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FleetKind {
    System,
    Cluster,
}

/// A fleet's settings.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The hub's URL (or its replicas', comma-separated).
    pub hub: String,
    /// sha256 of the hub's CA, as `drover-hub serve` prints it.
    pub ca_checksum: String,
    /// `system`: a custom cluster's registration token (`drr_…`); `cluster`: an API token
    /// allowed to create clusters.
    pub token: String,
    pub agents: usize,
    pub kind: FleetKind,
    /// Names are `<prefix>-<i>`; fleets in several processes use different prefixes.
    pub prefix: String,
    /// Where the agents keep their state.
    pub dir: PathBuf,
    /// Agents starting (registering) at once.
    pub concurrency: usize,
}

/// Agents per source address: far below the ~28,000 ephemeral ports of one address.
const PER_ADDRESS: usize = 2_000;

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    system: Vec<system_agent::Agent>,
    /// Host names (`system`) or cluster names (`cluster`), by index.
    pub names: Vec<String>,
    tasks: JoinSet<()>,
    _sim: Option<SimCluster>,
}

impl Fleet {
    /// System-agents with a session to the hub now (`cluster` fleets: see the hub's
    /// `drover_tunnel_sessions`).
    pub fn connected(&self) -> usize {
        self.system.iter().filter(|a| a.connected()).count()
    }

    /// Each system-agent, with its host's name.
    pub fn system_agents(&self) -> impl Iterator<Item = (&str, &system_agent::Agent)> {
        self.names.iter().map(String::as_str).zip(&self.system)
    }

    /// Waits until every agent has stopped (after the shutdown token given to [`start`]).
    pub async fn wait(mut self) {
        for agent in self.system.drain(..) {
            agent.wait().await;
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Open files a fleet asks for where it may raise its hard limit (as root): every agent holds
/// a connection, and a system-agent applying a plan two pipes per process it starts, so ten
/// thousand hosts applying at once pass the 20,000 some machines allow by default.
const OPEN_FILES_WANTED: u64 = 262_144;

/// Raises this process's open-files limit: to `OPEN_FILES_WANTED` where the hard limit may be
/// raised, else the soft limit to the hard one; returns the limit now. Children (a hub the
/// bench starts) inherit it.
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let to = |n: u64| Rlimit {
        current: Some(n),
        maximum: Some(limit.maximum.map_or(n, |hard| hard.max(n))),
    };
    let wanted = limit
        .maximum
        .map_or(OPEN_FILES_WANTED, |hard| hard.max(OPEN_FILES_WANTED));
    if limit.current.is_some_and(|now| now < wanted)
        && setrlimit(Resource::Nofile, to(wanted)).is_err()
        && let Some(hard) = limit.maximum
        && limit.current.is_some_and(|now| now < hard)
        && let Err(e) = setrlimit(Resource::Nofile, to(hard))
    {
        tracing::warn!(error = %e, "cannot raise the open-files limit");
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The source address of agent `i`, if the hub is on loopback.
fn source(hub: &str, i: usize) -> Option<IpAddr> {
    let loopback = hub.split(',').all(|url| {
        let host = url
            .trim()
            .trim_start_matches("https://")
            .trim_start_matches("wss://");
        host.starts_with("127.") || host.starts_with("localhost")
    });
    let offset = u32::try_from(i / PER_ADDRESS).ok()?;
    // 127.0.0.1, 127.0.0.2, …: 16 million addresses, all answered by the loopback interface.
    loopback.then(|| {
        IpAddr::V4(Ipv4Addr::from(
            u32::from(Ipv4Addr::new(127, 0, 0, 1)) + offset,
        ))
    })
}

/// Starts the fleet: every agent registered (at most `concurrency` at once) and dialling.
pub async fn start(config: FleetConfig, shutdown: CancellationToken) -> anyhow::Result<Fleet> {
    let limit = raise_open_files_limit();
    if (limit as usize) < config.agents + 256 {
        tracing::warn!(
            limit,
            agents = config.agents,
            "the open-files limit is below one per agent; run several fleet processes"
        );
    }
    std::fs::create_dir_all(&config.dir)
        .with_context(|| format!("cannot create {}", config.dir.display()))?;
    match config.kind {
        FleetKind::System => start_system(config, shutdown).await,
        FleetKind::Cluster => start_clusters(config, shutdown).await,
    }
}

async fn start_system(config: FleetConfig, shutdown: CancellationToken) -> anyhow::Result<Fleet> {
    let mut fleet = Fleet {
        system: Vec::with_capacity(config.agents),
        names: Vec::with_capacity(config.agents),
        tasks: JoinSet::new(),
        _sim: None,
    };
    // The agents are on one machine: one reader of its facts and usage serves them all (each
    // reading its own would be N readings of the same /proc and /sys every beat).
    let machine = agentkit::Sampler::new();
    let indices: Vec<usize> = (0..config.agents).collect();
    for batch in indices.chunks(config.concurrency.max(1)) {
        let starts = batch.iter().map(|&i| {
            let name = format!("{}-{i}", config.prefix);
            let agent = system_agent::Config {
                hub: Some(system_agent::HubSettings {
                    server: config.hub.clone(),
                    token: Secret::new(config.token.clone()),
                    ca_checksum: config.ca_checksum.clone(),
                    state_dir: config.dir.join(&name),
                    local_address: source(&config.hub, i),
                    proxy: Default::default(),
                }),
                dir: config.dir.join(&name),
                host: system_agent::HostSpec {
                    roles: system_agent::Roles {
                        worker: true,
                        ..system_agent::Roles::default()
                    },
                    node_name: name.clone(),
                    ..system_agent::HostSpec::default()
                },
                local_plans: None,
                root: system_agent::Root::default(),
                retry: system_agent::Retry::default(),
                machine: machine.clone(),
            };
            let (shutdown, dir) = (shutdown.clone(), config.dir.join(&name));
            async move {
                let started = system_agent::Agent::start(agent, shutdown)
                    .await
                    .with_context(|| format!("agent {name}"))?;
                // The host's name on the hub is the id it registered as.
                let registered: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(dir.join("registration.json"))?)?;
                let host = registered["id"]
                    .as_str()
                    .and_then(|id| id.strip_prefix("host/"))
                    .unwrap_or(&name)
                    .to_owned();
                anyhow::Ok((host, started))
            }
        });
        for started in futures::future::join_all(starts).await {
            let (host, agent) = started?;
            fleet.names.push(host);
            fleet.system.push(agent);
        }
    }
    Ok(fleet)
}

async fn start_clusters(config: FleetConfig, shutdown: CancellationToken) -> anyhow::Result<Fleet> {
    // One simulated API server for all the clusters, with no workload of its own.
    let sim = SimCluster::start(
        SimConfig {
            nodes: 1,
            pods: 0,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot start the simulated cluster: {e}"))?;
    let kube = cluster_agent::KubeTarget::from_kubeconfig_text(
        &sim.kubeconfig(ADMIN_TOKEN),
        "the fleet's simulated cluster",
    )?;
    // The hub's API, with the caller's token, verified by the CA checksum as agents do.
    let api = Connector::new(ConnectorConfig::new(
        config.hub.clone(),
        Secret::new(config.token.clone()),
        Peer {
            id: String::new(),
            kind: "fleet".into(),
        },
        Trust::from_checksum(&config.ca_checksum),
    ))?;
    let mut fleet = Fleet {
        system: Vec::new(),
        names: Vec::with_capacity(config.agents),
        tasks: JoinSet::new(),
        _sim: None,
    };
    let indices: Vec<usize> = (0..config.agents).collect();
    for batch in indices.chunks(config.concurrency.max(1)) {
        let creates = batch.iter().map(|&i| {
            let name = format!("{}-{i}", config.prefix);
            let api = api.clone();
            async move {
                let body =
                    serde_json::json!({"metadata": {"name": name}, "spec": {"type": "imported"}});
                let (status, reply) = api.post_json("/v1/clusters", body.to_string()).await?;
                let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap_or_default();
                anyhow::ensure!(
                    status.is_success(),
                    "creating cluster {name}: HTTP {status}: {}",
                    reply["message"].as_str().unwrap_or("no reason given")
                );
                let token = reply["registration"]["token"]
                    .as_str()
                    .context("the hub answered without a registration token")?
                    .to_owned();
                anyhow::Ok((i, name, token))
            }
        });
        for created in futures::future::join_all(creates).await {
            let (i, name, token) = created?;
            // A namespace of its own: the agent keeps its credential in a Secret beside its
            // Lease, and clusters must not share one.
            let namespace = format!("drover-{name}");
            sim.apply_manifest(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"
            ))
            .map_err(anyhow::Error::msg)?;
            let agent = cluster_agent::Config {
                hub: system_agent::HubSettings {
                    server: config.hub.clone(),
                    token: Secret::new(token),
                    ca_checksum: config.ca_checksum.clone(),
                    state_dir: config.dir.join(&name),
                    local_address: source(&config.hub, i),
                    proxy: Default::default(),
                },
                cluster: name.clone(),
                name: format!("{name}-agent"),
                kube: kube.clone(),
                // A Lease of its own: every agent leads its cluster.
                drift: std::time::Duration::from_secs(30),
                lease: cluster_agent::lease::LeaseConfig {
                    namespace,
                    name: format!("drover-{name}"),
                    identity: format!("{name}-agent"),
                    duration: Duration::from_secs(15),
                },
            };
            let shutdown = shutdown.clone();
            fleet.tasks.spawn(async move {
                if let Err(e) = cluster_agent::run(agent, shutdown).await {
                    tracing::warn!(cluster = %name, error = %e, "a fleet cluster-agent stopped");
                }
            });
            fleet.names.push(format!("{}-{i}", config.prefix));
        }
    }
    fleet._sim = Some(sim);
    Ok(fleet)
}
