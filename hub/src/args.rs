//! `drover-hub`'s command line: flags first, then `DROVER_*` environment variables, then
//! defaults. Parsed by one function that takes the arguments and the environment as values, so
//! tests feed it a map and never touch the process environment.

use std::{collections::HashMap, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use self::serve::ServeArgs;
use crate::config::{Config, StoreLocation};

/// What `drover-hub` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Serve(Config),
    /// Give the `admin` user a new password (printed once), in the hub's store.
    ResetAdminPassword {
        data_dir: PathBuf,
        store: StoreLocation,
    },
    /// Write a consistent backup (store and CA) to `out`; works while the hub runs.
    Backup {
        data_dir: PathBuf,
        store: StoreLocation,
        out: PathBuf,
    },
    /// Replace the state in `data_dir` with the backup `from`; the hub must be stopped.
    Restore {
        data_dir: PathBuf,
        store: StoreLocation,
        from: PathBuf,
    },
    /// Talk to a running hub's API.
    Client {
        request: crate::cli::Request,
        config: PathBuf,
        output: crate::cli::Output,
        /// Where the login password comes from.
        password: PasswordFrom,
    },
}

/// Where `login` takes its password from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordFrom {
    /// Given already (`DROVER_PASSWORD`), or not needed.
    Given,
    /// The first line of stdin (`--password-stdin`).
    Stdin,
    /// Asked for at the terminal, without echo; refused when there is none.
    Prompt,
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
    /// A flag without an environment variable.
    #[error("invalid {flag} {value:?}: {reason}")]
    Flag {
        flag: &'static str,
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
    Serve(Box<ServeArgs>),
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
    /// Print a kubeconfig that reaches CLUSTER through the hub (or, with --hub, the hub).
    Kubeconfig(KubeconfigArgs),
    /// Create, list or revoke your API tokens.
    Token(TokenArgs),
    /// Projects: namespaces of a cluster under one set of members (and secrets).
    Project(ProjectArgs),
    /// The hub's local users: create, list, delete, set a password.
    User(UserArgs),
    /// Who holds which role: grant, revoke, list.
    Role(RoleArgs),
    /// A cluster's machine pools: scale one.
    Pool(PoolArgs),
    /// The node groups of hosted clusters: scale one.
    Nodegroup(NodeGroupArgs),
    /// The machines the hub made for a cluster's pools.
    Machine(MachineArgs),
    /// Print objects of any kind the hub keeps (a table, or -o yaml|json)
    Get(GetArgs),
    /// Create or update the objects in a file (each by its kind and name)
    Apply(ApplyArgs),
    /// The hosts of custom clusters: list, show one.
    Host(HostArgs),
    /// The hub's settings: show, set.
    Setting(SettingArgs),
    /// Bundles delivered to clusters: list them, or what one cluster was given.
    Bundle(BundleArgs),
    /// Git repositories whose paths become bundles: list them, show one.
    Gitrepo(GitrepoArgs),
}

