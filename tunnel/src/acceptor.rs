//! The hub's end: `/v3/connect` upgrade requests become sessions.
//!
//! The credential is checked before the upgrade is answered, so a bad one gets a 401 and no
//! session ever exists. After the upgrade, the agent must say `Hello` on the control channel
//! (protocol version and identity) within the handshake timeout before its session is
//! registered and can carry traffic.

use std::{
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header, request::Parts};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use proto::tunnel::v1::{
    HelloReply, HelloRequest,
    handshake_server::{Handshake, HandshakeServer},
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::{
    allow::AllowList,
    inbound::{Control, Inbound, Services},
    listener::RemoteAddr,
    messages::{MESSAGES_HEADER, MessageHandler, Messenger, OnMessage, SESSION_MESSAGES},
    registry::Registry,
    session::{Ending, Peer, Session, SessionInfo, SessionSettings},
    ws::{self, Role},
};

/// Why the hub refused an agent's credential. The message goes back to the agent in the 401
/// body, so it must say what to fix and must not echo the credential.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct AuthError(pub String);

/// Whom an upgrade request comes from, and which credential proved it.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub peer: Peer,
    /// The name of the credential that proved it (never its secret): revoking that credential
    /// closes the sessions it opened, and only those ([`SessionInfo::credential`]).
    pub credential: Option<Arc<str>>,
}

impl From<Peer> for Authenticated {
    fn from(peer: Peer) -> Self {
        Self {
            peer,
            credential: None,
        }
    }
}

/// The boxed future an [`Authenticate`] implementation returns.
pub type AuthFuture = Pin<Box<dyn Future<Output = Result<Authenticated, AuthError>> + Send>>;

/// Decides who an upgrade request comes from, by its headers (the agent sends
/// `Authorization: Bearer <credential>`, `X-Drover-Agent-Id` and `X-Drover-Agent-Kind`).
pub trait Authenticate: Send + Sync + 'static {
    fn authenticate(&self, request: &Parts) -> AuthFuture;
}

impl<F> Authenticate for F
where
    F: Fn(&Parts) -> AuthFuture + Send + Sync + 'static,
{
    fn authenticate(&self, request: &Parts) -> AuthFuture {
        self(request)
    }
}

/// Header carrying the identity an agent claims; the credential must prove it.
pub const AGENT_ID_HEADER: &str = "x-drover-agent-id";
/// Header carrying the agent's kind.
pub const AGENT_KIND_HEADER: &str = "x-drover-agent-kind";

/// The bearer token of a request, if it has one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// What the hub's end needs besides the authenticator.
#[derive(Debug, Clone)]
pub struct AcceptorConfig {
    pub settings: SessionSettings,
    /// The hub's build, reported to agents in `HelloReply`.
    pub hub_version: String,
    /// Time an agent has after the upgrade to complete `Hello`.
    pub handshake_timeout: Duration,
    /// Extra gRPC services the hub offers on every session's control channel.
    pub routes: tonic::service::Routes,
    /// What agents may ask the hub to dial. Nothing, by default.
    pub allow: AllowList,
    /// In-process services agents may open streams to.
    pub services: Services,
    /// Takes messages on the session itself (see `messages`: heartbeats, plan watches) from
    /// agents that offer them; `None`: agents make calls instead.
    pub messages: Option<MessageHandler>,
}

impl Default for AcceptorConfig {
    fn default() -> Self {
        Self {
            settings: SessionSettings::default(),
            hub_version: env!("CARGO_PKG_VERSION").to_owned(),
            handshake_timeout: Duration::from_secs(10),
            routes: tonic::service::Routes::default(),
            allow: AllowList::none(),
            services: Services::default(),
            messages: None,
        }
    }
}

/// Accepts agents' tunnels. Cheap to clone; mount [`Acceptor::handle`] at `/v3/connect`.
#[derive(Clone)]
pub struct Acceptor {
    inner: Arc<Inner>,
}

struct Inner {
    config: AcceptorConfig,
    /// The configured gRPC services plus the handshake, built once: every session's control
    /// channel shares them (building a router per session cost about 4 KiB a session).
    routes: tonic::service::Routes,
    auth: Box<dyn Authenticate>,
    registry: Registry,
    shutdown: CancellationToken,
}

