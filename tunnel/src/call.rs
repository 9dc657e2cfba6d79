//! The control plane's gRPC calls, one yamux stream each (protocol 2; see `Call` in
//! tunnel.proto). The caller's side is [`Channel`], a tower service that tonic's generated
//! clients take in place of a `tonic::transport::Channel`; the accepting side hands each call to
//! tonic's `Routes` as an HTTP request, so services are written as for any tonic server.
//!
//! Why not HTTP/2 on one long-lived stream (protocol 1): h2 keeps about 28 KiB of codec buffers
//! and HPACK tables per connection, idle or not, which was over half of what a hub held per
//! agent. A stream per call holds nothing between calls, and a call's head travels with its
//! first bytes, so a call costs no round trip more than it did on HTTP/2.

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use proto::tunnel::v1::{Call, CallHead, Metadata, StreamHeader, StreamReply, stream_header};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::oneshot;

use crate::{
    header,
    session::{DialError, Session, SessionInfo, TunnelStream},
};

/// Frame tags after the stream's header and reply.
const DATA: u8 = 0;
const END: u8 = 1;
const HEAD: u8 = 2;
const TRAILERS: u8 = 3;

/// Tag and big-endian length.
const FRAME_HEAD: usize = 5;

/// Largest frame accepted: tonic's own limit on a decoded message is 4 MiB, and bodies are
/// framed as tonic hands them over (a message or a few at a time).
const MAX_FRAME: usize = 16 * 1024 * 1024;

/// Why a call could not be made or its response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot open a stream for the call: {0}")]
    Open(#[from] DialError),
    #[error("the far side refused the call: {0}")]
    Refused(String),
    #[error("the call's stream failed: {0}")]
    Io(#[from] io::Error),
}

/// gRPC to the far side of a session: every call opens a stream of its own. Cheap to clone;
/// calls fail once the session has ended.
#[derive(Clone, Debug)]
pub struct Channel {
    session: Session,
}

impl Channel {
    pub(crate) fn new(session: Session) -> Self {
        Self { session }
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<CallBody>;
    type Error = CallError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, CallError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        // Streams are opened per call; yamux's own stream limit queues the excess.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let session = self.session.clone();
        Box::pin(async move { call(&session, request).await })
    }
}

async fn call(
    session: &Session,
    request: http::Request<tonic::body::Body>,
) -> Result<http::Response<CallBody>, CallError> {
    let (parts, mut body) = request.into_parts();
    let header = StreamHeader {
        kind: Some(stream_header::Kind::Call(Call {
            path: parts.uri.path().to_owned(),
            metadata: metadata(&parts.headers),
        })),
    };
    // What of the request is ready now goes with the header, in one write: all of a unary
    // call's request, so a heartbeat is one frame each way rather than several.
    let mut first = Vec::new();
    let mut ended = false;
    while !ended {
        match body.frame().now_or_never() {
            Some(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    push_frame(&mut first, DATA, &data)?;
                }
            }
            // A request that cannot be encoded ends here; the far side answers the truncated
            // request with an error status.
            Some(Some(Err(_)) | None) => {
                push_frame(&mut first, END, &[])?;
                ended = true;
            }
            None => break,
        }
    }
    let stream = session.open_unacknowledged(&header, &first).await?;
    let (read, write) = tokio::io::split(stream);
    if !ended {
        // The rest goes out while the response is awaited: a streaming request may need both.
        tokio::spawn(send_request(write, body));
    }
    let mut frames = FrameReader::new(read);
    // The acknowledgement comes with the response's head, which may take as long as the call
    // does (an upload is answered at its end): no header timeout here.
    let reply: StreamReply = header::read_unbounded(&mut frames.io)
        .await
        .map_err(|e| io::Error::other(format!("no acknowledgement: {e}")))?;
    if let Some(error) = reply.error {
        return Err(CallError::Refused(error.message));
    }
    let head = match std::future::poll_fn(|cx| frames.poll_frame(cx)).await? {
        Some((HEAD, bytes)) => CallHead::decode(bytes).map_err(invalid)?,
        Some((tag, _)) => {
            return Err(invalid(format!("frame {tag} before the response head")).into());
        }
        None => return Err(invalid("stream closed before the response head").into()),
    };
    let mut response = http::Response::new(CallBody {
        frames,
        done: false,
    });
    *response.status_mut() = u16::try_from(head.status)
        .ok()
        .and_then(|s| http::StatusCode::from_u16(s).ok())
        .ok_or_else(|| invalid(format!("bad status {}", head.status)))?;
    *response.version_mut() = http::Version::HTTP_2;
    *response.headers_mut() = header_map(head.metadata);
    Ok(response)
}

