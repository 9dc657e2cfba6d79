//! How an agent reaches its hub and proves itself there: the connection settings every agent
//! reads, the one exchange of a registration token (`drr_…`) for a credential of the agent's
//! own (`POST /v3/register`), and the registration kept in the agent's state directory, in
//! one format for every agent: `registration.json` (identity, credential, cluster), owner-only,
//! written whole or not at all.
//!
//! Before this format the cluster-agent and the node-agent kept the bare credential in a file
//! named `credential`; [`load_or_migrate`] reads such a file once, keeps it in the new format and removes
//! it, so an upgraded agent keeps its identity instead of registering again.

use std::{
    collections::HashMap,
    io::Write as _,
    net::IpAddr,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use proto::register::{AgentKind, RegisterReply, RegisterRequest};
use serde::{Deserialize, Serialize};
use tunnel::{Connector, ConnectorConfig, Peer, ProxySettings, Secret, tls::Trust};

/// The file a registration is kept in, in the agent's state directory.
pub const REGISTRATION_FILE: &str = "registration.json";

/// The file the cluster-agent and node-agent kept their bare credential in before.
const LEGACY_CREDENTIAL_FILE: &str = "credential";

/// Where the hub is, what the agent proves itself with, and where it keeps its state.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// The hub, `https://HOST[:PORT]`, or its replicas' URLs separated by commas.
    pub server: String,
    /// A registration token (`drr_…`, exchanged at first start) or the agent's credential.
    pub token: Secret,
    /// sha256 of the hub's CA (as the hub prints it); empty to trust the system's roots.
    pub ca_checksum: String,
    /// Where the registration is kept between restarts.
    pub state_dir: PathBuf,
    /// The local address to reach the hub from (`None`: the system's choice); a fleet
    /// simulator spreads its agents over 127.0.0.0/8 with it.
    pub local_address: Option<IpAddr>,
    /// The HTTP proxy to the hub (`HTTPS_PROXY`, `NO_PROXY`), if any.
    pub proxy: ProxySettings,
}

impl HubSettings {
    /// `DROVER_SERVER` and `DROVER_TOKEN` (required; `hint` says where they come from),
    /// `DROVER_CA_CHECKSUM` (default: the system's roots), `DROVER_STATE_DIR` (default
    /// `default_state_dir`), `HTTPS_PROXY` and `NO_PROXY` (see [`ProxySettings::from_env`]).
    pub fn from_env(
        env: &HashMap<String, String>,
        default_state_dir: &str,
        hint: &str,
    ) -> Result<Self, String> {
        let need = |name: &str| {
            env.get(name)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| format!("{name} is required ({hint})"))
        };
        Ok(Self {
            server: need("DROVER_SERVER")?,
            token: Secret::new(need("DROVER_TOKEN")?),
            ca_checksum: env.get("DROVER_CA_CHECKSUM").cloned().unwrap_or_default(),
            state_dir: env
                .get("DROVER_STATE_DIR")
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default_state_dir), PathBuf::from),
            local_address: None,
            proxy: ProxySettings::from_env(|name| env.get(name).cloned())?,
        })
    }

    /// The hub's CA, as the agent pins it.
    pub fn trust(&self) -> Trust {
        Trust::from_checksum(&self.ca_checksum)
    }

    /// The tunnel to the hub as `identity`, proving itself with `credential`.
    pub fn connector(&self, credential: Secret, identity: Peer) -> ConnectorConfig {
        let mut config = ConnectorConfig::new(&self.server, credential, identity, self.trust());
        config.local_address = self.local_address;
        config.proxy = self.proxy.clone();
        config
    }

    /// Whether the token is a registration token, to be exchanged, rather than a credential.
    pub fn is_registration_token(&self) -> bool {
        self.token.expose().starts_with("drr_")
    }
}

/// What a registration left: the identity the hub gave the agent and the credential that
/// proves it.
#[derive(Debug, Clone)]
pub struct Registration {
    pub id: String,
    pub credential: Secret,
    pub cluster: String,
}

/// `registration.json` as it is on disk.
#[derive(Serialize, Deserialize)]
struct Kept {
    id: String,
    credential: String,
    #[serde(default)]
    cluster: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("registering with the hub failed: {0}")]
    Refused(String),
    #[error("cannot keep the registration in {0}: {1}")]
    State(String, std::io::Error),
    #[error(transparent)]
    Connect(#[from] tunnel::ConnectError),
}

