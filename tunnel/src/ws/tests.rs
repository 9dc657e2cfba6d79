//! The framing checked against tungstenite, an independent WebSocket implementation, in both
//! roles, plus the malformed input a peer could send and the keepalive's timing.

use super::*;
use futures::{AsyncReadExt, AsyncWriteExt, FutureExt, SinkExt, StreamExt};
use tokio::io::{AsyncWriteExt as _, DuplexStream};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        protocol::{
            Role as TRole,
            frame::{Frame, coding::Data, coding::OpCode},
        },
    },
};

fn ours(io: DuplexStream, role: Role) -> WsIo<DuplexStream> {
    WsIo::new(io, role, WsSettings::default())
}

async fn theirs(io: DuplexStream, role: TRole) -> WebSocketStream<DuplexStream> {
    WebSocketStream::from_raw_socket(io, role, None).await
}

fn reference_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= key[(offset + i) % 4];
    }
}

#[test]
fn masking_matches_the_bytewise_definition_at_every_offset() {
    let key = [0x12, 0x34, 0x56, 0x78];
    for offset in 0..8 {
        for len in [0, 1, 3, 7, 8, 9, 31, 64, 65] {
            let original: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut fast = original.clone();
            let mut slow = original.clone();
            apply_mask(&mut fast, key, offset);
            reference_mask(&mut slow, key, offset);
            assert_eq!(fast, slow, "offset {offset}, len {len}");
            let mut appended = vec![0xee];
            extend_masked(&mut appended, &original, key, offset);
            assert_eq!(
                appended[1..],
                slow[..],
                "extend_masked, offset {offset}, len {len}"
            );
        }
    }
}

#[test]
fn the_accept_key_matches_rfc_6455s_example() {
    assert_eq!(
        accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
}

#[tokio::test]
async fn our_client_and_tungstenites_server_exchange_bytes_pings_and_close() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut client = ours(a, Role::Client);
    let mut server = theirs(b, TRole::Server).await;

    client.write_all(b"hello ").await.unwrap();
    client.write_all(b"server").await.unwrap();
    client.flush().await.unwrap();
    match server.next().await.unwrap().unwrap() {
        Message::Binary(data) => assert_eq!(&data[..], b"hello server"),
        other => panic!("expected binary, got {other:?}"),
    }

    server
        .send(Message::Binary(b"hi client".to_vec().into()))
        .await
        .unwrap();
    server
        .send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let mut got = [0u8; 9];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hi client");

    // Our side answered the ping while reading; the pong arrives with the next flush.
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 1];
        let n = client.read(&mut buf).await.unwrap();
        (client, n)
    });
    match server.next().await.unwrap().unwrap() {
        Message::Pong(data) => assert_eq!(&data[..], b"are you there"),
        other => panic!("expected pong, got {other:?}"),
    }
    server.close(None).await.unwrap();
    let (_client, n) = reader.await.unwrap();
    assert_eq!(n, 0, "a Close from the peer reads as end of stream");
}

/// Counts the writes that reach the stream under the WebSocket.
struct CountingWrites {
    io: DuplexStream,
    writes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl TokioRead for CountingWrites {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl TokioWrite for CountingWrites {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Our client with flushes deferred, tungstenite's server, and the count of the client's
/// writes to the stream between them.
async fn deferring_client() -> (
    WsIo<CountingWrites>,
    WebSocketStream<DuplexStream>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = CountingWrites {
        io: a,
        writes: writes.clone(),
    };
    let client = WsIo::new(counted, Role::Client, WsSettings::default()).deferring_flushes();
    (client, theirs(b, TRole::Server).await, writes)
}

#[tokio::test]
async fn deferred_flushes_leave_together_when_the_writer_turns_to_read() {
    let (mut client, mut server, writes) = deferring_client().await;

    // As yamux does: a flush after each frame, while other frames are ready.
    for part in [&b"one "[..], b"two ", b"three"] {
        client.write_all(part).await.unwrap();
        client.flush().await.unwrap();
    }
    let written = || writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(written(), 0, "a deferred flush writes nothing yet");

    // The first read lets other tasks add their frames; the one after that pays the flush.
    let mut buf = [0u8; 16];
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), 0, "the first read only yields");
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), 1, "every deferred frame leaves in one write");
    match server.next().await.unwrap().unwrap() {
        Message::Binary(data) => assert_eq!(&data[..], b"one two three"),
        other => panic!("expected binary, got {other:?}"),
    }

    // Nothing owed: a read writes nothing.
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), 1);

    // Bulk data is written at its flush: waiting would gain nothing.
    let bulk = vec![7u8; DEFER_LIMIT];
    client.write_all(&bulk).await.unwrap();
    client.flush().await.unwrap();
    assert!(written() > 1, "a large flush is not deferred");
    match server.next().await.unwrap().unwrap() {
        Message::Binary(data) => assert_eq!(data.len(), DEFER_LIMIT),
        other => panic!("expected binary, got {other:?}"),
    }
}