impl fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acceptor")
            .field("sessions", &self.inner.registry.len())
            .finish_non_exhaustive()
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, message: &str) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl Acceptor {
    /// Sessions end when `shutdown` is cancelled.
    pub fn new(
        config: AcceptorConfig,
        auth: impl Authenticate,
        registry: Registry,
        shutdown: CancellationToken,
    ) -> Self {
        let routes = config
            .routes
            .clone()
            .add_service(HandshakeServer::new(HandshakeService {
                hub_version: config.hub_version.clone(),
            }));
        Self {
            inner: Arc::new(Inner {
                config,
                routes,
                auth: Box::new(auth),
                registry,
                shutdown,
            }),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Answers one upgrade request: 400/426 if it is not a WebSocket upgrade, 401 if the
    /// credential is refused, otherwise 101 and a session on the upgraded connection.
    pub async fn handle<B>(&self, request: Request<B>) -> Reply {
        let (mut parts, _body) = request.into_parts();
        let key = match check_upgrade(&parts) {
            Ok(key) => key,
            Err(response) => return *response,
        };
        let remote = parts.extensions.get::<RemoteAddr>().map(|r| r.0);
        let authenticated = match self.inner.auth.authenticate(&parts).await {
            Ok(authenticated) => authenticated,
            Err(e) => {
                tracing::info!(remote = ?remote, reason = %e, "tunnel credential refused");
                return reply(StatusCode::UNAUTHORIZED, &e.0);
            }
        };
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "this listener cannot upgrade connections (serve it with upgrades enabled)",
            );
        };
        let offered = parts
            .headers
            .get(MESSAGES_HEADER)
            .is_some_and(|v| v.as_bytes() == SESSION_MESSAGES.as_bytes());
        let messages = self
            .inner
            .config
            .messages
            .as_ref()
            .filter(|_| offered)
            .map(|handler| handler.0.clone());
        let accepts_messages = messages.is_some();
        let this = self.clone();
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(upgraded) => {
                    this.run_session(TokioIo::new(upgraded), authenticated, remote, messages)
                        .await;
                }
                Err(e) => {
                    tracing::info!(peer = %authenticated.peer.id, error = %e, "tunnel upgrade failed")
                }
            }
        });
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(
            header::CONNECTION,
            http::HeaderValue::from_static("upgrade"),
        );
        headers.insert(header::UPGRADE, http::HeaderValue::from_static("websocket"));
        if let Ok(accept) = http::HeaderValue::from_str(&ws::accept_key(&key)) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if accepts_messages {
            headers.insert(
                MESSAGES_HEADER,
                http::HeaderValue::from_static(SESSION_MESSAGES),
            );
        }
        response
    }

    /// Starts the session and waits for its `Hello`; returns it once registered. From then on
    /// the session's own driver takes it out of the registry when it ends, and the hub's
    /// shutdown closes it: no task per connected agent waits for that.
    pub(crate) async fn run_session<S>(
        &self,
        io: S,
        authenticated: Authenticated,
        remote: Option<SocketAddr>,
        messages: Option<Arc<dyn OnMessage>>,
    ) -> Option<Session>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let config = &self.inner.config;
        let shutdown = &self.inner.shutdown;
        let (hello_tx, hello_rx) = oneshot::channel();
        let mut extensions = http::Extensions::new();
        extensions.insert(HelloSlot(Arc::new(Mutex::new(Some(hello_tx)))));
        let inbound = Inbound {
            allow: config.allow.clone(),
            dial_timeout: config.settings.dial_timeout,
            control: Some(Control {
                routes: self.inner.routes.clone(),
                extensions,
            }),
            services: config.services.clone(),
        };
        let mut info = SessionInfo::new(authenticated.peer, remote);
        info.credential = authenticated.credential;
        let messages = messages.map(|handler| (handler, Messenger::new()));
        let registry = self.inner.registry.clone();
        let ending = Ending {
            close: shutdown.child_token(),
            then: Box::new(move |info, reason| registry.remove(info, reason)),
        };
        let session = Session::spawn(
            io,
            Role::Server,
            config.settings,
            info,
            inbound,
            messages,
            Some(ending),
        );
        let id = session.info().id;
        let peer_id = session.info().peer.id.clone();

        let hello = tokio::select! {
            hello = tokio::time::timeout(config.handshake_timeout, hello_rx) => hello,
            reason = session.ended() => {
                tracing::info!(session = id, peer = %peer_id, %reason, "tunnel session ended before Hello");
                return None;
            }
            // The session's close token is a child of `shutdown`: it is closing already.
            () = shutdown.cancelled() => return None,
        };
        let Ok(Ok(hello)) = hello else {
            tracing::warn!(
                session = id, peer = %peer_id,
                "no valid Hello within {:?}; closing the session", config.handshake_timeout
            );
            session.close();
            return None;
        };
        tracing::info!(
            session = id, peer = %peer_id, kind = %hello.kind, agent_version = %hello.agent_version,
            remote = ?remote, "tunnel session connected"
        );
        self.inner.registry.insert(session.clone());
        // The driver marks the session ended before it removes it: an end that came before
        // the insert above found nothing to remove, so it is removed here.
        if session.is_ended() {
            let reason = session.ended().await;
            self.inner.registry.remove(session.info(), &reason);
            return None;
        }
        Some(session)
    }
}

