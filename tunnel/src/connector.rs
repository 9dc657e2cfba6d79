//! The agent's end: dial `wss://HUB/v3/connect`, prove who we are, say `Hello`, and keep
//! doing so: when a session ends, reconnect with capped exponential backoff and full jitter,
//! resolving the hub's name anew on every attempt.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use proto::tunnel::v1::{HelloReply, HelloRequest, handshake_client::HandshakeClient};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use tokio::{net::TcpStream, sync::mpsc};
use tokio_rustls::{TlsConnector, client::TlsStream};
use tokio_util::sync::CancellationToken;

use crate::{
    acceptor::{AGENT_ID_HEADER, AGENT_KIND_HEADER},
    allow::AllowList,
    backoff::Backoff,
    call::Channel,
    inbound::{Control, Inbound, Services},
    messages::{Conversation, MESSAGES_HEADER, SESSION_MESSAGES},
    proxy::{ProxyError, ProxySettings},
    session::{DialError, Peer, Session, SessionInfo, SessionSettings},
    tls::{self, Trust},
    ws::{self, Role},
};

/// Largest `/cacerts` body accepted.
const MAX_CACERTS_LEN: usize = 1024 * 1024;
fn request_path<B>(request: &http::Request<B>) -> String {
    request
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default()
}

/// Largest refusal body read from a failed upgrade.
const MAX_REFUSAL_LEN: usize = 64 * 1024;

/// A credential that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Everything an agent needs to hold a session to the hub.
#[derive(Debug, Clone)]
pub struct ConnectorConfig {
    /// The hub: `https://HOST[:PORT]` or `wss://HOST[:PORT]/v3/connect`; or several hub
    /// replicas' URLs, comma-separated, tried in turn (the next one after a failed attempt).
    pub url: String,
    /// Sent as `Authorization: Bearer …` in the upgrade request.
    pub credential: Secret,
    /// Who this agent is; the hub checks the credential proves it.
    pub identity: Peer,
    /// This agent's build, reported in `Hello`.
    pub agent_version: String,
    pub trust: Trust,
    /// What the hub may ask this agent to dial.
    pub allow: AllowList,
    pub settings: SessionSettings,
    pub backoff: Backoff,
    /// Bound on one attempt: TCP, TLS, WebSocket upgrade and `Hello`.
    pub connect_timeout: Duration,
    /// gRPC services this agent offers the hub on control streams the hub opens.
    pub routes: Option<tonic::service::Routes>,
    /// In-process services the hub may open streams to.
    pub services: Services,
    /// The local address to connect from (port chosen by the system); `None`: the system's
    /// choice. A fleet simulator spreads thousands of agents over 127.0.0.0/8 with it, so one
    /// address's ephemeral ports do not run out.
    pub local_address: Option<std::net::IpAddr>,
    /// The HTTP proxy to reach the hub through (`HTTPS_PROXY`, `NO_PROXY`), if any.
    pub proxy: ProxySettings,
    /// The protocol version sent in `Hello`. Only tests change it.
    #[doc(hidden)]
    pub protocol_version: u32,
}

impl ConnectorConfig {
    pub fn new(url: impl Into<String>, credential: Secret, identity: Peer, trust: Trust) -> Self {
        Self {
            url: url.into(),
            credential,
            identity,
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            trust,
            allow: AllowList::none(),
            settings: SessionSettings::default(),
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(30),
            routes: None,
            services: Services::default(),
            local_address: None,
            proxy: ProxySettings::none(),
            protocol_version: proto::TUNNEL_PROTOCOL_VERSION,
        }
    }
}

