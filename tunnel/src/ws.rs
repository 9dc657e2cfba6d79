//! A WebSocket seen as a byte stream, so yamux can run over it, with the session's keepalive.
//!
//! Writes are gathered and sent as one binary message per flush (yamux writes a frame's header
//! and body separately; sending them apart would double the messages). Both sides ping every
//! interval and treat any inbound frame as a sign of life; a peer silent for three intervals is
//! declared dead, so a path that stops forwarding is noticed in bounded time on both ends.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use futures::{AsyncRead, AsyncWrite, Sink, Stream};
use tokio::{
    io::{AsyncRead as TokioRead, AsyncWrite as TokioWrite},
    time::{Instant, Sleep},
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{Error as WsError, Message, error::CapacityError, protocol::WebSocketConfig},
};

/// Limits and timing of the WebSocket under a session.
#[derive(Debug, Clone, Copy)]
pub struct WsSettings {
    /// Interval between keepalive pings; a peer silent for three of these is declared dead.
    pub ping_interval: Duration,
    /// Largest WebSocket message accepted from the peer; a larger one ends the session.
    pub max_message_size: usize,
    /// Outbound bytes gathered into one message before it is sent even without a flush.
    pub batch_size: usize,
}

impl Default for WsSettings {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(10),
            max_message_size: 1024 * 1024,
            batch_size: 256 * 1024,
        }
    }
}

impl WsSettings {
    /// The tungstenite configuration these settings imply.
    pub(crate) fn websocket_config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .max_message_size(Some(self.max_message_size))
            .max_frame_size(Some(self.max_message_size))
            .read_buffer_size(128 * 1024)
            .write_buffer_size(self.batch_size)
    }

    /// How long a peer may stay silent before the session is declared dead.
    pub fn dead_after(&self) -> Duration {
        self.ping_interval * 3
    }
}

/// The byte-stream view of a WebSocket, for yamux (futures-io traits).
pub(crate) struct WsIo<S> {
    ws: WebSocketStream<S>,
    settings: WsSettings,
    read_buf: Bytes,
    write_buf: Vec<u8>,
    keepalive: Keepalive,
}

impl<S> std::fmt::Debug for WsIo<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsIo").finish_non_exhaustive()
    }
}

impl<S: TokioRead + TokioWrite + Unpin> WsIo<S> {
    pub(crate) fn new(ws: WebSocketStream<S>, settings: WsSettings) -> Self {
        Self {
            ws,
            read_buf: Bytes::new(),
            write_buf: Vec::with_capacity(settings.batch_size),
            keepalive: Keepalive::new(settings.ping_interval, settings.dead_after()),
            settings,
        }
    }

    /// Checks liveness and sends a ping when one is due. Called from every poll so the timer is
    /// always armed, whichever direction yamux is waiting on.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.keepalive.poll(cx)?;
        if self.keepalive.ping_due {
            // A ping waits only for buffer space, never for yamux data still to be written: it
            // goes out with the next flush, ahead of the next batch.
            if let Poll::Ready(ready) = Pin::new(&mut self.ws).poll_ready(cx) {
                ready.map_err(ws_to_io)?;
                Pin::new(&mut self.ws)
                    .start_send(Message::Ping(Bytes::new()))
                    .map_err(ws_to_io)?;
                self.keepalive.ping_due = false;
                // Best effort: if the socket is full the ping leaves with the next flush.
                if let Poll::Ready(Err(e)) = Pin::new(&mut self.ws).poll_flush(cx) {
                    return Err(ws_to_io(e));
                }
            }
        }
        Ok(())
    }

    fn poll_send_batch(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(ws_to_io)?;
        let batch = std::mem::replace(
            &mut self.write_buf,
            Vec::with_capacity(self.settings.batch_size),
        );
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(Bytes::from(batch)))
            .map_err(ws_to_io)?;
        Poll::Ready(Ok(()))
    }
}

impl<S: TokioRead + TokioWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.poll_keepalive(cx)?;
        loop {
            if !this.read_buf.is_empty() {
                let n = buf.len().min(this.read_buf.len());
                buf[..n].copy_from_slice(&this.read_buf[..n]);
                this.read_buf.advance(n);
                return Poll::Ready(Ok(n));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(message)) => {
                    this.keepalive.heard_from_peer();
                    match message {
                        Message::Binary(data) => this.read_buf = data,
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                        Message::Close(_) => return Poll::Ready(Ok(0)),
                        Message::Text(_) => {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "peer sent a text message; the tunnel carries binary messages only",
                            )));
                        }
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(ws_to_io(e))),
                None => return Poll::Ready(Ok(0)),
            }
        }
    }
}

