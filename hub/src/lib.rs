//! The Drover hub: the HTTPS server agents dial out to and operators talk to.
//!
//! [`Hub::start`] binds the listener, loads (or creates) the hub's CA and serves until the
//! shutdown token is cancelled; tests start it on port 0 and read the address back.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::header,
    response::{IntoResponse, Response},
    routing::{any, get},
};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tunnel::{Acceptor, AcceptorConfig, Registry};

pub mod access;
pub mod agents;
pub mod api;
pub mod auth;
pub mod backup;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod cron;
pub mod dashboard;
pub mod downstream;
mod fsutil;
pub mod health;
pub mod identity;
pub mod metrics;
pub mod model;
pub mod pki;
pub mod planner;
pub mod plans;
pub mod proxy;
pub mod refs;
pub mod registration;
pub mod replicas;
pub mod store;
pub mod websec;

pub use config::{Command, Config, ConfigError};

/// Why the hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
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
}

/// What request handlers share.
#[derive(Clone, Debug)]
struct AppState {
    ca_pem: Arc<str>,
    acceptor: Acceptor,
    /// `None` in tests of the plain routes.
    health: Option<Arc<health::Health>>,
    replicas: Arc<replicas::Replicas>,
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    let mut plan_states = std::collections::BTreeMap::new();
    let mut agent_states = Vec::new();
    if let Some(health) = &state.health {
        agent_states = health.agent_states();
        if let Ok((plans, _)) = health
            .store()
            .list(
                model::Kind::Plan.name(),
                &store::LabelSelector::everything(),
            )
            .await
        {
            for plan in plans {
                let state = plan.status["state"].as_str().filter(|s| !s.is_empty());
                *plan_states
                    .entry(state.unwrap_or("pending").to_owned())
                    .or_insert(0) += 1;
            }
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&metrics::Scrape {
            registry: state.acceptor.registry(),
            agent_states,
            plan_states,
            leader: state.replicas.leading().borrow().is_some(),
        }),
    )
        .into_response()
}

