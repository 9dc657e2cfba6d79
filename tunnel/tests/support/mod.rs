//! What only these tests need beyond `tunnel::testing`: a reconnecting agent, a port nobody
//! listens on, and a relay that can go quiet.

// A module of a test crate: `pub` here means "for the test files", not an API.
#![allow(unreachable_pub, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tunnel::{
    AcceptorConfig, AgentSession, Connector, ConnectorConfig, Session, SessionSettings,
    testing::{TestHub, agent_config},
};

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
