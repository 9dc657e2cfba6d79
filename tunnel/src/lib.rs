//! Drover's tunnel: the one multiplexed, encrypted connection each agent dials out to the hub.
//!
//! Layers, bottom up: TCP, TLS (rustls, [`tls`]), a WebSocket (`/v3/connect`), yamux (every
//! logical connection a stream with its own credit window), and on each stream a typed header:
//! a dial to `tcp/HOST:PORT` (acknowledged, checked against the accepting side's allow-list),
//! one gRPC call of the control plane ([`Channel`]), or a named in-process service of the
//! accepting side. The hub side is an [`Acceptor`] mounted on the hub's
//! [`listener`]; the agent side is a [`Connector`]. This crate knows nothing of roles: who may
//! connect and what an agent is are decided by the code that embeds it.

mod acceptor;
mod allow;
mod backoff;
mod call;
mod connector;
mod header;
mod inbound;
pub mod listener;
mod messages;
pub mod metrics;
pub mod pool;
mod proxy;
mod registry;
mod session;
// An authenticator that accepts anyone who asks: only for tests and benchmarks, never built
// into a production binary.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
mod ws;

pub use acceptor::{
    AGENT_ID_HEADER, AGENT_KIND_HEADER, Acceptor, AcceptorConfig, AuthError, AuthFuture,
    Authenticate, Authenticated, bearer_token,
};
pub use allow::{AllowList, BadEntry};
pub use backoff::Backoff;
pub use call::{CallBody, CallError, Channel};
pub use connector::{AgentSession, ConnectError, Connector, ConnectorConfig, Secret};
pub use header::decode_header;
pub use inbound::Services;
pub use messages::{
    Conversation, MESSAGES_HEADER, MessageHandler, Messenger, NotSent, OnMessage, SESSION_MESSAGES,
};
pub use proxy::{ProxyError, ProxySettings, percent_decode};
pub use registry::{Registry, SessionEvent};
pub use session::{
    DialError, DialErrorKind, Peer, Session, SessionInfo, SessionSettings, TunnelStream,
};
pub use ws::WsSettings;

/// A token cancelled on SIGTERM or Ctrl-C: how the agents' and tools' mains stop cleanly.
pub fn shutdown_on_signal() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        stop.cancel();
    });
    shutdown
}
