//! A session: one yamux connection over one WebSocket, owned by one driver task.
//!
//! yamux only makes progress while a single task polls its `Connection`, so the driver owns it
//! and everything else talks to the driver through a [`Session`] handle: open a stream, close
//! the session, wait until it has ended. Streams the peer opens are handed to [`Inbound`], which
//! reads their header and either dials (checked against the allow-list) or serves gRPC.

use std::{
    collections::VecDeque,
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, SystemTime},
};

use futures::{future::poll_fn, task::AtomicWaker};
use proto::tunnel::v1::{
    Dial, ServiceStream, StreamHeader, StreamReply, stream_error::Kind, stream_header,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{Notify, oneshot},
};
use tokio_util::{
    compat::{Compat, FuturesAsyncReadCompatExt},
    sync::CancellationToken,
};

use crate::{
    header,
    inbound::Inbound,
    messages::{Messages, Messenger, OnMessage},
    ws::{Role, WsIo, WsSettings},
};

/// Tuning of a session. The defaults suit both hub and agents.
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    pub ws: WsSettings,
    /// Streams open at once; opening more fails until some close.
    pub max_streams: usize,
    /// Memory a session may hold for received-but-unread data beyond the 256 KiB every stream
    /// starts with; streams that move bulk data grow their windows out of this pool. It also
    /// bounds how much bulk data can queue in front of a small request on the same session:
    /// larger moves bulk faster and delays everything else more (see docs/benchmarks-history.md, "Tunnel tuning").
    pub window_growth: usize,
    /// Largest yamux data frame; bulk streams interleave with others at this granularity.
    pub frame_size: usize,
    /// How long the accepting side waits for a dialled address to answer.
    pub dial_timeout: Duration,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            ws: WsSettings::default(),
            max_streams: 512,
            // None: every stream keeps yamux's 256 KiB window. yamux lets the streams that
            // drain fastest first take any growth for good, and their larger windows then
            // take a larger share of the session: with 4 MiB to grow into, of 100 bulk
            // streams the last finished 1.6–2.2 times later than the first, and a small
            // request behind them waited 3.4–3.7 ms at p99 (without: 1.02–1.04 times and
            // 0.27–0.35 ms, the same aggregate). The price is one bulk stream alone: about
            // 256 KiB per round trip (docs/benchmarks-history.md, "Tunnel tuning").
            window_growth: 0,
            // 128 KiB measured best on one bulk stream (vs 64 KiB: ratio ~0.8 against ~0.65,
            // less CPU per GiB); 256 KiB stalls at times on the 256 KiB initial window.
            frame_size: 128 * 1024,
            dial_timeout: Duration::from_secs(10),
        }
    }
}

impl SessionSettings {
    fn yamux_config(&self) -> yamux::Config {
        let mut cfg = yamux::Config::default();
        // Order matters: yamux asserts window >= streams * 256 KiB on each call.
        cfg.set_max_connection_receive_window(Some(
            self.max_streams * yamux::DEFAULT_CREDIT as usize + self.window_growth,
        ));
        cfg.set_max_num_streams(self.max_streams);
        cfg.set_split_send_size(self.frame_size);
        cfg
    }

    /// Worst-case bytes a session buffers for received data: every stream's window filled.
    pub fn max_buffered_bytes(&self) -> usize {
        self.max_streams * yamux::DEFAULT_CREDIT as usize + self.window_growth
    }
}

/// Who is at the far end of a session, as the hub authenticated it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    /// Unique per agent, e.g. `cluster/c-7x2k` or `host/9f1c…`; one session per id.
    pub id: String,
    /// What the agent is (`cluster-agent`, `node-agent`, `system-agent`); opaque here.
    pub kind: String,
}

/// Facts about one session, handed to gRPC handlers in request extensions.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Unique within this process.
    pub id: u64,
    pub peer: Peer,
    /// The name of the credential the hub accepted for this session, if its authenticator
    /// names one.
    pub credential: Option<Arc<str>>,
    /// The TCP peer address, where known.
    pub remote_addr: Option<SocketAddr>,
    pub connected_at: SystemTime,
}

static NEXT_SESSION_ID: AtomicU64 = AtomicU64::new(1);

