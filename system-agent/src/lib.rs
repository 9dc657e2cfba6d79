//! Drover's system-agent, installed on a bare host by `system-agent-install.sh`.
//!
//! It registers the host with the hub once (exchanging the registration token for a credential
//! of its own, kept with the host's stable id in its directory), holds a tunnel session, and
//! applies the install plans the hub pushes: files, then one-time instructions in order, then
//! periodic instructions and probes for as long as the plan stands. Every step is recorded on
//! disk first (see [`record`]), so a crash never runs an applied plan twice and never loses a
//! status the hub has not acknowledged. A local plan directory works with no hub at all.

/// `drover-system-agent --help`: what it does and how it is configured.
pub const HELP: &str = "\
Drover's system-agent: runs on a bare host (installed by the hub's install script), registers
it with the hub and applies the plans with which the hub installs and runs K3s or RKE2.

Configured from the environment (the install script writes /etc/drover/system-agent.env):
  DROVER_SERVER            the hub's URL, https://HOST[:PORT] (or DROVER_LOCAL_PLANS alone)
  DROVER_TOKEN             the registration token, exchanged for a credential at first start
  DROVER_CA_CHECKSUM       sha256 of the hub's CA (empty: the system's roots)
  DROVER_DIR               its directory (default /var/lib/drover/system-agent)
  DROVER_ROLES             etcd,controlplane,worker or all
  DROVER_NODE_NAME         the node's name (default: the host name)
  DROVER_ADDRESS, DROVER_INTERNAL_ADDRESS   the node's addresses
  DROVER_LABELS            k=v,k=v        DROVER_TAINTS  k=v:Effect,...
  DROVER_LOCAL_PLANS       a directory of plans (*.json) applied with no hub
  DROVER_ROOT              a directory every path of a plan lands under, its instructions
                           confined to it (a host sharing its machine; needs Landlock)
  DROVER_LOOPBACK          the address (127.x.y.z) that is 127.0.0.1 to this host's probes
  DROVER_MAX_FAILURES      attempts per plan (default 5)
  DROVER_RETRY_SECONDS     the first retry's wait, doubling up to 300 (default 5)
";

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

