//! The hub's HTTPS listener: TLS (rustls), HTTP/1.1 and HTTP/2, upgrades allowed (the tunnel's
//! WebSocket, and later `exec` streams), a handshake timeout against slow clients, and a
//! graceful stop. Any tower service can be mounted; the hub mounts its axum router.

use std::{
    convert::Infallible, error::Error as StdError, net::SocketAddr, sync::Arc, time::Duration,
};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

/// The TCP address a request came from; every request carries it in its extensions.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// On a request whose connection presented a client certificate the listener's TLS config
/// verified (see `tls::server_config_with_clients`); absent otherwise.
#[derive(Debug, Clone, Copy)]
pub struct CertifiedClient;

/// Time a connection may wait for its turn to handshake under [`serve_limited`].
pub const HANDSHAKE_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Time a client has to complete the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a client has to send a request's headers once it starts one (or after the previous
/// response on a kept connection); a client dribbling bytes cannot hold a connection forever.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time requests in flight get to finish after `shutdown` is cancelled.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `service` over TLS on `listener` until `shutdown` is cancelled, then stops accepting
/// and lets requests in flight finish (at most [`DRAIN_TIMEOUT`]). Upgraded connections (tunnel
/// sessions) are not tracked here: their owners close them on the same `shutdown`.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    shutdown: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    serve_limited(listener, tls, service, Limits::default(), shutdown).await;
}

/// What one listener lets clients hold before they have proven anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// TLS handshakes in flight at once (0: no limit). When a whole fleet reconnects at once
    /// (the hub restarted), handshakes past the limit wait their turn (up to
    /// [`HANDSHAKE_QUEUE_TIMEOUT`]) instead of all competing for the CPU and timing out
    /// together; those that wait too long are closed, and their agents retry after a jittered
    /// backoff. One address holds at most half of them; its others wait.
    pub max_handshakes: usize,
    /// Connections from one address that have sent nothing for [`SILENT_AFTER`] (0: no
    /// limit); more are closed then, so one address cannot hold the listener's file
    /// descriptors. A crowd of clients that speak at once (a fleet behind one NAT) is never
    /// silent.
    pub max_silent_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_handshakes: 0,
            max_silent_per_address: DEFAULT_SILENT_PER_ADDRESS,
        }
    }
}

/// How long a new connection may say nothing before it counts as silent.
pub const SILENT_AFTER: Duration = Duration::from_secs(1);

/// Connections one address may hold before they send anything, by default.
pub const DEFAULT_SILENT_PER_ADDRESS: usize = 64;

/// Per address: connections that have sent nothing yet, and the address's share of the
/// handshake slots. An address's entries go once nothing of it is left.
#[derive(Debug, Default)]
struct PerAddress {
    silent: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    handshakes:
        std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, Arc<tokio::sync::Semaphore>>>,
}

/// One silent connection, counted until dropped.
struct Silent {
    counts: Arc<PerAddress>,
    addr: std::net::IpAddr,
}

impl PerAddress {
    fn silent(self: &Arc<Self>, addr: std::net::IpAddr, limit: usize) -> Option<Silent> {
        let mut counts = self.silent.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(addr).or_insert(0);
        if limit > 0 && *count >= limit {
            return None;
        }
        *count += 1;
        Some(Silent {
            counts: self.clone(),
            addr,
        })
    }

    /// The address's share of the handshake slots.
    fn share(&self, addr: std::net::IpAddr, permits: usize) -> Arc<tokio::sync::Semaphore> {
        let mut shares = self.handshakes.lock().unwrap_or_else(|p| p.into_inner());
        // Forget shares no one holds or waits for (only the map has them).
        if shares.len() > 1024 {
            shares.retain(|_, s| Arc::strong_count(s) > 1);
        }
        shares
            .entry(addr)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(permits)))
            .clone()
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        let mut counts = self.counts.silent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.addr) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.addr);
            }
        }
    }
}

