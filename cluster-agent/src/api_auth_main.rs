//! `drover-kube-api-auth`: the authorized endpoint's token authenticator, configured from the
//! environment (its DaemonSet's), runs until SIGTERM.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One thread: a review is a hash and a lookup in memory.
    agentkit::agent_main(
        &agentkit::About {
            name: "drover-kube-api-auth",
            version: env!("CARGO_PKG_VERSION"),
            help: cluster_agent::api_auth::HELP,
        },
        cluster_agent::api_auth::Config::from_env,
        cluster_agent::api_auth::run,
        true,
    )
}
