//! `drover-node-agent`: configured from the environment (the import manifest's Secret, the
//! node name from the DaemonSet, and the pod's service account or `KUBECONFIG`), runs until
//! SIGTERM.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One thread: the agent runs on every node and must stay small there.
    agentkit::agent_main(
        &agentkit::About {
            name: "drover-node-agent",
            version: env!("CARGO_PKG_VERSION"),
            help: node_agent::HELP,
        },
        node_agent::Config::from_env,
        node_agent::run,
        true,
    )
}
