//! `drover-hub`: parse the command line, run the command (see `hub::commands`), print what it
//! says; exit 0, or with the command's code.

use std::{collections::HashMap, process::ExitCode};

use hub::commands::{EXIT_USAGE, Failure};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(clippy::print_stdout, clippy::print_stderr)]
fn main() -> ExitCode {
    let env: HashMap<String, String> = std::env::vars().collect();
    let command = match hub::args::parse(std::env::args_os(), &env) {
        Ok(command) => command,
        // Prints help or version (exit 0) or the usage error (exit 2).
        Err(hub::ConfigError::Usage(e)) => e.exit(),
        Err(e) => {
            eprintln!("drover-hub: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    hub::commands::init_logging();
    let runtime = match hub::commands::runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(hub::commands::run(command)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure::Logged(e)) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
        Err(Failure::Said { message, code }) => {
            eprintln!("drover-hub: {message}");
            ExitCode::from(code)
        }
    }
}
