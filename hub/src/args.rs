//! `drover-hub`'s command line: flags first, then `DROVER_*` environment variables, then
//! defaults. Parsed by one function that takes the arguments and the environment as values, so
//! tests feed it a map and never touch the process environment.

use std::{collections::HashMap, net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::config::{
    Config, DEFAULT_HEARTBEAT, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_STREAMS_PER_USER, StoreLocation,
};

/// What `drover-hub` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Serve(Config),
    /// Give the `admin` user a new password (printed once).
    ResetAdminPassword {
        data_dir: PathBuf,
    },
    /// Write a consistent backup (store and CA) to `out`; works while the hub runs.
    Backup {
        data_dir: PathBuf,
        out: PathBuf,
    },
    /// Replace the state in `data_dir` with the backup `from`; the hub must be stopped.
    Restore {
        data_dir: PathBuf,
        from: PathBuf,
    },
    /// Talk to a running hub's API.
    Client {
        request: crate::cli::Request,
        config: PathBuf,
        output: crate::cli::Output,
        /// Read the login password from the first line of stdin.
        password_stdin: bool,
    },
}

/// A value that cannot be used; the message names the flag and variable to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not a valid command line; clap's error prints itself (help and version included).
    #[error("{0}")]
    Usage(#[from] clap::Error),
    #[error("invalid {flag} (or {var}) {value:?}: {reason}")]
    Invalid {
        flag: &'static str,
        var: &'static str,
        value: String,
        reason: String,
    },
}

#[derive(Parser, Debug)]
#[command(
    name = "drover-hub",
    version,
    about = "The Drover hub: agents dial out to it; operators and tools talk to it"
)]
struct Cli {
    #[command(subcommand)]
    command: CliCommand,
}

#[derive(Subcommand, Debug)]
enum CliCommand {
    /// Run the hub (HTTPS: the API, the agents' tunnel endpoint and the hub's CA).
    Serve(ServeArgs),
    /// Set a new random password for the `admin` user and print it (works while the hub runs).
    ResetAdminPassword(DataDirArgs),
    /// Write a backup of the hub's store and CA to one file (works while the hub runs).
    Backup(BackupArgs),
    /// Replace the hub's state with a backup (stop the hub first; the old state is kept aside).
    Restore(RestoreArgs),
    /// Log in to a hub and keep the token for the other commands.
    Login(LoginArgs),
    /// Create, list, show or delete clusters.
    Cluster(ClusterArgs),
    /// Print a kubeconfig that reaches CLUSTER through the hub.
    Kubeconfig(KubeconfigArgs),
    /// Create, list or revoke your API tokens.
    Token(TokenArgs),
    /// Projects: namespaces of a cluster under one set of members (and secrets).
    Project(ProjectArgs),
}

#[derive(Args, Debug)]
struct ClientOpts {
    /// Where the login is kept [env: DROVER_CONFIG] [default: ~/.config/drover/cli.json]
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Output format
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: crate::cli::Output,
}

#[derive(Args, Debug)]
struct LoginArgs {
    /// The hub, e.g. https://hub.example.com:8443 [env: DROVER_SERVER_URL]
    #[arg(long)]
    server: Option<String>,
    #[arg(long, default_value = "admin")]
    username: String,
    /// Read the password from stdin's first line (else from DROVER_PASSWORD)
    #[arg(long)]
    password_stdin: bool,
    /// Refuse to log in unless the hub's CA has this sha256 (as printed by `drover-hub serve`)
    #[arg(long)]
    ca_checksum: Option<String>,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Create a cluster and print the command that registers it
    Create {
        name: String,
        /// imported (an existing cluster) or custom (installed by the hub on hosts)
        #[arg(long = "type", default_value = "imported")]
        cluster_type: String,
        /// For custom clusters: k3s or rke2
        #[arg(long)]
        distribution: Option<String>,
        /// For custom clusters: e.g. v1.33.4+k3s1
        #[arg(long = "kubernetes-version")]
        version: Option<String>,
    },
    /// List the clusters you may see
    List,
    /// Show one cluster
    Get { name: String },
    /// Delete a cluster: its hosts run their uninstall plan, its agents' credentials are
    /// revoked, and what Drover created in an imported cluster is removed; waits until done
    Delete { name: String },
    /// Take an etcd snapshot of a custom cluster now (waits until it is saved)
    Snapshot {
        cluster: String,
        /// The snapshot's name [default: CLUSTER-YYYYMMDDHHMMSS]
        #[arg(long)]
        name: Option<String>,
        /// Keep a copy in the hub's data directory too, for restoring after losing the host
        #[arg(long)]
        copy_to_hub: bool,
    },
    /// List a cluster's etcd snapshots
    Snapshots { cluster: String },
    /// Delete an etcd snapshot (its file on the host too)
    DeleteSnapshot { name: String },
    /// Restore a custom cluster's etcd from one of its snapshots
    Restore {
        cluster: String,
        #[arg(long)]
        snapshot: String,
    },
    /// Rotate a custom cluster's certificates, host by host
    RotateCertificates { cluster: String },
}

