//! The tunnel end to end: a hub and agents in this process, real TLS and TCP on 127.0.0.1.

// Test code: a panic is how a failure is reported.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use futures::SinkExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
use tunnel::{
    AcceptorConfig, AllowList, ConnectError, Connector, DialErrorKind, Peer, Secret, Services,
    SessionEvent, SessionSettings, TunnelStream, WsSettings,
    tls::{self, Trust},
};

use support::*;
use tunnel::testing::*;

/// Dials the echo server through `session` and checks `message` comes back.
async fn assert_echoes(session: &tunnel::Session, echo: std::net::SocketAddr, message: &[u8]) {
    let mut stream = session.dial(&echo.to_string()).await.unwrap();
    stream.write_all(message).await.unwrap();
    let mut got = vec![0u8; message.len()];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(got, message);
}

fn init() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("tunnel=debug")
        .try_init();
}

#[tokio::test]
async fn bytes_echo_through_a_dialled_stream() {
    init();
    let (hub, agent, session) = connected_pair(
        "echo",
        AcceptorConfig::default(),
        SessionSettings::default(),
    )
    .await;
    let echo = echo_server().await;

    assert_echoes(&session, echo, b"hello through the tunnel").await;

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_streams_of_8_mib_arrive_intact() {
    init();
    let (hub, agent, session) = connected_pair(
        "bulk",
        AcceptorConfig::default(),
        SessionSettings::default(),
    )
    .await;
    let echo = echo_server().await;
    const LEN: usize = 8 * 1024 * 1024;

    // All streams are open before any data moves: this test is about data integrity across
    // concurrent streams. (How long a dial waits behind bulk data is the benchmark's
    // round-trip-under-load figure; a debug build on 2 busy cores can take seconds.)
    let target = echo.to_string();
    let streams = futures::future::join_all((0..100).map(|_| session.dial(&target))).await;
    let mut tasks = Vec::new();
    for (seed, stream) in (0..100u64).zip(streams) {
        let session = session.clone();
        let stream = stream.unwrap();
        tasks.push(tokio::spawn(async move {
            // On failure, say why the session ended, if it did.
            let why = |e: std::io::Error| {
                let ended = session.is_ended();
                format!("stream {seed}: {e} (session ended: {ended})")
            };
            let (mut r, mut w) = tokio::io::split(stream);
            let sent = pattern(seed, LEN);
            let writer = tokio::spawn(async move {
                for chunk in sent.chunks(100_003) {
                    w.write_all(chunk).await?;
                }
                w.shutdown().await
            });
            let mut got = Vec::with_capacity(LEN);
            r.read_to_end(&mut got).await.map_err(why).unwrap();
            writer.await.unwrap().map_err(why).unwrap();
            assert_eq!(got.len(), LEN, "stream {seed} length");
            assert!(got == pattern(seed, LEN), "stream {seed} contents differ");
        }));
    }
    let results: Vec<_> = futures::future::join_all(tasks).await;
    if results.iter().any(Result::is_err) {
        let reason = tokio::time::timeout(Duration::from_secs(1), session.ended()).await;
        panic!("some streams failed; the session ended with: {reason:?}");
    }

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_dial_outside_the_allow_list_fails_that_stream_alone() {
    init();
    let (hub, agent, session) = connected_pair(
        "allow",
        AcceptorConfig::default(),
        SessionSettings::default(),
    )
    .await;
    let echo = echo_server().await;

    // The agent allows 127.0.0.1:* only; "localhost" is a different name to the allow-list.
    let err = session
        .dial(&format!("localhost:{}", echo.port()))
        .await
        .unwrap_err();
    assert_eq!(err.kind, DialErrorKind::NotAllowed);
    assert!(err.message.contains("not allowed"), "{err}");

    // The session lives on.
    assert_echoes(&session, echo, b"still here").await;
    assert!(!session.is_ended());

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_dial_to_a_closed_port_is_refused_at_once_not_at_the_timeout() {
    init();
    let settings = SessionSettings {
        dial_timeout: Duration::from_secs(60),
        ..SessionSettings::default()
    };
    let (hub, agent, session) = connected_pair("closed", AcceptorConfig::default(), settings).await;
    let port = closed_port().await;

    let started = Instant::now();
    let err = session.dial(&port.to_string()).await.unwrap_err();
    assert_eq!(err.kind, DialErrorKind::Refused, "{err}");
    assert!(err.message.contains("refused"), "{err}");
    assert!(
        started.elapsed() < settings.dial_timeout,
        "the refusal came from the timeout"
    );
    assert!(!session.is_ended());

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_bad_credential_gets_401_and_no_session() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut events = hub.registry.subscribe();
    let mut config = agent_config(&hub, "intruder");
    config.credential = Secret::new("guessed");

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    match &err {
        ConnectError::Unauthorized { status, message } => {
            assert_eq!(*status, 401);
            assert!(message.contains("register the agent again"), "{message}");
        }
        other => panic!("expected 401, got {other}"),
    }
    assert!(hub.registry.is_empty());
    assert!(
        events.try_recv().is_err(),
        "a refused agent must not produce session events"
    );
    hub.stop().await;
}

#[tokio::test]
async fn a_wrong_ca_checksum_refuses_to_connect_and_names_both_checksums() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "pinned");
    let wrong = tls::ca_checksum(b"some other CA");
    config.trust = Trust::CaChecksum(wrong.clone());

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    assert!(
        matches!(err, ConnectError::CaChecksumMismatch { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&wrong) && text.contains(&checksum()),
        "{text}"
    );
    assert!(hub.registry.is_empty());
    hub.stop().await;
}

#[tokio::test]
async fn a_ca_checked_against_its_checksum_is_fetched_once_per_process() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let first = Connector::new(agent_config(&hub, "first-copy")).unwrap();
    first.connect().await.unwrap().session.close();
    let served = hub.cacerts_served.load(std::sync::atomic::Ordering::SeqCst);
    assert!(served <= 1, "fetched {served} times for one connector");
    // Another connector pinning the same checksum (another agent of a fleet simulator).
    let second = Connector::new(agent_config(&hub, "second-copy")).unwrap();
    second.connect().await.unwrap().session.close();
    assert_eq!(
        hub.cacerts_served.load(std::sync::atomic::Ordering::SeqCst),
        served,
        "the second connector used the CA the first one checked"
    );
    hub.stop().await;
}

#[tokio::test]
async fn trusting_a_ca_that_did_not_sign_the_hub_fails_the_tls_handshake() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "stranger");
    let other = tls::CertificateAuthority::generate("another CA").unwrap();
    config.trust = Trust::CaPem(other.pem().cert_pem.clone().into_bytes());

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    assert!(matches!(err, ConnectError::Tls { .. }), "{err}");
    assert!(!err.to_string().contains("DROVER_CA_CHECKSUM"), "{err}");
    hub.stop().await;
}