/// Sends the rest of the request's body as DATA frames, then END. The caller's side of the
/// stream stays open (this half is dropped, not shut down) so that dropping the response resets
/// the stream.
async fn send_request(mut write: WriteHalf<TunnelStream>, mut body: tonic::body::Body) {
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data()
            && write_frame(&mut write, DATA, &data).await.is_err()
        {
            return;
        }
    }
    let _ = write_frame(&mut write, END, &[]).await;
}

/// A call's response body: DATA frames, then the trailers (gRPC's status).
pub struct CallBody {
    frames: FrameReader<ReadHalf<TunnelStream>>,
    done: bool,
}

impl std::fmt::Debug for CallBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallBody")
            .field("done", &self.done)
            .finish()
    }
}

impl http_body::Body for CallBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let frame = match ready!(self.frames.poll_frame(cx)) {
            Ok(Some((DATA, bytes))) => Frame::data(bytes),
            Ok(Some((TRAILERS, bytes))) => {
                self.done = true;
                let trailers = CallHead::decode(bytes).map_err(invalid)?;
                Frame::trailers(header_map(trailers.metadata))
            }
            Ok(Some((tag, _))) => {
                self.done = true;
                return Poll::Ready(Some(Err(invalid(format!("frame {tag} in a response")))));
            }
            Ok(None) => {
                self.done = true;
                return Poll::Ready(None);
            }
            Err(e) => {
                self.done = true;
                return Poll::Ready(Some(Err(e)));
            }
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// Serves one call the peer opened (its header read, the stream acknowledged) with `routes`.
/// Ends early, dropping the response, if the caller resets the stream.
pub(crate) async fn serve(
    stream: TunnelStream,
    call: Call,
    routes: tonic::service::Routes,
    extensions: http::Extensions,
    info: SessionInfo,
) {
    let session = info.id;
    let (read, mut write) = tokio::io::split(stream);
    let (give_back, given_back) = oneshot::channel();
    let body = RequestBody {
        frames: Some(FrameReader::new(read)),
        ended: false,
        give_back: Some(give_back),
    };
    let mut request = http::Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.version_mut() = http::Version::HTTP_2;
    match call.path.parse() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => {
            tracing::debug!(session, path = %call.path, "call with a bad path");
            return;
        }
    }
    *request.headers_mut() = header_map(call.metadata);
    request.extensions_mut().insert(info);
    request.extensions_mut().extend(extensions);
    let respond = async {
        // The acknowledgement goes with the response's head, and with as much of the response
        // as is ready: all of a unary call's, in one write.
        let mut out = header::accepted().encode_length_delimited_to_vec();
        let Ok(response) = tower::ServiceExt::oneshot(routes, request).await;
        let (parts, mut body) = response.into_parts();
        let head = CallHead {
            status: u32::from(parts.status.as_u16()),
            metadata: metadata(&parts.headers),
        };
        push_frame(&mut out, HEAD, &head.encode_to_vec())?;
        let mut ended = false;
        while !ended {
            match body.frame().now_or_never() {
                Some(Some(frame)) => push_response_frame(&mut out, frame)?,
                Some(None) => ended = true,
                None => break,
            }
        }
        write.write_all(&out).await?;
        write.flush().await?;
        if !ended {
            while let Some(frame) = body.frame().await {
                out.clear();
                push_response_frame(&mut out, frame)?;
                write.write_all(&out).await?;
                write.flush().await?;
            }
        }
        write.shutdown().await
    };
    // The request body hands the stream's reading half back when it is done with it; from
    // then on, anything but the caller's close after our response means it went away.
    let gone = async {
        let Ok((mut frames, mut ended)) = given_back.await else {
            return std::future::pending().await;
        };
        loop {
            match std::future::poll_fn(|cx| frames.poll_frame(cx)).await {
                Ok(Some((END, _))) if !ended => ended = true,
                Ok(Some((DATA, _))) if !ended => {}
                _ => return,
            }
        }
    };
    tokio::select! {
        result = respond => {
            if let Err(e) = result {
                tracing::debug!(session, path = %call.path, error = %e, "call ended early");
            }
        }
        () = gone => tracing::debug!(session, path = %call.path, "the caller went away; call cancelled"),
    }
}

/// A call's request body on the accepting side: DATA frames until END.
struct RequestBody {
    frames: Option<FrameReader<ReadHalf<TunnelStream>>>,
    ended: bool,
    give_back: Option<oneshot::Sender<(FrameReader<ReadHalf<TunnelStream>>, bool)>>,
}

