//! The `kube-api` service the hub opens streams to: HTTP/1 requests from the hub (already
//! carrying `Impersonate-*` for the user) are sent on to the API server with the agent's own
//! credential; responses stream back (watches included) and upgrades (`exec`, `attach`,
//! `port-forward`) are spliced through. The hub never holds the agent's credential.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tunnel::TunnelStream;

use crate::kube::KubeTarget;

type Body = BoxBody<Bytes, hyper::Error>;

/// Serves one tunnel stream.
pub(crate) async fn serve(stream: TunnelStream, target: Arc<KubeTarget>) {
    let service = hyper::service::service_fn(move |request| forward(target.clone(), request));
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "kube-api stream ended");
    }
}

fn failure(code: StatusCode, message: String) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "ServiceUnavailable", "code": code.as_u16(),
    });
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
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
    target: Arc<KubeTarget>,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
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
    let tcp = match tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await {
        Ok(tcp) => tcp,
        Err(e) => return Ok(unreachable(e.to_string())),
    };
    let _ = tcp.set_nodelay(true);
    let name = match rustls_pki_types::ServerName::try_from(target.host.clone()) {
        Ok(name) => name,
        Err(e) => return Ok(unreachable(e.to_string())),
    };
    let tls = match tokio_rustls::TlsConnector::from(target.tls.clone())
        .connect(name, tcp)
        .await
    {
        Ok(tls) => tls,
        Err(e) => return Ok(unreachable(format!("TLS: {e}"))),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
        Ok(pair) => pair,
        Err(e) => return Ok(unreachable(e.to_string())),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let headers = request.headers_mut();
    headers.remove(header::AUTHORIZATION);
    if let Ok(bearer) = HeaderValue::from_str(&format!("Bearer {}", target.token.expose())) {
        headers.insert(header::AUTHORIZATION, bearer);
    }
    if let Ok(host) = HeaderValue::from_str(&target.address()) {
        headers.insert(header::HOST, host);
    }
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => return Ok(unreachable(e.to_string())),
    };
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