impl SessionInfo {
    pub(crate) fn new(peer: Peer, remote_addr: Option<SocketAddr>) -> Self {
        Self {
            id: NEXT_SESSION_ID.fetch_add(1, Ordering::Relaxed),
            peer,
            credential: None,
            remote_addr,
            connected_at: SystemTime::now(),
        }
    }
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialErrorKind {
    /// The far side's allow-list does not include the address.
    NotAllowed,
    /// Nothing listens at the address.
    Refused,
    /// The address could not be reached or resolved.
    Unreachable,
    /// The address did not answer in time, or the far side did not acknowledge.
    TimedOut,
    /// The far side does not offer what the header asked for.
    Unsupported,
    /// The session ended, or has no room for another stream.
    Session,
}

/// A failed dial or stream open; the message says what and why, for people.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DialError {
    pub kind: DialErrorKind,
    pub message: String,
}

impl DialError {
    pub(crate) fn session(message: impl Into<String>) -> Self {
        Self {
            kind: DialErrorKind::Session,
            message: message.into(),
        }
    }
}

type OpenReply = oneshot::Sender<Result<yamux::Stream, yamux::ConnectionError>>;

/// How a session ends besides its peer going away: the token that closes it, and what its
/// driver does last, once the session is marked ended. The hub uses it to take the session out
/// of the registry from the driver task itself, so that a connected agent costs no task that
/// only waits for its end.
pub(crate) struct Ending {
    pub close: CancellationToken,
    pub then: OnEnd,
}

/// Called with the ended session and why it ended.
pub(crate) type OnEnd = Box<dyn FnOnce(&SessionInfo, &str) + Send>;

/// A handle on a live (or ended) session. Cheap to clone.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Shared>,
}

// Kept small: the hub holds one per connected agent. A tokio mpsc channel for the opens and a
// watch for the end cost 800 and 368 bytes (measured); the queue, waker and notify here cost
// about a tenth of that.
struct Shared {
    info: SessionInfo,
    opens: Mutex<Opens>,
    /// The driver, woken when an open is queued.
    driver: AtomicWaker,
    close: CancellationToken,
    /// Why the session ended, once it has.
    ended: OnceLock<String>,
    on_end: Notify,
}

/// Callers waiting for the driver to open their stream.
#[derive(Default)]
struct Opens {
    waiting: VecDeque<OpenReply>,
    /// The driver is gone: an open would wait forever, so it fails at once.
    closed: bool,
}

impl Shared {
    fn opens(&self) -> MutexGuard<'_, Opens> {
        // Each change is one push, pop or flag: a poisoned lock is still whole.
        self.opens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the session ended (the first reason stays): fails the opens still waiting and
    /// wakes whoever waits for the end.
    fn finish(&self, reason: String) {
        let waiting = {
            let mut opens = self.opens();
            opens.closed = true;
            std::mem::take(&mut opens.waiting)
        };
        drop(waiting);
        let _ = self.ended.set(reason);
        self.on_end.notify_waiters();
    }
}

/// Marks the session ended if its driver task stops without doing so (a panic, or the runtime
/// going away), so that no one waits for it forever.
struct FinishOnDrop(Arc<Shared>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if self.0.ended.get().is_none() {
            self.0.finish("session driver stopped".to_owned());
        }
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.info.id)
            .field("peer", &self.inner.info.peer)
            .finish()
    }
}

