//! The Drover hub: the HTTPS server agents dial out to and operators talk to.
//!
//! [`Hub::start`] binds the listener, loads (or creates) the hub's CA and serves until the
//! shutdown token is cancelled; tests start it on port 0 and read the address back.

use std::{net::SocketAddr, sync::Arc};

use tokio::{
    net::TcpListener,
    task::{JoinHandle, JoinSet},
};
use tokio_util::sync::CancellationToken;
use tunnel::{Acceptor, AcceptorConfig, Registry};

pub mod access;
pub mod agents;
pub mod api;
pub mod args;
pub mod audit;
pub mod auth;
pub mod backup;
pub mod bootstrap;
pub mod cli;
pub mod commands;
pub mod config;
pub mod cron;
pub mod dashboard;
pub mod delivery;
pub mod downstream;
mod fsutil;
pub mod grants;
pub mod health;
pub mod hosted;
pub mod identity;
pub mod machines;
pub mod messages;
pub mod metrics;
pub mod model;
pub mod pki;
pub mod planner;
pub mod plans;
pub mod proxy;
pub mod recording;
pub mod refs;
pub mod registration;
pub mod replicas;
pub mod roles;
mod routes;
pub mod store;
pub mod websec;

pub use args::{Command, ConfigError};
pub use config::Config;

/// Why the hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// (The cause is its source: printed after the message, once.)
    #[error("cannot listen on {addr}{}", listen_hint(source))]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    DataDir(#[from] backup::BackupError),
    #[error("cannot open the audit log {path}: {source} (give --audit-log another file, or off)")]
    Audit {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What to do about a listen address that cannot be had.
fn listen_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process holds it: stop that one, or give --listen another address)"
        }
        std::io::ErrorKind::PermissionDenied => {
            " (ports below 1024 need root or CAP_NET_BIND_SERVICE: use a higher port, e.g. --listen 0.0.0.0:8443)"
        }
        std::io::ErrorKind::AddrNotAvailable => {
            " (no interface of this machine has that address: use one it has, or 0.0.0.0)"
        }
        _ => "",
    }
}

/// How long a stopping hub waits for its tasks once the listener has drained.
pub const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A running hub.
#[derive(Debug)]
pub struct Hub {
    addr: SocketAddr,
    url: String,
    ca_checksum: String,
    registry: Registry,
    store: Arc<dyn store::Store>,
    bootstrap_password: Option<String>,
    /// The listener.
    task: JoinHandle<()>,
    /// Controllers, watchers and the leader's work.
    tasks: JoinSet<()>,
    /// The audit log's writer, flushed before the hub stops.
    audit: Arc<audit::Audit>,
}

impl Hub {
    /// Binds, prepares certificates and starts serving; returns once requests are accepted.
    pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Hub, StartError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;
        let url = config.server_url_for(addr.port());
        let names = certificate_names(&config, &url, addr);
        fsutil::owner_only_dir(&config.data_dir).map_err(|source| {
            StartError::Pki(pki::PkiError::Io {
                path: config.data_dir.display().to_string(),
                source,
            })
        })?;
        // One hub per data directory: two would interleave writes to the CA and the store.
        let lock = backup::lock_data_dir(&config.data_dir)?;
        let registry = Registry::default();
        // With etcd, replicas share the CA through the store and call each other over mutual
        // TLS; with SQLite the CA lives in the data directory.
        let (objects, pki, peers, replicas): (Arc<dyn store::Store>, _, _, _) = match &config.store
        {
            config::StoreLocation::Sqlite => {
                let pki = match &config.tls {
                    Some((cert, key)) => pki::from_files(cert, key)?,
                    None => pki::load_or_create(&config.data_dir, &names)?,
                };
                let objects =
                    store::sqlite::SqliteStore::open(&config.data_dir.join(backup::STORE_FILE))?;
                (Arc::new(objects), pki, None, replicas::Replicas::single())
            }
            config::StoreLocation::Etcd(etcd_url) => {
                let etcd = store::etcd::EtcdStore::connect(etcd_url).await?;
                let tls = config.tls.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
                let (pki, peers) = pki::shared(&etcd, &config.data_dir, &names, tls).await?;
                let replica_url = config.replica_url_for(addr);
                let replicas = replicas::Replicas::join(
                    etcd.clone(),
                    replica_url,
                    registry.clone(),
                    shutdown.clone(),
                )
                .await?;
                (Arc::new(etcd), pki, Some(peers.client), replicas)
            }
        };
        // Every task the hub runs besides the listener, joined when it stops.
        let mut tasks = JoinSet::new();
        let known = Arc::new(auth::known::Known::default());
        let store: Arc<dyn store::Store> =
            Arc::new(auth::known::Tracked::new(objects, known.clone()));
        tasks.spawn(known.clone().follow(store.clone(), shutdown.clone()));
        let bootstrap_password = bootstrap::first_admin(store.as_ref()).await?;
        bootstrap::builtin_roles(store.as_ref()).await?;
        // Objects from before references were recorded get them before anything is served
        // (until then they would grant nothing).
        refs::backfill(store.as_ref()).await?;