#[tokio::test]
async fn an_agent_on_the_system_roots_facing_a_hub_with_its_own_ca_is_told_what_to_set() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "no-checksum");
    config.trust = Trust::SystemRoots;

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ConnectError::Tls { .. }), "{text}");
    assert!(
        text.contains("UnknownIssuer") && text.contains("set DROVER_CA_CHECKSUM"),
        "{text}"
    );
    hub.stop().await;
}

#[tokio::test]
async fn an_agent_speaking_another_protocol_version_is_refused_with_a_message() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "old-agent");
    config.protocol_version = proto::TUNNEL_PROTOCOL_VERSION + 1;

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    match err {
        ConnectError::Handshake(message) => {
            assert!(
                message.contains("incompatible tunnel protocol"),
                "{message}"
            );
        }
        other => panic!("expected a handshake refusal, got {other}"),
    }
    assert!(hub.registry.is_empty());
    hub.stop().await;
}

#[tokio::test]
async fn a_credential_cannot_claim_another_agents_identity() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "cluster-b");
    config.credential = token_for("cluster-a");

    let err = Connector::new(config).unwrap().connect().await.unwrap_err();
    match err {
        ConnectError::Handshake(message) => assert!(message.contains("cluster-a"), "{message}"),
        other => panic!("expected a handshake refusal, got {other}"),
    }
    assert!(hub.registry.get("cluster-b").is_none());
    hub.stop().await;
}

