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
    serve_limited(listener, tls, service, 0, shutdown).await;
}

/// As [`serve`], with at most `max_handshakes` TLS handshakes in flight (0: no limit). When a
/// whole fleet reconnects at once (the hub restarted), handshakes past the limit wait their turn
/// (up to [`HANDSHAKE_QUEUE_TIMEOUT`]) instead of all competing for the CPU and timing out
/// together; those that wait too long are closed, and their agents retry after a jittered
/// backoff.
pub async fn serve_limited<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    max_handshakes: usize,
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
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let handshakes =
        (max_handshakes > 0).then(|| Arc::new(tokio::sync::Semaphore::new(max_handshakes)));
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
        tokio::spawn(async move {
            let permit = match handshakes {
                Some(handshakes) => {
                    match tokio::time::timeout(HANDSHAKE_QUEUE_TIMEOUT, handshakes.acquire_owned())
                        .await
                    {
                        Ok(Ok(permit)) => Some(permit),
                        _ => {
                            tracing::debug!(%remote, "waited too long for a handshake slot");
                            return;
                        }
                    }
                }
                None => None,
            };
            let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
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
            drop(permit);
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
                TokioIo::new(tls),
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