impl Session {
    /// Starts the driver task on a connection whose WebSocket upgrade has completed; with an
    /// `ending`, closed by its token and finished by its `then`.
    pub(crate) fn spawn<S>(
        io: S,
        role: Role,
        settings: SessionSettings,
        info: SessionInfo,
        inbound: Inbound,
        messages: Option<(Arc<dyn OnMessage>, Messenger)>,
        ending: Option<Ending>,
    ) -> Self
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mode = match role {
            Role::Client => yamux::Mode::Client,
            Role::Server => yamux::Mode::Server,
        };
        let mut io = WsIo::new(io, role, settings.ws).deferring_flushes();
        if settings.window_growth == 0 {
            io = io.without_yamux_pings();
        }
        if let Some((handler, messenger)) = messages {
            io = io.with_messages(Messages::new(info.clone(), handler, messenger));
        }
        let conn = yamux::Connection::new(io, settings.yamux_config(), mode);
        let (close, then) = match ending {
            Some(Ending { close, then }) => (close, Some(then)),
            None => (CancellationToken::new(), None),
        };
        let session = Session {
            inner: Arc::new(Shared {
                info,
                opens: Mutex::default(),
                driver: AtomicWaker::new(),
                close,
                ended: OnceLock::new(),
                on_end: Notify::new(),
            }),
        };
        let driver = Driver {
            conn,
            pending_open: None,
            inbound,
            shared: session.inner.clone(),
        };
        tokio::spawn(async move {
            let guard = FinishOnDrop(driver.shared.clone());
            let reason = driver.run().await;
            let shared = &guard.0;
            let info = &shared.info;
            tracing::info!(session = info.id, peer = %info.peer.id, %reason, "tunnel session ended");
            // Marked ended before `then` runs: whoever registers the session after its
            // handshake checks this flag, so an end that comes first is never missed.
            shared.finish(reason.clone());
            if let Some(then) = then {
                then(info, &reason);
            }
        });
        session
    }

    pub fn info(&self) -> &SessionInfo {
        &self.inner.info
    }

    /// Asks the driver to close the session: a yamux GoAway, then a WebSocket close.
    pub fn close(&self) {
        self.inner.close.cancel();
    }

    /// Whether the session has ended.
    pub fn is_ended(&self) -> bool {
        self.inner.ended.get().is_some()
    }

    /// Waits until the session has ended; returns why.
    pub async fn ended(&self) -> String {
        loop {
            // Enabled before the check, so an end between the two still wakes it.
            let notified = self.inner.on_end.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = self.inner.ended.get() {
                return reason.clone();
            }
            notified.await;
        }
    }

    /// Opens a stream and asks the far side to connect it to `address` (`host:port`, TCP).
    /// Fails at once, for this stream only, if the far side refuses or cannot connect.
    pub async fn dial(&self, address: &str) -> Result<TunnelStream, DialError> {
        let header = StreamHeader {
            kind: Some(stream_header::Kind::Dial(Dial {
                network: "tcp".to_owned(),
                address: address.to_owned(),
            })),
        };
        self.open(header).await
    }

    /// Opens a stream to the service the far side registered as `name`.
    pub async fn open_service(&self, name: &str) -> Result<TunnelStream, DialError> {
        let header = StreamHeader {
            kind: Some(stream_header::Kind::Service(ServiceStream {
                name: name.to_owned(),
            })),
        };
        self.open(header).await
    }

    async fn open(&self, header: StreamHeader) -> Result<TunnelStream, DialError> {
        let mut stream = self.open_unacknowledged(&header, &[]).await?;
        let reply: StreamReply = header::read(&mut stream).await.map_err(|e| DialError {
            kind: match e {
                header::HeaderError::TimedOut => DialErrorKind::TimedOut,
                _ => DialErrorKind::Session,
            },
            message: format!("the far side did not acknowledge the stream: {e}"),
        })?;
        match reply.error {
            None => Ok(stream),
            Some(err) => Err(DialError {
                kind: match err.kind() {
                    Kind::NotAllowed => DialErrorKind::NotAllowed,
                    Kind::Refused => DialErrorKind::Refused,
                    Kind::Unreachable => DialErrorKind::Unreachable,
                    Kind::TimedOut => DialErrorKind::TimedOut,
                    Kind::Unsupported | Kind::Unspecified => DialErrorKind::Unsupported,
                },
                message: err.message,
            }),
        }
    }

    /// Opens a stream and sends `header` and then `payload` (in one write), without waiting
    /// for the far side's reply: the caller reads it (a call's request goes with its header).
    pub(crate) async fn open_unacknowledged(
        &self,
        header: &StreamHeader,
        payload: &[u8],
    ) -> Result<TunnelStream, DialError> {
        let (tx, rx) = oneshot::channel();
        let gone = || DialError::session("the tunnel session has ended");
        {
            let mut opens = self.inner.opens();
            if opens.closed {
                return Err(gone());
            }
            opens.waiting.push_back(tx);
        }
        self.inner.driver.wake();
        let stream = rx
            .await
            .map_err(|_| gone())?
            .map_err(|e| DialError::session(format!("cannot open a stream: {e}")))?;
        let mut stream = TunnelStream::new(stream, self.inner.info.clone());
        header::write_with(&mut stream, header, payload)
            .await
            .map_err(|e| DialError::session(format!("cannot send the stream header: {e}")))?;
        Ok(stream)
    }
}

