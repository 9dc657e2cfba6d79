//! `drover-hub`: parse the configuration, start the hub, stop it on SIGINT/SIGTERM.

use std::{collections::HashMap, process::ExitCode};

use tokio_util::sync::CancellationToken;

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
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = match command {
        hub::Command::Serve(config) => runtime.block_on(serve(config)),
        hub::Command::ResetAdminPassword { data_dir } => {
            runtime.block_on(reset_admin_password(&data_dir))
        }
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

async fn serve(config: hub::Config) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM sent as soon as the hub says it is up must stop it cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let hub = hub::Hub::start(config, shutdown.clone()).await?;
    // For people (and scripts) on stdout; the log on stderr says the same for machines.
    #[allow(clippy::print_stdout)]
    {
        if let Some(password) = hub.bootstrap_password() {
            // Shown this once, never logged: only its hash is stored.
            println!(
                "First start: log in as \"admin\" with password\n\n    {password}\n\n\
                 It is not shown again; `drover-hub reset-admin-password` sets a new one.\n"
            );
        }
        println!(
            "Drover hub is up\n  URL:          {}\n  listening on: {}\n  CA checksum:  {}",
            hub.url(),
            hub.local_addr(),
            hub.ca_checksum()
        );
    }
    tracing::info!(
        url = %hub.url(), listen = %hub.local_addr(), ca_checksum = %hub.ca_checksum(),
        "Drover hub is up; agents pin the CA by this checksum"
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping: closing agent sessions and draining requests");
    shutdown.cancel();
    hub.wait().await;
    Ok(())
}

async fn reset_admin_password(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let store = hub::store::sqlite::SqliteStore::open(&data_dir.join("state.db"))?;
    let password = hub::bootstrap::reset_admin_password(&store).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("New password for \"admin\":\n\n    {password}\n\nIt is not shown again.");
    }
    Ok(())
}
