//! What Drover's three agents share: the hub connection settings, registration and the kept
//! credential (`hub`), the heartbeat with the machine's facts and usage (`heartbeat`), the way
//! to a cluster's API server and the forwarder of the hub's requests to it (`kube`,
//! `kube_api`; the cluster-agent's and the node-agent's), and the body of their mains.

use std::{collections::HashMap, fmt::Display, process::ExitCode};

pub mod heartbeat;
pub mod hub;
pub mod kube;
pub mod kube_api;

pub use heartbeat::{Sampler, beat};
pub use hub::{HubSettings, RegisterError, Registration};
pub use kube::KubeTarget;

/// An agent's `main`: logs to stderr (filter `DROVER_LOG`, default `info`), the configuration
/// from the environment (exit code 2 with its message when it is unusable), then `run` on a
/// Tokio runtime (one thread with `one_thread`: the agents that sit on hosts stay small) until
/// SIGTERM or Ctrl-C (exit code 1 with the error if it fails).
pub fn agent_main<C, E: Display, R: Display, F: Future<Output = Result<(), R>>>(
    config: impl FnOnce(&HashMap<String, String>) -> Result<C, E>,
    run: impl FnOnce(C, tokio_util::sync::CancellationToken) -> F,
    one_thread: bool,
) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // As the hub logs (`hub::commands::init_logging`; the agents do not depend on the
        // hub). Colours only for a person at a terminal, not in a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let env: HashMap<String, String> = std::env::vars().collect();
    let config = match config(&env) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = if one_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    let Ok(runtime) = runtime else {
        return ExitCode::FAILURE;
    };
    runtime.block_on(async {
        match run(config, tunnel::shutdown_on_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("{e}");
                ExitCode::FAILURE
            }
        }
    })
}
