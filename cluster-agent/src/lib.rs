//! Drover's cluster-agent (a Deployment in each downstream cluster).
//!
//! It registers with the hub once (exchanging the registration token from the import
//! manifest for a credential of its own, kept in its state directory), then holds a tunnel
//! session whose `kube-api` service forwards the hub's proxied requests to the cluster's API
//! server with the agent's own credential. The only address the hub may dial through it is
//! that API server.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{AllowList, Connector, ConnectorConfig, Peer, Secret, Services, tls::Trust};

mod facts;
pub mod kube;
mod kube_api;

pub use kube::KubeTarget;

/// The agent kind this crate is.
pub const KIND: &str = "cluster-agent";

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hub, `https://HOST[:PORT]`.
    pub server: String,
    /// A registration token (`drr_…`, exchanged at first start) or the agent's credential.
    pub token: Secret,
    /// sha256 of the hub's CA (as printed by the hub); empty to trust the system's roots.
    pub ca_checksum: String,
    /// The cluster's name on the hub.
    pub cluster: String,
    /// This replica's name (the pod's), unique among the agent's copies.
    pub name: String,
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
    /// `DROVER_POD_NAME` (default: the host name), `DROVER_STATE_DIR` (default
    /// `/var/lib/drover`), and the API server from the pod's service account or `KUBECONFIG`.
    pub fn from_env(env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let need = |name: &str| {
            env.get(name)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| {
                    ConfigError(format!(
                        "{name} is required (the import manifest's Secret provides it)"
                    ))
                })
        };
        let kube = match KubeTarget::in_cluster(env).map_err(|e| ConfigError(e.to_string()))? {
            Some(target) => target,
            None => {
                let path = need("KUBECONFIG").map_err(|_| {
                    ConfigError("outside a pod, set KUBECONFIG to a kubeconfig with a token for the cluster".into())
                })?;
                KubeTarget::from_kubeconfig(std::path::Path::new(&path))
                    .map_err(|e| ConfigError(e.to_string()))?
            }
        };
        Ok(Self {
            server: need("DROVER_SERVER")?,
            token: Secret::new(need("DROVER_TOKEN")?),
            ca_checksum: env.get("DROVER_CA_CHECKSUM").cloned().unwrap_or_default(),
            cluster: need("DROVER_CLUSTER")?,
            name: env
                .get("DROVER_POD_NAME")
                .or_else(|| env.get("HOSTNAME"))
                .cloned()
                .unwrap_or_else(|| "cluster-agent".into()),
            kube,
            state_dir: env
                .get("DROVER_STATE_DIR")
                .map_or_else(|| PathBuf::from("/var/lib/drover"), PathBuf::from),
        })
    }

    fn trust(&self) -> Trust {
        if self.ca_checksum.is_empty() {
            Trust::SystemRoots
        } else {
            Trust::CaChecksum(self.ca_checksum.clone())
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("registering with the hub failed: {0}")]
    Register(String),
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
        id: format!("cluster/{}", config.cluster),
        kind: KIND.into(),
    };
    let connector = Connector::new(ConnectorConfig::new(
        &config.server,
        config.token.clone(),
        identity,
        config.trust(),
    ))?;
    let body = serde_json::json!({"kind": KIND}).to_string();
    let request = http::Request::post("/v3/register")
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", config.token.expose()),
        )
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| AgentError::Register(e.to_string()))?;
    let response = connector.request(request).await?;
    let reply: serde_json::Value = serde_json::from_slice(response.body()).unwrap_or_default();
    if !response.status().is_success() {
        let message = reply["message"]
            .as_str()
            .unwrap_or("no reason given")
            .to_owned();
        return Err(AgentError::Register(format!(
            "HTTP {}: {message}",
            response.status()
        )));
    }
    let value = reply["credential"].as_str().unwrap_or_default().to_owned();
    std::fs::create_dir_all(&config.state_dir)
        .map_err(|e| AgentError::State(config.state_dir.display().to_string(), e))?;
    write_secret(&path, &value).map_err(|e| AgentError::State(path.display().to_string(), e))?;
    tracing::info!(cluster = %config.cluster, "registered with the hub; credential kept");
    Ok(Secret::new(value))
}

fn write_secret(path: &std::path::Path, value: &str) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(value.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Runs the agent until `shutdown`.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    let credential = credential(&config).await?;
    let identity = Peer {
        id: format!("cluster/{}/{}", config.cluster, config.name),
        kind: KIND.into(),
    };
    let mut tunnel = ConnectorConfig::new(&config.server, credential, identity, config.trust());
    tunnel.allow =
        AllowList::new([config.kube.address()]).map_err(|e| AgentError::Register(e.to_string()))?;
    let target = Arc::new(config.kube.clone());
    let for_service = target.clone();
    tunnel.services = Services::default().add(proto::KUBE_API_SERVICE, move |stream| {
        kube_api::serve(stream, for_service.clone())
    });
    let connector = Connector::new(tunnel)?;
    let (tx, mut sessions) = mpsc::channel(1);
    let runner = tokio::spawn(connector.run(tx, shutdown.clone()));
    while let Some(session) = sessions.recv().await {
        tracing::info!(session = %session.hello.session_id, cluster = %config.cluster, "serving the hub");
        tokio::spawn(facts::report(session, target.clone()));
    }
    let _ = runner.await;
    Ok(())
}