#[derive(Args, Debug)]
struct GetArgs {
    #[command(flatten)]
    get: objects::Get,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct ApplyArgs {
    #[command(flatten)]
    apply: objects::Apply,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct HostArgs {
    #[command(subcommand)]
    command: objects::HostCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct GitrepoArgs {
    #[command(subcommand)]
    command: objects::GitrepoCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct BundleArgs {
    #[command(subcommand)]
    command: objects::BundleCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct SettingArgs {
    #[command(subcommand)]
    command: objects::SettingCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct PoolArgs {
    #[command(subcommand)]
    command: PoolCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum PoolCommand {
    /// Set how many machines a pool has (the hub makes or removes the difference)
    Scale {
        cluster: String,
        pool: String,
        quantity: u32,
    },
}

#[derive(Args, Debug)]
struct NodeGroupArgs {
    #[command(subcommand)]
    command: hosted::NodeGroupCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct MachineArgs {
    #[command(subcommand)]
    command: MachineCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum MachineCommand {
    /// List a cluster's machines with their phase, address and host
    List { cluster: String },
}

#[derive(Args, Debug)]
struct UserArgs {
    #[command(subcommand)]
    command: access::UserCommand,
    #[command(flatten)]
    opts: ClientOpts,
}

#[derive(Args, Debug)]
struct RoleArgs {
    #[command(subcommand)]
    command: access::RoleCommand,
    #[command(flatten)]
    opts: ClientOpts,
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
    /// Sign in with this auth provider (a company directory: its login name and password);
    /// the hub's own users if not given
    #[arg(long)]
    provider: Option<String>,
    /// Read the password from stdin's first line (else from DROVER_PASSWORD, else asked for
    /// at the terminal)
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
        /// For custom clusters: e.g. v1.33.4+k3s1; for hosted ones, a minor version, e.g. 1.31
        #[arg(long = "kubernetes-version")]
        version: Option<String>,
        #[command(flatten)]
        hosted: Box<hosted::HostedFlags>,
    },
    /// List the clusters you may see
    List,
    /// Show one cluster
    Get { name: String },
    /// Delete a cluster: its hosts run their uninstall plan, its agents' credentials are
    /// revoked, and what Drover created in an imported cluster is removed; waits until done,
    /// saying what it waits on
    Delete {
        name: String,
        /// Remove it without waiting for its hosts to uninstall (they are gone for good): their
        /// credentials are revoked and they are forgotten; what they ran keeps running
        #[arg(long)]
        force: bool,
    },
    /// Follow a custom cluster's provisioning as lines: its and each host's state when it
    /// changes, and each running step's output (as `kubectl logs -f`); ends once it is active
    Watch { name: String },
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
    /// Turn a custom cluster's authorized endpoint on or off: kubectl straight to its API
    /// servers with the hub's kubeconfig (its control plane rolls, one host at a time)
    Endpoint {
        cluster: String,
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        #[arg(long)]
        disable: bool,
        /// A DNS name[:port] in front of the control plane (a load balancer)
        #[arg(long, conflicts_with = "disable")]
        fqdn: Option<String>,
        /// A PEM file with the CA certificates that verify the FQDN's server
        #[arg(long, requires = "fqdn")]
        ca_certs: Option<std::path::PathBuf>,
    },
}

#[derive(Args, Debug)]
struct KubeconfigArgs {
    /// The cluster to reach through the hub.
    #[arg(required_unless_present = "hub", conflicts_with = "hub")]
    cluster: Option<String>,
    /// A kubeconfig for the hub itself: kubectl then manages the hub's own objects
    /// (`kubectl get clusters`, `kubectl apply -f cluster.yaml`).
    #[arg(long)]
    hub: bool,
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
    /// List your tokens (an admin: everyone's, or one user's with --user)
    List {
        /// Only this user's tokens (admins)
        #[arg(long)]
        user: Option<String>,
    },
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

/// Where a hub keeps its state, as it was served with.
#[derive(Args, Debug)]
struct DataDirArgs {
    /// Directory for the hub's state [env: DROVER_DATA_DIR] [default: ./drover-data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The hub's store, as given to `serve`: `sqlite` (in the data directory) or
    /// `etcd://HOST:2379[,HOST:2379…][/PREFIX]` [env: DROVER_STORE] [default: sqlite]
    #[arg(long)]
    store: Option<String>,
}

const DEFAULT_DATA_DIR: &str = "./drover-data";

/// Parses `args` (the program name first) with `env` as the environment.
pub fn parse<I, S>(args: I, env: &HashMap<String, String>) -> Result<Command, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    match cli.command {
        CliCommand::Serve(args) => serve::config(*args, env).map(Command::Serve),
        CliCommand::ResetAdminPassword(args) => Ok(Command::ResetAdminPassword {
            data_dir: data_dir(args.data_dir, env),
            store: serve::store_location(args.store, env)?,
        }),
        CliCommand::Backup(args) => Ok(Command::Backup {
            data_dir: data_dir(args.dir.data_dir, env),
            store: serve::store_location(args.dir.store, env)?,
            out: args.out,
        }),
        CliCommand::Restore(args) => Ok(Command::Restore {
            data_dir: data_dir(args.dir.data_dir, env),
            store: serve::store_location(args.dir.store, env)?,
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
            let from = if args.password_stdin {
                PasswordFrom::Stdin
            } else if password.is_empty() {
                PasswordFrom::Prompt
            } else {
                PasswordFrom::Given
            };
            Ok(Command::Client {
                request: Request::Login {
                    server,
                    username: args.username,
                    provider: args.provider,
                    password: tunnel::Secret::new(password),
                    ca_checksum: args.ca_checksum,
                },
                config: crate::cli::config_path(args.opts.config, env),
                output: args.opts.output,
                password: from,
            })
        }
        CliCommand::Cluster(args) => {
            use crate::cli::Request;
            let request = match args.command {
                ClusterCommand::Create {
                    name,
                    hosted,
                    version,
                    ..
                } if hosted.hosted() => {
                    let spec =
                        serde_json::json!({"type": "hosted", "hosted": hosted.spec(version)?});
                    Request::ClusterCreate { name, spec }
                }
                ClusterCommand::Create {
                    name,
                    cluster_type,
                    distribution,
                    version,
                    hosted: _,
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
                ClusterCommand::Watch { name } => Request::ClusterWatch { name },
                ClusterCommand::Delete { name, force } => Request::ClusterDelete { name, force },
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
                ClusterCommand::Endpoint {
                    cluster,
                    enable,
                    disable: _,
                    fqdn,
                    ca_certs,
                } => Request::ClusterEndpoint {
                    cluster,
                    enabled: enable,
                    fqdn: fqdn.unwrap_or_default(),
                    ca_certs,
                },
            };
            Ok(client(request, args.opts, env))
        }
        CliCommand::Pool(args) => {
            let PoolCommand::Scale {
                cluster,
                pool,
                quantity,
            } = args.command;
            Ok(client(
                crate::cli::Request::PoolScale {
                    cluster,
                    pool,
                    quantity,
                },
                args.opts,
                env,
            ))
        }
        CliCommand::Nodegroup(args) => {
            let hosted::NodeGroupCommand::Scale {
                cluster,
                group,
                desired,
                min,
                max,
            } = args.command;
            Ok(client(
                crate::cli::Request::NodeGroupScale {
                    cluster,
                    group,
                    desired,
                    min,
                    max,
                },
                args.opts,
                env,
            ))
        }
        CliCommand::Machine(args) => {
            let MachineCommand::List { cluster } = args.command;
            Ok(client(
                crate::cli::Request::MachineList { cluster },
                args.opts,
                env,
            ))
        }
        CliCommand::Kubeconfig(args) => Ok(client(
            crate::cli::Request::Kubeconfig {
                cluster: args.cluster.filter(|_| !args.hub),
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
                TokenCommand::List { user } => Request::TokenList { user },
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
        CliCommand::User(args) => {
            let (request, from) = access::user_request(args.command);
            let mut command = client(request, args.opts, env);
            if let Command::Client { password, .. } = &mut command {
                *password = from;
            }
            Ok(command)
        }
        CliCommand::Role(args) => Ok(client(access::role_request(args.command), args.opts, env)),
        CliCommand::Get(args) => Ok(client(objects::get_request(args.get), args.opts, env)),
        CliCommand::Apply(args) => Ok(client(objects::apply_request(args.apply), args.opts, env)),
        CliCommand::Host(args) => Ok(client(objects::host_request(args.command), args.opts, env)),
        CliCommand::Gitrepo(args) => Ok(client(
            objects::gitrepo_request(args.command),
            args.opts,
            env,
        )),
        CliCommand::Bundle(args) => Ok(client(
            objects::bundle_request(args.command),
            args.opts,
            env,
        )),
        CliCommand::Setting(args) => Ok(client(
            objects::setting_request(args.command),
            args.opts,
            env,
        )),
    }
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
        password: PasswordFrom::Given,
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
    serve::check_url("--server-url", "DROVER_SERVER_URL", url)
}

mod access;
mod hosted;
mod objects;
mod serve;
#[cfg(test)]
mod tests;