/// Why one connection attempt failed. Each message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("hub URL {url:?} is not usable: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot reach the hub at {authority}: {source}")]
    Unreachable {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the hub at {authority} {source}")]
    Proxy {
        authority: String,
        #[source]
        source: ProxyError,
    },
    #[error(
        "CA checksum mismatch: the hub at {authority} serves a CA whose sha256 is {actual}, \
         but this agent was given {expected}; check the --ca-checksum the agent was installed with"
    )]
    CaChecksumMismatch {
        authority: String,
        expected: String,
        actual: String,
    },
    #[error("cannot fetch the hub's CA from https://{authority}/cacerts: {reason}")]
    CaFetch { authority: String, reason: String },
    #[error("TLS with the hub at {authority} failed: {source}{hint}")]
    Tls {
        authority: String,
        #[source]
        source: std::io::Error,
        /// What to set, when the cause is one an operator meets (empty otherwise).
        hint: &'static str,
    },
    #[error("the hub refused this agent's credential (HTTP {status}): {message}")]
    Unauthorized { status: u16, message: String },
    #[error("WebSocket upgrade at {url} failed: {reason}")]
    Upgrade { url: String, reason: String },
    #[error("the hub refused the handshake: {0}")]
    Handshake(String),
    #[error("the session ended during the handshake: {0}")]
    Session(#[from] DialError),
    #[error("no usable trust roots: {0}")]
    Trust(#[from] tls::TlsError),
    #[error("connecting took longer than {0:?}")]
    TimedOut(Duration),
}

/// The CAs this process fetched from `/cacerts` and found to match a checksum, by checksum: the
/// same checksum is the same PEM, so connectors that pin it (a fleet simulator's agents, an
/// agent's connector made anew) fetch it once per process, not once each — at 10,000 agents
/// that was a TLS handshake more per agent.
fn verified_cas()
-> std::sync::MutexGuard<'static, std::collections::HashMap<String, Arc<ClientConfig>>> {
    static VERIFIED: std::sync::OnceLock<
        Mutex<std::collections::HashMap<String, Arc<ClientConfig>>>,
    > = std::sync::OnceLock::new();
    VERIFIED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A session to the hub that has completed `Hello`.
#[derive(Debug, Clone)]
pub struct AgentSession {
    pub session: Session,
    /// gRPC to the hub; each call is a stream of its own in the session.
    pub channel: Channel,
    pub hello: HelloReply,
    /// Messages on the session itself (heartbeats, plans), if the hub takes them (see
    /// `messages`).
    pub messages: Option<Conversation>,
}

/// Connects an agent to the hub. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ConnectorConfig,
    /// One per hub URL; attempts go to `targets[current]`.
    targets: Vec<Target>,
    current: std::sync::atomic::AtomicUsize,
    /// Roots proven by the CA checksum (or given), kept for later attempts.
    roots: Mutex<Option<Arc<ClientConfig>>>,
}

#[derive(Debug)]
struct Target {
    host: String,
    port: u16,
    authority: String,
    path: String,
    ws_url: String,
}

impl Target {
    fn parse(url: &str) -> Result<Self, ConnectError> {
        let bad = |reason: &str| ConnectError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|_| bad("expected https://HOST[:PORT]"))?;
        match uri.scheme_str() {
            Some("https" | "wss") => {}
            _ => {
                return Err(bad(
                    "the scheme must be https:// (or wss://); the tunnel always uses TLS",
                ));
            }
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?.to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let path = match uri.path() {
            "" | "/" => "/v3/connect",
            p => p,
        };
        Ok(Self {
            ws_url: format!("wss://{authority}{path}"),
            path: path.to_owned(),
            host,
            port,
            authority,
        })
    }

    fn server_name(&self) -> Result<ServerName<'static>, ConnectError> {
        ServerName::try_from(self.host.clone()).map_err(|_| ConnectError::InvalidUrl {
            url: self.ws_url.clone(),
            reason: "the host is not a valid DNS name or IP address".to_owned(),
        })
    }
}