/// `POST /v3/register` with the settings' registration token, as `identity`; the agent's
/// identity and credential come back.
pub async fn register(
    hub: &HubSettings,
    identity: Peer,
    request: &RegisterRequest,
) -> Result<Registration, RegisterError> {
    let connector = Connector::new(hub.connector(hub.token.clone(), identity))?;
    let body = serde_json::to_string(request)
        .map_err(|e| RegisterError::Refused(format!("the request cannot be written: {e}")))?;
    let (status, body) = connector.post_json("/v3/register", body).await?;
    if !status.is_success() {
        let reply: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let message = reply["message"].as_str().unwrap_or("no reason given");
        return Err(RegisterError::Refused(format!("HTTP {status}: {message}")));
    }
    let reply: RegisterReply = serde_json::from_slice(&body).map_err(|e| {
        RegisterError::Refused(format!(
            "the hub answered without an identity and credential: {e}"
        ))
    })?;
    if reply.credential.is_empty() || reply.id.is_empty() {
        return Err(RegisterError::Refused(
            "the hub answered without an identity and credential".into(),
        ));
    }
    Ok(Registration {
        id: reply.id,
        credential: Secret::new(reply.credential),
        cluster: reply.cluster,
    })
}

/// The registration kept in `dir`, if any.
pub fn load(dir: &Path) -> Result<Option<Registration>, RegisterError> {
    let path = dir.join(REGISTRATION_FILE);
    let state = |e| RegisterError::State(path.display().to_string(), e);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(state(e)),
    };
    let kept: Kept = serde_json::from_slice(&bytes)
        .map_err(|e| state(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    Ok(Some(Registration {
        id: kept.id,
        credential: Secret::new(kept.credential),
        cluster: kept.cluster,
    })
    .filter(|r| !r.credential.expose().is_empty()))
}

/// As [`load`]; without a registration, a bare credential kept by an older cluster-agent or
/// node-agent (which registered as `legacy_id` in `cluster`) is kept anew in the current format
/// and its file removed.
pub fn load_or_migrate(
    dir: &Path,
    legacy_id: &str,
    cluster: &str,
) -> Result<Option<Registration>, RegisterError> {
    if let Some(kept) = load(dir)? {
        return Ok(Some(kept));
    }
    let legacy = dir.join(LEGACY_CREDENTIAL_FILE);
    let state = |e| RegisterError::State(legacy.display().to_string(), e);
    let value = match std::fs::read_to_string(&legacy) {
        Ok(value) if !value.trim().is_empty() => value.trim().to_owned(),
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(state(e)),
    };
    let registration = Registration {
        id: legacy_id.to_owned(),
        credential: Secret::new(value),
        cluster: cluster.to_owned(),
    };
    keep(dir, &registration)?;
    std::fs::remove_file(&legacy).map_err(state)?;
    tracing::info!(dir = %dir.display(), "kept the credential of an earlier version in {REGISTRATION_FILE}");
    Ok(Some(registration))
}

/// Keeps `registration` in `dir` (created if missing), readable by its owner only, whole or
/// not at all.
pub fn keep(dir: &Path, registration: &Registration) -> Result<(), RegisterError> {
    let state = |e| RegisterError::State(dir.display().to_string(), e);
    std::fs::create_dir_all(dir).map_err(state)?;
    let kept = Kept {
        id: registration.id.clone(),
        credential: registration.credential.expose().to_owned(),
        cluster: registration.cluster.clone(),
    };
    let text = serde_json::to_vec(&kept)
        .map_err(|e| state(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    write_secret(&dir.join(REGISTRATION_FILE), &text).map_err(state)
}

/// Writes a secret readable by its owner only, whole or not at all.
pub fn write_secret(path: &Path, value: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(value)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The registration kept in the settings' state directory, else one made now with the
/// registration token and kept; a token that is not a registration token is used as the
/// credential itself. For the node-agent; the cluster-agent also keeps its credential in its
/// cluster, and the system-agent's request says more.
pub async fn ensure(
    hub: &HubSettings,
    kind: AgentKind,
    id: &str,
    cluster: &str,
) -> Result<Registration, RegisterError> {
    if let Some(kept) = load_or_migrate(&hub.state_dir, id, cluster)? {
        return Ok(kept);
    }
    if !hub.is_registration_token() {
        return Ok(Registration {
            id: id.to_owned(),
            credential: hub.token.clone(),
            cluster: cluster.to_owned(),
        });
    }
    let identity = Peer {
        id: id.to_owned(),
        kind: kind.as_str().into(),
    };
    let registration = register(hub, identity, &RegisterRequest::of(kind))
        .await?
        .of_cluster(cluster)?;
    keep(&hub.state_dir, &registration)?;
    Ok(registration)
}

impl Registration {
    /// This registration, if it is `cluster`'s: a registration token of another cluster is
    /// refused (and nothing kept), rather than an agent that says it serves one cluster while
    /// the hub knows it as another's.
    pub fn of_cluster(self, cluster: &str) -> Result<Self, RegisterError> {
        if self.cluster.is_empty() || self.cluster == cluster {
            return Ok(self);
        }
        Err(RegisterError::Refused(format!(
            "the registration token belongs to cluster {:?}, not DROVER_CLUSTER={cluster:?}: set DROVER_CLUSTER={:?}, or use the token of {cluster:?}'s import command",
            self.cluster, self.cluster
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("agentkit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_registration_of_another_cluster_is_refused_naming_both() {
        let of = |cluster: &str| Registration {
            id: "cluster/prod".into(),
            credential: Secret::new("drc_x"),
            cluster: cluster.into(),
        };
        assert!(of("prod").of_cluster("prod").is_ok());
        // An older hub that does not say which cluster: taken as asked.
        assert!(of("").of_cluster("prod").is_ok());
        let err = of("staging").of_cluster("prod").unwrap_err().to_string();
        assert!(
            err.contains("belongs to cluster \"staging\", not DROVER_CLUSTER=\"prod\""),
            "{err}"
        );
    }

    #[test]
    fn a_kept_registration_reads_back_and_only_its_owner_can_read_it() {
        let dir = temp_dir("keep");
        assert!(load(&dir).unwrap().is_none());
        let registration = Registration {
            id: "host/h1".into(),
            credential: Secret::new("drt_secret"),
            cluster: "c".into(),
        };
        keep(&dir, &registration).unwrap();
        let path = dir.join(REGISTRATION_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let kept = load(&dir).unwrap().unwrap();
        assert_eq!(
            (
                kept.id.as_str(),
                kept.credential.expose(),
                kept.cluster.as_str()
            ),
            ("host/h1", "drt_secret", "c")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_older_agents_bare_credential_is_kept_in_the_new_format() {
        let dir = temp_dir("legacy");
        std::fs::write(dir.join("credential"), "drt_old\n").unwrap();
        let kept = load_or_migrate(&dir, "cluster/prod", "prod")
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                kept.id.as_str(),
                kept.credential.expose(),
                kept.cluster.as_str()
            ),
            ("cluster/prod", "drt_old", "prod")
        );
        assert!(!dir.join("credential").exists(), "the old file is removed");
        let text = std::fs::read_to_string(dir.join(REGISTRATION_FILE)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["credential"], "drt_old");
        // And it reads back as any registration does.
        assert_eq!(load(&dir).unwrap().unwrap().id, "cluster/prod");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_system_agents_registration_of_before_reads_as_it_is() {
        // The system-agent kept exactly this before the format was shared.
        let dir = temp_dir("system");
        std::fs::write(
            dir.join(REGISTRATION_FILE),
            r#"{"id":"host/abc","credential":"drt_x","cluster":"edge"}"#,
        )
        .unwrap();
        let kept = load(&dir).unwrap().unwrap();
        assert_eq!(
            (kept.id.as_str(), kept.cluster.as_str()),
            ("host/abc", "edge")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn settings_come_from_the_environment_with_a_clear_error() {
        let env: HashMap<String, String> = [("DROVER_SERVER", "https://hub:8443")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let err = HubSettings::from_env(&env, "/var/lib/x", "the manifest sets it").unwrap_err();
        assert_eq!(err, "DROVER_TOKEN is required (the manifest sets it)");
        let mut env = env;
        env.insert("DROVER_TOKEN".into(), "drr_abc".into());
        let settings = HubSettings::from_env(&env, "/var/lib/x", "").unwrap();
        assert_eq!(settings.state_dir, PathBuf::from("/var/lib/x"));
        assert!(settings.is_registration_token());
    }
}