/// As [`serve`], within `limits`. A connection takes a handshake slot only once its client has
/// sent something (a silent one never holds a slot; one address at most half of them), must finish its handshake within
/// [`TLS_HANDSHAKE_TIMEOUT`], and must start its first request within [`HEADER_READ_TIMEOUT`]
/// after it (then HTTP/1's header timeout covers the time between requests, and HTTP/2 pings
/// a quiet peer).
pub async fn serve_limited<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    limits: Limits,
    shutdown: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(HTTP2_PING_INTERVAL))
        .keep_alive_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let handshakes = (limits.max_handshakes > 0)
        .then(|| Arc::new(tokio::sync::Semaphore::new(limits.max_handshakes)));
    let per_address = Arc::new(PerAddress::default());
    loop {
        let (tcp, remote) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let service = service.clone();
        let handshakes = handshakes.clone();
        let share = handshakes
            .as_ref()
            .map(|_| per_address.share(remote.ip(), (limits.max_handshakes / 2).max(1)));
        let per_address = per_address.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            // A client that never speaks never takes a handshake slot. One that has not spoken
            // within a second (a TLS client sends its ClientHello at once) is silent, and an
            // address holds only so many silent connections.
            let mut first = [0u8; 1];
            let spoke = |peeked: Result<std::io::Result<usize>, _>| matches!(peeked, Ok(Ok(1)));
            let peeked = tokio::time::timeout(SILENT_AFTER, tcp.peek(&mut first)).await;
            if peeked.is_err() {
                let Some(silent) = per_address.silent(remote.ip(), limits.max_silent_per_address)
                else {
                    tracing::debug!(%remote, "too many silent connections from this address");
                    return;
                };
                let rest = TLS_HANDSHAKE_TIMEOUT.saturating_sub(SILENT_AFTER);
                if !spoke(tokio::time::timeout(rest, tcp.peek(&mut first)).await) {
                    tracing::debug!(%remote, "no ClientHello in time");
                    return;
                }
                drop(silent);
            } else if !spoke(peeked) {
                return;
            }
            let queued = tokio::time::Instant::now() + HANDSHAKE_QUEUE_TIMEOUT;
            let mut permits = Vec::new();
            for semaphore in share.into_iter().chain(handshakes) {
                match tokio::time::timeout_at(queued, semaphore.acquire_owned()).await {
                    Ok(Ok(permit)) => permits.push(permit),
                    _ => {
                        tracing::debug!(%remote, "waited too long for a handshake slot");
                        return;
                    }
                }
            }
            let deadline = started + TLS_HANDSHAKE_TIMEOUT;
            let tls = match tokio::time::timeout_at(
                deadline.max(tokio::time::Instant::now() + TLS_HANDSHAKE_TIMEOUT / 2),
                acceptor.accept(tcp),
            )
            .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake timed out");
                    return;
                }
            };
            drop(permits);
            // A client certificate is verified in the handshake, or the handshake fails.
            let certified = tls.get_ref().1.peer_certificates().is_some();
            let service = service.map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(RemoteAddr(remote));
                if certified {
                    req.extensions_mut().insert(CertifiedClient);
                }
                req
            });
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(FirstByteDeadline::new(tls, HEADER_READ_TIMEOUT)),
                TowerToHyperService::new(service),
            );
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%remote, error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after {DRAIN_TIMEOUT:?}; stopping anyway");
    }
}

/// How often an HTTP/2 connection pings a quiet peer (a dead one is closed when the ping goes
/// unanswered for [`HEADER_READ_TIMEOUT`]).
pub const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// A stream that fails its reads if nothing at all arrives within a deadline from its start:
/// the HTTP server first reads to tell HTTP/1 from HTTP/2, with no timeout of its own, so a
/// client that completes TLS and then says nothing would hold its connection forever.
struct FirstByteDeadline<T> {
    inner: T,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> FirstByteDeadline<T> {
    fn new(inner: T, within: Duration) -> Self {
        Self {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for FirstByteDeadline<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            std::task::Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.deadline = None;
            }
            std::task::Poll::Pending => {
                if let Some(deadline) = &mut self.deadline
                    && std::future::Future::poll(deadline.as_mut(), cx).is_ready()
                {
                    return std::task::Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client sent no request after the TLS handshake",
                    )));
                }
            }
            _ => {}
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for FirstByteDeadline<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
