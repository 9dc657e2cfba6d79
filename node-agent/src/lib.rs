//! Drover's node-agent (a DaemonSet on the host network, one per node).
//!
//! It registers once with the cluster's registration token (the credential it gets back is
//! kept in its state directory, a host path, so a restarted pod keeps it), holds a tunnel
//! session as `node/<cluster>/<node>`, and beats with its node's facts and usage. Its session
//! also serves `kube-api`, as the cluster-agent's does: when the cluster-agent has no tunnel,
//! the hub sends proxied requests this way instead. The only address the hub may dial through
//! it is the cluster's API server.

/// `drover-node-agent --help`: what it does and how it is configured.
pub const HELP: &str = "\
Drover's node-agent: runs on every node (a DaemonSet from the import manifest), reports the
node's health to the hub and is the hub's fallback route into the cluster.

Configured from the environment (the import manifest's Secret and DaemonSet set them):
  DROVER_SERVER       the hub's URL, https://HOST[:PORT] (replicas: comma-separated)
  DROVER_TOKEN        the registration token, exchanged for a credential at first start
  DROVER_CA_CHECKSUM  sha256 of the hub's CA, as `drover-hub serve` prints it
  DROVER_CLUSTER      the cluster's name on the hub
  DROVER_NODE_NAME    this node's name (the DaemonSet sets it from spec.nodeName)
  DROVER_STATE_DIR    where the credential is kept (default /var/lib/drover/node-agent)
  KUBECONFIG          outside a pod: a kubeconfig with a token for the cluster
";

use std::collections::HashMap;

use agentkit::{HubSettings, KubeTarget, kube_api};
use proto::register::AgentKind;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{AllowList, Connector, Peer, Services};

/// The agent kind this crate is.
pub const KIND: AgentKind = AgentKind::NodeAgent;

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hub, and where the registration is kept between restarts.
    pub hub: HubSettings,
    /// The cluster's name on the hub.
    pub cluster: String,
    /// The node this copy runs on.
    pub node: String,
    pub kube: KubeTarget,
    /// What reads the node's facts and usage; `None`: this machine, as the agent finds it (a
    /// simulator gives its stand-in nodes loads of their own).
    pub machine: Option<agentkit::Sampler>,
}

/// A setting that is missing or unusable; names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Reads `DROVER_SERVER`, `DROVER_TOKEN`, `DROVER_CA_CHECKSUM`, `DROVER_CLUSTER`,
    /// `DROVER_NODE_NAME` (the DaemonSet sets it from `spec.nodeName`), `DROVER_STATE_DIR`
    /// (default `/var/lib/drover/node-agent`), and the API server from the pod's service
    /// account or `KUBECONFIG`.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let need = |name: &str, hint: &str| {
            env.get(name)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| ConfigError(format!("{name} is required ({hint})")))
        };
        let node = need(
            "DROVER_NODE_NAME",
            "the node's name; the DaemonSet sets it from spec.nodeName",
        )?;
        if node.contains('/') {
            return Err(ConfigError(format!(
                "DROVER_NODE_NAME={node:?}: a node name has no '/'"
            )));
        }
        let kube = match KubeTarget::in_cluster(env).map_err(|e| ConfigError(e.to_string()))? {
            Some(target) => target,
            None => {
                let path = need(
                    "KUBECONFIG",
                    "outside a pod, a kubeconfig with a token for the cluster",
                )?;
                KubeTarget::from_kubeconfig(std::path::Path::new(&path))
                    .map_err(|e| ConfigError(e.to_string()))?
            }
        };
        let hub = HubSettings::from_env(
            env,
            "/var/lib/drover/node-agent",
            "the import manifest's Secret provides it",
        )
        .map_err(ConfigError)?;
        Ok(Self {
            cluster: need("DROVER_CLUSTER", "the import manifest's Secret provides it")?,
            hub,
            node,
            kube,
            machine: None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Register(#[from] agentkit::RegisterError),
    #[error("the API server's address {0}: {1}")]
    Kube(String, String),
    #[error(transparent)]
    Connect(#[from] tunnel::ConnectError),
}

/// Runs the agent until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    let registration = agentkit::hub::ensure(
        &config.hub,
        KIND,
        &format!("node/{}", config.cluster),
        &config.cluster,
    )
    .await?;
    let identity = Peer {
        id: format!("node/{}/{}", config.cluster, config.node),
        kind: KIND.as_str().into(),
    };
    let mut tunnel = config.hub.connector(registration.credential, identity);
    tunnel.allow = AllowList::new([config.kube.address()])
        .map_err(|e| AgentError::Kube(config.kube.address(), e.to_string()))?;
    let upstream = kube_api::Upstream::new(config.kube.clone());
    tunnel.services = Services::default().add(proto::KUBE_API_SERVICE, move |stream| {
        kube_api::serve(stream, upstream.clone())
    });
    let connector = Connector::new(tunnel)?;
    let (tx, mut sessions) = mpsc::channel(1);
    let runner = tokio::spawn(connector.run(tx, shutdown));
    // One sampler for the process: CPU usage is measured between samples.
    let sampler = config.machine.clone().or_else(agentkit::Sampler::new);
    while let Some(session) = sessions.recv().await {
        tracing::info!(session = %session.hello.session_id, cluster = %config.cluster, node = %config.node, "connected to the hub");
        agentkit::beat(&session, sampler.as_ref()).await;
    }
    let _ = runner.await;
    Ok(())
}