#[derive(Args, Debug)]
struct KubeconfigArgs {
    cluster: String,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create an API token (shown once)
    Create {
        #[arg(long, default_value = "API token")]
        description: String,
        /// RFC 3339 time it stops working, e.g. 2027-01-01T00:00:00Z
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// List your tokens
    List,
    /// Revoke a token by name
    Revoke { name: String },
}

#[derive(Args, Debug)]
struct ProjectArgs {
    #[command(subcommand)]
    command: ProjectCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum ProjectCommand {
    /// Create a project in a cluster; its namespaces are those labelled drover.io/project=NAME
    Create {
        name: String,
        #[arg(long)]
        cluster: String,
        #[arg(long, default_value = "")]
        display_name: String,
    },
    /// List the projects you may see
    List,
    /// Delete a project (its namespaces stay; its bindings and secrets stop applying)
    Delete { name: String },
    /// Give a user (or a group) a role on a project: project-owner, project-member or read-only
    AddMember {
        project: String,
        /// The project's cluster
        #[arg(long)]
        cluster: String,
        #[arg(long, conflicts_with = "group", required_unless_present = "group")]
        user: Option<String>,
        #[arg(long)]
        group: Option<String>,
        #[arg(long, default_value = "project-member")]
        role: String,
    },
    /// Take a user's (or a group's) role on a project away
    RemoveMember {
        project: String,
        #[arg(long, conflicts_with = "group", required_unless_present = "group")]
        user: Option<String>,
        #[arg(long)]
        group: Option<String>,
    },
}

#[derive(Args, Debug)]
struct BackupArgs {
    /// The file to write; must not exist. It holds the CA's private key: keep it as secret.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    dir: DataDirArgs,
}

#[derive(Args, Debug)]
struct RestoreArgs {
    /// A file written by `drover-hub backup`
    #[arg(long)]
    from: PathBuf,
    #[command(flatten)]
    dir: DataDirArgs,
}

#[derive(Args, Debug)]
struct DataDirArgs {
    /// Directory for the hub's state [env: DROVER_DATA_DIR] [default: ./drover-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ServeArgs {
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
}

const DEFAULT_DATA_DIR: &str = "./drover-data";
const DEFAULT_LISTEN: &str = "0.0.0.0:8443";

/// Parses `args` (the program name first) with `env` as the environment.
pub fn parse<I, S>(args: I, env: &HashMap<String, String>) -> Result<Command, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    match cli.command {
        CliCommand::Serve(args) => serve_config(args, env).map(Command::Serve),
        CliCommand::ResetAdminPassword(args) => Ok(Command::ResetAdminPassword {
            data_dir: data_dir(args.data_dir, env),
        }),
        CliCommand::Backup(args) => Ok(Command::Backup {
            data_dir: data_dir(args.dir.data_dir, env),
            out: args.out,
        }),
        CliCommand::Restore(args) => Ok(Command::Restore {
            data_dir: data_dir(args.dir.data_dir, env),
            from: args.from,
        }),
        CliCommand::Login(args) => {
            use crate::cli::Request;
            let server = args
                .server
                .or_else(|| env.get("DROVER_SERVER_URL").cloned())
                .ok_or_else(|| ConfigError::Invalid {
                    flag: "--server",
                    var: "DROVER_SERVER_URL",
                    value: String::new(),
                    reason: "say which hub to log in to, e.g. https://hub.example.com:8443".into(),
                })?;
            let server = check_server_url(&server).map_err(|_| ConfigError::Invalid {
                flag: "--server",
                var: "DROVER_SERVER_URL",
                value: server.clone(),
                reason: "expected https://HOST[:PORT]".into(),
            })?;
            let password = env.get("DROVER_PASSWORD").cloned().unwrap_or_default();
            if password.is_empty() && !args.password_stdin {
                return Err(ConfigError::Invalid {
                    flag: "--password-stdin",
                    var: "DROVER_PASSWORD",
                    value: String::new(),
                    reason:
                        "give the password on stdin with --password-stdin, or in DROVER_PASSWORD"
                            .into(),
                });
            }
            Ok(Command::Client {
                request: Request::Login {
                    server,
                    username: args.username,
                    password: tunnel::Secret::new(password),
                    ca_checksum: args.ca_checksum,
                },
                config: crate::cli::config_path(args.opts.config, env),
                output: args.opts.output,
                password_stdin: args.password_stdin,
            })
        }
        CliCommand::Cluster(args) => {
            use crate::cli::Request;
            let request = match args.command {
                ClusterCommand::Create {
                    name,
                    cluster_type,
                    distribution,
                    version,
                } => {
                    let mut spec = serde_json::json!({"type": cluster_type});
                    if let Some(d) = distribution {
                        spec["distribution"] = d.into();
                    }
                    if let Some(v) = version {
                        spec["version"] = v.into();
                    }
                    Request::ClusterCreate { name, spec }
                }
                ClusterCommand::List => Request::ClusterList,
                ClusterCommand::Get { name } => Request::ClusterGet { name },
                ClusterCommand::Delete { name } => Request::ClusterDelete { name },
                ClusterCommand::Snapshot {
                    cluster,
                    name,
                    copy_to_hub,
                } => {
                    let name = name.unwrap_or_else(|| {
                        let stamp = time::OffsetDateTime::now_utc()
                            .format(time::macros::format_description!(
                                "[year][month][day][hour][minute][second]"
                            ))
                            .unwrap_or_default();
                        let prefix: String = cluster.chars().take(48).collect();
                        format!("{}-{stamp}", prefix.trim_end_matches('-'))
                    });
                    Request::SnapshotCreate {
                        cluster,
                        name,
                        copy_to_hub,
                    }
                }
                ClusterCommand::Snapshots { cluster } => Request::SnapshotList { cluster },
                ClusterCommand::DeleteSnapshot { name } => Request::SnapshotDelete { name },
                ClusterCommand::Restore { cluster, snapshot } => {
                    Request::ClusterRestore { cluster, snapshot }
                }
                ClusterCommand::RotateCertificates { cluster } => {
                    Request::ClusterRotateCertificates { cluster }
                }
            };
            Ok(client(request, args.opts, env))
        }
        CliCommand::Kubeconfig(args) => Ok(client(
            crate::cli::Request::Kubeconfig {
                cluster: args.cluster,
            },
            args.opts,
            env,
        )),
        CliCommand::Token(args) => {
            use crate::cli::Request;
            let request = match args.command {
                TokenCommand::Create {
                    description,
                    expires_at,
                } => Request::TokenCreate {
                    description,
                    expires_at,
                },
                TokenCommand::List => Request::TokenList,
                TokenCommand::Revoke { name } => Request::TokenRevoke { name },
            };
            Ok(client(request, args.opts, env))
        }
        CliCommand::Project(args) => {
            use crate::cli::Request;
            let request = match args.command {
                ProjectCommand::Create {
                    name,
                    cluster,
                    display_name,
                } => Request::ProjectCreate {
                    name,
                    cluster,
                    display_name,
                },
                ProjectCommand::List => Request::ProjectList,
                ProjectCommand::Delete { name } => Request::ProjectDelete { name },
                ProjectCommand::AddMember {
                    project,
                    cluster,
                    user,
                    group,
                    role,
                } => Request::ProjectAddMember {
                    project,
                    cluster,
                    user,
                    group,
                    role,
                },
                ProjectCommand::RemoveMember {
                    project,
                    user,
                    group,
                } => Request::ProjectRemoveMember {
                    binding: crate::cli::member_binding(
                        &project,
                        user.as_deref(),
                        group.as_deref(),
                    ),
                },
            };
            Ok(client(request, args.opts, env))
        }
    }
}

fn serve_config(args: ServeArgs, env: &HashMap<String, String>) -> Result<Config, ConfigError> {
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
    let store = match pick(args.store, "DROVER_STORE", "sqlite") {
        text if text == "sqlite" => StoreLocation::Sqlite,
        text => {
            crate::store::etcd::EtcdUrl::parse(&text).map_err(|reason| ConfigError::Invalid {
                flag: "--store",
                var: "DROVER_STORE",
                value: text.clone(),
                reason: format!("{reason}; or use sqlite, the default"),
            })?;
            StoreLocation::Etcd(text)
        }
    };
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
    Ok(Config {
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

fn client(
    request: crate::cli::Request,
    opts: ClientOpts,
    env: &HashMap<String, String>,
) -> Command {
    Command::Client {
        request,
        config: crate::cli::config_path(opts.config, env),
        output: opts.output,
        password_stdin: false,
    }
}

fn data_dir(flag: Option<PathBuf>, env: &HashMap<String, String>) -> PathBuf {
    flag.or_else(|| {
        env.get("DROVER_DATA_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR))
}

fn check_server_url(url: &str) -> Result<String, ConfigError> {
    check_url("--server-url", "DROVER_SERVER_URL", url)
}

/// An `https://HOST[:PORT]` URL, given by `flag` or `var`.
fn check_url(flag: &'static str, var: &'static str, url: &str) -> Result<String, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::url_host;

    fn serve(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = ["drover-hub", "serve"]
            .iter()
            .chain(args)
            .map(|s| s.to_string());
        match parse(argv, &env)? {
            Command::Serve(c) => Ok(c),
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn no_flags_gives_the_documented_defaults() {
        let config = serve(&[], &[("HOSTNAME", "hub1")]).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("./drover-data"));
        assert_eq!(config.listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(config.server_url_for(8443), "https://hub1:8443");
        assert_eq!(config.heartbeat, DEFAULT_HEARTBEAT);
    }

    #[test]
    fn the_heartbeat_interval_is_whole_seconds_in_range() {
        let config = serve(&["--heartbeat-seconds", "2"], &[]).unwrap();
        assert_eq!(config.heartbeat, std::time::Duration::from_secs(2));
        assert_eq!(serve(&[], &[]).unwrap().store, StoreLocation::Sqlite);
        assert_eq!(
            serve(&[], &[]).unwrap().max_handshakes,
            DEFAULT_MAX_HANDSHAKES
        );
        assert_eq!(
            serve(&["--max-handshakes", "0"], &[])
                .unwrap()
                .max_handshakes,
            0
        );
        assert!(serve(&["--max-handshakes", "lots"], &[]).is_err());
        assert_eq!(
            serve(&["--store", "etcd://10.0.0.1:2379,10.0.0.2:2379"], &[])
                .unwrap()
                .store,
            StoreLocation::Etcd("etcd://10.0.0.1:2379,10.0.0.2:2379".into())
        );
        assert_eq!(
            serve(&[], &[("DROVER_STORE", "etcd://etcd:2379/hubs/eu")])
                .unwrap()
                .store,
            StoreLocation::Etcd("etcd://etcd:2379/hubs/eu".into())
        );
        let err = serve(&["--store", "postgres://db"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--store") && err.contains("etcd://HOST:PORT"),
            "{err}"
        );
        for bad in ["0", "301", "1.5", "ten"] {
            let err = serve(&[], &[("DROVER_HEARTBEAT_SECONDS", bad)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--heartbeat-seconds") && err.contains("1 to 300"),
                "{err}"
            );
        }
    }

    #[test]
    fn flags_beat_environment_variables() {
        let env = [
            ("DROVER_LISTEN", "127.0.0.1:9000"),
            ("DROVER_DATA_DIR", "/var/lib/drover"),
        ];
        let config = serve(&["--listen", "127.0.0.1:9443"], &env).unwrap();
        assert_eq!(config.listen, "127.0.0.1:9443".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/drover"));
    }

    #[test]
    fn a_bad_value_names_the_flag_and_the_variable() {
        let err = serve(&[], &[("DROVER_LISTEN", "8443")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--listen") && err.contains("DROVER_LISTEN"),
            "{err}"
        );
        let err = serve(&["--server-url", "http://hub"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--server-url") && err.contains("https://"),
            "{err}"
        );
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let err = serve(&["--tls-cert", "/etc/hub.pem"], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--tls-key"), "{err}");
        let config = serve(
            &[],
            &[("DROVER_TLS_CERT", "/c.pem"), ("DROVER_TLS_KEY", "/k.pem")],
        )
        .unwrap();
        assert_eq!(
            config.tls,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
    }

    #[test]
    fn an_unknown_flag_is_a_usage_error() {
        assert!(matches!(
            serve(&["--lisen", "x"], &[]),
            Err(ConfigError::Usage(_))
        ));
    }

    #[test]
    fn url_host_strips_ipv6_brackets() {
        assert_eq!(url_host("https://[::1]:8443").as_deref(), Some("::1"));
        assert_eq!(
            url_host("https://hub.example.com").as_deref(),
            Some("hub.example.com")
        );
    }
}
