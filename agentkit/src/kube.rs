//! The agent's way to its cluster's API server: its address, the CA that signs it, and the
//! agent's own credential, from the in-cluster service account or from a kubeconfig.

use std::{collections::HashMap, path::Path, sync::Arc};

use base64::Engine as _;
use serde::Deserialize;
use tunnel::Secret;

/// Where the API server is and how to talk to it.
#[derive(Debug, Clone)]
pub struct KubeTarget {
    /// `https://HOST:PORT`.
    pub server: String,
    pub host: String,
    pub port: u16,
    pub tls: Arc<rustls::ClientConfig>,
    /// The CA certificates (DER) the API server is verified against, for the cluster-agent's
    /// `kube` client.
    pub ca: Vec<Vec<u8>>,
    /// The same CA as given (PEM): the cluster-agent reports it to the hub, for kubeconfigs
    /// that reach the API server directly (the authorized endpoint).
    pub ca_pem: String,
    pub token: Secret,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeConfigError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error("kubeconfig {0}: {1}")]
    Invalid(String, String),
}

impl KubeTarget {
    /// The in-cluster service account, when running in a pod.
    pub fn in_cluster(env: &HashMap<String, String>) -> Result<Option<Self>, KubeConfigError> {
        let (Some(host), Some(port)) = (
            env.get("KUBERNETES_SERVICE_HOST"),
            env.get("KUBERNETES_SERVICE_PORT"),
        ) else {
            return Ok(None);
        };
        let dir = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| KubeConfigError::Read(path.display().to_string(), e))
        };
        let token = String::from_utf8_lossy(&read("token")?).trim().to_owned();
        let server = if host.contains(':') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        };
        Self::new(&server, &read("ca.crt")?, token, "in-cluster").map(Some)
    }

    /// The current context of a kubeconfig file (token authentication only).
    pub fn from_kubeconfig(path: &Path) -> Result<Self, KubeConfigError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| KubeConfigError::Read(name.clone(), e))?;
        Self::from_kubeconfig_text(&text, &name)
    }

    pub fn from_kubeconfig_text(text: &str, name: &str) -> Result<Self, KubeConfigError> {
        let invalid = |m: &str| KubeConfigError::Invalid(name.to_owned(), m.to_owned());
        let config: KubeConfig =
            serde_saphyr::from_str(text).map_err(|e| invalid(&e.to_string()))?;
        let context = config
            .contexts
            .iter()
            .find(|c| Some(&c.name) == config.current_context.as_ref())
            .or(config.contexts.first())
            .ok_or_else(|| invalid("no context"))?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.context.cluster)
            .ok_or_else(|| invalid("the current context's cluster is missing"))?;
        let user = config
            .users
            .iter()
            .find(|u| u.name == context.context.user)
            .ok_or_else(|| invalid("the current context's user is missing"))?;
        let ca = cluster
            .cluster
            .certificate_authority_data
            .as_deref()
            .ok_or_else(|| invalid("certificate-authority-data is required"))?;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(ca.trim())
            .map_err(|e| invalid(&format!("certificate-authority-data: {e}")))?;
        let token = user
            .user
            .token
            .clone()
            .ok_or_else(|| invalid("only token users are supported"))?;
        Self::new(&cluster.cluster.server, &ca, token, name)
    }

    fn new(
        server: &str,
        ca_pem: &[u8],
        token: String,
        name: &str,
    ) -> Result<Self, KubeConfigError> {
        let invalid = |m: String| KubeConfigError::Invalid(name.to_owned(), m);
        let uri: http::Uri = server
            .parse()
            .map_err(|_| invalid(format!("server {server:?} is not a URL")))?;
        let host = uri
            .host()
            .ok_or_else(|| invalid(format!("server {server:?} has no host")))?;
        let roots = tunnel::tls::roots_from_pem(ca_pem).map_err(|e| invalid(e.to_string()))?;
        let ca = tunnel::tls::certs_from_pem(ca_pem)
            .map_err(|e| invalid(e.to_string()))?
            .into_iter()
            .map(|c| c.to_vec())
            .collect();
        let mut tls = (*tunnel::tls::client_config(roots)).clone();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            server: server.trim_end_matches('/').to_owned(),
            host: host.trim_matches(['[', ']']).to_owned(),
            port: uri.port_u16().unwrap_or(443),
            tls: Arc::new(tls),
            ca,
            ca_pem: String::from_utf8_lossy(ca_pem).into_owned(),
            token: Secret::new(token),
        })
    }

    /// `HOST:PORT`, the one address the agent lets the hub dial.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeConfig {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<NamedUser>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    current_context: Option<String>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    cluster: T,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    user: UserEntry,
}

#[derive(Deserialize)]
struct UserEntry {
    token: Option<String>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: ContextEntry,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    user: String,
}
