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

/// `drover-cluster-agent --help`: what it does and how it is configured.
pub const HELP: &str = "\
Drover's cluster-agent: runs in the cluster (a Deployment from the import manifest), holds the
hub's tunnel, forwards the hub's Kubernetes API requests, keeps watch-driven caches and keeps
the cluster's RBAC in step with the hub's role bindings.

Configured from the environment (the import manifest's Secret sets the first four):
  DROVER_SERVER         the hub's URL, https://HOST[:PORT] (replicas: comma-separated)
  DROVER_TOKEN          the registration token, exchanged for a credential at first start
  DROVER_CA_CHECKSUM    sha256 of the hub's CA, as `drover-hub serve` prints it
  DROVER_CLUSTER        the cluster's name on the hub
  DROVER_POD_NAME       this replica's name in the leader election (default: the host name)
  DROVER_NAMESPACE      the lease's and credential Secret's namespace (default: the pod's)
  DROVER_LEASE_SECONDS  leader lease, 2 to 3600 (default 15)
  DROVER_DRIFT_SECONDS  how often delivered bundles are checked for drift and readiness,
                        1 to 3600 (default 30)
  DROVER_STATE_DIR      where the credential is kept (default /var/lib/drover in a pod,
                        $HOME/.local/state/drover/cluster-agent outside one)
  KUBECONFIG            outside a pod: a kubeconfig with a token for the cluster
";

use std::collections::HashMap;

use agentkit::{HubSettings, Registration, kube_api};
use proto::register::{AgentKind, RegisterRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::{AllowList, Connector, Peer, Secret, Services};

pub mod access;
pub mod api_auth;
pub mod bundles;
pub mod cache;
mod facts;
pub mod lease;

pub use agentkit::KubeTarget;

/// The agent kind this crate is.
pub const KIND: AgentKind = AgentKind::ClusterAgent;

/// Everything the agent needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The hub, and where the registration is kept between restarts.
    pub hub: HubSettings,
    /// The cluster's name on the hub.
    pub cluster: String,
    /// This replica's name (the pod's), unique among the agent's copies.
    pub name: String,
    pub kube: KubeTarget,
    /// The Lease the replicas elect their leader with.
    pub lease: lease::LeaseConfig,
    /// How often delivered bundles are read back for drift and readiness.
    pub drift: std::time::Duration,
}

/// A setting that is missing or unusable; names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The whole number of seconds `name` sets, within `range`, or `default`.
fn seconds(
    env: &HashMap<String, String>,
    name: &str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, ConfigError> {
    let Some(v) = env.get(name) else {
        return Ok(default);
    };
    v.parse::<u64>()
        .ok()
        .filter(|s| range.contains(s))
        .ok_or_else(|| {
            ConfigError(format!(
                "{name}={v:?}: give a whole number of seconds from {} to {}",
                range.start(),
                range.end()
            ))
        })
}

/// The API server: the pod's service account, else `KUBECONFIG`; and whether in a pod.
fn kube_target(env: &HashMap<String, String>) -> Result<(KubeTarget, bool), ConfigError> {
    if let Some(target) = KubeTarget::in_cluster(env).map_err(|e| ConfigError(e.to_string()))? {
        return Ok((target, true));
    }
    let path = env
        .get("KUBECONFIG")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ConfigError(
                "outside a pod, set KUBECONFIG to a kubeconfig with a token for the cluster".into(),
            )
        })?;
    let target = KubeTarget::from_kubeconfig(std::path::Path::new(path))
        .map_err(|e| ConfigError(e.to_string()))?;
    Ok((target, false))
}

/// Where the credential is kept unless `DROVER_STATE_DIR` says: in a pod, where the image
/// expects it; run by hand, under the user's own state directory (not a system path the user
/// may not write).
fn default_state_dir(in_pod: bool, env: &HashMap<String, String>) -> String {
    let set = |name: &str| env.get(name).filter(|v| !v.is_empty());
    match (in_pod, set("XDG_STATE_HOME"), set("HOME")) {
        (true, _, _) => "/var/lib/drover".to_owned(),
        (false, Some(state), _) => format!("{state}/drover/cluster-agent"),
        (false, None, Some(home)) => format!("{home}/.local/state/drover/cluster-agent"),
        (false, None, None) => "drover-cluster-agent".to_owned(),
    }
}

impl Config {
    /// Reads `DROVER_SERVER`, `DROVER_TOKEN`, `DROVER_CA_CHECKSUM`, `DROVER_CLUSTER`,
    /// `DROVER_POD_NAME` (default: the host name), `DROVER_STATE_DIR` (default
    /// `/var/lib/drover` in a pod, else `$XDG_STATE_HOME/drover/cluster-agent` or
    /// `$HOME/.local/state/drover/cluster-agent`), `DROVER_NAMESPACE` (the lease's and the credential Secret's;
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
        let (kube, in_pod) = kube_target(env)?;
        let state_dir = default_state_dir(in_pod, env);
        let name = env
            .get("DROVER_POD_NAME")
            .or_else(|| env.get("HOSTNAME"))
            .cloned()
            .unwrap_or_else(|| "cluster-agent".into());
        let lease_seconds = seconds(env, "DROVER_LEASE_SECONDS", 15, 2..=3600)?;
        let drift_seconds = seconds(env, "DROVER_DRIFT_SECONDS", 30, 1..=3600)?;
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
            hub: HubSettings::from_env(env, &state_dir, "the import manifest's Secret provides it")
                .map_err(ConfigError)?,
            cluster: need("DROVER_CLUSTER")?,
            name,
            kube,
            drift: std::time::Duration::from_secs(drift_seconds),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Register(#[from] agentkit::RegisterError),
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
    let id = format!("cluster/{}", config.cluster);
    if let Some(kept) = agentkit::hub::load_or_migrate(&config.hub.state_dir, &id, &config.cluster)?
    {
        return Ok(kept.credential);
    }
    if !config.hub.is_registration_token() {
        return Ok(config.hub.token.clone());
    }
    let secrets = ::kube::Api::<KubeSecret>::namespaced(client.clone(), &config.lease.namespace);
    let value = match kept_in_cluster(&secrets).await? {
        Some(value) => value,
        None => {
            let identity = Peer {
                id: id.clone(),
                kind: KIND.as_str().into(),
            };
            let registered =
                agentkit::hub::register(&config.hub, identity, &RegisterRequest::of(KIND))
                    .await?
                    .of_cluster(&config.cluster)?;
            tracing::info!(cluster = %registered.cluster, id = %registered.id, "registered with the hub");
            keep_in_cluster(&secrets, registered.credential.expose().to_owned()).await?
        }
    };
    let registration = Registration {
        id,
        credential: Secret::new(value),
        cluster: config.cluster.clone(),
    };
    agentkit::hub::keep(&config.hub.state_dir, &registration)?;
    Ok(registration.credential)
}

/// A `kube` client for the agent's API server, with its credential and CA.
pub(crate) fn kube_client(target: &KubeTarget) -> Result<::kube::Client, String> {
    kube_client_as(target, None)
}

/// As [`kube_client`], acting as `user` (impersonated) if given.
pub(crate) fn kube_client_as(
    target: &KubeTarget,
    user: Option<&str>,
) -> Result<::kube::Client, String> {
    let url = target
        .server
        .parse()
        .map_err(|_| format!("server {:?} is not a URL", target.server))?;
    let mut config = ::kube::Config::new(url);
    config.root_cert = Some(target.ca.clone());
    let mut bearer = http::HeaderValue::from_str(&format!("Bearer {}", target.token.expose()))
        .map_err(|_| "the API server token cannot be sent as a header".to_owned())?;
    // Keeps it out of Debug output.
    bearer.set_sensitive(true);
    config.headers.push((http::header::AUTHORIZATION, bearer));
    if let Some(user) = user {
        let value = http::HeaderValue::from_str(user)
            .map_err(|_| format!("{user:?} cannot be sent as a header"))?;
        config
            .headers
            .push((http::HeaderName::from_static("impersonate-user"), value));
    }
    ::kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Runs the agent until `shutdown`: stands by until this replica holds the lease, then serves
/// the hub (tunnel, caches, facts) for as long as it keeps the lease.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), AgentError> {
    let client = kube_client(&config.kube).map_err(AgentError::Kube)?;
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
        kind: KIND.as_str().into(),
    };
    let mut tunnel = config.hub.connector(credential.clone(), identity);
    tunnel.allow = AllowList::new([config.kube.address()])
        .map_err(|e| AgentError::Kube(format!("{}: {e}", config.kube.address())))?;
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
    // Delivery likewise, from the latest bundles the hub sent.
    let (bundles, wanted) = tokio::sync::watch::channel(None);
    let bundles = std::sync::Arc::new(bundles);
    tokio::spawn(bundles::sync(
        client.clone(),
        config.kube.clone(),
        config.lease.namespace.clone(),
        wanted,
        config.drift,
        leading.clone(),
    ));
    let (tx, mut sessions) = mpsc::channel(1);
    let runner = tokio::spawn(connector.run(tx, leading));
    while let Some(session) = sessions.recv().await {
        tracing::info!(session = %session.hello.session_id, cluster = %config.cluster, "serving the hub");
        // Beats speak for the agent only: the cluster's machines are the node-agents' to report.
        tokio::spawn({
            let session = session.clone();
            async move { agentkit::beat(&session, None).await }
        });
        tokio::spawn(access::follow(session.clone(), access.clone()));
        tokio::spawn(bundles::follow(session.clone(), bundles.clone()));
        tokio::spawn(facts::report(
            session,
            client.clone(),
            caches.clone(),
            config.kube.ca_pem.clone(),
        ));
    }
    let _ = runner.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_kept_in_the_pod_or_under_the_users_own_state_directory() {
        let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let home = env(&[("HOME", "/home/ann")]);
        assert_eq!(default_state_dir(true, &home), "/var/lib/drover");
        assert_eq!(
            default_state_dir(false, &home),
            "/home/ann/.local/state/drover/cluster-agent"
        );
        let xdg = env(&[("HOME", "/home/ann"), ("XDG_STATE_HOME", "/srv/state")]);
        assert_eq!(
            default_state_dir(false, &xdg),
            "/srv/state/drover/cluster-agent"
        );
        assert_eq!(default_state_dir(false, &env(&[])), "drover-cluster-agent");
    }
}
