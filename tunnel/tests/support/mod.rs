//! A hub and agents in one process on 127.0.0.1:0, plus the TCP servers they dial.

// A module of a test crate: `pub` here means "for the test files", not an API.
#![allow(unreachable_pub)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tunnel::{
    Acceptor, AcceptorConfig, AgentSession, AllowList, AuthError, AuthFuture, Backoff, Connector,
    ConnectorConfig, Peer, Registry, Secret, Session, SessionEvent, SessionSettings,
    tls::{CertificateAuthority, Trust, ca_checksum, server_config},
};

pub const KIND: &str = "test-agent";

/// The credential that proves identity `id` to the test hub.
pub fn token_for(id: &str) -> Secret {
    Secret::new(format!("token-for-{id}"))
}

/// Tests share one CA (generation takes a moment); each hub gets its own serving certificate.
pub fn ca() -> &'static CertificateAuthority {
    static CA: std::sync::OnceLock<CertificateAuthority> = std::sync::OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate("drover test CA").unwrap())
}

pub fn ca_pem() -> &'static str {
    &ca().pem().cert_pem
}

pub fn checksum() -> String {
    ca_checksum(ca_pem().as_bytes())
}

/// Accepts `token-for-<id>` as proof of `<id>`, of whatever kind the agent says.
fn authenticate(parts: &http::request::Parts) -> AuthFuture {
    let token = tunnel::bearer_token(&parts.headers).map(str::to_owned);
    let kind = parts
        .headers
        .get(tunnel::AGENT_KIND_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Box::pin(async move {
        match token.as_deref().and_then(|t| t.strip_prefix("token-for-")) {
            Some(id) => Ok(Peer {
                id: id.to_owned(),
                kind,
            }),
            None => Err(AuthError(
                "unknown agent credential; register the agent again".into(),
            )),
        }
    })
}

pub struct TestHub {
    pub addr: SocketAddr,
    pub registry: Registry,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestHub {
    pub async fn start(config: AcceptorConfig) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), config).await
    }

    pub async fn start_on(addr: SocketAddr, config: AcceptorConfig) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let leaf = ca()
            .issue_server(&["localhost".into(), "127.0.0.1".into()])
            .unwrap();
        let tls = server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).unwrap();
        let shutdown = CancellationToken::new();
        let registry = Registry::default();
        let acceptor = Acceptor::new(config, authenticate, registry.clone(), shutdown.clone());
        let service = tower::service_fn(move |req: Request<hyper::body::Incoming>| {
            let acceptor = acceptor.clone();
            async move {
                let response = match req.uri().path() {
                    "/cacerts" => Response::new(Either::Left(Full::new(Bytes::from(ca_pem())))),
                    "/v3/connect" => acceptor.handle(req).await.map(Either::Right),
                    _ => {
                        let mut r = Response::new(Either::Left(Full::new(Bytes::from_static(
                            b"not found",
                        ))));
                        *r.status_mut() = StatusCode::NOT_FOUND;
                        r
                    }
                };
                Ok::<_, Infallible>(response)
            }
        });
        let task = tokio::spawn(tunnel::listener::serve(
            listener,
            tls,
            service,
            shutdown.clone(),
        ));
        Self {
            addr,
            registry,
            shutdown,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Stops accepting, closes every session, and waits until the listener has let go.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }

    /// The session of agent `id`, once it has completed its handshake.
    pub async fn session(&self, id: &str) -> Session {
        let mut events = self.registry.subscribe();
        if let Some(session) = self.registry.get(id) {
            return session;
        }
        loop {
            if let SessionEvent::Connected(info) = events.recv().await.unwrap() {
                if info.peer.id == id {
                    return self.registry.get(id).unwrap();
                }
            }
        }
    }
}

pub fn agent_config(hub: &TestHub, id: &str) -> ConnectorConfig {
    let identity = Peer {
        id: id.to_owned(),
        kind: KIND.to_owned(),
    };
    let mut config = ConnectorConfig::new(
        hub.url(),
        token_for(id),
        identity,
        Trust::CaChecksum(checksum()),
    );
    config.allow = AllowList::new(["127.0.0.1:*"]).unwrap();
    config.backoff = Backoff {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(500),
    };
    config
}

/// An agent that keeps reconnecting until `stop`.
pub struct TestAgent {
    pub sessions: mpsc::Receiver<AgentSession>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestAgent {
    pub fn start(config: ConnectorConfig) -> Self {
        let connector = Connector::new(config).unwrap();
        let (tx, sessions) = mpsc::channel(4);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(connector.run(tx, shutdown.clone()));
        Self {
            sessions,
            shutdown,
            task,
        }
    }

    pub async fn next_session(&mut self) -> AgentSession {
        self.sessions.recv().await.unwrap()
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

/// Hub and agent `id`, connected; returns the hub's view of the session.
pub async fn connected_pair(
    id: &str,
    hub_config: AcceptorConfig,
    agent_settings: SessionSettings,
) -> (TestHub, TestAgent, Session) {
    let hub = TestHub::start(hub_config).await;
    let mut config = agent_config(&hub, id);
    config.settings = agent_settings;
    let mut agent = TestAgent::start(config);
    agent.next_session().await;
    let session = hub.session(id).await;
    (hub, agent, session)
}

/// A TCP server that echoes every byte back, until dropped.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A port on which nothing listens (bound, read, then released).
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A TCP relay that forwards both ways until `go_quiet`, then holds every connection open
/// without passing another byte: a path that silently stops forwarding.
pub struct QuietRelay {
    pub addr: SocketAddr,
    quiet: Arc<AtomicBool>,
}

impl QuietRelay {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let quiet = Arc::new(AtomicBool::new(false));
        let flag = quiet.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let up = TcpStream::connect(upstream).await.unwrap();
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(forward(dr, uw, flag.clone()));
                tokio::spawn(forward(ur, dw, flag.clone()));
            }
        });
        Self { addr, quiet }
    }

    pub fn go_quiet(&self) {
        self.quiet.store(true, Ordering::SeqCst);
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    quiet: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if quiet.load(Ordering::SeqCst) {
            // Hold both sockets open (they live in this frame), forward nothing, forever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Deterministic bytes for stream `seed`, so each side can check what it got.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
