//! Exec and attach over SPDY/3.1, as the kubelet serves client-go's SPDY executor
//! (`X-Stream-Protocol-Version: v4.channel.k8s.io`): the client opens one stream a channel,
//! each named by its `streamType` header (`error`, `stdin`, `stdout`, `stderr`, `resize`),
//! and the server starts the process once every stream the request's flags call for is open.
//! Here the streams become the channel messages a WebSocket session reads and writes
//! (a channel byte, then the bytes), so one session serves both.

use axum::{
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{StreamExt, channel::mpsc};
use hyper_util::rt::TokioIo;
use kubeshape::spdy::{self, Frame};
use std::{collections::HashMap, future::Future};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use super::{CLOSE, ERROR, RESIZE, Rx, STDERR, STDIN, STDOUT, Tx};

use crate::cluster::server::status;

const UPGRADE: &str = "SPDY/3.1";
const PROTOCOL: &str = "v4.channel.k8s.io";
const VERSION_HEADER: &str = "x-stream-protocol-version";
/// How long the client has to open its streams, as the kubelet's stream creation timeout.
const STREAMS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Which streams the request's flags call for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Expected {
    pub(super) stdin: bool,
    pub(super) stdout: bool,
    pub(super) stderr: bool,
    pub(super) tty: bool,
}

impl Expected {
    /// How many streams the client opens: the error stream, one for each flag, the terminal's
    /// size with a tty, and no stderr then (a terminal has one output).
    fn count(self) -> usize {
        1 + usize::from(self.stdin)
            + usize::from(self.stdout)
            + usize::from(self.stderr && !self.tty)
            + usize::from(self.tty)
    }
}

/// Whether the request asks to switch to SPDY.
pub(super) fn asked(request: &Request) -> bool {
    request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(UPGRADE))
}

/// Answers `101 Switching Protocols` to SPDY/3.1 with `v4.channel.k8s.io`, and runs
/// `serve(tx, rx)` once the client's streams are open; `400` when the client offers no
/// protocol version the simulator speaks.
pub(super) fn switch<F, Fut>(mut request: Request, expected: Expected, serve: F) -> Response
where
    F: FnOnce(Tx, Rx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let offered = request
        .headers()
        .get_all(VERSION_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == PROTOCOL);
    if !offered {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the simulated cluster streams exec over SPDY with {VERSION_HEADER} {PROTOCOL} only"
            ),
        );
    }
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let (to_session, rx) = mpsc::unbounded::<Message>();
        let (tx, from_session) = mpsc::channel::<Message>(super::WAITING);
        let (ready, opened) = tokio::sync::oneshot::channel();
        let pump = tokio::spawn(pump(
            TokioIo::new(upgraded),
            expected.count(),
            to_session,
            from_session,
            ready,
        ));
        if let Ok(Ok(())) = tokio::time::timeout(STREAMS_WAIT, opened).await {
            serve(tx, Box::pin(rx)).await;
        } else {
            pump.abort();
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let out = response.headers_mut();
    out.insert(header::UPGRADE, HeaderValue::from_static(UPGRADE));
    out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    out.insert(VERSION_HEADER, HeaderValue::from_static(PROTOCOL));
    response
}

/// Moves the session's bytes: the client's frames become channel messages to the session,
/// the session's messages become data frames on their streams. A `Close` from the session
/// ends every stream it wrote; the client's going ends the session's input.
async fn pump<IO>(
    io: IO,
    expected: usize,
    to_session: mpsc::UnboundedSender<Message>,
    mut from_session: mpsc::Receiver<Message>,
    ready: tokio::sync::oneshot::Sender<()>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut read, mut write) = tokio::io::split(io);
    let mut session = spdy::Session::new();
    let mut streams: HashMap<u8, u32> = HashMap::new();
    let mut ready = Some(ready);
    let mut input = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    let to = |message: Message| {
        let _ = to_session.unbounded_send(message);
    };
    loop {
        tokio::select! {
            n = read.read(&mut buffer) => {
                let n = match n {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                if n == 0 {
                    to(Message::Close(None));
                    // Keep writing what the session still says until it ends.
                    while let Some(message) = from_session.next().await {
                        if !write_out(&mut write, &streams, message).await {
                            break;
                        }
                    }
                    return;
                }
                input.extend_from_slice(&buffer[..n]);
                let mut replies = Vec::new();
                loop {
                    let frame = match session.next_frame(&mut input) {
                        Ok(Some(frame)) => frame,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "an exec's SPDY session is not readable");
                            to(Message::Close(None));
                            return;
                        }
                    };
                    match frame {
                        Frame::SynStream { stream, headers, .. } => {
                            match session.syn_reply(stream) {
                                Ok(reply) => replies.push(reply),
                                Err(e) => {
                                    tracing::debug!(error = %e, "an exec's SPDY reply");
                                    return;
                                }
                            }
                            if let Some(channel) = spdy::exec_channel(&headers) {
                                streams.insert(channel, stream);
                            }
                            if streams.len() >= expected
                                && let Some(ready) = ready.take()
                            {
                                let _ = ready.send(());
                            }
                        }
                        Frame::Data { stream, data, fin } => {
                            let channel = streams.iter().find(|(_, s)| **s == stream).map(|(c, _)| *c);
                            match channel {
                                Some(STDIN) => {
                                    if !data.is_empty() {
                                        to(Message::Binary([&[STDIN], data.as_slice()].concat().into()));
                                    }
                                    if fin {
                                        to(Message::Binary(vec![CLOSE, STDIN].into()));
                                    }
                                }
                                Some(RESIZE) => {
                                    for message in spdy::channel_messages(RESIZE, &data) {
                                        to(Message::Binary(message.into()));
                                    }
                                }
                                _ => {}
                            }
                        }
                        Frame::Ping { id } => replies.push(spdy::ping(id)),
                        Frame::GoAway => to(Message::Close(None)),
                        Frame::Other => {}
                    }
                }
                for reply in replies {
                    if write.write_all(&reply).await.is_err() {
                        to(Message::Close(None));
                        return;
                    }
                }
            }
            message = from_session.next() => {
                let Some(message) = message else { return };
                if !write_out(&mut write, &streams, message).await {
                    return;
                }
            }
        }
    }
}

/// Writes one of the session's messages as a data frame on its channel's stream; a `Close`
/// ends the streams the server writes and the connection. `false` once nothing more goes out.
async fn write_out<W>(write: &mut W, streams: &HashMap<u8, u32>, message: Message) -> bool
where
    W: tokio::io::AsyncWrite + Unpin,
{
    match message {
        Message::Binary(bytes) => {
            let Some((channel, data)) = bytes.split_first() else {
                return true;
            };
            match streams.get(channel) {
                Some(stream) => write
                    .write_all(&spdy::data(*stream, data, false))
                    .await
                    .is_ok(),
                None => true,
            }
        }
        Message::Close(_) => {
            for channel in [STDOUT, STDERR, ERROR] {
                if let Some(stream) = streams.get(&channel) {
                    let _ = write.write_all(&spdy::data(*stream, &[], true)).await;
                }
            }
            let _ = write.shutdown().await;
            false
        }
        _ => true,
    }
}
