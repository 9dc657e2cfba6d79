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
    /// List the GitRepos: the commit each applies, its clusters ready, its error
    List,
    /// Show one GitRepo
    Get { name: String },
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
