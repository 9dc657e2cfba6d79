//! Drover's node-agent (a DaemonSet on the host network, one per node).
//!
//! It registers once with the cluster's registration token (the credential it gets back is
//! kept in its state directory, a host path, so a restarted pod keeps it), holds a tunnel
//! session as `node/<cluster>/<node>`, and beats with its node's facts and usage. Its session
//! also serves `kube-api`, as the cluster-agent's does: when the cluster-agent has no tunnel,
//! the hub sends proxied requests this way instead. The only address the hub may dial through
//! it is the cluster's API server.

use std::{collections::HashMap, path::PathBuf};

use cluster_agent::{KubeTarget, kube_api};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{AllowList, Connector, ConnectorConfig, Peer, Secret, Services, tls::Trust};

/// The agent kind this crate is.
pub const KIND: &str = "node-agent";

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hub, `https://HOST[:PORT]`.
    pub server: String,
    /// A registration token (`drr_…`, exchanged at first start) or the agent's credential.
    pub token: Secret,
    /// sha256 of the hub's CA; empty to trust the system's roots.
    pub ca_checksum: String,
    /// The cluster's name on the hub.
    pub cluster: String,
    /// The node this copy runs on.
    pub node: String,
    pub kube: KubeTarget,
    /// Where the credential is kept between restarts.
    pub state_dir: PathBuf,
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
        let manifest = "the import manifest's Secret provides it";
        Ok(Self {
            server: need("DROVER_SERVER", manifest)?,
            token: Secret::new(need("DROVER_TOKEN", manifest)?),
            ca_checksum: env.get("DROVER_CA_CHECKSUM").cloned().unwrap_or_default(),
            cluster: need("DROVER_CLUSTER", manifest)?,
            node,
            kube,
            state_dir: env.get("DROVER_STATE_DIR").map_or_else(
                || PathBuf::from("/var/lib/drover/node-agent"),
                PathBuf::from,
            ),
        })
    }

    fn trust(&self) -> Trust {
        Trust::from_checksum(&self.ca_checksum)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Hub(#[from] cluster_agent::AgentError),
    #[error("cannot keep the credential in {0}: {1}")]
    State(String, std::io::Error),
    #[error(transparent)]
    Connect(#[from] tunnel::ConnectError),
}

/// The credential: kept from an earlier registration, exchanged now, or given as is.
async fn credential(config: &Config) -> Result<Secret, AgentError> {
    let path = config.state_dir.join("credential");
    if let Ok(saved) = std::fs::read_to_string(&path)
        && !saved.trim().is_empty()
    {
        return Ok(Secret::new(saved.trim()));
    }
    if !config.token.expose().starts_with("drr_") {
        return Ok(config.token.clone());
    }
    let identity = Peer {
        id: format!("node/{}", config.cluster),
        kind: KIND.into(),
    };
    let value =
        cluster_agent::exchange(&config.server, &config.token, config.trust(), identity).await?;
    tracing::info!(cluster = %config.cluster, node = %config.node, "registered with the hub");
    std::fs::create_dir_all(&config.state_dir)
        .map_err(|e| AgentError::State(config.state_dir.display().to_string(), e))?;
    cluster_agent::write_secret(&path, &value)
        .map_err(|e| AgentError::State(path.display().to_string(), e))?;
    Ok(Secret::new(value))
}

/// Runs the agent until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    let credential = credential(&config).await?;
    let identity = Peer {
        id: format!("node/{}/{}", config.cluster, config.node),
        kind: KIND.into(),
    };
    let mut tunnel = ConnectorConfig::new(&config.server, credential, identity, config.trust());
    tunnel.allow = AllowList::new([config.kube.address()])
        .map_err(|e| AgentError::Hub(cluster_agent::AgentError::Register(e.to_string())))?;
    let upstream = kube_api::Upstream::new(config.kube.clone());
    tunnel.services = Services::default().add(proto::KUBE_API_SERVICE, move |stream| {
        kube_api::serve(stream, upstream.clone())
    });
    let connector = Connector::new(tunnel)?;
    let (tx, mut sessions) = mpsc::channel(1);
    let runner = tokio::spawn(connector.run(tx, shutdown));
    // One sampler for the process: CPU usage is measured between samples.
    let sampler = hostinfo::Sampler::new();
    while let Some(session) = sessions.recv().await {
        tracing::info!(session = %session.hello.session_id, cluster = %config.cluster, node = %config.node, "connected to the hub");
        hostinfo::beat(&session, sampler.as_ref()).await;
    }
    let _ = runner.await;
    Ok(())
}
