//! What `drover-hub serve` runs with: the data directory, the listener, the store, the limits.
//! Built by the argument parser (`args`), or by hand where the hub library is embedded (the
//! demo, the benchmarks).

use std::{net::SocketAddr, path::PathBuf};

/// Everything `drover-hub serve` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where the hub keeps its state (certificates now; the store with the next release).
    pub data_dir: PathBuf,
    /// Address the HTTPS listener binds; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The URL agents and users reach the hub at; its host goes into the serving certificate.
    /// `None`: `https://HOST_NAME:PORT` with the port actually bound.
    pub server_url: Option<String>,
    /// This machine's name, for the default server URL.
    pub host_name: String,
    /// A serving certificate chain (PEM) and its key to use instead of one from the hub's CA.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Where the agent binaries the install script downloads are (`drover-system-agent`, for
    /// this machine's architecture, and `drover-system-agent-<arch>` for others). `None`: the
    /// directory the hub's own executable is in.
    pub agent_binaries: Option<PathBuf>,
    /// How often agents send heartbeats; after 3 missed the hub shows the agent disconnected.
    pub heartbeat: std::time::Duration,
    /// Where the objects live.
    pub store: StoreLocation,
    /// TLS handshakes in flight at most (0: no limit); more wait their turn, so a fleet
    /// reconnecting at once is served in order instead of timing out together.
    pub max_handshakes: usize,
    /// Connections one address may hold that have sent nothing for a second (0: no limit).
    pub max_silent_per_address: usize,
    /// Watches and streams (exec, attach, port-forward, logs that follow) one user may have
    /// open at once, through the API and the proxy together (0: no limit); past it, 429.
    pub max_streams_per_user: usize,
    /// The URL other hub replicas reach this one at (etcd store only). `None`:
    /// `https://ADDRESS:PORT` with the listen address (this machine's name if that is 0.0.0.0).
    pub replica_url: Option<String>,
    /// The audit log's file, size and rotation.
    pub audit: crate::audit::AuditConfig,
}

/// Where the hub's objects live (`--store`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreLocation {
    /// The embedded SQLite file in the data directory.
    #[default]
    Sqlite,
    /// An etcd cluster, `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]`, which several hubs can share.
    Etcd(String),
}

/// TLS handshakes in flight at most, by default: enough to keep two cores busy with them.
pub const DEFAULT_MAX_HANDSHAKES: usize = 128;

/// Open watches and streams per user, by default: far more than a dashboard and a few
/// kubectl sessions need, far fewer than exhaust the hub.
pub const DEFAULT_MAX_STREAMS_PER_USER: usize = 256;

/// Heartbeats every 10 s, as Rancher's agents; a silent agent shows within half a minute.
pub const DEFAULT_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

impl Config {
    /// The URL peers reach this replica at, given the address the listener actually bound.
    pub fn replica_url_for(&self, addr: SocketAddr) -> String {
        if let Some(url) = &self.replica_url {
            return url.clone();
        }
        let host = if addr.ip().is_unspecified() {
            self.host_name.clone()
        } else if addr.is_ipv6() {
            format!("[{}]", addr.ip())
        } else {
            addr.ip().to_string()
        };
        format!("https://{host}:{}", addr.port())
    }

    /// The server URL, given the port the listener actually bound.
    pub fn server_url_for(&self, port: u16) -> String {
        self.server_url
            .clone()
            .unwrap_or_else(|| format!("https://{}:{port}", self.host_name))
    }
}

/// The host part of a server URL (no brackets for IPv6).
pub fn url_host(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(
        uri.host()?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )
}
