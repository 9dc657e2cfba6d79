//! `drover-hub`: parse the command line, run the command (see `hub::commands`), print what it
//! says; exit 0, or with the command's code.

use std::{collections::HashMap, process::ExitCode};

use hub::commands::{EXIT_USAGE, Failure};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc gives memory freed by a burst (a fleet reconnecting to a restarted hub) back to the
/// system only once its `purge_delay` (1 s) has passed, and looks at that only when an
/// allocation takes its slow path, which a quiet hub rarely does: what the burst freed stays
/// resident, about 2 KiB an agent under 10,000 agents (see docs/benchmarks.md). mimalloc reads
/// its options from the environment as the process starts, and setting one from Rust would
/// take its C API (unsafe, which this workspace forbids), so the hub starts itself again, once,
/// with the option set. An operator's own setting is left alone.
#[cfg(unix)]
#[allow(clippy::print_stderr)]
fn purge_freed_memory_at_once() {
    use std::os::unix::process::CommandExt;
    const OPTION: &str = "MIMALLOC_PURGE_DELAY";
    if std::env::var_os(OPTION).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(name) = args.next() {
        command.arg0(name);
    }
    // `exec` returns only if it failed; the hub then runs as it is.
    let e = command.args(args).env(OPTION, "0").exec();
    eprintln!("drover-hub: cannot restart itself with {OPTION}=0 ({e}); going on without");
}

#[allow(clippy::print_stdout, clippy::print_stderr)]
fn main() -> ExitCode {
    #[cfg(unix)]
    purge_freed_memory_at_once();
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
