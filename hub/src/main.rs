//! `drover-hub`: parse the command line, run the command (see `hub::commands`), print what it
//! says; exit 0, or with the command's code.

use std::{collections::HashMap, process::ExitCode};

use hub::commands::{EXIT_USAGE, Failure};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's delay, in milliseconds, before it gives freed memory back to the system.
const PURGE_DELAY_MS: &str = "10";

/// A serving hub runs with mimalloc's `purge_delay` at [`PURGE_DELAY_MS`] rather than its 1 s.
/// mimalloc looks for memory to give back only when an allocation takes its slow path, and
/// gives back only what was freed longer ago than the delay: after a burst (a fleet
/// reconnecting to a restarted hub) a quiet hub rarely looks again that late, and about 2 KiB
/// an agent it no longer uses stays resident (docs/benchmarks-history.md). At 0 every free page goes
/// back at once, a system call each, which slowed the plan fan-out by half; at 10 ms the
/// fan-out measured the same as at 1 s. mimalloc reads its options from the environment as the
/// process starts, and setting one from Rust takes its C API (unsafe, which this workspace
/// forbids), so the hub starts itself again, once, with the option set (same process, same
/// arguments). An operator's own setting is left alone.
#[cfg(unix)]
#[allow(clippy::print_stderr)]
fn serve_with_purge_delay() {
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
    // `exec` returns only if it failed (the binary replaced on disk, say): the hub then runs
    // with mimalloc's default, which costs memory, not correctness.
    let e = command.args(args).env(OPTION, PURGE_DELAY_MS).exec();
    eprintln!(
        "drover-hub: cannot start again with {OPTION}={PURGE_DELAY_MS} ({e}); going on without"
    );
}

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
    #[cfg(unix)]
    if matches!(command, hub::args::Command::Serve(_)) {
        serve_with_purge_delay();
    }
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