        let agent_binaries = match &config.agent_binaries {
            Some(dir) => dir.clone(),
            None => std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf))
                .unwrap_or_default(),
        };
        let charts_file = config.data_dir.join(health::charts::FILE);
        let charts = health::charts::Charts::open(&charts_file).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "usage charts are kept in memory until the hub restarts");
            health::charts::Charts::in_memory()
        });
        let health = Arc::new(health::Health::with_charts(
            store.clone(),
            config.heartbeat,
            charts,
        ));
        tasks.spawn(health.clone().run(shutdown.clone()));
        // Every replica serves agents, so every replica keeps the deployments' index.
        let bundles = Arc::new(delivery::index::Index::default());
        tasks.spawn(bundles.clone().run(store.clone(), shutdown.clone()));
        // ... and one watch of the store for all its agents' access streams.
        let access = Arc::new(access::Changes::default());
        tasks.spawn(access.clone().run(store.clone(), shutdown.clone()));
        let dispatch = Arc::new(plans::Dispatch::default());
        tasks.spawn(dispatch.clone().run(store.clone(), shutdown.clone()));
        let acceptor_config = AcceptorConfig {
            routes: tonic::service::Routes::new(
                proto::cluster::v1::cluster_agent_server::ClusterAgentServer::new(
                    agents::FactsService {
                        store: store.clone(),
                        bundles: bundles.clone(),
                        access,
                    },
                ),
            )
            .add_service(proto::health::v1::health_server::HealthServer::new(
                health::HealthService(health.clone()),
            ))
            .add_service(proto::plan::v1::plans_server::PlansServer::new(
                plans::PlansService {
                    store: store.clone(),
                    dispatch: dispatch.clone(),
                    files: config.data_dir.join(plans::FILES_DIR),
                },
            )),
            messages: Some(tunnel::MessageHandler::new(messages::SessionMessages {
                health: health.clone(),
                dispatch: dispatch.clone(),
                reports: Arc::new(plans::Reports::new(store.clone())),
            })),
            ..AcceptorConfig::default()
        };
        let acceptor = Acceptor::new(
            acceptor_config,
            agents::authenticator(store.clone()),
            registry.clone(),
            shutdown.clone(),
        );
        tasks.spawn(agents::run_controllers(
            store.clone(),
            registry.clone(),
            health.clone(),
            shutdown.clone(),
        ));
        // The planner and its controllers run on the leading replica only, writing fenced.
        let planner = planner::Planner {
            store: store.clone(),
            server_url: url.clone(),
            ca_checksum: pki.ca_checksum.clone(),
            ca_pem: pki.ca_pem.to_string(),
            agents: Some(proxy::Agents {
                registry: registry.clone(),
                replicas: replicas.clone(),
                peers: peers.clone(),
            }),
            files: Some(config.data_dir.join(plans::FILES_DIR)),
        };
        let hosted_providers = hosted::cloud_providers();
        // Where the leader keeps its GitRepos' mirrors.
        let git_dir = config.data_dir.join("git");
        tasks.spawn(replicas.clone().lead(
            store.clone(),
            move |store, stop| {
                let planner = planner::Planner {
                    store: store.clone(),
                    ..planner.clone()
                };
                let machines = machines::Controller::new(
                    store.clone(),
                    planner.server_url.clone(),
                    planner.ca_checksum.clone(),
                );
                let hosted = hosted::Controller::new(
                    store.clone(),
                    hosted_providers.clone(),
                    planner.server_url.clone(),
                    planner.ca_checksum.clone(),
                );
                let git_dir = git_dir.clone();
                async move {
                    tokio::join!(
                        planner.run(stop.clone()),
                        machines.run(stop.clone()),
                        hosted.run(stop.clone()),
                        refs::run_collector(store.clone(), stop.clone()),
                        auth::lifetimes::run_sweeper(store.clone(), stop.clone()),
                        auth::providers::run_refresher(store.clone(), stop.clone()),
                        delivery::run(store.clone(), stop.clone()),
                        delivery::git::run(store, git_dir, stop),
                    );
                }
            },
            shutdown.clone(),
        ));
        let audit = audit::Audit::start(&config.audit).map_err(|source| StartError::Audit {
            path: config
                .audit
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source,
        })?;
        let audit = Arc::new(audit);
        let api = api::Api {
            store: store.clone(),
            limiter: Arc::default(),
            known,
            server_url: url.clone(),
            ca_checksum: pki.ca_checksum.clone(),
            ca_pem: pki.ca_pem.clone(),
            streams: auth::streams::Streams::new(config.max_streams_per_user),
            audit: audit.clone(),
            audit_keep: config.audit.keep,
            recordings: Arc::new(recording::Recordings::in_data_dir(&config.data_dir)),
        };
        let app = routes::router(routes::Parts {
            api,
            health,
            acceptor,
            registry: registry.clone(),
            replicas,
            peers,
            ca_pem: pki.ca_pem.clone(),
            downloads: registration::Downloads {
                binaries: agent_binaries,
                artifacts: config.data_dir.join("artifacts"),
            },
        });
        let serve = tunnel::listener::serve_limited(
            listener,
            pki.server_config.clone(),
            app,
            tunnel::listener::Limits {
                max_handshakes: config.max_handshakes,
                max_silent_per_address: config.max_silent_per_address,
            },
            shutdown,
        );
        let task = tokio::spawn(async move {
            serve.await;
            // Released only once the listener has let go.
            drop(lock);
        });
        Ok(Hub {
            addr,
            url,
            ca_checksum: pki.ca_checksum,
            registry,
            store,
            bootstrap_password,
            task,
            tasks,
            audit,
        })
    }

    /// The bootstrap admin password, on the start that created it; never again.
    pub fn bootstrap_password(&self) -> Option<&str> {
        self.bootstrap_password.as_deref()
    }

    /// The hub's store.
    pub fn store(&self) -> &Arc<dyn store::Store> {
        &self.store
    }

    /// The address the listener is bound to (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL agents are told to reach the hub at.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// sha256 of the CA served at `/cacerts`.
    pub fn ca_checksum(&self) -> &str {
        &self.ca_checksum
    }

    /// What `serve` tells the person who started it, on stdout: the first start's admin
    /// password (shown this once, never logged: only its hash is stored), the URL and the CA
    /// checksum agents pin.
    pub fn banner(&self) -> String {
        let mut text = String::new();
        if let Some(password) = self.bootstrap_password() {
            text.push_str(&format!(
                "First start: log in as \"admin\" with password\n\n    {password}\n\n\
                 It is not shown again; `drover-hub reset-admin-password` sets a new one.\n\n"
            ));
        }
        text.push_str(&format!(
            "Drover hub is up\n  URL:          {}\n  listening on: {}\n  CA checksum:  {}\n",
            self.url(),
            self.local_addr(),
            self.ca_checksum()
        ));
        text
    }

    /// Agents connected now.
    pub fn sessions(&self) -> &Registry {
        &self.registry
    }

    /// Waits until the hub has stopped (after its shutdown token was cancelled): the listener
    /// drained, then every task it runs ended; a task still running after
    /// [`STOP_DEADLINE`] is aborted, saying which it was not.
    pub async fn wait(mut self) {
        let _ = self.task.await;
        // The last requests' records reach the file before the process ends.
        self.audit.flushed().await;
        let joined = tokio::time::timeout(STOP_DEADLINE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if joined.is_err() {
            tracing::warn!(
                left = self.tasks.len(),
                "tasks still running {} s after the stop; aborting them",
                STOP_DEADLINE.as_secs()
            );
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
    }
}

/// `drover-hub serve`: starts the hub, prints its banner, starts `alongside` (the demo's
/// simulated fleet; it gets the hub and the shutdown token and must not borrow the hub past
/// its start), and stops on SIGINT or SIGTERM, closing agent sessions and draining requests.
pub async fn serve<F, Fut>(config: Config, alongside: F) -> anyhow::Result<()>
where
    F: FnOnce(&Hub, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use tokio::signal::unix::{SignalKind, signal};
    // Handlers first: a SIGTERM sent as soon as the hub says it is up must stop it cleanly.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let hub = Hub::start(config, shutdown.clone()).await?;
    tracing::info!(
        url = %hub.url(), listen = %hub.local_addr(), ca_checksum = %hub.ca_checksum(),
        "Drover hub is up; agents pin the CA by this checksum"
    );
    alongside(&hub, shutdown.clone()).await?;
    // For people (and scripts) on stdout, after the start's log lines on stderr (which say
    // the same for machines), so that at a terminal the password is the last thing shown.
    #[allow(clippy::print_stdout)]
    {
        print!("{}", hub.banner());
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

/// The names the serving certificate is issued for: the server URL's host, loopback, the
/// listen address, and (with replicas) the host of the replica URL peers verify it by.
fn certificate_names(config: &Config, url: &str, addr: SocketAddr) -> Vec<String> {
    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if let Some(host) = config::url_host(url) {
        names.insert(0, host);
    }
    if !addr.ip().is_unspecified() {
        names.push(addr.ip().to_string());
    }
    if matches!(config.store, config::StoreLocation::Etcd(_))
        && let Some(host) = config::url_host(&config.replica_url_for(addr))
    {
        names.push(host);
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

/// Runs the hub until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), StartError> {
    Hub::start(config, shutdown).await?.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_serve_a_certificate_for_the_name_their_peers_use() {
        let env = std::collections::HashMap::new();
        let argv = |extra: &[&str]| {
            let mut argv = vec!["drover-hub", "serve", "--listen", "0.0.0.0:8443"];
            argv.extend_from_slice(extra);
            argv.into_iter().map(str::to_owned).collect::<Vec<_>>()
        };
        let Ok(Command::Serve(config)) = args::parse(
            argv(&[
                "--store",
                "etcd://10.0.0.5:2379",
                "--replica-url",
                "https://10.0.0.11:8443",
            ]),
            &env,
        ) else {
            panic!("a serve command");
        };
        let addr: SocketAddr = "0.0.0.0:8443".parse().unwrap();
        let names = certificate_names(&config, &config.server_url_for(8443), addr);
        assert!(names.contains(&"10.0.0.11".to_owned()), "{names:?}");
        assert!(names.contains(&"127.0.0.1".to_owned()), "{names:?}");
        // Without replicas, no replica name.
        let Ok(Command::Serve(single)) =
            args::parse(argv(&["--replica-url", "https://10.0.0.11:8443"]), &env)
        else {
            panic!("a serve command");
        };
        let names = certificate_names(&single, &single.server_url_for(8443), addr);
        assert!(!names.contains(&"10.0.0.11".to_owned()), "{names:?}");
    }
}
