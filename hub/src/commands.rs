//! What `drover-hub` does for each command, apart from parsing it and printing the outcome
//! (its `main`): serving, the commands on a data directory (a new admin password, backup,
//! restore) and the commands a client sends to a running hub.

use std::path::Path;

use crate::{
    args::{Command, PasswordFrom},
    backup, bootstrap, cli,
    config::StoreLocation,
    store,
};

/// Exit code for a bad flag or variable, as clap uses for a bad command line.
pub const EXIT_USAGE: u8 = 2;

/// How a command failed.
#[derive(Debug)]
pub enum Failure {
    /// Logged (the hub's own errors, with their causes); exit code 1.
    Logged(anyhow::Error),
    /// Told the person on stderr, with this exit code (a client's errors, a bad argument).
    Said { message: String, code: u8 },
}

/// The async runtime every command runs on. The SQLite store does its work on blocking threads,
/// one at a time (one connection): a burst of requests (thousands of hosts registering) would
/// otherwise start hundreds of threads that only wait, each leaving its allocator heap behind.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(16)
        .build()
}

/// Logs to stderr at the level `DROVER_LOG` sets (default `info`), as every Drover process
/// logs; the agents' `agentkit::agent_main` does the same.
pub fn init_logging() {
    init_logging_at("info");
}

/// As [`init_logging`], at `level` unless `DROVER_LOG` says otherwise.
pub fn init_logging_at(level: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DROVER_LOG")
                .unwrap_or_else(|_| level.into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in a journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Runs `command`; what to print on stdout, or how it failed.
pub async fn run(command: Command) -> Result<String, Failure> {
    match command {
        Command::Serve(config) => crate::serve(config, |_, _| async { Ok(()) })
            .await
            .map(|()| String::new())
            .map_err(Failure::Logged),
        Command::ResetAdminPassword { data_dir, store } => {
            reset_admin_password(&data_dir, &store).await
        }
        Command::Backup {
            data_dir,
            store,
            out,
        } => {
            sqlite_only(&store, "backup")?;
            backup(&data_dir, &out).map_err(Failure::Logged)
        }
        Command::Restore {
            data_dir,
            store,
            from,
        } => {
            sqlite_only(&store, "restore")?;
            restore(&data_dir, &from).map_err(Failure::Logged)
        }
        Command::Client {
            mut request,
            config,
            output,
            password: from,
        } => {
            // A provider whose users sign in at its own page needs no password here.
            let browser = match &request {
                cli::Request::Login {
                    server,
                    provider: Some(provider),
                    ..
                } => cli::provider_redirects(server, provider).await,
                _ => false,
            };
            if let Some((password, username)) = request.password_mut().filter(|_| !browser) {
                match from {
                    PasswordFrom::Given => {}
                    PasswordFrom::Stdin => {
                        let mut line = String::new();
                        if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty()
                        {
                            return Err(Failure::Said {
                                message: "--password-stdin: no password on stdin".into(),
                                code: EXIT_USAGE,
                            });
                        }
                        *password = tunnel::Secret::new(line.trim_end_matches(['\r', '\n']));
                    }
                    PasswordFrom::Prompt => {
                        *password = tunnel::Secret::new(ask_password(username)?);
                    }
                }
            }
            cli::run(request, &config, output)
                .await
                .map_err(|e| Failure::Said {
                    message: e.to_string(),
                    code: e.exit_code(),
                })
        }
    }
}

/// A new password for `admin`, in the store the hub serves from: a password written anywhere
/// else would be one the hub never sees.
async fn reset_admin_password(
    data_dir: &Path,
    location: &StoreLocation,
) -> Result<String, Failure> {
    let store: Box<dyn store::Store> = match location {
        StoreLocation::Sqlite => {
            let file = data_dir.join(backup::STORE_FILE);
            if !file.exists() {
                return Err(Failure::Said {
                    message: format!(
                        "no hub state in {}: give the hub's data directory (--data-dir or DROVER_DATA_DIR), or its etcd store (--store or DROVER_STORE)",
                        data_dir.display()
                    ),
                    code: 1,
                });
            }
            Box::new(store::sqlite::SqliteStore::open(&file).map_err(logged)?)
        }
        StoreLocation::Etcd(url) => {
            Box::new(store::etcd::EtcdStore::connect(url).await.map_err(logged)?)
        }
    };
    let password = bootstrap::reset_admin_password(store.as_ref())
        .await
        .map_err(logged)?;
    Ok(format!(
        "New password for \"admin\":\n\n    {password}\n\nIt is not shown again.\n"
    ))
}

fn logged(e: impl Into<anyhow::Error>) -> Failure {
    Failure::Logged(e.into())
}

/// Backup and restore work on a data directory's SQLite store; etcd has its own.
fn sqlite_only(location: &StoreLocation, command: &str) -> Result<(), Failure> {
    match location {
        StoreLocation::Sqlite => Ok(()),
        StoreLocation::Etcd(url) => Err(Failure::Said {
            message: format!(
                "this hub's objects and CA are in etcd ({url}), not in its data directory: {command} etcd itself (`etcdctl snapshot save` / `etcdutl snapshot restore`; see docs/ha-etcd.md)"
            ),
            code: 1,
        }),
    }
}

fn backup(data_dir: &Path, out: &Path) -> anyhow::Result<String> {
    let summary = backup::backup(data_dir, out)?;
    Ok(format!(
        "Backup written to {}: {summary}.\nIt holds the hub's CA key: keep it as secret as the data directory.\n",
        out.display()
    ))
}

fn restore(data_dir: &Path, from: &Path) -> anyhow::Result<String> {
    let restored = backup::restore(data_dir, from)?;
    let mut text = format!(
        "Restored {} from {}: {}.\n",
        data_dir.display(),
        from.display(),
        restored.summary
    );
    if let Some(previous) = &restored.previous {
        text.push_str(&format!(
            "The state it replaced is in {}; delete it once the hub runs as it should.\n",
            previous.display()
        ));
    }
    Ok(text)
}

/// `username`'s password, asked for at the terminal without echoing it; refused (saying how
/// else to give it) when stdin is not a terminal, as in a script.
fn ask_password(username: &str) -> Result<String, Failure> {
    use std::io::{BufRead, IsTerminal, Write};

    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let refused = |why: String| Failure::Said {
        message: why,
        code: EXIT_USAGE,
    };
    if !std::io::stdin().is_terminal() {
        return Err(refused(
            "no password: give it on stdin with --password-stdin (login also reads DROVER_PASSWORD), or run this at a terminal to be asked".into(),
        ));
    }
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| refused(format!("cannot ask for the password at /dev/tty: {e}")))?;
    let saved =
        tcgetattr(&tty).map_err(|e| refused(format!("cannot ask for the password: {e}")))?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    let mut line = String::new();
    let asked = (|| -> std::io::Result<()> {
        write!(&tty, "Password for {username}: ")?;
        tcsetattr(&tty, OptionalActions::Now, &quiet)?;
        std::io::BufReader::new(&tty).read_line(&mut line)?;
        Ok(())
    })();
    // The echo comes back whatever happened.
    let _ = tcsetattr(&tty, OptionalActions::Now, &saved);
    let _ = writeln!(&tty);
    asked.map_err(|e| refused(format!("cannot read the password: {e}")))?;
    let password = line.trim_end_matches(['\r', '\n']).to_owned();
    if password.is_empty() {
        return Err(refused("no password given".into()));
    }
    Ok(password)
}