impl Connector {
    pub fn new(config: ConnectorConfig) -> Result<Self, ConnectError> {
        let targets = config
            .url
            .split(',')
            .map(|url| Target::parse(url.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let roots = match &config.trust {
            Trust::CaChecksum(_) => None,
            Trust::CaPem(pem) => Some(tls::client_config(tls::roots_from_pem(pem)?)),
            Trust::SystemRoots => Some(tls::client_config(tls::system_roots()?)),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                targets,
                current: std::sync::atomic::AtomicUsize::new(0),
                roots: Mutex::new(roots),
            }),
        })
    }

    pub fn config(&self) -> &ConnectorConfig {
        &self.inner.config
    }

    /// The hub URL attempts go to now.
    fn target(&self) -> &Target {
        let i = self
            .inner
            .current
            .load(std::sync::atomic::Ordering::Relaxed);
        &self.inner.targets[i % self.inner.targets.len()]
    }

    /// After a failed attempt: the next hub URL, if several were given.
    fn next_target(&self) {
        self.inner
            .current
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// One attempt: connect, authenticate, `Hello`.
    pub async fn connect(&self) -> Result<AgentSession, ConnectError> {
        let timeout = self.inner.config.connect_timeout;
        tokio::time::timeout(timeout, self.connect_unbounded())
            .await
            .map_err(|_| ConnectError::TimedOut(timeout))?
    }

    async fn connect_unbounded(&self) -> Result<AgentSession, ConnectError> {
        let config = &self.inner.config;
        let target = self.target();
        let tls_config = self.tls_config().await?;
        let tls = match self.open_tls(tls_config).await {
            Ok(tls) => tls,
            Err(e) => {
                // A pinned CA may have been replaced by one with the same checksum only in
                // theory; forget it so the next attempt re-fetches and re-checks.
                if matches!(config.trust, Trust::CaChecksum(_))
                    && matches!(e, ConnectError::Tls { .. })
                {
                    self.forget_roots();
                }
                return Err(e);
            }
        };

        let (upgraded, hub_takes_messages) = self.upgrade(tls).await?;

        let hub = Peer {
            id: target.authority.clone(),
            kind: "hub".to_owned(),
        };
        let inbound = Inbound {
            allow: config.allow.clone(),
            dial_timeout: config.settings.dial_timeout,
            control: config.routes.clone().map(|routes| Control {
                routes,
                extensions: http::Extensions::new(),
            }),
            services: config.services.clone(),
        };
        let (conversation, messages) = if hub_takes_messages {
            let (conversation, handler, messenger) = Conversation::new();
            (Some(conversation), Some((handler, messenger)))
        } else {
            (None, None)
        };
        let session = Session::spawn(
            TokioIo::new(upgraded),
            Role::Client,
            config.settings,
            SessionInfo::new(hub, None),
            inbound,
            messages,
            None,
        );
        match self.hello(&session).await {
            Ok((channel, hello)) => Ok(AgentSession {
                session,
                channel,
                hello,
                messages: conversation,
            }),
            Err(e) => {
                session.close();
                Err(e)
            }
        }
    }

    /// Sends the WebSocket upgrade request carrying our credential; returns the upgraded
    /// connection and whether the hub takes messages (see `messages`), or the hub's refusal.
    async fn upgrade(
        &self,
        tls: TlsStream<TcpStream>,
    ) -> Result<(hyper::upgrade::Upgraded, bool), ConnectError> {
        let config = &self.inner.config;
        let target = self.target();
        let failed = |reason: String| ConnectError::Upgrade {
            url: target.ws_url.clone(),
            reason,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| failed(e.to_string()))?;
        tokio::spawn(conn.with_upgrades());
        let key = ws::new_key();
        let request = http::Request::get(target.path.as_str())
            .header(header::HOST, &target.authority)
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, &key)
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", config.credential.expose()),
            )
            .header(AGENT_ID_HEADER, &config.identity.id)
            .header(AGENT_KIND_HEADER, &config.identity.kind)
            .header(MESSAGES_HEADER, SESSION_MESSAGES)
            .body(Empty::<Bytes>::new())
            .map_err(|_| {
                failed("the credential or identity holds characters not allowed in a header".into())
            })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        if status != http::StatusCode::SWITCHING_PROTOCOLS {
            let body = Limited::new(response.into_body(), MAX_REFUSAL_LEN)
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
                .unwrap_or_default();
            return Err(match status.as_u16() {
                code @ (401 | 403) => ConnectError::Unauthorized {
                    status: code,
                    message: body,
                },
                code => failed(format!("HTTP {code}: {body}")),
            });
        }
        let accepted = response
            .headers()
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .and_then(|v| v.to_str().ok());
        if accepted != Some(ws::accept_key(&key).as_str()) {
            return Err(failed(
                "the answer's Sec-WebSocket-Accept does not match our key".into(),
            ));
        }
        let takes_messages = response
            .headers()
            .get(MESSAGES_HEADER)
            .is_some_and(|v| v.as_bytes() == SESSION_MESSAGES.as_bytes());
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok((upgraded, takes_messages))
    }

    async fn hello(&self, session: &Session) -> Result<(Channel, HelloReply), ConnectError> {
        let config = &self.inner.config;
        hello_on(
            session,
            HelloRequest {
                agent_id: config.identity.id.clone(),
                kind: config.identity.kind.clone(),
                protocol_version: config.protocol_version,
                agent_version: config.agent_version.clone(),
            },
        )
        .await
    }

    fn lock_roots(&self) -> std::sync::MutexGuard<'_, Option<Arc<ClientConfig>>> {
        self.inner.roots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the CA fetched under this connector's checksum, here and process-wide.
    fn forget_roots(&self) {
        *self.lock_roots() = None;
        if let Trust::CaChecksum(expected) = &self.inner.config.trust {
            verified_cas().remove(&expected.trim().to_ascii_lowercase());
        }
    }

    /// The client config to verify the hub with; under a CA checksum, fetched and checked first.
    async fn tls_config(&self) -> Result<Arc<ClientConfig>, ConnectError> {
        if let Some(config) = self.lock_roots().clone() {
            return Ok(config);
        }
        let Trust::CaChecksum(expected) = &self.inner.config.trust else {
            unreachable!("roots are set at construction for every other kind of trust")
        };
        let key = expected.trim().to_ascii_lowercase();
        if let Some(config) = verified_cas().get(&key).cloned() {
            *self.lock_roots() = Some(config.clone());
            return Ok(config);
        }
        let pem = self.fetch_cacerts().await?;
        let actual = tls::ca_checksum(&pem);
        if !actual.eq_ignore_ascii_case(expected.trim()) {
            return Err(ConnectError::CaChecksumMismatch {
                authority: self.target().authority.clone(),
                expected: expected.clone(),
                actual,
            });
        }
        let roots: RootCertStore = tls::roots_from_pem(&pem)?;
        let config = tls::client_config(roots);
        *self.lock_roots() = Some(config.clone());
        verified_cas().insert(key, config.clone());
        Ok(config)
    }

    async fn open_tls(
        &self,
        config: Arc<ClientConfig>,
    ) -> Result<TlsStream<TcpStream>, ConnectError> {
        let target = self.target();
        let unreachable = |source| ConnectError::Unreachable {
            authority: target.authority.clone(),
            source,
        };
        let through_proxy = self
            .inner
            .config
            .proxy
            .connect(&target.host, target.port, self.inner.config.connect_timeout)
            .await;
        let tcp = if let Some(result) = through_proxy {
            result.map_err(|source| ConnectError::Proxy {
                authority: target.authority.clone(),
                source,
            })?
        } else {
            // Connecting by name resolves it again on every attempt.
            match self.inner.config.local_address {
                None => TcpStream::connect((target.host.as_str(), target.port))
                    .await
                    .map_err(unreachable)?,
                Some(local) => {
                    let mut last = None;
                    let mut connected = None;
                    for addr in tokio::net::lookup_host((target.host.as_str(), target.port))
                        .await
                        .map_err(unreachable)?
                        .filter(|a| a.is_ipv4() == local.is_ipv4())
                    {
                        let socket = if local.is_ipv4() {
                            tokio::net::TcpSocket::new_v4()
                        } else {
                            tokio::net::TcpSocket::new_v6()
                        }
                        .map_err(unreachable)?;
                        socket
                            .bind(std::net::SocketAddr::new(local, 0))
                            .map_err(unreachable)?;
                        match socket.connect(addr).await {
                            Ok(tcp) => {
                                connected = Some(tcp);
                                break;
                            }
                            Err(e) => last = Some(e),
                        }
                    }
                    connected.ok_or_else(|| {
                        unreachable(last.unwrap_or_else(|| {
                            std::io::Error::new(
                                std::io::ErrorKind::AddrNotAvailable,
                                format!("no address of the hub's family to reach from {local}"),
                            )
                        }))
                    })?
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        TlsConnector::from(config)
            .connect(target.server_name()?, tcp)
            .await
            .map_err(|source| {
                // A hub with its own CA, and an agent told to trust the system's roots.
                let unknown_ca = matches!(
                    source.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()),
                    Some(rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer
                    ))
                );
                let hint = match &self.inner.config.trust {
                    Trust::SystemRoots if unknown_ca => {
                        "; this agent trusts the system's CA roots, which did not sign the hub's certificate: set DROVER_CA_CHECKSUM to the CA checksum `drover-hub serve` printed"
                    }
                    _ => "",
                };
                ConnectError::Tls {
                    authority: target.authority.clone(),
                    source,
                    hint,
                }
            })
    }

    /// Sends one HTTP request to the hub over a connection verified as the tunnel's are (the
    /// CA checksum or system roots), e.g. an agent's registration. The path is the request's
    /// URI; the `Host` header is set here.
    /// With several hub URLs, a hub that cannot be reached is skipped for the next.
    pub async fn request(
        &self,
        request: http::Request<http_body_util::Full<Bytes>>,
    ) -> Result<http::Response<Bytes>, ConnectError> {
        let (parts, body) = request.into_parts();
        let mut tries = self.inner.targets.len();
        loop {
            let mut attempt = http::Request::new(body.clone());
            *attempt.method_mut() = parts.method.clone();
            *attempt.uri_mut() = parts.uri.clone();
            *attempt.headers_mut() = parts.headers.clone();
            match self.request_once(attempt).await {
                Err(e) if tries > 1 => {
                    tracing::debug!(error = %e, "hub not reachable; trying the next URL");
                    tries -= 1;
                    self.next_target();
                }
                result => return result,
            }
        }
    }

    async fn request_once(
        &self,
        mut request: http::Request<http_body_util::Full<Bytes>>,
    ) -> Result<http::Response<Bytes>, ConnectError> {
        let target = self.target();
        let url = format!("https://{}{}", target.authority, request_path(&request));
        let failed = |reason: String| ConnectError::Upgrade {
            url: url.clone(),
            reason,
        };
        let tls = self.open_tls(self.tls_config().await?).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| failed(e.to_string()))?;
        tokio::spawn(conn);
        if let Ok(host) = http::HeaderValue::from_str(&target.authority) {
            request.headers_mut().insert(header::HOST, host);
        }
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_CACERTS_LEN)
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        Ok(http::Response::from_parts(parts, body))
    }

    /// POSTs a JSON body to `path` with this connector's credential as the bearer (an agent
    /// exchanging its registration token, say); returns the status and the body.
    pub async fn post_json(
        &self,
        path: &str,
        json: String,
    ) -> Result<(http::StatusCode, Bytes), ConnectError> {
        let request = http::Request::post(path)
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", self.inner.config.credential.expose()),
            )
            .header(header::CONTENT_TYPE, "application/json")
            .body(http_body_util::Full::new(Bytes::from(json)))
            .map_err(|e| ConnectError::Upgrade {
                url: path.to_owned(),
                reason: e.to_string(),
            })?;
        let response = self.request(request).await?;
        Ok((response.status(), response.into_body()))
    }

    /// Downloads `/cacerts` without verifying the chain; the caller checks its checksum before
    /// trusting a byte of it.
    async fn fetch_cacerts(&self) -> Result<Vec<u8>, ConnectError> {
        let target = self.target();
        let fail = |reason: String| ConnectError::CaFetch {
            authority: target.authority.clone(),
            reason,
        };
        let tls = self.open_tls(tls::unverified_client_config()).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(conn);
        let request = http::Request::get("/cacerts")
            .header(header::HOST, &target.authority)
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !response.status().is_success() {
            return Err(fail(format!("HTTP {}", response.status())));
        }
        let body = Limited::new(response.into_body(), MAX_CACERTS_LEN)
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(body.to_bytes().to_vec())
    }

    /// Holds a session to the hub until `shutdown`: each new session is sent to `sessions`;
    /// when it ends, reconnects after a backoff delay. Returns once `shutdown` is cancelled
    /// (closing the live session) or `sessions` is dropped.
    pub async fn run(self, sessions: mpsc::Sender<AgentSession>, shutdown: CancellationToken) {
        let backoff = self.inner.config.backoff;
        let mut attempt: u32 = 0;
        loop {
            let hub = self.target().authority.clone();
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = self.connect() => result,
            };
            match result {
                Ok(agent) => {
                    attempt = 0;
                    let session = agent.session.clone();
                    tracing::info!(%hub, session = %agent.hello.session_id, "connected to the hub");
                    if sessions.send(agent).await.is_err() {
                        session.close();
                        return;
                    }
                    tokio::select! {
                        reason = session.ended() => {
                            tracing::warn!(%hub, %reason, "session to the hub ended; reconnecting");
                        }
                        () = shutdown.cancelled() => {
                            session.close();
                            let _ = tokio::time::timeout(Duration::from_secs(5), session.ended()).await;
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(%hub, error = %e, "cannot connect to the hub");
                    self.next_target();
                }
            }
            // Also after a session ends: agents cut off together come back spread out.
            let delay = backoff.delay(attempt);
            attempt = attempt.saturating_add(1);
            tracing::debug!(%hub, "next attempt in {delay:?}");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// Says `Hello` on an agent's session; returns the channel for later calls and the hub's reply.
pub(crate) async fn hello_on(
    session: &Session,
    request: HelloRequest,
) -> Result<(Channel, HelloReply), ConnectError> {
    let channel = Channel::new(session.clone());
    let reply = HandshakeClient::new(channel.clone())
        .hello(request)
        .await
        .map_err(|status| ConnectError::Handshake(status.message().to_owned()))?;
    Ok((channel, reply.into_inner()))
}