impl RequestBody {
    fn hand_back(&mut self) {
        if let (Some(frames), Some(give_back)) = (self.frames.take(), self.give_back.take()) {
            let _ = give_back.send((frames, self.ended));
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.hand_back();
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let Some(frames) = self.frames.as_mut() else {
            return Poll::Ready(None);
        };
        match ready!(frames.poll_frame(cx)) {
            Ok(Some((DATA, bytes))) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Ok(Some((END, _))) => {
                self.ended = true;
                self.hand_back();
                Poll::Ready(None)
            }
            Ok(Some((tag, _))) => {
                Poll::Ready(Some(Err(invalid(format!("frame {tag} in a request")))))
            }
            Ok(None) => Poll::Ready(Some(Err(invalid("the caller closed mid-request")))),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_none()
    }
}

/// Reads `[tag][u32 length][payload]` frames; `None` at a clean end between frames.
struct FrameReader<R> {
    io: R,
    head: [u8; FRAME_HEAD],
    have: usize,
    body: Option<(u8, BytesMut, usize)>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(io: R) -> Self {
        Self {
            io,
            head: [0; FRAME_HEAD],
            have: 0,
            body: None,
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<(u8, Bytes)>>> {
        loop {
            if let Some((_, buf, filled)) = self.body.as_mut() {
                while *filled < buf.len() {
                    let mut read = ReadBuf::new(&mut buf[*filled..]);
                    ready!(Pin::new(&mut self.io).poll_read(cx, &mut read))?;
                    if read.filled().is_empty() {
                        return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
                    }
                    *filled += read.filled().len();
                }
                if let Some((tag, buf, _)) = self.body.take() {
                    return Poll::Ready(Ok(Some((tag, buf.freeze()))));
                }
            }
            while self.have < FRAME_HEAD {
                let mut read = ReadBuf::new(&mut self.head[self.have..]);
                ready!(Pin::new(&mut self.io).poll_read(cx, &mut read))?;
                let n = read.filled().len();
                if n == 0 {
                    return Poll::Ready(if self.have == 0 {
                        Ok(None)
                    } else {
                        Err(io::ErrorKind::UnexpectedEof.into())
                    });
                }
                self.have += n;
            }
            self.have = 0;
            let [tag, length @ ..] = self.head;
            let length = u32::from_be_bytes(length) as usize;
            if length > MAX_FRAME {
                return Poll::Ready(Err(invalid(format!(
                    "frame of {length} bytes exceeds the {MAX_FRAME}-byte limit"
                ))));
            }
            self.body = Some((tag, BytesMut::zeroed(length), 0));
        }
    }
}

/// Appends a `[tag][u32 length][payload]` frame to `out`.
fn push_frame(out: &mut Vec<u8>, tag: u8, payload: &[u8]) -> io::Result<()> {
    let length = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| invalid(format!("a frame of {} bytes is too large", payload.len())))?;
    out.reserve(FRAME_HEAD + payload.len());
    out.push(tag);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends a frame of a response body: its data, or its trailers.
fn push_response_frame(
    out: &mut Vec<u8>,
    frame: Result<Frame<Bytes>, tonic::Status>,
) -> io::Result<()> {
    let frame = frame.map_err(|e| io::Error::other(e.to_string()))?;
    match frame.into_data() {
        Ok(data) => push_frame(out, DATA, &data),
        Err(frame) => match frame.into_trailers() {
            Ok(trailers) => {
                let trailers = CallHead {
                    status: 0,
                    metadata: metadata(&trailers),
                };
                push_frame(out, TRAILERS, &trailers.encode_to_vec())
            }
            Err(_) => Ok(()),
        },
    }
}

/// One write per frame, so a frame is one yamux frame.
async fn write_frame<W: AsyncWrite + Unpin>(io: &mut W, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut frame = Vec::new();
    push_frame(&mut frame, tag, payload)?;
    io.write_all(&frame).await?;
    io.flush().await
}

fn metadata(headers: &http::HeaderMap) -> Vec<Metadata> {
    headers
        .iter()
        .map(|(name, value)| Metadata {
            name: name.as_str().to_owned(),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

/// Entries that are not valid HTTP headers are left out (a peer cannot inject a bad one).
fn header_map(metadata: Vec<Metadata>) -> http::HeaderMap {
    let mut headers = http::HeaderMap::with_capacity(metadata.len());
    for entry in metadata {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(entry.name.as_bytes()),
            http::HeaderValue::from_bytes(&entry.value),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

fn invalid(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, time::Duration};

    use tokio::sync::mpsc;

    use super::*;
    use crate::{session::spawn_for_test, ws::Role};

    /// A service whose every response sends one message and then never ends; it reports when
    /// its response body is dropped.
    #[derive(Clone)]
    struct Endless(mpsc::UnboundedSender<()>);

    impl tonic::server::NamedService for Endless {
        const NAME: &'static str = "test.Endless";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Endless {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
            let body = EndlessBody {
                sent: false,
                dropped: self.0.clone(),
            };
            std::future::ready(Ok(http::Response::new(tonic::body::Body::new(body))))
        }
    }

    struct EndlessBody {
        sent: bool,
        dropped: mpsc::UnboundedSender<()>,
    }

    impl Drop for EndlessBody {
        fn drop(&mut self) {
            let _ = self.dropped.send(());
        }
    }

    impl http_body::Body for EndlessBody {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.sent {
                return Poll::Pending;
            }
            self.sent = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"first")))))
        }
    }

    fn sessions(routes: tonic::service::Routes) -> (Session, Session) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let control = crate::inbound::Control {
            routes,
            extensions: http::Extensions::new(),
        };
        let hub = spawn_for_test(a, Role::Server, "agent", "test", Some(control));
        let agent = spawn_for_test(b, Role::Client, "hub", "test", None);
        (hub, agent)
    }

