//! `drover-hub get|apply|host|setting`: any of the hub's objects from the command line, as
//! kubectl reads and applies Kubernetes objects, and the two kinds people look at most.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::cli::Request;

#[derive(Args, Debug)]
pub(super) struct Get {
    /// A kind of the hub's objects: clusters, hosts, machines, settings… (plural or singular)
    kind: String,
    /// One object; all you may see if not given
    name: Option<String>,
    /// Only objects whose labels match, e.g. `env=prod,tier!=web`
    #[arg(short = 'l', long)]
    selector: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct Apply {
    /// A YAML or JSON file of one or more objects (`---` between them); `-` reads stdin
    #[arg(short = 'f', long = "filename")]
    file: PathBuf,
}

#[derive(Subcommand, Debug)]
pub(super) enum HostCommand {
    /// List the hosts you may see (of one cluster with --cluster)
    List {
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Show one host
    Get { name: String },
}

#[derive(Subcommand, Debug)]
pub(super) enum GitrepoCommand {
    /// Create a GitRepo from flags (or write one as YAML and `drover-hub apply -f` it: the
    /// webhook's secret is set that way, never on a command line)
    Create(Box<GitrepoCreate>),
    /// List the GitRepos: the commit each applies, its clusters ready, its error
    List,
    /// Show one GitRepo
    Get { name: String },
}

#[derive(Args, Debug)]
pub(super) struct GitrepoCreate {
    name: String,
    /// The repository: https://…, ssh://git@host/path, git@host:path or git://…
    #[arg(long)]
    repo: String,
    /// The branch followed (default main)
    #[arg(long, conflicts_with = "revision")]
    branch: Option<String>,
    /// A fixed commit or tag, instead of following a branch
    #[arg(long)]
    revision: Option<String>,
    /// A directory that becomes one bundle (repeat for several; default the whole repository)
    #[arg(long = "path")]
    paths: Vec<String>,
    /// How often the branch is looked at: 60s, 5m (default 60s)
    #[arg(long)]
    polling_interval: Option<String>,
    /// A CloudCredential of driver git: an HTTPS login, or an SSH key and pinned host keys
    #[arg(long)]
    credential: Option<String>,
    /// A target: the cluster of this name (repeat for several)
    #[arg(long = "cluster")]
    clusters: Vec<String>,
    /// A target: the clusters whose labels match KEY=VALUE,… e.g. env=prod,region=eu
    /// (repeat for several)
    #[arg(long = "selector", value_parser = parse_labels)]
    selectors: Vec<serde_json::Value>,
    /// A target: the clusters of this cluster group (repeat for several)
    #[arg(long = "group")]
    groups: Vec<String>,
}

/// `KEY=VALUE,…` as a selector's `matchLabels`.
fn parse_labels(text: &str) -> Result<serde_json::Value, String> {
    let mut labels = serde_json::Map::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() && !key.ends_with('!') => {
                labels.insert(key.trim().to_owned(), value.trim().into());
            }
            _ => {
                return Err(format!(
                    "{pair:?}: write KEY=VALUE (for expressions such as NotIn, write the GitRepo as YAML and apply it)"
                ));
            }
        }
    }
    if labels.is_empty() {
        return Err("name at least one label, e.g. env=prod".into());
    }
    Ok(serde_json::json!({ "matchLabels": labels }))
}

#[derive(Subcommand, Debug)]
pub(super) enum BundleCommand {
    /// List the bundles and how many of their clusters are ready; with --cluster, what that
    /// cluster was given of each and how it stands
    List {
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Show one bundle
    Get { name: String },
}

#[derive(Subcommand, Debug)]
pub(super) enum SettingCommand {
    /// Show one setting's value, or every setting's
    Get { name: Option<String> },
    /// Set a setting's value (admins)
    Set { name: String, value: String },
}

pub(super) fn get_request(args: Get) -> Request {
    Request::Get {
        kind: args.kind,
        name: args.name,
        selector: args.selector,
    }
}

pub(super) fn apply_request(args: Apply) -> Request {
    Request::Apply { file: args.file }
}

pub(super) fn host_request(command: HostCommand) -> Request {
    match command {
        HostCommand::List { cluster } => Request::HostList { cluster },
        HostCommand::Get { name } => Request::HostGet { name },
    }
}

pub(super) fn gitrepo_request(command: GitrepoCommand) -> Request {
    match command {
        GitrepoCommand::Create(create) => {
            let mut spec = serde_json::json!({ "repo": create.repo });
            for (field, value) in [
                ("branch", create.branch),
                ("revision", create.revision),
                ("pollingInterval", create.polling_interval),
                ("credential", create.credential),
            ] {
                if let Some(value) = value {
                    spec[field] = value.into();
                }
            }
            if !create.paths.is_empty() {
                spec["paths"] = create.paths.into();
            }
            let targets: Vec<serde_json::Value> = (create.clusters.into_iter())
                .map(|c| serde_json::json!({ "clusterName": c }))
                .chain(
                    (create.selectors.into_iter())
                        .map(|s| serde_json::json!({ "clusterSelector": s })),
                )
                .chain(
                    (create.groups.into_iter()).map(|g| serde_json::json!({ "clusterGroup": g })),
                )
                .collect();
            spec["targets"] = targets.into();
            Request::GitrepoCreate {
                name: create.name,
                spec,
            }
        }
        GitrepoCommand::List => Request::GitrepoList,
        GitrepoCommand::Get { name } => Request::GitrepoGet { name },
    }
}

pub(super) fn bundle_request(command: BundleCommand) -> Request {
    match command {
        BundleCommand::List { cluster } => Request::BundleList { cluster },
        BundleCommand::Get { name } => Request::BundleGet { name },
    }
}

pub(super) fn setting_request(command: SettingCommand) -> Request {
    match command {
        SettingCommand::Get { name: None } => Request::SettingList,
        SettingCommand::Get { name: Some(name) } => Request::SettingGet { name },
        SettingCommand::Set { name, value } => Request::SettingSet { name, value },
    }
}
