//! An in-process hub and the helpers its tests need, for tests and benchmarks of code that
//! embeds the tunnel. Not for production: its authenticator accepts `token-for-<id>` as proof
//! of `<id>`, and its certificate authority lives only in memory.

// Fixture set-up failing means the test machine is broken; panicking says so plainly.
#![allow(clippy::expect_used)]

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    Acceptor, AcceptorConfig, AllowList, AuthError, AuthFuture, Backoff, ConnectorConfig, Peer,
    Registry, Secret, Session, SessionEvent,
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
    CA.get_or_init(|| CertificateAuthority::generate("drover test CA").expect("test fixture"))
}

pub fn ca_pem() -> &'static str {
    &ca().pem().cert_pem
}

pub fn checksum() -> String {
    ca_checksum(ca_pem().as_bytes())
}

/// Accepts `token-for-<id>` as proof of `<id>`, of whatever kind the agent says.
fn authenticate(parts: &http::request::Parts) -> AuthFuture {
    let token = crate::bearer_token(&parts.headers).map(str::to_owned);
    let kind = parts
        .headers
        .get(crate::AGENT_KIND_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Box::pin(async move {
        match token.as_deref().and_then(|t| t.strip_prefix("token-for-")) {
            Some(id) => Ok(Peer {
                id: id.to_owned(),
                kind,
            }
            .into()),
            None => Err(AuthError(
                "unknown agent credential; register the agent again".into(),
            )),
        }
    })
}

#[derive(Debug)]
pub struct TestHub {
    pub addr: SocketAddr,
    pub registry: Registry,
    /// How many times `/cacerts` has been served.
    pub cacerts_served: Arc<std::sync::atomic::AtomicUsize>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestHub {
    pub async fn start(config: AcceptorConfig) -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("test fixture"), config).await
    }

    pub async fn start_on(addr: SocketAddr, config: AcceptorConfig) -> Self {
        Self::start_with(addr, config, authenticate).await
    }

    /// A test hub whose credentials `auth` checks (instead of `token-for-<id>`).
    pub async fn start_with(
        addr: SocketAddr,
        config: AcceptorConfig,
        auth: impl crate::Authenticate,
    ) -> Self {
        let listener = TcpListener::bind(addr).await.expect("test fixture");
        let addr = listener.local_addr().expect("test fixture");
        let leaf = ca()
            .issue_server(&["localhost".into(), "127.0.0.1".into()])
            .expect("test fixture");
        let tls =
            server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).expect("test fixture");
        let shutdown = CancellationToken::new();
        let registry = Registry::default();
        let acceptor = Acceptor::new(config, auth, registry.clone(), shutdown.clone());
        let cacerts_served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let served = cacerts_served.clone();
        let service = tower::service_fn(move |req: Request<hyper::body::Incoming>| {
            let (acceptor, served) = (acceptor.clone(), served.clone());
            async move {
                let response = match req.uri().path() {
                    "/cacerts" => {
                        served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Response::new(Either::Left(Full::new(Bytes::from(ca_pem()))))
                    }
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
        let task = tokio::spawn(crate::listener::serve(
            listener,
            tls,
            service,
            shutdown.clone(),
        ));
        Self {
            addr,
            registry,
            cacerts_served,
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
        self.task.await.expect("test fixture");
    }

    /// The session of agent `id`, once it has completed its handshake.
    pub async fn session(&self, id: &str) -> Session {
        let mut events = self.registry.subscribe();
        if let Some(session) = self.registry.get(id) {
            return session;
        }
        loop {
            if let SessionEvent::Connected(info) = events.recv().await.expect("test fixture")
                && info.peer.id == id
            {
                return self.registry.get(id).expect("test fixture");
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
    config.allow = AllowList::new(["127.0.0.1:*"]).expect("test fixture");
    config.backoff = Backoff {
        base: Duration::from_millis(50),
        cap: Duration::from_millis(500),
    };
    config
}

/// The hub's end of a session on `io` for agent `id`, as the test hub's acceptor runs it after
/// the upgrade; ends with `io` or `shutdown`.
fn hub_session<S>(io: S, id: &str, shutdown: CancellationToken) -> JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let acceptor = Acceptor::new(
        AcceptorConfig::default(),
        authenticate,
        Registry::default(),
        shutdown,
    );
    let peer = Peer {
        id: id.to_owned(),
        kind: KIND.to_owned(),
    };
    // Messages too, as the hub takes them: the intake reads text frames for them.
    let echo: Arc<dyn crate::OnMessage> = Arc::new(
        |_: &crate::SessionInfo, message: &[u8], _: &crate::Messenger| Some(message.to_vec()),
    );
    tokio::spawn(async move {
        if let Some(session) = acceptor
            .run_session(io, peer.into(), None, Some(echo))
            .await
        {
            session.ended().await;
        }
    })
}

/// Feeds `bytes` to the hub's end of a session as if an agent had sent them after the
/// WebSocket upgrade (WebSocket frames carrying yamux, the control stream's gRPC and stream
/// headers), ends the input, and returns once the session has ended. The hub's frame intake
/// as the fuzzer drives it (`fuzz/fuzz_targets/hub_intake.rs`); its unit test is below.
pub async fn hub_intake(bytes: &[u8]) {
    use tokio::io::AsyncWriteExt as _;
    let (agent, hub) = tokio::io::duplex(64 * 1024);
    let session = hub_session(hub, "fuzz", CancellationToken::new());
    let (mut from_hub, mut to_hub) = tokio::io::split(agent);
    // What the hub sends (pings, window updates, replies) must be read or it stalls.
    let drain = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_hub, &mut tokio::io::sink()).await;
    });
    let _ = to_hub.write_all(bytes).await;
    let _ = to_hub.shutdown().await;
    let _ = session.await;
    drain.abort();
}

/// What a real agent sends after the WebSocket upgrade when it says `Hello`, asks the hub to
/// dial an address and opens a service stream, recorded as the hub receives it: the seed the
/// fuzzer starts the hub's intake from (`tunnel/examples/fuzz_seeds.rs`). The hub's end is the
/// real acceptor's session.
pub async fn agent_opening() -> Vec<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (agent, relay_a) = tokio::io::duplex(64 * 1024);
    let (relay_b, hub) = tokio::io::duplex(64 * 1024);
    let shutdown = CancellationToken::new();
    hub_session(hub, "seed-agent", shutdown.clone());
    let (mut agent_out, mut agent_in) = tokio::io::split(relay_a);
    let (mut hub_out, mut hub_in) = tokio::io::split(relay_b);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut hub_out, &mut agent_in).await;
    });
    let recorder = tokio::spawn(async move {
        let (mut seen, mut buf) = (Vec::new(), [0u8; 8192]);
        while let Ok(n) = agent_out.read(&mut buf).await {
            if n == 0 || hub_in.write_all(&buf[..n]).await.is_err() {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });

    let session = Session::spawn(
        agent,
        crate::ws::Role::Client,
        crate::SessionSettings::default(),
        crate::SessionInfo::new(
            Peer {
                id: "hub".to_owned(),
                kind: "hub".to_owned(),
            },
            None,
        ),
        crate::inbound::Inbound {
            allow: AllowList::none(),
            dial_timeout: Duration::from_secs(1),
            control: None,
            services: crate::Services::default(),
        },
        None,
        None,
    );
    let hello = proto::tunnel::v1::HelloRequest {
        agent_id: "seed-agent".to_owned(),
        kind: KIND.to_owned(),
        protocol_version: proto::TUNNEL_PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    let _channel = crate::connector::hello_on(&session, hello)
        .await
        .expect("test fixture");
    // Both are refused by the hub (its allow-list is empty, it offers no services), which is
    // part of what the seed exercises.
    let _ = session.dial("127.0.0.1:1").await;
    let _ = session.open_service("metrics").await;
    session.close();
    let _ = session.ended().await;
    shutdown.cancel();
    recorder.await.expect("test fixture")
}

/// A TCP server that echoes every byte back, until dropped.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("test fixture");
    let addr = listener.local_addr().expect("test fixture");
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

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_intake_ends_on_garbage_on_a_truncated_frame_and_on_an_empty_input() {
        // A masked binary frame header announcing 100 bytes, then only 3 of them.
        let truncated = [0x82, 0x80 | 100, 1, 2, 3, 4, 0xaa, 0xbb, 0xcc];
        for input in [&b""[..], b"GET / HTTP/1.1\r\n\r\n", &truncated] {
            tokio::time::timeout(std::time::Duration::from_secs(5), super::hub_intake(input))
                .await
                .expect("the session ends when its input does");
        }
    }

    #[tokio::test]
    async fn a_recorded_agent_opening_replays_into_a_session_that_ends() {
        let opening = super::agent_opening().await;
        // A WebSocket binary frame from a client: FIN + opcode 2, masked.
        assert_eq!(opening[0], 0x82, "starts with a binary frame");
        assert!(opening[1] & 0x80 != 0, "client frames are masked");
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            super::hub_intake(&opening),
        )
        .await
        .expect("the replayed session ends when its input does");
    }

    #[test]
    fn patterns_differ_by_seed_and_repeat_for_the_same_seed() {
        assert_eq!(super::pattern(1, 64), super::pattern(1, 64));
        assert_ne!(super::pattern(1, 64), super::pattern(2, 64));
    }
}
