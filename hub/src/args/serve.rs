//! `drover-hub serve`'s flags and environment, checked into the hub's [`Config`].

use std::{collections::HashMap, net::SocketAddr, path::PathBuf};

use clap::Args;

use super::{ConfigError, DEFAULT_DATA_DIR, check_server_url};
use crate::config::{
    Config, DEFAULT_HEARTBEAT, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_STREAMS_PER_USER, StoreLocation,
};

const DEFAULT_LISTEN: &str = "0.0.0.0:8443";

#[derive(Args, Debug)]
pub(super) struct ServeArgs {
    /// Directory for the hub's state [env: DROVER_DATA_DIR] [default: ./drover-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on [env: DROVER_LISTEN] [default: 0.0.0.0:8443]
    #[arg(long)]
    listen: Option<String>,
    /// URL agents reach the hub at [env: DROVER_SERVER_URL] [default: https://HOSTNAME:PORT]
    #[arg(long)]
    server_url: Option<String>,
    /// Serving certificate chain, PEM, leaf first; its last certificate is served at /cacerts
    /// for agents to pin [env: DROVER_TLS_CERT] [default: issued by the hub's own CA]
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// The serving certificate's private key, PEM [env: DROVER_TLS_KEY]
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Directory of the agent binaries hosts download [env: DROVER_AGENT_BINARIES]
    /// [default: the directory of this executable]
    #[arg(long)]
    agent_binaries: Option<PathBuf>,
    /// Seconds between agents' heartbeats, 1 to 300; 3 missed mark an agent disconnected
    /// [env: DROVER_HEARTBEAT_SECONDS] [default: 10]
    #[arg(long)]
    heartbeat_seconds: Option<String>,
    /// Where the hub's objects live: `sqlite` (a file in the data directory) or
    /// `etcd://HOST:2379[,HOST:2379…][/PREFIX]` [env: DROVER_STORE] [default: sqlite]
    #[arg(long)]
    store: Option<String>,
    /// TLS handshakes in flight at most; more wait their turn (0: no limit)
    /// [env: DROVER_MAX_HANDSHAKES] [default: 128]
    #[arg(long)]
    max_handshakes: Option<String>,
    /// Connections one address may hold that have sent nothing for a second; more are closed
    /// (0: no limit) [env: DROVER_MAX_SILENT_PER_ADDRESS] [default: 64]
    #[arg(long)]
    max_silent_per_address: Option<String>,
    /// Watches and streams one user may have open at once; more get 429 (0: no limit)
    /// [env: DROVER_MAX_STREAMS_PER_USER] [default: 256]
    #[arg(long)]
    max_streams_per_user: Option<String>,
    /// With the etcd store: the URL other hub replicas reach this one at
    /// [env: DROVER_REPLICA_URL] [default: https://LISTEN_ADDRESS:PORT]
    #[arg(long)]
    replica_url: Option<String>,
    /// The audit log's file, or `off` [env: DROVER_AUDIT_LOG]
    /// [default: DATA_DIR/audit/audit.log]
    #[arg(long)]
    audit_log: Option<String>,
    /// The audit log's size, in MiB, at which it is rotated [env: DROVER_AUDIT_LOG_MAX_SIZE]
    /// [default: 100]
    #[arg(long)]
    audit_log_max_size: Option<String>,
    /// Rotated audit log files kept [env: DROVER_AUDIT_LOG_KEEP] [default: 5]
    #[arg(long)]
    audit_log_keep: Option<String>,
    /// How much of a request the audit log keeps: `metadata` (who, what, where, the code) or
    /// `request` (also a write's JSON body, secrets redacted) [env: DROVER_AUDIT_LEVEL]
    /// [default: metadata]
    #[arg(long)]
    audit_level: Option<String>,
}