/// Checks the request is a WebSocket upgrade and returns its `Sec-WebSocket-Key`.
fn check_upgrade(parts: &Parts) -> Result<String, Box<Reply>> {
    let has_token = |name: header::HeaderName, token: &str| {
        parts.headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if parts.method != http::Method::GET
        || !has_token(header::CONNECTION, "upgrade")
        || !has_token(header::UPGRADE, "websocket")
    {
        return Err(Box::new(reply(
            StatusCode::BAD_REQUEST,
            "this endpoint takes a WebSocket upgrade (GET with Connection: Upgrade, Upgrade: websocket) from a Drover agent",
        )));
    }
    if parts
        .headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        let mut response = reply(
            StatusCode::UPGRADE_REQUIRED,
            "only WebSocket version 13 is supported",
        );
        response.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            http::HeaderValue::from_static("13"),
        );
        return Err(Box::new(response));
    }
    parts
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| {
            Box::new(reply(
                StatusCode::BAD_REQUEST,
                "missing Sec-WebSocket-Key header",
            ))
        })
}

/// Where the handshake service reports a valid `Hello` to the session that is waiting for it.
#[derive(Clone)]
struct HelloSlot(Arc<Mutex<Option<oneshot::Sender<HelloRequest>>>>);

struct HandshakeService {
    hub_version: String,
}

#[tonic::async_trait]
impl Handshake for HandshakeService {
    async fn hello(
        &self,
        request: tonic::Request<HelloRequest>,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        let info = request
            .extensions()
            .get::<SessionInfo>()
            .cloned()
            .ok_or_else(|| tonic::Status::internal("control channel without a session"))?;
        let slot = request.extensions().get::<HelloSlot>().cloned();
        let hello = request.into_inner();
        if hello.protocol_version != proto::TUNNEL_PROTOCOL_VERSION {
            return Err(tonic::Status::failed_precondition(format!(
                "incompatible tunnel protocol: this hub speaks version {}, the {} speaks version {}; \
                 install the {} from this hub's release",
                proto::TUNNEL_PROTOCOL_VERSION,
                hello.kind,
                hello.protocol_version,
                hello.kind
            )));
        }
        if hello.agent_id != info.peer.id || hello.kind != info.peer.kind {
            return Err(tonic::Status::permission_denied(format!(
                "the credential is for {} ({}), but the agent says it is {} ({})",
                info.peer.id, info.peer.kind, hello.agent_id, hello.kind
            )));
        }
        let sender = slot.and_then(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()).take());
        match sender {
            Some(sender) => {
                let _ = sender.send(hello);
            }
            None => {
                return Err(tonic::Status::failed_precondition(
                    "Hello was already completed on this session",
                ));
            }
        }
        Ok(tonic::Response::new(HelloReply {
            protocol_version: proto::TUNNEL_PROTOCOL_VERSION,
            hub_version: self.hub_version.clone(),
            session_id: info.id.to_string(),
        }))
    }
}
