//! `drover-hub`: parse the configuration, start the hub, stop it on SIGINT/SIGTERM.

use std::{collections::HashMap, process::ExitCode};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code for a bad flag or variable, as clap uses for a bad command line.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let env: HashMap<String, String> = std::env::vars().collect();
    let command = match hub::config::parse(std::env::args_os(), &env) {
        Ok(command) => command,
        // Prints help or version (exit 0) or the usage error (exit 2).
        Err(hub::ConfigError::Usage(e)) => e.exit(),
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("drover-hub: {e}");
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // The SQLite store does its work on blocking threads, one at a time (one connection):
        // a burst of requests (thousands of hosts registering) would otherwise start hundreds
        // of threads that only wait, each leaving its allocator heap behind.
        .max_blocking_threads(16)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        hub::Command::Serve(config) => {
            runtime.block_on(hub::serve(config, |_, _| async { Ok(()) }))
        }
        hub::Command::ResetAdminPassword { data_dir } => {
            runtime.block_on(reset_admin_password(&data_dir))
        }
        hub::Command::Backup { data_dir, out } => backup(&data_dir, &out),
        hub::Command::Restore { data_dir, from } => restore(&data_dir, &from),
        hub::Command::Client {
            mut request,
            config,
            output,
            password_stdin,
        } => {
            if let (true, hub::cli::Request::Login { password, .. }) =
                (password_stdin, &mut request)
            {
                let mut line = String::new();
                if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("drover-hub: --password-stdin: no password on stdin");
                    }
                    return ExitCode::from(EXIT_USAGE);
                }
                *password = tunnel::Secret::new(line.trim_end_matches(['\r', '\n']));
            }
            return match runtime.block_on(hub::cli::run(request, &config, output)) {
                Ok(text) => {
                    #[allow(clippy::print_stdout)]
                    {
                        print!("{text}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    #[allow(clippy::print_stderr)]
                    {
                        eprintln!("drover-hub: {e}");
                    }
                    ExitCode::from(e.exit_code())
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn reset_admin_password(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let store = hub::store::sqlite::SqliteStore::open(&data_dir.join(hub::backup::STORE_FILE))?;
    let password = hub::bootstrap::reset_admin_password(&store).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("New password for \"admin\":\n\n    {password}\n\nIt is not shown again.");
    }
    Ok(())
}

fn backup(data_dir: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    let summary = hub::backup::backup(data_dir, out)?;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "Backup written to {}: {summary}.\nIt holds the hub's CA key: keep it as secret as the data directory.",
            out.display()
        );
    }
    Ok(())
}

fn restore(data_dir: &std::path::Path, from: &std::path::Path) -> anyhow::Result<()> {
    let restored = hub::backup::restore(data_dir, from)?;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "Restored {} from {}: {}.",
            data_dir.display(),
            from.display(),
            restored.summary
        );
        if let Some(previous) = &restored.previous {
            println!(
                "The state it replaced is in {}; delete it once the hub runs as it should.",
                previous.display()
            );
        }
    }
    Ok(())
}
