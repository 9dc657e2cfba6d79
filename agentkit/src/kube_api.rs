//! The `kube-api` service the hub opens streams to: HTTP/1 requests from the hub (already
//! carrying `Impersonate-*` for the user) are sent on to the API server with the agent's own
//! credential; responses stream back (watches included) and upgrades (`exec`, `attach`,
//! `port-forward`) are spliced through. The hub never holds the agent's credential.
//!
//! Connections to the API server are kept and reused (a TLS handshake per request would cost
//! more than the request); an upgrade gets a connection of its own.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tunnel::{TunnelStream, pool::Http1Pool};

use crate::kube::KubeTarget;

type Body = BoxBody<Bytes, hyper::Error>;

/// The API server, and the connections to it kept for reuse.
#[derive(Debug, Clone)]
pub struct Upstream {
    target: Arc<KubeTarget>,
    pool: Http1Pool<Body>,
    /// The agent's own credential and the API server's address, as sent on every request.
    authorization: Option<HeaderValue>,
    host: Option<HeaderValue>,
}

impl Upstream {
    pub fn new(target: KubeTarget) -> Self {
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {}", target.token.expose())).ok();
        if let Some(value) = &mut authorization {
            // Keeps it out of any Debug output.
            value.set_sensitive(true);
        }
        let host = HeaderValue::from_str(&target.address()).ok();
        Self {
            target: Arc::new(target),
            pool: Http1Pool::default(),
            authorization,
            host,
        }
    }

    /// A new TLS connection to the API server.
    async fn connect(&self) -> Result<SendRequest<Body>, String> {
        let target = &self.target;
        let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let name = rustls_pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(target.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        Ok(sender)
    }
}

/// Serves one tunnel stream.
pub async fn serve(stream: TunnelStream, upstream: Upstream) {
    let service = hyper::service::service_fn(move |request| forward(upstream.clone(), request));
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "kube-api stream ended");
    }
}

fn failure(code: StatusCode, message: String) -> Response<Body> {
    let body = kubeshape::status::failure(code.as_u16(), "ServiceUnavailable", &message);
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn forward(
    upstream: Upstream,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let target = &upstream.target;
    let unreachable = |e: String| {
        failure(
            StatusCode::BAD_GATEWAY,
            format!(
                "the cluster-agent cannot reach its API server at {}: {e}",
                target.server
            ),
        )
    };
    let upgrade = request.headers().contains_key(header::UPGRADE);
    let from_hub = upgrade.then(|| hyper::upgrade::on(&mut request));
    let kept = if upgrade { None } else { upstream.pool.take() };
    let reused = kept.is_some();
    let mut sender = match kept {
        Some(sender) => sender,
        None => match upstream.connect().await {
            Ok(sender) => sender,
            Err(e) => return Ok(unreachable(e)),
        },
    };
    let headers = request.headers_mut();
    headers.remove(header::AUTHORIZATION);
    if let Some(bearer) = &upstream.authorization {
        headers.insert(header::AUTHORIZATION, bearer.clone());
    }
    if let Some(host) = &upstream.host {
        headers.insert(header::HOST, host.clone());
    }
    // The API server may close a kept connection just as a request goes out on it. A GET or
    // HEAD without a body is then sent again on a new connection, as Go's HTTP client does;
    // anything else could have had an effect and gets the error.
    let again = (reused
        && matches!(*request.method(), http::Method::GET | http::Method::HEAD)
        && request.body().is_end_stream())
    .then(|| {
        let mut copy = Request::new(());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.headers_mut() = request.headers().clone();
        copy
    });
    let mut response = match sender.send_request(request.map(BodyExt::boxed)).await {
        Ok(response) => response,
        Err(e) => {
            let Some(copy) = again else {
                return Ok(unreachable(e.to_string()));
            };
            tracing::debug!(error = %e, "a kept connection to the API server failed; retrying on a new one");
            sender = match upstream.connect().await {
                Ok(sender) => sender,
                Err(e) => return Ok(unreachable(e)),
            };
            let retry = copy.map(|()| {
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed()
            });
            match sender.send_request(retry).await {
                Ok(response) => response,
                Err(e) => return Ok(unreachable(e.to_string())),
            }
        }
    };
    if !upgrade {
        upstream.pool.put(sender);
    }
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(from_hub) = from_hub
    {
        let from_server = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(hub), Ok(server)) = (from_hub.await, from_server.await) {
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(hub),
                    &mut TokioIo::new(server),
                )
                .await;
            }
        });
    }
    Ok(response.map(BodyExt::boxed))
}
