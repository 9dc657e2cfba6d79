//! Drover's cluster-agent (a Deployment in each downstream cluster).
//!
//! It registers with the hub once (exchanging the registration token from the import
//! manifest for a credential of its own, kept in its state directory), then holds a tunnel
//! session whose `kube-api` service forwards the hub's proxied requests to the cluster's API
//! server with the agent's own credential. The only address the hub may dial through it is
//! that API server.
//!
//! Its replicas elect a leader with a `coordination.k8s.io` Lease; only the leader holds a
//! session, so the hub always has one way into the cluster, and a standby takes over when
//! the leader's lease runs out. The leader also keeps watch-driven caches of nodes,
//! namespaces, pods, deployments, services and events, served to the hub as the
//! `cluster-cache` service.

use std::{collections::HashMap, path::PathBuf};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{AllowList, Connector, ConnectorConfig, Peer, Secret, Services, tls::Trust};

pub mod access;
pub mod cache;
mod facts;
pub mod kube;
pub mod kube_api;
pub mod lease;

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
    /// The Lease the replicas elect their leader with.
    pub lease: lease::LeaseConfig,
    /// The local address to reach the hub from (`None`: the system's choice); a fleet
    /// simulator spreads its agents over 127.0.0.0/8 with it.
    pub local_address: Option<std::net::IpAddr>,
}

/// A setting that is missing or unusable; names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Reads `DROVER_SERVER`, `DROVER_TOKEN`, `DROVER_CA_CHECKSUM`, `DROVER_CLUSTER`,
    /// `DROVER_POD_NAME` (default: the host name), `DROVER_STATE_DIR` (default
    /// `/var/lib/drover`), `DROVER_NAMESPACE` (the lease's and the credential Secret's;
    /// default: the pod's, else `drover-system`), `DROVER_LEASE_SECONDS` (default 15), and the
    /// API server from the pod's service account or `KUBECONFIG`.
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
        let name = env
            .get("DROVER_POD_NAME")
            .or_else(|| env.get("HOSTNAME"))
            .cloned()
            .unwrap_or_else(|| "cluster-agent".into());
        let lease_seconds = match env.get("DROVER_LEASE_SECONDS") {
            None => 15,
            Some(v) => v
                .parse::<u64>()
                .ok()
                .filter(|s| (2..=3600).contains(s))
                .ok_or_else(|| {
                    ConfigError(format!(
                        "DROVER_LEASE_SECONDS={v:?}: give a whole number of seconds from 2 to 3600"
                    ))
                })?,
        };
        let namespace = env
            .get("DROVER_NAMESPACE")
            .cloned()
            .or_else(|| {
                std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                    .ok()
                    .filter(|_| env.contains_key("KUBERNETES_SERVICE_HOST"))
                    .map(|ns| ns.trim().to_owned())
            })
            .unwrap_or_else(|| "drover-system".into());
        Ok(Self {
            lease: lease::LeaseConfig {
                namespace,
                name: "drover-cluster-agent".into(),
                identity: name.clone(),
                duration: std::time::Duration::from_secs(lease_seconds),
            },
            server: need("DROVER_SERVER")?,
            token: Secret::new(need("DROVER_TOKEN")?),
            ca_checksum: env.get("DROVER_CA_CHECKSUM").cloned().unwrap_or_default(),
            cluster: need("DROVER_CLUSTER")?,
            name,
            kube,
            state_dir: env
                .get("DROVER_STATE_DIR")
                .map_or_else(|| PathBuf::from("/var/lib/drover"), PathBuf::from),
            local_address: None,
        })
    }

    fn trust(&self) -> Trust {
        Trust::from_checksum(&self.ca_checksum)
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
    #[error("cannot use the cluster's API server: {0}")]
    Kube(String),
}

/// The Secret, in the lease's namespace, that the replicas keep the agent's credential in: a
/// restarted pod has lost its state directory, and its registration token may have expired or
/// been revoked since; without this the cluster would be cut off from the hub.
pub const CREDENTIAL_SECRET: &str = "drover-agent-credential";

type KubeSecret = k8s_openapi::api::core::v1::Secret;

/// The credential kept in the cluster, if any.
async fn kept_in_cluster(secrets: &::kube::Api<KubeSecret>) -> Result<Option<String>, AgentError> {
    let kept = secrets
        .get_opt(CREDENTIAL_SECRET)
        .await
        .map_err(|e| AgentError::Kube(format!("reading Secret {CREDENTIAL_SECRET}: {e}")))?;
    Ok(kept
        .and_then(|s| s.data?.remove("credential"))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .filter(|v| !v.is_empty()))
}

