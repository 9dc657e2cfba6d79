//! `pods/portforward` as kubectl 1.32 asks for it: a WebSocket whose subprotocol is
//! `SPDY/3.1+portforward.k8s.io`, carrying a SPDY/3.1 session. For each local connection the
//! client opens two streams, headers `streamType: error|data`, `port`, `requestID`; the
//! server answers each with SYN_REPLY, copies the data stream to and from the pod's port,
//! and ends the error stream (empty: no error) when the data stream ends. In the simulator
//! every port of every pod is a stand-in **echo server**: what is sent comes back.

use std::{collections::HashMap, sync::Arc};

use axum::{extract::Request, response::Response};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::{
    Sim,
    request::Target,
    store::StoreError,
    upgrade::{self, Socket},
};
use kubeshape::spdy::{self, Frame, Session};

const PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// Answers a port-forward request: switches to WebSocket and serves the SPDY session on its
/// own task.
pub(super) fn forward(sim: &Arc<Sim>, target: &Target, request: Request) -> Response {
    if sim.store.get("pods", &target.key()).is_none() {
        return super::server::store_error(target, StoreError::NotFound);
    }
    upgrade::switch(
        request,
        &[PROTOCOL],
        &format!(
            "the simulated cluster forwards ports over WebSocket ({PROTOCOL}); plain SPDY is not simulated"
        ),
        |socket, _| async move {
            if let Err(e) = serve(socket).await {
                tracing::debug!(error = %e, "a port-forward session ended");
            }
        },
    )
}

/// The two streams of one forwarded connection, by the client's `requestID`.
#[derive(Debug, Default)]
struct Pair {
    error: Option<u32>,
    data: Option<u32>,
}

async fn serve(socket: Socket) -> Result<(), String> {
    let (mut tx, mut rx) = socket.split();
    let mut session = Session::new();
    let mut input = Vec::new();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    while let Some(message) = rx.next().await {
        let bytes = match message.map_err(|e| e.to_string())? {
            Message::Binary(bytes) => bytes,
            Message::Close(_) => break,
            _ => continue,
        };
        input.extend_from_slice(&bytes);
        let mut replies: Vec<Vec<u8>> = Vec::new();
        while let Some(frame) = session.next_frame(&mut input)? {
            match frame {
                Frame::SynStream {
                    stream, headers, ..
                } => {
                    replies.push(session.syn_reply(stream)?);
                    let header = |name: &str| {
                        headers
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    let pair = pairs.entry(header("requestid")).or_default();
                    match header("streamtype").as_str() {
                        "error" => pair.error = Some(stream),
                        _ => pair.data = Some(stream),
                    }
                }
                // The stand-in echo server: what arrives on a data stream goes back on it.
                Frame::Data { stream, data, fin } => {
                    let is_data = pairs.values().any(|p| p.data == Some(stream));
                    if !is_data {
                        continue;
                    }
                    if !data.is_empty() {
                        replies.push(spdy::data(stream, &data, false));
                    }
                    if fin {
                        // The client is done sending: end the echo, then the error stream
                        // (empty: nothing went wrong).
                        replies.push(spdy::data(stream, &[], true));
                        if let Some((id, pair)) = pairs.iter().find(|(_, p)| p.data == Some(stream))
                        {
                            if let Some(error) = pair.error {
                                replies.push(spdy::data(error, &[], true));
                            }
                            let id = id.clone();
                            pairs.remove(&id);
                        }
                    }
                }
                Frame::Ping { id } => replies.push(spdy::ping(id)),
                Frame::GoAway => return Ok(()),
                Frame::Other => {}
            }
        }
        for reply in replies {
            tx.send(Message::Binary(reply.into()))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
