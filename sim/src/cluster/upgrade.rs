//! Switching a request to WebSocket with one of the subprotocols its handler speaks, as
//! kube-apiserver answers exec, attach and port-forward; the socket goes to the handler's own
//! task once the client has switched.

use std::future::Future;

use axum::{
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{handshake::derive_accept_key, protocol::Role},
};

use super::server::status;

pub(super) type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Answers `101 Switching Protocols` with the first of `ours` the client offers, and runs
/// `serve(socket, protocol)` once switched; or `400` with `refusal` when the request is no
/// WebSocket upgrade or offers none of them.
pub(super) fn switch<F, Fut>(
    mut request: Request,
    ours: &[&'static str],
    refusal: &str,
    serve: F,
) -> Response
where
    F: FnOnce(Socket, &'static str) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let headers = request.headers();
    let key = headers
        .get("sec-websocket-key")
        .map(|k| derive_accept_key(k.as_bytes()));
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let protocol = ours.iter().copied().find(|p| offered.contains(p));
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let (Some(key), Some(protocol), true) = (key, protocol, websocket) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", refusal.to_owned());
    };
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        serve(socket, protocol).await;
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let out = response.headers_mut();
    out.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    out.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    if let Ok(accept) = HeaderValue::from_str(&key) {
        out.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}