/// Keeps `value` in the cluster; if another replica kept one first, that one is used.
async fn keep_in_cluster(
    secrets: &::kube::Api<KubeSecret>,
    value: String,
) -> Result<String, AgentError> {
    let secret = KubeSecret {
        metadata: ::kube::api::ObjectMeta {
            name: Some(CREDENTIAL_SECRET.into()),
            labels: Some([("drover.io/managed".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        data: Some(
            [(
                "credential".to_owned(),
                k8s_openapi::ByteString(value.clone().into_bytes()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    match secrets
        .create(&::kube::api::PostParams::default(), &secret)
        .await
    {
        Ok(_) => Ok(value),
        Err(::kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!("another replica registered first; using its credential");
            kept_in_cluster(secrets)
                .await?
                .ok_or_else(|| AgentError::Kube(format!("Secret {CREDENTIAL_SECRET} is empty")))
        }
        Err(e) => Err(AgentError::Kube(format!(
            "keeping the credential in Secret {CREDENTIAL_SECRET}: {e}"
        ))),
    }
}

/// The credential: kept from an earlier registration (in the state directory, else in the
/// cluster), exchanged now, or given as is.
async fn credential(config: &Config, client: &::kube::Client) -> Result<Secret, AgentError> {
    let path = config.state_dir.join("credential");
    if let Ok(saved) = std::fs::read_to_string(&path)
        && !saved.trim().is_empty()
    {
        return Ok(Secret::new(saved.trim()));
    }
    if !config.token.expose().starts_with("drr_") {
        return Ok(config.token.clone());
    }
    let secrets = ::kube::Api::<KubeSecret>::namespaced(client.clone(), &config.lease.namespace);
    let value = match kept_in_cluster(&secrets).await? {
        Some(value) => value,
        None => keep_in_cluster(&secrets, register(config).await?).await?,
    };
    std::fs::create_dir_all(&config.state_dir)
        .map_err(|e| AgentError::State(config.state_dir.display().to_string(), e))?;
    write_secret(&path, &value).map_err(|e| AgentError::State(path.display().to_string(), e))?;
    Ok(Secret::new(value))
}

/// Exchanges the registration token for a credential of the agent's own.
async fn register(config: &Config) -> Result<String, AgentError> {
    let identity = Peer {
        id: format!("cluster/{}", config.cluster),
        kind: KIND.into(),
    };
    let value = exchange(&config.server, &config.token, config.trust(), identity).await?;
    tracing::info!(cluster = %config.cluster, "registered with the hub");
    Ok(value)
}

/// `POST /v3/register` with a registration token, as an agent of `identity`'s kind; the
/// agent's own credential comes back.
pub async fn exchange(
    server: &str,
    token: &Secret,
    trust: Trust,
    identity: Peer,
) -> Result<String, AgentError> {
    let kind = identity.kind.clone();
    let connector = Connector::new(ConnectorConfig::new(server, token.clone(), identity, trust))?;
    let (status, body) = connector
        .post_json(
            "/v3/register",
            serde_json::json!({"kind": kind}).to_string(),
        )
        .await?;
    let reply: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if !status.is_success() {
        let message = reply["message"].as_str().unwrap_or("no reason given");
        return Err(AgentError::Register(format!("HTTP {status}: {message}")));
    }
    let value = reply["credential"].as_str().unwrap_or_default().to_owned();
    if value.is_empty() {
        return Err(AgentError::Register(
            "the hub answered without a credential".into(),
        ));
    }
    Ok(value)
}

/// Writes a secret readable by its owner only, whole or not at all.
pub fn write_secret(path: &std::path::Path, value: &str) -> std::io::Result<()> {
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

/// Runs the agent until `shutdown`: stands by until this replica holds the lease, then serves
/// the hub (tunnel, caches, facts) for as long as it keeps the lease.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    let client = config.kube.client().map_err(AgentError::Kube)?;
    let credential = credential(&config, &client).await?;
    let mut elector = lease::Elector::new(client.clone(), config.lease.clone());
    loop {
        if !elector.acquire(&shutdown).await {
            return Ok(());
        }
        tracing::info!(lease = %config.lease.name, identity = %config.lease.identity, "leading: serving the hub");
        let leading = shutdown.child_token();
        let served = {
            let keep = elector.keep(leading.clone());
            let serve = serve(&config, &credential, &client, leading.clone());
            tokio::pin!(serve);
            tokio::select! {
                () = keep => {
                    // Lost the lease: stop serving at once.
                    leading.cancel();
                    serve.await
                }
                result = &mut serve => {
                    leading.cancel();
                    result
                }
            }
        };
        if shutdown.is_cancelled() {
            elector.release().await;
            return served;
        }
        served?;
        tracing::warn!("no longer leading; standing by");
    }
}

/// Serves the hub until `leading` is cancelled.
async fn serve(
    config: &Config,
    credential: &Secret,
    client: &::kube::Client,
    leading: CancellationToken,
) -> Result<(), AgentError> {
    let identity = Peer {
        id: format!("cluster/{}/{}", config.cluster, config.name),
        kind: KIND.into(),
    };
    let mut tunnel =
        ConnectorConfig::new(&config.server, credential.clone(), identity, config.trust());
    tunnel.local_address = config.local_address;
    tunnel.allow =
        AllowList::new([config.kube.address()]).map_err(|e| AgentError::Register(e.to_string()))?;
    let caches = cache::Caches::start(client, &leading);
    let upstream = kube_api::Upstream::new(config.kube.clone());
    tunnel.services = Services::default()
        .add(proto::KUBE_API_SERVICE, move |stream| {
            kube_api::serve(stream, upstream.clone())
        })
        .add(proto::CLUSTER_CACHE_SERVICE, {
            let caches = caches.clone();
            move |stream| cache::serve(stream, caches.clone())
        });
    let connector = Connector::new(tunnel)?;
    // RBAC sync runs while leading, from the latest access the hub sent over any session.
    let (access, desired) = tokio::sync::watch::channel(None);
    let access = std::sync::Arc::new(access);
    tokio::spawn(access::sync(
        client.clone(),
        config.lease.namespace.clone(),
        desired,
        leading.clone(),
    ));
    let (tx, mut sessions) = mpsc::channel(1);
    let runner = tokio::spawn(connector.run(tx, leading));
    while let Some(session) = sessions.recv().await {
        tracing::info!(session = %session.hello.session_id, cluster = %config.cluster, "serving the hub");
        // Beats speak for the agent only: the cluster's machines are the node-agents' to report.
        tokio::spawn({
            let session = session.clone();
            async move { hostinfo::beat(&session, None).await }
        });
        tokio::spawn(access::follow(session.clone(), access.clone()));
        tokio::spawn(facts::report(session, client.clone(), caches.clone()));
    }
    let _ = runner.await;
    Ok(())
}