impl<S: TokioRead + TokioWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        this.poll_keepalive(cx)?;
        if this.write_buf.len() >= this.settings.batch_size {
            ready!(this.poll_send_batch(cx))?;
        }
        this.write_buf.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.poll_keepalive(cx)?;
        if !this.write_buf.is_empty() {
            ready!(this.poll_send_batch(cx))?;
        }
        Pin::new(&mut this.ws).poll_flush(cx).map_err(ws_to_io)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.ws).poll_close(cx).map_err(ws_to_io)
    }
}

fn ws_to_io(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::Capacity(CapacityError::MessageTooLong { size, max_size }) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("peer sent a {size}-byte WebSocket message; the limit is {max_size}"),
        ),
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::ErrorKind::BrokenPipe.into(),
        other => io::Error::new(io::ErrorKind::InvalidData, format!("WebSocket: {other}")),
    }
}

/// When to ping and when to give up on a silent peer.
struct Keepalive {
    interval: Duration,
    dead_after: Duration,
    last_heard: Instant,
    next_ping: Instant,
    ping_due: bool,
    timer: Pin<Box<Sleep>>,
}

impl Keepalive {
    fn new(interval: Duration, dead_after: Duration) -> Self {
        let now = Instant::now();
        Self {
            interval,
            dead_after,
            last_heard: now,
            next_ping: now + interval,
            ping_due: false,
            timer: Box::pin(tokio::time::sleep_until(now + interval)),
        }
    }

    fn heard_from_peer(&mut self) {
        // Only a timestamp: the timer is re-armed lazily in `poll`, not on every message.
        self.last_heard = Instant::now();
    }

    /// Fails once the peer has been silent for `dead_after`; sets `ping_due` when a ping
    /// should go out; leaves the timer armed for the next of the two moments.
    fn poll(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            let now = Instant::now();
            let deadline = self.last_heard + self.dead_after;
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "keepalive: nothing heard from the peer for {:?} (pings every {:?})",
                        now - self.last_heard,
                        self.interval
                    ),
                ));
            }
            if now >= self.next_ping {
                self.ping_due = true;
                self.next_ping = now + self.interval;
            }
            let wake_at = self.next_ping.min(deadline);
            if self.timer.deadline() != wake_at {
                self.timer.as_mut().reset(wake_at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::protocol::Role;

    async fn pair(
        settings: WsSettings,
    ) -> (WsIo<tokio::io::DuplexStream>, WsIo<tokio::io::DuplexStream>) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let cfg = Some(settings.websocket_config());
        let a = WebSocketStream::from_raw_socket(a, Role::Client, cfg).await;
        let b = WebSocketStream::from_raw_socket(b, Role::Server, cfg).await;
        (WsIo::new(a, settings), WsIo::new(b, settings))
    }

    #[tokio::test]
    async fn bytes_written_on_one_side_are_read_on_the_other() {
        let (mut a, mut b) = pair(WsSettings::default()).await;
        a.write_all(b"hello ").await.unwrap();
        a.write_all(b"world").await.unwrap();
        a.flush().await.unwrap();
        let mut got = [0u8; 11];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_declared_dead_after_three_intervals() {
        let settings = WsSettings {
            ping_interval: Duration::from_secs(10),
            ..WsSettings::default()
        };
        // The peer exists but never reads or answers: the other end of the pipe is held idle.
        let (a, _idle_peer) = tokio::io::duplex(1 << 20);
        let ws =
            WebSocketStream::from_raw_socket(a, Role::Client, Some(settings.websocket_config()))
                .await;
        let mut io = WsIo::new(ws, settings);
        let start = Instant::now();
        let mut buf = [0u8; 16];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn pings_keep_an_idle_but_healthy_session_alive() {
        let settings = WsSettings {
            ping_interval: Duration::from_secs(10),
            ..WsSettings::default()
        };
        let (mut a, mut b) = pair(settings).await;
        let mut buf_a = [0u8; 16];
        let mut buf_b = [0u8; 16];
        // Both sides read for ten dead-intervals' worth of time without any data: only pings flow.
        let idle = tokio::time::timeout(Duration::from_secs(300), async {
            tokio::join!(a.read(&mut buf_a), b.read(&mut buf_b))
        })
        .await;
        assert!(
            idle.is_err(),
            "a healthy idle session must not be declared dead"
        );
    }

    #[tokio::test]
    async fn an_oversized_message_is_an_error_naming_the_limit() {
        let settings = WsSettings {
            max_message_size: 1024,
            ..WsSettings::default()
        };
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut raw = WebSocketStream::from_raw_socket(a, Role::Client, None).await;
        let ws =
            WebSocketStream::from_raw_socket(b, Role::Server, Some(settings.websocket_config()))
                .await;
        let mut io = WsIo::new(ws, settings);
        futures::SinkExt::send(&mut raw, Message::Binary(Bytes::from(vec![0u8; 4096])))
            .await
            .unwrap();
        let err = io.read(&mut [0u8; 16]).await.unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }
}
