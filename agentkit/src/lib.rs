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

/// What an agent says of itself, for `--help` and `--version`.
#[derive(Debug, Clone, Copy)]
pub struct About {
    /// The binary's name, e.g. `drover-cluster-agent`.
    pub name: &'static str,
    pub version: &'static str,
    /// What it does and the environment variables that configure it.
    pub help: &'static str,
}

/// What an agent's command line asks for: to run (no arguments: agents are configured from
/// the environment), a text to print, or a usage error.
#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    Run,
    Print(String),
    Usage(String),
}

impl About {
    /// The command line `args` (without the program name) as an [`Invocation`].
    pub fn invocation(&self, args: &[String]) -> Invocation {
        match args {
            [] => Invocation::Run,
            [one] if one == "--help" || one == "-h" => Invocation::Print(format!(
                "{} {}\n\n{}\n\nDROVER_LOG sets the log filter (default info); the log goes to stderr.\n",
                self.name,
                self.version,
                self.help.trim_end()
            )),
            [one] if one == "--version" || one == "-V" => {
                Invocation::Print(format!("{} {}\n", self.name, self.version))
            }
            _ => Invocation::Usage(format!(
                "{}: unexpected argument {:?}: it takes none, only environment variables (see {} --help)",
                self.name, args[0], self.name
            )),
        }
    }
}

/// An agent's `main`: `--help` and `--version` answered; else logs to stderr (filter `DROVER_LOG`, default `info`), the configuration
/// from the environment (exit code 2 with its message when it is unusable), then `run` on a
/// Tokio runtime (one thread with `one_thread`: the agents that sit on hosts stay small) until
/// SIGTERM or Ctrl-C (exit code 1 with the error if it fails).
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub fn agent_main<C, E: Display, R: Display, F: Future<Output = Result<(), R>>>(
    about: &About,
    config: impl FnOnce(&HashMap<String, String>) -> Result<C, E>,
    run: impl FnOnce(C, tokio_util::sync::CancellationToken) -> F,
    one_thread: bool,
) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match about.invocation(&args) {
        Invocation::Run => {}
        Invocation::Print(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Invocation::Usage(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const ABOUT: About = About {
        name: "drover-test-agent",
        version: "1.2.3",
        help: "Does a test's work.\n\n  DROVER_SERVER  the hub\n",
    };

    fn invoke(args: &[&str]) -> Invocation {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        ABOUT.invocation(&args)
    }

    #[test]
    fn an_agent_answers_help_and_version_and_refuses_arguments() {
        assert_eq!(invoke(&[]), Invocation::Run);
        for help in ["--help", "-h"] {
            let Invocation::Print(text) = invoke(&[help]) else {
                panic!("{help}");
            };
            assert!(text.starts_with("drover-test-agent 1.2.3\n\nDoes a test's work."));
            assert!(text.contains("DROVER_SERVER  the hub") && text.contains("DROVER_LOG"));
        }
        for version in ["--version", "-V"] {
            assert_eq!(
                invoke(&[version]),
                Invocation::Print("drover-test-agent 1.2.3\n".into())
            );
        }
        let Invocation::Usage(message) = invoke(&["--server", "x"]) else {
            panic!("arguments are refused");
        };
        assert!(
            message.contains("\"--server\"") && message.contains("--help"),
            "{message}"
        );
    }
}