    #[tokio::test]
    async fn a_caller_that_drops_a_streaming_response_cancels_the_call_on_the_far_side() {
        let (dropped, mut drops) = mpsc::unbounded_channel();
        let (_hub, agent) = sessions(tonic::service::Routes::new(Endless(dropped)));
        let mut channel = Channel::new(agent);
        let request = http::Request::builder()
            .uri("/test.Endless/Watch")
            .body(tonic::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(&mut channel, request)
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, Bytes::from_static(b"first"));
        assert!(
            drops.try_recv().is_err(),
            "the response is still being served"
        );
        drop(body);
        tokio::time::timeout(Duration::from_secs(5), drops.recv())
            .await
            .expect("the far side drops the response once the caller has gone")
            .unwrap();
    }

    /// A service that answers after a while: 15 s, longer than a stream header may take.
    #[derive(Clone)]
    struct Slow;

    impl tonic::server::NamedService for Slow {
        const NAME: &'static str = "test.Slow";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Slow {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(15)).await;
                let body =
                    tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(b"late")));
                Ok(http::Response::new(body))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_may_take_longer_than_a_stream_header_may() {
        let (_hub, agent) = sessions(tonic::service::Routes::new(Slow));
        let request = http::Request::builder()
            .uri("/test.Slow/Wait")
            .body(tonic::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(Channel::new(agent), request)
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"late"));
    }

    #[tokio::test]
    async fn a_call_to_a_side_that_serves_none_is_refused_with_the_reason() {
        let (hub, _agent) = sessions(tonic::service::Routes::default());
        // The agent's side serves no calls.
        let request = http::Request::builder()
            .uri("/test.Endless/Watch")
            .body(tonic::body::Body::empty())
            .unwrap();
        let err = tower::ServiceExt::oneshot(Channel::new(hub), request)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("serves no gRPC calls"), "{err}");
    }

    #[tokio::test]
    async fn frames_round_trip_and_a_clean_end_is_none() {
        let mut wire = Vec::new();
        write_frame(&mut wire, DATA, b"hello").await.unwrap();
        write_frame(&mut wire, END, b"").await.unwrap();
        let mut frames = FrameReader::new(wire.as_slice());
        let next = |frames: &mut FrameReader<&[u8]>| {
            let waker = futures::task::noop_waker();
            match frames.poll_frame(&mut Context::from_waker(&waker)) {
                Poll::Ready(r) => r.unwrap(),
                Poll::Pending => panic!("a slice never waits"),
            }
        };
        assert_eq!(
            next(&mut frames),
            Some((DATA, Bytes::from_static(b"hello")))
        );
        assert_eq!(next(&mut frames), Some((END, Bytes::new())));
        assert_eq!(next(&mut frames), None);
    }

    #[tokio::test]
    async fn an_oversized_or_truncated_frame_is_an_error() {
        let mut wire = vec![DATA];
        wire.extend_from_slice(&(u32::try_from(MAX_FRAME).unwrap() + 1).to_be_bytes());
        let mut frames = FrameReader::new(wire.as_slice());
        let err = std::future::poll_fn(|cx| frames.poll_frame(cx))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");

        let wire = [DATA, 0, 0, 0, 9, b'x'];
        let mut frames = FrameReader::new(&wire[..]);
        let err = std::future::poll_fn(|cx| frames.poll_frame(cx))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
