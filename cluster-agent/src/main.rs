//! `drover-cluster-agent`: configured from the environment (the import manifest's Secret and
//! the pod's service account, or `KUBECONFIG`), runs until SIGTERM.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    agentkit::agent_main(
        &agentkit::About {
            name: "drover-cluster-agent",
            version: env!("CARGO_PKG_VERSION"),
            help: cluster_agent::HELP,
        },
        cluster_agent::Config::from_env,
        cluster_agent::run,
        false,
    )
}