#[tokio::test]
async fn a_yield_that_gains_no_frame_is_skipped_for_the_next_writes() {
    let (mut client, mut server, writes) = deferring_client().await;
    let written = || writes.load(std::sync::atomic::Ordering::Relaxed);
    let mut buf = [0u8; 16];

    // One request at a time: the yield gains nothing (yamux asks for a flush again when
    // polled after it, with no frame to add)...
    client.write_all(b"alone").await.unwrap();
    client.flush().await.unwrap();
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), 0, "the first deferred write yields");
    client.flush().await.unwrap();
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), 1);
    // ...so the next writes are made at the first read, without one.
    for n in 0..UNYIELDING {
        client.write_all(b"next").await.unwrap();
        client.flush().await.unwrap();
        assert!(client.read(&mut buf).now_or_never().is_none());
        assert_eq!(
            written(),
            2 + usize::from(n),
            "write {n} waited for a yield"
        );
    }

    // Then a yield is tried again; one that gains a frame is kept.
    let before = written();
    client.write_all(b"first ").await.unwrap();
    client.flush().await.unwrap();
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(
        written(),
        before,
        "after the unyielding writes, a yield again"
    );
    client.write_all(b"joined").await.unwrap();
    client.flush().await.unwrap();
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(written(), before + 1);
    client.write_all(b"later").await.unwrap();
    client.flush().await.unwrap();
    assert!(client.read(&mut buf).now_or_never().is_none());
    assert_eq!(
        written(),
        before + 1,
        "a yield that paid off is tried again"
    );

    let mut got = Vec::new();
    for _ in 0..2 + UNYIELDING {
        match server.next().await.unwrap().unwrap() {
            Message::Binary(data) => got.push(String::from_utf8(data.to_vec()).unwrap()),
            other => panic!("expected binary, got {other:?}"),
        }
    }
    assert_eq!(got[0], "alone");
    assert!(got[1..=usize::from(UNYIELDING)].iter().all(|m| m == "next"));
    assert_eq!(got.last().unwrap(), "first joined");
}