pub use agentkit::HubSettings;
use proto::register::{AgentKind, RegisterRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{Connector, Peer, Secret};

pub mod applier;
pub mod exec;
pub mod files;
mod hub;
pub mod local;
pub mod probe;
pub mod record;
pub mod root;
#[cfg(test)]
mod testing;
pub mod transfer;

pub use applier::Retry;
pub use root::Root;

/// The agent kind this crate is.
pub const KIND: AgentKind = AgentKind::SystemAgent;

/// How the host joins its cluster (sent when registering), and its roles there.
pub use proto::register::{HostRoles as Roles, RegisterHost as HostSpec};

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hub and how to reach it (its `state_dir` keeps the host id and the registration;
    /// from the environment, the agent's directory); `None` with only a local plan directory.
    pub hub: Option<HubSettings>,
    /// The agent's directory: the plan records.
    pub dir: PathBuf,
    pub host: HostSpec,
    /// Plans in JSON files applied with no hub (`*.json`, one plan each).
    pub local_plans: Option<PathBuf>,
    /// Where the plans land: the machine itself, or a root directory of the host's own.
    pub root: Root,
    pub retry: Retry,
    /// Where the machine's facts and usage are read (`None`: a reader of its own). A fleet
    /// simulator gives all its agents, on one machine, one reader.
    pub machine: Option<agentkit::Sampler>,
}

/// A setting that is missing or unusable; names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Reads `DROVER_SERVER`, `DROVER_TOKEN`, `DROVER_CA_CHECKSUM`, `DROVER_DIR` (default
    /// `/var/lib/drover/system-agent`), `DROVER_ROLES` (`etcd,controlplane,worker` or `all`),
    /// `DROVER_NODE_NAME` (default: the host name), `DROVER_ADDRESS`,
    /// `DROVER_INTERNAL_ADDRESS`, `DROVER_LABELS` (`k=v,k=v`), `DROVER_TAINTS`
    /// (`k=v:Effect,…`), `DROVER_LOCAL_PLANS` (a directory), `DROVER_MAX_FAILURES` (default 5)
    /// and `DROVER_RETRY_SECONDS` (the first retry's wait, default 5; it doubles up to 300).
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let get = |name: &str| env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let server = get("DROVER_SERVER").map(str::to_owned);
        let local_plans = get("DROVER_LOCAL_PLANS").map(PathBuf::from);
        if server.is_none() && local_plans.is_none() {
            return Err(ConfigError(
                "DROVER_SERVER is required (or DROVER_LOCAL_PLANS, to apply local plans with no hub)"
                    .into(),
            ));
        }
        let dir = get("DROVER_DIR").map_or_else(
            || PathBuf::from("/var/lib/drover/system-agent"),
            PathBuf::from,
        );
        let proxy =
            tunnel::ProxySettings::from_env(|name| env.get(name).cloned()).map_err(ConfigError)?;
        let hub = server.map(|server| HubSettings {
            server,
            token: Secret::new(get("DROVER_TOKEN").unwrap_or_default()),
            ca_checksum: get("DROVER_CA_CHECKSUM").unwrap_or_default().to_owned(),
            state_dir: dir.clone(),
            local_address: None,
            proxy: proxy.clone(),
        });
        let mut roles = Roles::default();
        for role in get("DROVER_ROLES").unwrap_or_default().split(',') {
            match role.trim() {
                "" => {}
                "etcd" => roles.etcd = true,
                "controlplane" | "control-plane" => roles.control_plane = true,
                "worker" => roles.worker = true,
                "all" => {
                    roles = Roles {
                        etcd: true,
                        control_plane: true,
                        worker: true,
                    }
                }
                other => {
                    return Err(ConfigError(format!(
                        "DROVER_ROLES: {other:?} is not a role (etcd, controlplane, worker, all)"
                    )));
                }
            }
        }
        let mut node_labels = BTreeMap::new();
        for label in get("DROVER_LABELS").unwrap_or_default().split(',') {
            let label = label.trim();
            if label.is_empty() {
                continue;
            }
            let Some((k, v)) = label.split_once('=').filter(|(k, _)| !k.is_empty()) else {
                return Err(ConfigError(format!(
                    "DROVER_LABELS: {label:?} must be key=value"
                )));
            };
            node_labels.insert(k.to_owned(), v.to_owned());
        }
        let taints = get("DROVER_TAINTS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        let number =
            |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| match get(name) {
                None => Ok(default),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| range.contains(n))
                    .ok_or_else(|| {
                        ConfigError(format!(
                            "{name}={v:?}: give a whole number from {} to {}",
                            range.start(),
                            range.end()
                        ))
                    }),
            };
        let root = Root {
            dir: match get("DROVER_ROOT") {
                None => None,
                Some(dir) if dir.starts_with('/') && dir != "/" => Some(PathBuf::from(dir)),
                Some(dir) => {
                    return Err(ConfigError(format!(
                        "DROVER_ROOT={dir:?}: give an absolute directory other than /"
                    )));
                }
            },
            loopback: match get("DROVER_LOOPBACK") {
                None => None,
                Some(text) => Some(
                    text.parse::<std::net::Ipv4Addr>()
                        .ok()
                        .filter(std::net::Ipv4Addr::is_loopback)
                        .ok_or_else(|| {
                            ConfigError(format!(
                                "DROVER_LOOPBACK={text:?}: give a loopback address, 127.x.y.z"
                            ))
                        })?,
                ),
            },
        };
        let retry = Retry {
            max_failures: number("DROVER_MAX_FAILURES", 5, 1..=1000)? as u32,
            base: Duration::from_secs(number("DROVER_RETRY_SECONDS", 5, 1..=3600)?),
            cap: Duration::from_secs(300),
        };
        Ok(Self {
            hub,
            dir,
            host: HostSpec {
                roles,
                node_name: get("DROVER_NODE_NAME")
                    .map(str::to_owned)
                    .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
                    .map(|n| n.trim().to_owned())
                    .unwrap_or_default(),
                address: get("DROVER_ADDRESS").unwrap_or_default().to_owned(),
                internal_address: get("DROVER_INTERNAL_ADDRESS")
                    .unwrap_or_default()
                    .to_owned(),
                node_labels,
                taints,
            },
            local_plans,
            root,
            machine: None,
            retry,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("registering with the hub failed: {0}")]
    Register(String),
    #[error(transparent)]
    Registration(#[from] agentkit::RegisterError),
    #[error("cannot use the agent's directory {0}: {1}")]
    State(String, std::io::Error),
    #[error(transparent)]
    Connect(#[from] tunnel::ConnectError),
}

/// The host's stable id: made once, kept in the agent's directory, sent at registration so
/// that installing again re-registers the same host.
pub fn host_id(dir: &std::path::Path) -> Result<String, AgentError> {
    use ring::rand::{SecureRandom, SystemRandom};
    let path = dir.join("id");
    let state = |e| AgentError::State(dir.display().to_string(), e);
    if let Ok(id) = std::fs::read_to_string(&path)
        && id.trim().len() >= 8
    {
        return Ok(id.trim().to_owned());
    }
    let mut bytes = [0u8; 10];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| state(std::io::Error::other("no randomness for the host id")))?;
    let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    record::write_file_atomically(&path, id.as_bytes(), 0o644).map_err(state)?;
    Ok(id)
}

/// The identity and credential from an earlier registration, or from registering now.
async fn registration(hub: &HubSettings, host: &HostSpec) -> Result<(String, Secret), AgentError> {
    // A host's identity is the hub's to give; the system-agent always kept this format.
    if let Some(kept) = agentkit::hub::load(&hub.state_dir)? {
        return Ok((kept.id, kept.credential));
    }
    if !hub.is_registration_token() {
        return Err(AgentError::Register(
            "no credential kept and DROVER_TOKEN is not a registration token (drr_…); install with the hub's host command".into(),
        ));
    }
    let request = RegisterRequest {
        host_id: Some(host_id(&hub.state_dir)?),
        host: Some(host.clone()),
        ..RegisterRequest::of(KIND)
    };
    let identity = Peer {
        id: String::new(),
        kind: KIND.as_str().into(),
    };
    let registration = agentkit::hub::register(hub, identity, &request).await?;
    agentkit::hub::keep(&hub.state_dir, &registration)?;
    tracing::info!(id = %registration.id, cluster = %registration.cluster, "registered with the hub");
    Ok((registration.id, registration.credential))
}

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    /// The record of the hub's plan for this host (none with only local plans).
    pub record: Option<Arc<record::Record>>,
    /// The record of the hub's task for this host (one-time operations, beside the plan).
    pub task: Option<Arc<record::Record>>,
    /// The session to the hub now (`None` between sessions).
    session: Option<tokio::sync::watch::Receiver<Option<(String, tunnel::Channel)>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Agent {
    /// Registers (the first time), opens the plan record and starts following the hub and
    /// the local plan directory; returns once registered.
    pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Agent, AgentError> {
        std::fs::create_dir_all(&config.dir)
            .map_err(|e| AgentError::State(config.dir.display().to_string(), e))?;
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(dir) = &config.local_plans {
            tasks.spawn(local::follow(
                dir.clone(),
                config.dir.join("local"),
                config.retry,
                config.root.clone(),
                shutdown.clone(),
            ));
        }
        let (mut kept, mut kept_task, mut session) = (None, None, None);
        if let Some(hub) = &config.hub {
            let (id, credential) = registration(hub, &config.host).await?;
            let state = |e| AgentError::State(config.dir.display().to_string(), e);
            let record = record::Record::open(&config.dir.join("plan.json")).map_err(state)?;
            let task = record::Record::open(&config.dir.join("task.json")).map_err(state)?;
            // The session there is now, for plans that move files to or from the hub.
            let (channel, follow) = tokio::sync::watch::channel(None);
            session = Some(follow.clone());
            let hub_files = transfer::Hub::new(follow);
            for slot in [&record, &task] {
                tasks.spawn(applier::drive(
                    slot.clone(),
                    config.retry,
                    Some(hub_files.clone()),
                    config.root.clone(),
                    shutdown.clone(),
                ));
            }
            let tunnel = hub.connector(
                credential,
                Peer {
                    id,
                    kind: KIND.as_str().into(),
                },
            );
            let connector = Connector::new(tunnel)?;
            let (tx, mut sessions) = mpsc::channel(1);
            tasks.spawn(connector.run(tx, shutdown.clone()));
            let slots = hub::Slots {
                plan: record.clone(),
                task: task.clone(),
            };
            // One reader for the agent's life: CPU usage is measured between readings.
            let sampler = config.machine.clone().or_else(agentkit::Sampler::new);
            tasks.spawn(async move {
                while let Some(session) = sessions.recv().await {
                    let id = session.hello.session_id.clone();
                    tracing::info!(session = %id, "connected to the hub");
                    channel.send_replace(Some((id.clone(), session.channel.clone())));
                    let (slots, channel) = (slots.clone(), channel.clone());
                    let sampler = sampler.clone();
                    tokio::spawn(async move {
                        hub::serve(session, slots, sampler).await;
                        // Gone: transfers wait for the next session (unless one came already).
                        channel.send_if_modified(|current| {
                            let this = current.as_ref().is_some_and(|(s, _)| *s == id);
                            if this {
                                *current = None;
                            }
                            this
                        });
                    });
                }
            });
            kept = Some(record);
            kept_task = Some(task);
        }
        Ok(Agent {
            record: kept,
            task: kept_task,
            session,
            tasks,
        })
    }

    /// Whether a session to the hub is up now.
    pub fn connected(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.borrow().is_some())
    }

    /// Waits until the agent has stopped (after `shutdown`).
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Runs the agent until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    Agent::start(config, shutdown).await?.wait().await;
    Ok(())
}

/// Now, RFC 3339 in UTC.
pub(crate) fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