pub(super) fn config(
    args: ServeArgs,
    env: &HashMap<String, String>,
) -> Result<Config, ConfigError> {
    let pick = |flag: Option<String>, var: &str, default: &str| {
        flag.or_else(|| env.get(var).filter(|v| !v.is_empty()).cloned())
            .unwrap_or_else(|| default.to_owned())
    };
    let data_dir = args
        .data_dir
        .or_else(|| {
            env.get("DROVER_DATA_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    let listen_text = pick(args.listen, "DROVER_LISTEN", DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.parse().map_err(|_| ConfigError::Invalid {
        flag: "--listen",
        var: "DROVER_LISTEN",
        value: listen_text.clone(),
        reason: "expected IP:PORT, e.g. 0.0.0.0:8443 or [::]:8443".into(),
    })?;
    let server_url = args
        .server_url
        .or_else(|| {
            env.get("DROVER_SERVER_URL")
                .filter(|v| !v.is_empty())
                .cloned()
        })
        .map(|url| check_server_url(&url))
        .transpose()?;
    let path = |flag: Option<PathBuf>, var: &str| {
        flag.or_else(|| env.get(var).filter(|v| !v.is_empty()).map(PathBuf::from))
    };
    let tls = match (
        path(args.tls_cert, "DROVER_TLS_CERT"),
        path(args.tls_key, "DROVER_TLS_KEY"),
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (cert, _) => {
            let (flag, var) = if cert.is_some() {
                ("--tls-key", "DROVER_TLS_KEY")
            } else {
                ("--tls-cert", "DROVER_TLS_CERT")
            };
            return Err(ConfigError::Invalid {
                flag,
                var,
                value: String::new(),
                reason: "--tls-cert and --tls-key go together".into(),
            });
        }
    };
    let heartbeat = match args.heartbeat_seconds.or_else(|| {
        env.get("DROVER_HEARTBEAT_SECONDS")
            .filter(|v| !v.is_empty())
            .cloned()
    }) {
        None => DEFAULT_HEARTBEAT,
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=300).contains(s))
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| ConfigError::Invalid {
                flag: "--heartbeat-seconds",
                var: "DROVER_HEARTBEAT_SECONDS",
                value: text,
                reason: "give a whole number of seconds from 1 to 300".into(),
            })?,
    };
    let store = store_location(args.store, env)?;
    let count = |given: Option<String>, flag: &'static str, var: &'static str, default| match given
        .or_else(|| env.get(var).filter(|v| !v.is_empty()).cloned())
    {
        None => Ok(default),
        Some(text) => text.parse::<usize>().map_err(|_| ConfigError::Invalid {
            flag,
            var,
            value: text,
            reason: "give a whole number (0 for no limit)".into(),
        }),
    };
    let max_handshakes = count(
        args.max_handshakes,
        "--max-handshakes",
        "DROVER_MAX_HANDSHAKES",
        DEFAULT_MAX_HANDSHAKES,
    )?;
    let max_silent_per_address = count(
        args.max_silent_per_address,
        "--max-silent-per-address",
        "DROVER_MAX_SILENT_PER_ADDRESS",
        tunnel::listener::DEFAULT_SILENT_PER_ADDRESS,
    )?;
    let max_streams_per_user = count(
        args.max_streams_per_user,
        "--max-streams-per-user",
        "DROVER_MAX_STREAMS_PER_USER",
        DEFAULT_MAX_STREAMS_PER_USER,
    )?;
    let mut audit = crate::audit::AuditConfig::in_data_dir(&data_dir);
    match args
        .audit_log
        .or_else(|| {
            env.get("DROVER_AUDIT_LOG")
                .filter(|v| !v.is_empty())
                .cloned()
        })
        .as_deref()
    {
        Some("off") => audit.path = None,
        Some(file) => audit.path = Some(PathBuf::from(file)),
        None => {}
    }
    let max_mib = count(
        args.audit_log_max_size,
        "--audit-log-max-size",
        "DROVER_AUDIT_LOG_MAX_SIZE",
        100,
    )?;
    if max_mib == 0 {
        return Err(ConfigError::Invalid {
            flag: "--audit-log-max-size",
            var: "DROVER_AUDIT_LOG_MAX_SIZE",
            value: "0".into(),
            reason: "give the size in MiB at which the log is rotated (1 or more)".into(),
        });
    }
    audit.max_bytes = max_mib as u64 * 1024 * 1024;
    audit.keep = count(
        args.audit_log_keep,
        "--audit-log-keep",
        "DROVER_AUDIT_LOG_KEEP",
        5,
    )?;
    audit.level = match pick(args.audit_level, "DROVER_AUDIT_LEVEL", "metadata").as_str() {
        "metadata" => crate::audit::Level::Metadata,
        "request" => crate::audit::Level::Request,
        other => {
            return Err(ConfigError::Invalid {
                flag: "--audit-level",
                var: "DROVER_AUDIT_LEVEL",
                value: other.to_owned(),
                reason: "give metadata or request".into(),
            });
        }
    };
    Ok(Config {
        audit,
        data_dir,
        listen,
        server_url,
        host_name: host_name(env),
        tls,
        agent_binaries: path(args.agent_binaries, "DROVER_AGENT_BINARIES"),
        heartbeat,
        store,
        max_handshakes,
        max_silent_per_address,
        max_streams_per_user,
        replica_url: args
            .replica_url
            .or_else(|| {
                env.get("DROVER_REPLICA_URL")
                    .filter(|v| !v.is_empty())
                    .cloned()
            })
            .map(|url| check_url("--replica-url", "DROVER_REPLICA_URL", &url))
            .transpose()?,
    })
}

/// An `https://HOST[:PORT]` URL, given by `flag` or `var`.
pub(super) fn check_url(
    flag: &'static str,
    var: &'static str,
    url: &str,
) -> Result<String, ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid {
        flag,
        var,
        value: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|_| invalid("expected https://HOST[:PORT]"))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid("the hub only serves HTTPS; use https://"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if !matches!(uri.path(), "" | "/") {
        return Err(invalid("a path is not supported; give https://HOST[:PORT]"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// This machine's name, as the default host of the server URL.
fn host_name(env: &HashMap<String, String>) -> String {
    env.get("HOSTNAME")
        .filter(|h| !h.is_empty())
        .cloned()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `--store` or `DROVER_STORE`: `sqlite` (the default) or an etcd URL.
pub(super) fn store_location(
    flag: Option<String>,
    env: &HashMap<String, String>,
) -> Result<StoreLocation, ConfigError> {
    let text = flag
        .or_else(|| env.get("DROVER_STORE").filter(|v| !v.is_empty()).cloned())
        .unwrap_or_else(|| "sqlite".to_owned());
    if text == "sqlite" {
        return Ok(StoreLocation::Sqlite);
    }
    crate::store::etcd::EtcdUrl::parse(&text).map_err(|reason| ConfigError::Invalid {
        flag: "--store",
        var: "DROVER_STORE",
        value: text.clone(),
        reason: format!("{reason}; or use sqlite, the default"),
    })?;
    Ok(StoreLocation::Etcd(text))
}