#[tokio::test]
async fn tungstenites_client_and_our_server_exchange_fragmented_messages() {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut client = theirs(a, TRole::Client).await;
    let mut server = ours(b, Role::Server);

    let parts: [&[u8]; 3] = [b"frag", b"men", b"ted"];
    client
        .send(Message::Frame(Frame::message(
            parts[0].to_vec(),
            OpCode::Data(Data::Binary),
            false,
        )))
        .await
        .unwrap();
    client
        .send(Message::Frame(Frame::message(
            parts[1].to_vec(),
            OpCode::Data(Data::Continue),
            false,
        )))
        .await
        .unwrap();
    client
        .send(Message::Ping(b"between".to_vec().into()))
        .await
        .unwrap();
    client
        .send(Message::Frame(Frame::message(
            parts[2].to_vec(),
            OpCode::Data(Data::Continue),
            true,
        )))
        .await
        .unwrap();
    client
        .send(Message::Binary(b"!".to_vec().into()))
        .await
        .unwrap();
    let mut got = [0u8; 11];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"fragmented!");

    server.write_all(b"reply").await.unwrap();
    server.flush().await.unwrap();
    loop {
        match client.next().await.unwrap().unwrap() {
            Message::Pong(_) => continue,
            Message::Binary(data) => {
                assert_eq!(&data[..], b"reply");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    server.close().await.unwrap();
    assert!(matches!(
        client.next().await,
        Some(Ok(Message::Close(_))) | None
    ));
}

#[tokio::test]
async fn a_byte_stream_survives_backpressure_and_arbitrary_flush_points() {
    // A tiny pipe forces partial writes, so frames are sealed while earlier ones still wait.
    let (a, b) = tokio::io::duplex(97);
    let mut client = ours(a, Role::Client);
    let mut server = ours(b, Role::Server);
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let expected = data.clone();
    let writer = tokio::spawn(async move {
        let mut at = 0;
        let mut step = 1;
        while at < data.len() {
            let end = (at + step).min(data.len());
            client.write_all(&data[at..end]).await.unwrap();
            if step % 3 == 0 {
                client.flush().await.unwrap();
            }
            at = end;
            step = step * 7 % 70_001 + 1;
        }
        client.flush().await.unwrap();
        client.close().await.unwrap();
    });
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    assert!(got == expected, "bytes differ");
}

#[tokio::test]
async fn two_peers_that_write_before_they_read_do_not_wait_on_each_other() {
    // Each side writes far more than the pipe holds before it reads anything, as yamux does
    // while a pong it owes cannot be sent. The socket must keep draining meanwhile.
    const LEN: usize = 2 * 1024 * 1024;
    let (a, b) = tokio::io::duplex(64 * 1024);
    let side = |mut io: WsIo<DuplexStream>, seed: u8| async move {
        let sent: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(seed)).collect();
        io.write_all(&sent).await.unwrap();
        io.flush().await.unwrap();
        let mut got = vec![0u8; LEN];
        io.read_exact(&mut got).await.unwrap();
        got
    };
    let both = futures::future::join(
        tokio::spawn(side(ours(a, Role::Client), 3)),
        tokio::spawn(side(ours(b, Role::Server), 7)),
    );
    let (from_b, from_a) = tokio::time::timeout(std::time::Duration::from_secs(30), both)
        .await
        .expect("the two writers waited on each other");
    assert!(
        from_b.unwrap()
            == (0..LEN)
                .map(|i| (i as u8).wrapping_mul(7))
                .collect::<Vec<_>>()
    );
    assert!(
        from_a.unwrap()
            == (0..LEN)
                .map(|i| (i as u8).wrapping_mul(3))
                .collect::<Vec<_>>()
    );
}

async fn read_error(raw: &[u8], role: Role) -> io::Error {
    let (mut a, b) = tokio::io::duplex(1 << 20);
    a.write_all(raw).await.unwrap();
    let settings = WsSettings {
        max_message_size: 1024,
        ..WsSettings::default()
    };
    let mut io = WsIo::new(b, role, settings);
    let mut sink = Vec::new();
    // Valid bytes before the fault are delivered; the fault itself is an error, not an EOF.
    io.read_to_end(&mut sink).await.unwrap_err()
}

#[tokio::test]
async fn malformed_frames_are_errors_that_say_what_was_wrong() {
    let key = [1, 2, 3, 4];
    let masked = |b0: u8, len: u8| vec![b0, 0x80 | len, key[0], key[1], key[2], key[3]];
    let cases: Vec<(Vec<u8>, Role, &str)> = vec![
        (vec![0x82, 0x01, 0xff], Role::Server, "not masked"),
        (masked(0x82, 1), Role::Client, "masked"),
        (masked(0xc2, 0), Role::Server, "reserved bits"),
        (masked(0x81, 0), Role::Server, "text frame"),
        (masked(0x83, 0), Role::Server, "unknown opcode"),
        (masked(0x80, 0), Role::Server, "continuation frame outside"),
        (masked(0x09, 0), Role::Server, "control frame"),
        (
            [masked(0x02, 1), vec![0], masked(0x82, 1)].concat(),
            Role::Server,
            "new message started",
        ),
        (
            [
                vec![0x82, 0xff],
                4096u64.to_be_bytes().to_vec(),
                key.to_vec(),
            ]
            .concat(),
            Role::Server,
            "limit is 1024",
        ),
    ];
    for (raw, role, expect) in cases {
        let err = read_error(&raw, role).await;
        assert!(err.to_string().contains(expect), "{raw:02x?}: {err}");
    }
}

#[tokio::test]
async fn fragments_count_together_against_the_message_limit() {
    let key = [9, 9, 9, 9];
    let mut raw = Vec::new();
    for (b0, len) in [(0x02u8, 600u16), (0x00, 600)] {
        raw.extend_from_slice(&[b0, 0x80 | 126]);
        raw.extend_from_slice(&len.to_be_bytes());
        raw.extend_from_slice(&key);
        raw.extend(std::iter::repeat_n(0u8, usize::from(len)));
    }
    let (mut a, b) = tokio::io::duplex(1 << 20);
    a.write_all(&raw).await.unwrap();
    let settings = WsSettings {
        max_message_size: 1024,
        ..WsSettings::default()
    };
    let mut io = WsIo::new(b, Role::Server, settings);
    let mut sink = Vec::new();
    let err = io.read_to_end(&mut sink).await.unwrap_err();
    assert!(err.to_string().contains("1200-byte message"), "{err}");
    assert_eq!(sink.len(), 600, "the first fragment was within the limit");
}

#[tokio::test(start_paused = true)]
async fn a_silent_peer_is_declared_dead_after_three_intervals() {
    let settings = WsSettings {
        ping_interval: Duration::from_secs(10),
        ..WsSettings::default()
    };
    // The peer exists but never reads or answers: the other end of the pipe is held idle.
    let (a, _idle_peer) = tokio::io::duplex(1 << 20);
    let mut io = WsIo::new(a, Role::Client, settings);
    let start = Instant::now();
    let err = io.read(&mut [0u8; 16]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert_eq!(start.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_peer_heard_from_lately_is_not_pinged() {
    async fn due(keepalive: &mut Keepalive) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(keepalive.poll(cx).unwrap())).await
    }
    let mut keepalive = Keepalive::new(Duration::from_secs(10), Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(!due(&mut keepalive).await);
    keepalive.heard_from_peer();
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(
        !due(&mut keepalive).await,
        "heard 2 s ago: no ping at the interval"
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    assert!(
        !due(&mut keepalive).await,
        "heard an interval ago: a beat a little late is no reason to ping"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(
        due(&mut keepalive).await,
        "an interval and a half of quiet since: ping"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(!due(&mut keepalive).await, "the next one an interval later");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(due(&mut keepalive).await);
}

#[tokio::test(start_paused = true)]
async fn pings_keep_an_idle_but_healthy_session_alive() {
    let settings = WsSettings {
        ping_interval: Duration::from_secs(10),
        ..WsSettings::default()
    };
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut client = WsIo::new(a, Role::Client, settings);
    let mut server = WsIo::new(b, Role::Server, settings);
    let (mut buf_a, mut buf_b) = ([0u8; 16], [0u8; 16]);
    // Ten dead-intervals' worth of time without data: only pings and pongs flow.
    let idle = tokio::time::timeout(Duration::from_secs(300), async {
        tokio::join!(client.read(&mut buf_a), server.read(&mut buf_b))
    })
    .await;
    assert!(
        idle.is_err(),
        "a healthy idle session must not be declared dead"
    );
}

/// Type and flags of each yamux frame in `bytes`, read as yamux's spec lays them out: a
/// 12-byte header (version, type, flags, stream, length), a body only after a data frame's.
fn yamux_frames(bytes: &[u8]) -> Vec<(u8, u16)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(h) = bytes.get(at..at + 12) {
        frames.push((h[1], u16::from_be_bytes([h[2], h[3]])));
        let length = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        at += 12 + if h[1] == 0 { length } else { 0 };
    }
    frames
}

/// What tungstenite's server receives from a yamux client over our WebSocket that opens a
/// stream and writes `payload` on it: the type and flags of each frame.
async fn yamux_client_writes(payload: &[u8], without_pings: bool) -> Vec<(u8, u16)> {
    let (a, b) = tokio::io::duplex(1 << 20);
    let mut client = ours(a, Role::Client);
    if without_pings {
        client = client.without_yamux_pings();
    }
    let mut server = theirs(b, TRole::Server).await;
    let mut conn = yamux::Connection::new(client, yamux::Config::default(), yamux::Mode::Client);
    let mut stream = futures::future::poll_fn(|cx| conn.poll_new_outbound(cx))
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        while let Some(Ok(_)) = futures::future::poll_fn(|cx| conn.poll_next_inbound(cx)).await {}
    });
    stream.write_all(payload).await.unwrap();
    stream.flush().await.unwrap();
    let mut bytes = Vec::new();
    let arrived = async {
        while !bytes.windows(payload.len()).any(|w| w == payload) {
            if let Message::Binary(data) = server.next().await.unwrap().unwrap() {
                bytes.extend_from_slice(&data);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the payload never arrived");
    driver.abort();
    yamux_frames(&bytes)
}

#[tokio::test]
async fn yamuxs_round_trip_pings_are_dropped_and_nothing_else_is() {
    // A body that reads exactly like a ping's header is a body.
    let ping_shaped: [u8; 12] = [0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9];
    let is_ping = |&(kind, flags): &(u8, u16)| kind == 2 && flags & 1 == 1;

    let sent = yamux_client_writes(&ping_shaped, false).await;
    assert!(sent.iter().any(is_ping), "yamux pings by itself: {sent:?}");

    // The payload arrived (the helper waits for it), in a data frame, and no ping went.
    let sent = yamux_client_writes(&ping_shaped, true).await;
    assert!(!sent.iter().any(is_ping), "{sent:?}");
    assert!(sent.iter().any(|&(kind, _)| kind == 0), "{sent:?}");
}
