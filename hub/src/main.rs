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
        hub::Command::Serve(config) => runtime.block_on(serve(config)),
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

async fn serve(config: hub::Config) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM sent as soon as the hub says it is up must stop it cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let (demo, data_dir) = (config.demo, config.data_dir.clone());
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
    if demo > 0 {
        start_demo(&hub, &data_dir, demo, shutdown.clone()).await?;
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("stopping: closing agent sessions and draining requests");
    shutdown.cancel();
    hub.wait().await;
    Ok(())
}

/// `--demo N`: N simulated imported clusters with their agents, and a paused custom cluster
/// with three simulated hosts, in this process (see `sim::demo`). The agents reach the hub at
/// its listening address, so the demo works whatever the server URL says.
async fn start_demo(
    hub: &hub::Hub,
    data_dir: &std::path::Path,
    clusters: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let port = hub.local_addr().port();
    let demo = sim::demo::DemoHub {
        url: format!("https://127.0.0.1:{port}"),
        ca_checksum: hub.ca_checksum().to_owned(),
        dir: data_dir.join("demo"),
    };
    for i in 1..=clusters {
        let name = format!("demo-{i}");
        let spec =
            serde_json::json!({"type": "imported", "description": "simulated (drover --demo)"});
        let token = hub::registration::ensure_cluster(hub.store().as_ref(), &name, &spec).await?;
        let manifest = hub::registration::agents_manifest(
            hub.store().as_ref(),
            &demo.url,
            &demo.ca_checksum,
            &name,
            &token,
        )
        .await?;
        // Two to five nodes, so the clusters differ.
        let nodes = 2 + (i - 1) % 4;
        tokio::spawn(log_failure(
            name.clone(),
            sim::demo::imported_cluster(
                demo.clone(),
                name,
                token,
                manifest,
                nodes,
                shutdown.clone(),
            ),
        ));
    }
    let name = "demo-hosts".to_owned();
    let spec = serde_json::json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
        "paused": true, "description": "simulated hosts (drover --demo); paused: nothing is installed"});
    let token = hub::registration::ensure_cluster(hub.store().as_ref(), &name, &spec).await?;
    tokio::spawn(log_failure(
        name.clone(),
        sim::demo::hosts(demo, name, token, 3, shutdown),
    ));
    #[allow(clippy::print_stdout)]
    {
        println!(
            "Demo: {clusters} simulated clusters (demo-1…) and 3 simulated hosts (demo-hosts) are \
             connecting; they are stand-ins from `sim`, not real Kubernetes."
        );
    }
    Ok(())
}

async fn log_failure(name: String, run: impl std::future::Future<Output = anyhow::Result<()>>) {
    if let Err(e) = run.await {
        tracing::error!(cluster = %name, error = %e, "the demo's simulated cluster stopped");
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