#[tokio::test]
async fn the_hello_exchange_reports_versions_and_the_session() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let agent = Connector::new(agent_config(&hub, "hello"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert_eq!(agent.hello.protocol_version, proto::TUNNEL_PROTOCOL_VERSION);
    assert_eq!(agent.hello.hub_version, env!("CARGO_PKG_VERSION"));
    let session = hub.session("hello").await;
    assert_eq!(agent.hello.session_id, session.info().id.to_string());
    assert_eq!(
        session.info().peer,
        Peer {
            id: "hello".into(),
            kind: KIND.into()
        }
    );
    agent.session.close();
    hub.stop().await;
}

#[tokio::test]
async fn a_new_session_for_the_same_agent_replaces_the_old_one() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut events = hub.registry.subscribe();
    let connector = Connector::new(agent_config(&hub, "twice")).unwrap();

    let first = connector.connect().await.unwrap();
    let first_id = hub.session("twice").await.info().id;
    let second = connector.connect().await.unwrap();
    first.session.ended().await;

    let mut seen = Vec::new();
    while seen.len() < 3 {
        match events.recv().await.unwrap() {
            SessionEvent::Connected(info) => seen.push(format!("connected {}", info.id)),
            SessionEvent::Disconnected { info, reason } => {
                assert!(reason.contains("replaced"), "{reason}");
                seen.push(format!("disconnected {}", info.id));
            }
        }
    }
    let second_id = hub.registry.get("twice").unwrap().info().id;
    assert_ne!(first_id, second_id);
    assert_eq!(
        seen,
        [
            format!("connected {first_id}"),
            format!("disconnected {first_id}"),
            format!("connected {second_id}")
        ]
    );
    assert_eq!(hub.registry.len(), 1);

    // The replacement carries traffic.
    let echo = echo_server().await;
    assert_echoes(&hub.registry.get("twice").unwrap(), echo, b"x").await;
    second.session.close();
    hub.stop().await;
}

#[tokio::test]
async fn the_agent_reconnects_after_a_hub_restart_and_streams_work_again() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let addr = hub.addr;
    let mut agent = TestAgent::start(agent_config(&hub, "restart"));
    let first = agent.next_session().await;
    hub.session("restart").await;

    hub.stop().await;
    first.session.ended().await;

    let hub = TestHub::start_on(addr, AcceptorConfig::default()).await;
    let second = agent.next_session().await;
    assert_ne!(first.hello.session_id, second.hello.session_id);
    let session = hub.session("restart").await;
    let echo = echo_server().await;
    assert_echoes(&session, echo, b"back").await;

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn with_several_hub_urls_the_agent_moves_to_the_next_when_its_hub_goes() {
    init();
    let dead = closed_port().await;
    let first = TestHub::start(AcceptorConfig::default()).await;
    let second = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&first, "replicas");
    // A hub that is down, then two that are up (replicas share one CA).
    config.url = format!(
        "https://127.0.0.1:{}, {},{}",
        dead.port(),
        first.url(),
        second.url()
    );
    let mut agent = TestAgent::start(config);
    let on_first = agent.next_session().await;
    first.session("replicas").await;

    first.stop().await;
    on_first.session.ended().await;
    let on_second = agent.next_session().await;
    let session = second.session("replicas").await;
    let echo = echo_server().await;
    assert_echoes(&session, echo, b"moved").await;
    assert_ne!(on_first.hello.session_id, on_second.hello.session_id);

    agent.stop().await;
    second.stop().await;
}

#[tokio::test]
async fn a_path_that_goes_quiet_is_noticed_by_both_ends_within_the_keepalive_bound() {
    init();
    let ws = WsSettings {
        ping_interval: Duration::from_millis(300),
        ..WsSettings::default()
    };
    let settings = SessionSettings {
        ws,
        ..SessionSettings::default()
    };
    let hub = TestHub::start(AcceptorConfig {
        settings,
        ..AcceptorConfig::default()
    })
    .await;
    let relay = QuietRelay::start(hub.addr).await;
    let mut config = agent_config(&hub, "quiet");
    config.url = format!("https://127.0.0.1:{}", relay.addr.port());
    config.settings = settings;
    // One attempt only: no reconnect loop, so the ended session is the one we watch.
    let agent = Connector::new(config).unwrap().connect().await.unwrap();
    let hub_session = hub.session("quiet").await;

    relay.go_quiet();
    let started = Instant::now();
    let (agent_reason, hub_reason) = tokio::join!(agent.session.ended(), hub_session.ended());
    let noticed_after = started.elapsed();

    assert!(agent_reason.contains("keepalive"), "agent: {agent_reason}");
    assert!(hub_reason.contains("keepalive"), "hub: {hub_reason}");
    // Bound: three ping intervals; the extra second absorbs a loaded test machine's scheduling.
    assert!(
        noticed_after <= ws.dead_after() + Duration::from_secs(1),
        "noticed after {noticed_after:?}, bound {:?}",
        ws.dead_after()
    );
    hub.stop().await;
}