/// Owns the yamux connection; serves open requests and hands inbound streams out.
struct Driver<S> {
    conn: yamux::Connection<WsIo<S>>,
    pending_open: Option<OpenReply>,
    inbound: Inbound,
    shared: Arc<Shared>,
}

impl<S> Driver<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    /// Drives the session until it ends, or is closed; returns why.
    async fn run(mut self) -> String {
        let close = self.shared.close.clone();
        let closing = close.cancelled();
        tokio::pin!(closing);
        let reason = poll_fn(|cx| {
            if closing.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            self.poll_opens(cx);
            loop {
                match self.conn.poll_next_inbound(cx) {
                    Poll::Ready(Some(Ok(stream))) => {
                        let stream = TunnelStream::new(stream, self.shared.info.clone());
                        self.inbound.spawn(stream);
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(e.to_string())),
                    Poll::Ready(None) => {
                        return Poll::Ready(Some("the peer closed the session".to_owned()));
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
        match reason {
            Some(reason) => reason,
            None => {
                // Bounded: a peer that stopped reading must not hold shutdown up.
                let closed = tokio::time::timeout(
                    Duration::from_secs(5),
                    poll_fn(|cx| self.conn.poll_close(cx)),
                )
                .await;
                match closed {
                    Ok(Ok(())) => "closed by this side".to_owned(),
                    Ok(Err(e)) => format!("closed by this side ({e})"),
                    Err(_) => {
                        "closed by this side (the peer did not take the close in 5 s)".to_owned()
                    }
                }
            }
        }
    }

    /// Opens outbound streams for waiting callers, as far as yamux allows right now.
    fn poll_opens(&mut self, cx: &mut Context<'_>) {
        loop {
            let reply = match self.pending_open.take() {
                Some(reply) => reply,
                None => {
                    // Registered before the queue is read, so an open queued after the read
                    // wakes the driver again.
                    self.shared.driver.register(cx.waker());
                    match self.shared.opens().waiting.pop_front() {
                        Some(reply) => reply,
                        None => return,
                    }
                }
            };
            match self.conn.poll_new_outbound(cx) {
                Poll::Ready(result) => {
                    let _ = reply.send(result);
                }
                Poll::Pending => {
                    // Too many streams await the peer's acknowledgement; yamux wakes us.
                    self.pending_open = Some(reply);
                    return;
                }
            }
        }
    }
}

/// One logical connection inside a session: tokio `AsyncRead + AsyncWrite`, with half-close.
pub struct TunnelStream {
    io: Compat<yamux::Stream>,
    session: SessionInfo,
    /// How much of a caller's uninitialised buffer the next read zeroes (see `poll_read`).
    window: usize,
}

impl fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunnelStream")
            .field("stream", self.io.get_ref())
            .field("session", &self.session.id)
            .finish()
    }
}

impl TunnelStream {
    fn new(stream: yamux::Stream, session: SessionInfo) -> Self {
        crate::metrics::STREAMS_OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::STREAMS_OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            io: stream.compat(),
            session,
            window: READ_WINDOW_MIN,
        }
    }

    /// The session this stream belongs to.
    pub fn session(&self) -> &SessionInfo {
        &self.session
    }
}

impl Drop for TunnelStream {
    fn drop(&mut self) {
        crate::metrics::STREAMS_OPEN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Least and most bytes of a caller's uninitialised buffer zeroed for one read (see
/// `poll_read`).
const READ_WINDOW_MIN: usize = 4 * 1024;
const READ_WINDOW_MAX: usize = 64 * 1024;

/// The next read's window after one that returned `n` bytes of an offered `window`: twice
/// as large when the data filled it (a body is streaming), else what that read needed.
fn next_window(window: usize, n: usize) -> usize {
    if n >= window {
        (window * 2).min(READ_WINDOW_MAX)
    } else {
        n.next_power_of_two()
            .clamp(READ_WINDOW_MIN, READ_WINDOW_MAX)
    }
}

impl AsyncRead for TunnelStream {
    /// yamux reads into initialised memory, so the part of `buf` offered to it is zeroed
    /// first. hyper offers its whole read buffer, uninitialised, on every read, including
    /// those that only check an idle kept-alive connection, and that buffer grows to tens of
    /// KiB: zeroing all of it was about 4 % of the hub's and the agent's CPU per proxied
    /// request, and a fixed 16 KiB still 3–5 % (a GET's request and answer are a few KiB).
    /// What is already initialised is offered whole; past that, a window that follows what
    /// the reads return: small for requests and short answers, doubling while a large body
    /// fills it (a 128 KiB yamux frame then takes a few reads, each a copy).
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let ready = buf.initialized().len() - buf.filled().len();
        let window = self.window;
        let offered = buf.remaining().min(ready.max(window));
        let dst = buf.initialize_unfilled_to(offered);
        let stream = self.io.get_mut();
        let n = ready!(futures::AsyncRead::poll_read(Pin::new(stream), cx, dst))?;
        buf.advance(n);
        if n > 0 && offered >= window {
            self.window = next_window(window, n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A session on `io` with default settings, allowed to dial nothing, as unit tests use it.
#[cfg(test)]
pub(crate) fn spawn_for_test<S>(
    io: S,
    role: Role,
    id: &str,
    kind: &str,
    control: Option<crate::inbound::Control>,
) -> Session
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let info = SessionInfo::new(
        Peer {
            id: id.to_owned(),
            kind: kind.to_owned(),
        },
        None,
    );
    let inbound = Inbound {
        allow: crate::AllowList::none(),
        dial_timeout: Duration::from_secs(1),
        control,
        services: crate::Services::default(),
    };
    Session::spawn(
        io,
        role,
        SessionSettings::default(),
        info,
        inbound,
        None,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zeroed_read_window_follows_what_reads_return() {
        const K: usize = 1024;
        for (window, n, next) in [
            // A filled window doubles, up to 64 KiB.
            (4 * K, 4 * K, 8 * K),
            (32 * K, 32 * K, 64 * K),
            (64 * K, 64 * K, 64 * K),
            // A short read sets it to what that read needed, at least 4 KiB.
            (64 * K, 3000, 4 * K),
            (64 * K, 9000, 16 * K),
            (4 * K, 1, 4 * K),
        ] {
            assert_eq!(next_window(window, n), next, "{window} after {n}");
        }
    }

    fn pair() -> (Session, Session) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        (
            spawn_for_test(a, Role::Server, "agent", "test", None),
            spawn_for_test(b, Role::Client, "hub", "test", None),
        )
    }

    #[tokio::test]
    async fn everyone_waiting_for_the_end_hears_why_and_an_open_after_it_fails_at_once() {
        let (hub, agent) = pair();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let agent = agent.clone();
                tokio::spawn(async move { agent.ended().await })
            })
            .collect();
        assert!(!agent.is_ended());
        hub.close();
        for waiter in waiters {
            let reason = waiter.await.unwrap();
            assert!(reason.contains("peer closed"), "{reason}");
        }
        assert!(agent.is_ended());
        assert_eq!(hub.ended().await, "closed by this side");
        let err = agent.dial("127.0.0.1:1").await.unwrap_err();
        assert_eq!(err.kind, DialErrorKind::Session);
        assert!(err.message.contains("ended"), "{}", err.message);
    }

    #[tokio::test]
    async fn opens_queued_by_many_callers_at_once_are_each_answered() {
        let (_hub, agent) = pair();
        // More callers than the old 64-deep queue held; the agent's allow-list is empty, so
        // each stream is opened and then refused by the far side, one answer per caller.
        let opens: Vec<_> = (0..200)
            .map(|_| {
                let agent = agent.clone();
                tokio::spawn(async move { agent.dial("127.0.0.1:1").await })
            })
            .collect();
        for open in opens {
            let err = open.await.unwrap().unwrap_err();
            assert_eq!(err.kind, DialErrorKind::NotAllowed, "{}", err.message);
        }
    }
}