/// A running hub.
#[derive(Debug)]
pub struct Hub {
    addr: SocketAddr,
    url: String,
    ca_checksum: String,
    registry: Registry,
    store: Arc<dyn store::Store>,
    bootstrap_password: Option<String>,
    task: JoinHandle<()>,
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
        std::fs::create_dir_all(&config.data_dir).map_err(|source| {
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
        let known = Arc::new(auth::known::Known::default());
        let store: Arc<dyn store::Store> =
            Arc::new(auth::known::Tracked::new(objects, known.clone()));
        tokio::spawn(known.clone().follow(store.clone(), shutdown.clone()));
        let bootstrap_password = bootstrap::first_admin(store.as_ref()).await?;
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
        let health = Arc::new(health::Health::new(store.clone(), config.heartbeat));
        tokio::spawn(health.clone().run(shutdown.clone()));
        let dispatch = Arc::new(plans::Dispatch::default());
        tokio::spawn(dispatch.clone().run(store.clone(), shutdown.clone()));
        let acceptor_config = AcceptorConfig {
            routes: tonic::service::Routes::new(
                proto::cluster::v1::cluster_agent_server::ClusterAgentServer::new(
                    agents::FactsService {
                        store: store.clone(),
                    },
                ),
            )
            .add_service(proto::health::v1::health_server::HealthServer::new(
                health::HealthService(health.clone()),
            ))
            .add_service(proto::plan::v1::plans_server::PlansServer::new(
                plans::PlansService {
                    store: store.clone(),
                    dispatch,
                    files: config.data_dir.join(plans::FILES_DIR),
                },
            )),
            ..AcceptorConfig::default()
        };
        let acceptor = Acceptor::new(
            acceptor_config,
            agents::authenticator(store.clone()),
            registry.clone(),
            shutdown.clone(),
        );
        tokio::spawn(agents::run_controllers(
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
        tokio::spawn(replicas.clone().lead(
            store.clone(),
            move |store, stop| {
                let planner = planner::Planner {
                    store: store.clone(),
                    ..planner.clone()
                };
                async move {
                    tokio::join!(planner.run(stop.clone()), refs::run_collector(store, stop));
                }
            },
            shutdown.clone(),
        ));
        let api = api::Api {
            store: store.clone(),
            limiter: Arc::default(),
            known,
            server_url: url.clone(),
            ca_checksum: pki.ca_checksum.clone(),
            ca_pem: pki.ca_pem.clone(),
            streams: auth::streams::Streams::new(config.max_streams_per_user),
        };
        let app = router(AppState {
            ca_pem: pki.ca_pem.clone(),
            acceptor,
            health: Some(health.clone()),
            replicas: replicas.clone(),
        })
        .merge(api::router(api.clone()))
        .merge(dashboard::router(dashboard::Dash {
            api: api.clone(),
            health: health.clone(),
        }))
        .merge(
            Router::new()
                .route("/v3/register", axum::routing::post(agents::register))
                .route("/v3/import/{file}", get(registration::import_manifest))
                .with_state(api.clone()),
        )
        .merge(
            Router::new()
                .route("/v1/events", get(health::api::events))
                .route("/v1/hosts/{host}/usage", get(health::api::host_usage))
                .route("/v1/clusters/{cluster}/nodes", get(health::api::nodes))
                .route(
                    "/v1/clusters/{cluster}/nodes/{node}/usage",
                    get(health::api::node_usage),
                )
                .with_state(health::api::HealthApi {
                    api: api.clone(),
                    health: health.clone(),
                }),
        )
        .merge(
            Router::new()
                .route(
                    "/system-agent-install.sh",
                    get(registration::install_script),
                )
                .route(
                    "/v3/system-agent/{arch}",
                    get(registration::system_agent_binary),
                )
                .route(
                    "/v3/artifacts/{version}/{file}",
                    get(registration::artifact),
                )
                .with_state(registration::Downloads {
                    binaries: agent_binaries,
                    artifacts: config.data_dir.join("artifacts"),
                }),
        )
        .merge(
            Router::new()
                .route("/k8s/clusters/{cluster}/{*rest}", any(proxy::handle))
                .route(
                    "/v3/relay/{kind}/{cluster}/{service}/{*rest}",
                    any(proxy::relay),
                )
                .route("/v1/clusters/{cluster}/cache/{resource}", get(proxy::cache))
                // Shared, not cloned per request: the proxy's hot path.
                .with_state(Arc::new(proxy::ProxyState {
                    api,
                    registry: registry.clone(),
                    pools: proxy::Pools::default(),
                    replicas: replicas.clone(),
                    peers,
                })),
        );
        let app = app
            .layer(axum::middleware::from_fn(websec::layer))
            .layer(axum::middleware::from_fn(metrics::count_requests));
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

    /// Waits until the hub has stopped (after its shutdown token was cancelled).
    pub async fn wait(self) {
        let _ = self.task.await;
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
    // For people (and scripts) on stdout; the log on stderr says the same for machines.
    #[allow(clippy::print_stdout)]
    {
        print!("{}", hub.banner());
    }
    tracing::info!(
        url = %hub.url(), listen = %hub.local_addr(), ca_checksum = %hub.ca_checksum(),
        "Drover hub is up; agents pin the CA by this checksum"
    );
    alongside(&hub, shutdown.clone()).await?;
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

fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ok\n" }))
        .route("/cacerts", get(cacerts))
        .route("/v3/connect", any(connect))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

async fn cacerts(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/x-pem-file")],
        state.ca_pem.to_string(),
    )
        .into_response()
}

async fn connect(State(state): State<AppState>, request: Request) -> Response {
    state.acceptor.handle(request).await.map(Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    fn app() -> Router {
        let shutdown = CancellationToken::new();
        let refuse_all = |_: &http::request::Parts| -> tunnel::AuthFuture {
            Box::pin(async { Err(tunnel::AuthError("no agents in this test".into())) })
        };
        let acceptor = Acceptor::new(
            AcceptorConfig::default(),
            refuse_all,
            Registry::default(),
            shutdown,
        );
        router(AppState {
            ca_pem: "-----BEGIN CERTIFICATE-----\n".into(),
            acceptor,
            health: None,
            replicas: replicas::Replicas::single(),
        })
    }

    async fn get(path: &str) -> (StatusCode, String) {
        let response = app()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[test]
    fn replicas_serve_a_certificate_for_the_name_their_peers_use() {
        let env = std::collections::HashMap::new();
        let argv = |extra: &[&str]| {
            let mut argv = vec!["drover-hub", "serve", "--listen", "0.0.0.0:8443"];
            argv.extend_from_slice(extra);
            argv.into_iter().map(str::to_owned).collect::<Vec<_>>()
        };
        let Ok(Command::Serve(config)) = config::parse(
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
            config::parse(argv(&["--replica-url", "https://10.0.0.11:8443"]), &env)
        else {
            panic!("a serve command");
        };
        let names = certificate_names(&single, &single.server_url_for(8443), addr);
        assert!(!names.contains(&"10.0.0.11".to_owned()), "{names:?}");
    }

    #[tokio::test]
    async fn health_endpoints_answer_ok() {
        assert_eq!(get("/healthz").await, (StatusCode::OK, "ok\n".into()));
        assert_eq!(get("/readyz").await, (StatusCode::OK, "ok\n".into()));
    }

    #[tokio::test]
    async fn cacerts_serves_the_ca_pem() {
        let (status, body) = get("/cacerts").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[tokio::test]
    async fn connect_without_an_upgrade_says_what_it_expects() {
        let (status, body) = get("/v3/connect").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("WebSocket upgrade"), "{body}");
    }
}
