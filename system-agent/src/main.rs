//! `drover-system-agent`: configured from the environment (the install script writes it to
//! `/etc/drover/system-agent.env`), runs until SIGTERM.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One thread: the agent waits on the hub and on processes, and must stay small on the host.
    agentkit::agent_main(
        &agentkit::About {
            name: "drover-system-agent",
            version: env!("CARGO_PKG_VERSION"),
            help: system_agent::HELP,
        },
        system_agent::Config::from_env,
        system_agent::run,
        true,
    )
}