/// Opens a raw WebSocket to the hub with a valid credential, as a misbehaving agent would.
async fn raw_websocket(
    hub: &TestHub,
    id: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let roots = tls::roots_from_pem(ca_pem().as_bytes()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(tls::client_config(roots))
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let mut request = format!("wss://127.0.0.1:{}/v3/connect", hub.addr.port())
        .into_client_request()
        .unwrap();
    let bearer = format!("Bearer {}", token_for(id).expose());
    request
        .headers_mut()
        .insert("authorization", bearer.parse().unwrap());
    request
        .headers_mut()
        .insert(tunnel::AGENT_KIND_HEADER, KIND.parse().unwrap());
    let (ws, response) = tokio_tungstenite::client_async(request, tls).await.unwrap();
    assert_eq!(response.status(), 101);
    ws
}

async fn assert_closed_by_hub<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::StreamExt;
    // The hub must close this connection: reading ends (cleanly or with a reset).
    loop {
        match ws.next().await {
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
            Some(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn an_oversized_message_closes_that_session_and_no_other() {
    init();
    let hub_config = AcceptorConfig {
        // Long enough that only the oversized message can explain the close.
        handshake_timeout: Duration::from_secs(120),
        ..AcceptorConfig::default()
    };
    let (hub, agent, good) = connected_pair("good", hub_config, SessionSettings::default()).await;
    let limit = SessionSettings::default().ws.max_message_size;

    let mut bad = raw_websocket(&hub, "bad").await;
    bad.send(Message::Binary(vec![0u8; limit + 1].into()))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), assert_closed_by_hub(&mut bad))
        .await
        .unwrap();

    let echo = echo_server().await;
    assert_echoes(&good, echo, b"unaffected").await;
    assert!(!good.is_ended());

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_malformed_yamux_frame_closes_that_session_and_no_other() {
    init();
    let hub_config = AcceptorConfig {
        handshake_timeout: Duration::from_secs(120),
        ..AcceptorConfig::default()
    };
    let (hub, agent, good) = connected_pair("good", hub_config, SessionSettings::default()).await;

    let mut bad = raw_websocket(&hub, "bad").await;
    // A yamux header with version 7 (only 0 exists), then garbage.
    bad.send(Message::Binary(vec![7u8; 64].into()))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), assert_closed_by_hub(&mut bad))
        .await
        .unwrap();

    assert!(!good.is_ended());
    let echo = echo_server().await;
    assert_echoes(&good, echo, b"ok").await;

    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn an_agent_may_dial_through_the_hub_only_where_the_hub_allows() {
    init();
    let echo = echo_server().await;
    let hub_config = AcceptorConfig {
        allow: AllowList::new([echo.to_string()]).unwrap(),
        ..AcceptorConfig::default()
    };
    let hub = TestHub::start(hub_config).await;
    let agent = Connector::new(agent_config(&hub, "outbound"))
        .unwrap()
        .connect()
        .await
        .unwrap();

    assert_echoes(&agent.session, echo, b"up").await;

    let other = echo_server().await;
    let err = agent.session.dial(&other.to_string()).await.unwrap_err();
    assert_eq!(err.kind, DialErrorKind::NotAllowed);
    agent.session.close();
    hub.stop().await;
}

#[tokio::test]
async fn stopping_the_agent_disconnects_it_on_the_hub_and_stopping_the_hub_ends_agent_sessions() {
    init();
    let (hub, agent, session) =
        connected_pair("bye", AcceptorConfig::default(), SessionSettings::default()).await;
    let mut events = hub.registry.subscribe();
    agent.stop().await;
    let reason = session.ended().await;
    assert!(reason.contains("peer closed"), "{reason}");
    match events.recv().await.unwrap() {
        SessionEvent::Disconnected { info, .. } => assert_eq!(info.peer.id, "bye"),
        other => panic!("expected a disconnect, got {other:?}"),
    }
    assert!(hub.registry.is_empty());

    let agent = Connector::new(agent_config(&hub, "bye"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    hub.session("bye").await;
    hub.stop().await;
    let reason = agent.session.ended().await;
    assert!(!reason.is_empty());
}

#[tokio::test]
async fn a_named_service_of_the_agent_serves_streams_and_unknown_names_are_refused() {
    init();
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let mut config = agent_config(&hub, "svc");
    config.services = Services::default().add("upper", |mut stream: TunnelStream| async move {
        let mut buf = [0u8; 5];
        stream.read_exact(&mut buf).await.unwrap();
        stream.write_all(&buf.to_ascii_uppercase()).await.unwrap();
    });
    let agent = Connector::new(config).unwrap().connect().await.unwrap();
    let session = hub.session("svc").await;

    let mut stream = session.open_service("upper").await.unwrap();
    stream.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"HELLO");

    let err = session.open_service("lower").await.unwrap_err();
    assert_eq!(err.kind, DialErrorKind::Unsupported);
    assert!(err.message.contains("\"lower\""), "{err}");
    assert!(!session.is_ended());
    agent.session.close();
    hub.stop().await;
}

/// Reads until the server closes the connection; returns how long that took.
async fn closed_within(mut stream: impl tokio::io::AsyncRead + Unpin, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the hub kept a slow client's connection open past {limit:?}"),
        }
    }
}

#[tokio::test]
async fn slow_clients_cannot_hold_connections_open() {
    let hub = TestHub::start(AcceptorConfig::default()).await;
    let bound = tunnel::listener::TLS_HANDSHAKE_TIMEOUT + Duration::from_secs(5);
    // One never starts TLS; one completes it and then says nothing (the HTTP server's first
    // read, which tells HTTP/1 from HTTP/2, has no timeout of its own); another completes it
    // and then dribbles a request's headers.
    let silent = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let tcp = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let quiet = tokio_rustls::TlsConnector::from(tls::unverified_client_config())
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let quiet = tokio::spawn(closed_within(quiet, bound));
    let tcp = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(tls::unverified_client_config())
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /cacerts HTTP/1.1\r\nHost: hub\r\n")
        .await
        .unwrap();
    let dribbling = tokio::spawn(async move {
        let started = Instant::now();
        // A header line every few seconds, never the blank line that ends them.
        let (mut read, mut write) = tokio::io::split(tls);
        let writer = tokio::spawn(async move {
            for i in 0.. {
                tokio::time::sleep(Duration::from_secs(3)).await;
                if write
                    .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let mut buf = [0u8; 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        writer.abort();
        started.elapsed()
    });
    let (silent, dribbling) = tokio::join!(
        closed_within(silent, bound),
        tokio::time::timeout(bound, dribbling)
    );
    let dribbling = dribbling
        .unwrap_or_else(|_| panic!("a client dribbling headers held its connection past {bound:?}"))
        .unwrap();
    // closed_within panics past the bound; it returning is the proof.
    quiet.await.unwrap();
    assert!(
        silent >= Duration::from_secs(5),
        "closed at once? {silent:?}"
    );
    assert!(
        dribbling < bound,
        "a dribbling client held on for {dribbling:?}"
    );
    hub.stop().await;
}

#[tokio::test]
async fn a_client_older_than_tls_1_2_is_refused() {
    let hub = TestHub::start(AcceptorConfig::default()).await;
    // A TLS 1.1 ClientHello (RSA with AES-128-CBC-SHA, no extensions), as an old client sends.
    let mut hello = vec![0x03, 0x02];
    hello.extend_from_slice(&[7u8; 32]); // random
    hello.extend_from_slice(&[0x00, 0x00, 0x02, 0x00, 0x2f, 0x01, 0x00]);
    let mut handshake = vec![0x01, 0x00, 0x00, u8::try_from(hello.len()).unwrap()];
    handshake.extend_from_slice(&hello);
    let mut record = vec![
        0x16,
        0x03,
        0x01,
        0x00,
        u8::try_from(handshake.len()).unwrap(),
    ];
    record.extend_from_slice(&handshake);
    let mut tcp = tokio::net::TcpStream::connect(hub.addr).await.unwrap();
    tcp.write_all(&record).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the hub answers an old client at once")
        .ok();
    // An alert (content type 21) and no ServerHello (a handshake record, 22).
    assert_eq!(answer.first(), Some(&0x15), "{answer:02x?}");
    assert!(!answer.contains(&0x16), "{answer:02x?}");

    hub.stop().await;
}

/// A listener within `limits` on a loopback port, answering every request "ok".
async fn ok_listener(
    limits: tunnel::listener::Limits,
) -> (
    std::net::SocketAddr,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let leaf = tunnel::testing::ca()
        .issue_server(&["127.0.0.1".into()])
        .unwrap();
    let tls = tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).unwrap();
    let service = tower::service_fn(|_: http::Request<hyper::body::Incoming>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(tunnel::listener::serve_limited(
        listener,
        tls,
        service,
        limits,
        shutdown.clone(),
    ));
    (addr, shutdown, server)
}

#[tokio::test]
async fn past_the_handshake_limit_connections_wait_their_turn() {
    let (addr, shutdown, server) = ok_listener(tunnel::listener::Limits {
        max_handshakes: 1,
        max_silent_per_address: 0,
    })
    .await;
    // One connection takes the only handshake slot: it starts a ClientHello and stalls.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    silent.write_all(&[0x16]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let handshake = tokio::spawn(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio_rustls::TlsConnector::from(tls::unverified_client_config())
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !handshake.is_finished(),
        "the second handshake did not wait"
    );
    // The slot is free once the first connection goes: the second handshakes at once.
    drop(silent);
    let done = tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .expect("the waiting handshake goes on when the slot frees")
        .unwrap();
    assert!(done.is_ok(), "{done:?}");
    shutdown.cancel();
    server.await.unwrap();
}

#[tokio::test]
async fn a_flood_of_silent_connections_from_one_address_leaves_the_listener_to_everyone_else() {
    let (addr, shutdown, server) = ok_listener(tunnel::listener::Limits {
        max_handshakes: 128,
        max_silent_per_address: 64,
    })
    .await;
    let port = addr.port();
    // 300 connections from another loopback address that never send a byte (the probe used
    // 1,000; fewer keep the test inside a small open-file limit).
    let flooder: std::net::SocketAddr = "127.0.0.2:0".parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(flooder).unwrap();
        flood.push(socket.connect(([127, 0, 0, 1], port).into()).await.unwrap());
    }
    // Past the per-address limit they are closed once they count as silent (a second), not
    // at the handshake timeout.
    let closes = flood.iter_mut().map(|stream| async move {
        let mut byte = [0u8; 1];
        let limit = tunnel::listener::SILENT_AFTER * 3;
        matches!(
            tokio::time::timeout(limit, stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let closed = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter(|c| *c)
        .count();
    assert_eq!(closed, 300 - 64, "the flood's connections closed early");
    // Meanwhile a client from another address is served: no slot is held by the silent ones.
    // (Before, they took every handshake slot and a request waited past the 10 s handshake
    // timeout of the next.)
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio::time::timeout(
        tunnel::listener::TLS_HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(tls::unverified_client_config())
            .connect("127.0.0.1".try_into().unwrap(), tcp),
    )
    .await
    .expect("served while flooded")
    .unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.ok();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(flood);
    shutdown.cancel();
    server.await.unwrap();
}

/// A hub's message handler for the tests: answers `now…` at once and anything else later,
/// from a task, and keeps the id of each message's sender.
fn answering_handler(
    senders: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> tunnel::MessageHandler {
    tunnel::MessageHandler::new(
        move |info: &tunnel::SessionInfo, message: &[u8], messenger: &tunnel::Messenger| {
            senders.lock().unwrap().push(info.peer.id.clone());
            if message == b"flood" {
                // More than a session queues before its driver runs again.
                for n in 0..100 {
                    if messenger.send(format!("flood {n}").into_bytes()).is_err() {
                        break;
                    }
                }
                return None;
            }
            if message.starts_with(b"now") {
                return Some([b"now:".as_slice(), message].concat());
            }
            let (answer, messenger) = ([b"later:".as_slice(), message].concat(), messenger.clone());
            tokio::spawn(async move { messenger.send(answer).unwrap() });
            None
        },
    )
}

#[tokio::test]
async fn messages_beside_the_streams_are_answered_at_once_or_later_and_know_their_sender() {
    init();
    let senders = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hub = TestHub::start(AcceptorConfig {
        messages: Some(answering_handler(senders.clone())),
        ..AcceptorConfig::default()
    })
    .await;
    let mut agent = TestAgent::start(agent_config(&hub, "talker"));
    let session = agent.next_session().await;
    let talk = session.messages.clone().expect("the hub takes messages");
    let wait = Duration::from_secs(10);
    let ask = |message: Vec<u8>| {
        let talk = talk.clone();
        async move {
            talk.tell(message).unwrap();
            tokio::time::timeout(wait, talk.answer())
                .await
                .unwrap()
                .unwrap()
        }
    };
    assert_eq!(ask(b"now 1".to_vec()).await, b"now:now 1");
    assert_eq!(ask(b"beat".to_vec()).await, b"later:beat");
    // Large enough to span several reads of the hub's frame buffer.
    let big = [b"now".as_slice(), &pattern(7, 100_000)].concat();
    assert_eq!(ask(big.clone()).await, [b"now:".as_slice(), &big].concat());
    assert_eq!(*senders.lock().unwrap(), ["talker"; 3]);
    // Streams go on as before, on the same session.
    let echo = echo_server().await;
    assert_echoes(&hub.session("talker").await, echo, b"still a tunnel").await;
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn a_session_whose_messages_overflow_ends_and_its_agent_connects_again() {
    init();
    let senders = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hub = TestHub::start(AcceptorConfig {
        messages: Some(answering_handler(senders)),
        ..AcceptorConfig::default()
    })
    .await;
    let mut agent = TestAgent::start(agent_config(&hub, "flooded"));
    let first = agent.next_session().await;
    let talk = first.messages.clone().expect("the hub takes messages");
    talk.tell(b"flood".to_vec()).unwrap();
    // Rather than lose what did not fit, the hub ends the session...
    let why = tokio::time::timeout(Duration::from_secs(30), first.session.ended())
        .await
        .expect("the session ended");
    assert!(!why.is_empty());
    // ...and none of the flood's messages was written before that: they would have come whole.
    assert!(
        tokio::time::timeout(Duration::from_secs(10), talk.answer())
            .await
            .unwrap()
            .is_none()
    );
    // The agent is back on a new session, whose messages are answered.
    let second = agent.next_session().await;
    let talk = second.messages.clone().unwrap();
    talk.tell(b"now again".to_vec()).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), talk.answer()).await;
    assert_eq!(answer.unwrap().unwrap(), b"now:now again");
    agent.stop().await;
    hub.stop().await;
}

#[tokio::test]
async fn an_agent_beats_with_calls_where_the_hub_takes_no_messages_and_unasked_messages_end_a_session()
 {
    init();
    // A hub without a handler: the agent is told nothing and keeps to calls.
    let plain = TestHub::start(AcceptorConfig::default()).await;
    let mut agent = TestAgent::start(agent_config(&plain, "old-hub"));
    assert!(agent.next_session().await.messages.is_none());
    agent.stop().await;
    plain.stop().await;

    // A hub that takes messages, and a peer that never offered them sends one anyway.
    let senders = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hub_config = AcceptorConfig {
        messages: Some(answering_handler(senders.clone())),
        handshake_timeout: Duration::from_secs(120),
        ..AcceptorConfig::default()
    };
    let (hub, agent, good) = connected_pair("good", hub_config, SessionSettings::default()).await;
    let mut bad = raw_websocket(&hub, "bad").await;
    bad.send(Message::Text("now".into())).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), assert_closed_by_hub(&mut bad))
        .await
        .unwrap();
    assert!(
        senders.lock().unwrap().is_empty(),
        "the hub took an unasked message"
    );
    assert!(!good.is_ended());
    agent.stop().await;
    hub.stop().await;
}
