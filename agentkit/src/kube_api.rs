//! The `kube-api` service the hub opens streams to: HTTP/1 requests from the hub (already
//! carrying `Impersonate-*` for the user) are sent on to the API server with the agent's own
//! credential; responses (watches included) and upgraded connections (`exec`, `attach`,
//! `port-forward`) come back as the API server sends them. The hub never holds the agent's
//! credential.
//!
//! Each stream has a TLS connection to the API server of its own for as long as it lasts: the
//! hub keeps its streams and sends request after request on each, so the handshake is paid once
//! per stream, not per request. Of what the hub sends only each request's head is read, to put
//! the agent's credential in it and to find where the request ends; bodies, and all that the
//! API server answers, pass through as bytes. (Parsing and writing each request and response
//! again here cost more than the rest of the agent's share of a proxied request.)
//!
//! When the API server closes its connection the stream is closed with it; the hub sends a
//! read that met such a close again on a new stream.

use std::{io, sync::Arc};

use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::client::TlsStream;
use tunnel::{Secret, TunnelStream};

use crate::kube::KubeTarget;

mod head;

use head::Head;

/// Bytes read at a time, each way.
const READ: usize = 16 << 10;

/// The API server, and what the agent puts in every request to it.
#[derive(Debug, Clone)]
pub struct Upstream {
    target: Arc<KubeTarget>,
    /// `Bearer <the agent's own token>`, kept out of Debug output.
    authorization: Arc<Secret>,
    host: Arc<[u8]>,
}

impl Upstream {
    pub fn new(target: KubeTarget) -> Self {
        let authorization = Secret::new(format!("Bearer {}", target.token.expose()));
        let host = target.address().into_bytes().into();
        Self {
            target: Arc::new(target),
            authorization: Arc::new(authorization),
            host,
        }
    }

    /// A new TLS connection to the API server.
    async fn connect(&self) -> Result<TlsStream<tokio::net::TcpStream>, String> {
        let target = &self.target;
        let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let name = rustls_pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| e.to_string())?;
        tokio_rustls::TlsConnector::from(target.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    }

    /// The next head in `pending`, reading more from `hub` as needed; `None` when the hub
    /// closes the stream between requests.
    async fn next_head(
        &self,
        hub: &mut (impl AsyncRead + Unpin),
        pending: &mut Vec<u8>,
    ) -> io::Result<Option<Head>> {
        loop {
            if !pending.is_empty()
                && let Some(head) =
                    head::parse(pending, self.authorization.expose().as_bytes(), &self.host)
                        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?
            {
                return Ok(Some(head));
            }
            if fill(hub, pending).await? == 0 {
                return match pending.is_empty() {
                    true => Ok(None),
                    false => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the hub closed the stream within a request's head",
                    )),
                };
            }
        }
    }
}

/// Serves one tunnel stream.
pub async fn serve(stream: TunnelStream, upstream: Upstream) {
    if let Err(e) = relay(stream, &upstream).await {
        tracing::debug!(error = %e, "kube-api stream ended");
    }
}

async fn relay(mut hub: TunnelStream, upstream: &Upstream) -> io::Result<()> {
    let mut pending = Vec::with_capacity(READ);
    let first = match upstream.next_head(&mut hub, &mut pending).await {
        Ok(Some(head)) => head,
        Ok(None) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return answer(
                &mut hub,
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &e.to_string(),
            )
            .await;
        }
        Err(e) => return Err(e),
    };
    let server = match upstream.connect().await {
        Ok(server) => server,
        Err(e) => {
            let message = format!(
                "the cluster-agent cannot reach its API server at {}: {e}",
                upstream.target.server
            );
            return answer(
                &mut hub,
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                &message,
            )
            .await;
        }
    };
    let (hub_read, mut hub_write) = tokio::io::split(hub);
    let (mut server_read, server_write) = tokio::io::split(server);
    let up = requests(hub_read, server_write, first, pending, upstream);
    let down = async {
        let mut buf = vec![0; READ];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return hub_write.shutdown().await;
            }
            hub_write.write_all(&buf[..n]).await?;
            hub_write.flush().await?;
        }
    };
    tokio::try_join!(up, down).map(|_| ())
}

/// Sends the hub's requests on to the API server, `first` (already read, its bytes at the
/// start of `pending`) and those after it, until the hub closes the stream or a request
/// switches protocols, after which every byte is the upgraded connection's.
async fn requests(
    mut hub: impl AsyncRead + Unpin,
    mut server: impl AsyncWrite + Unpin,
    first: Head,
    mut pending: Vec<u8>,
    upstream: &Upstream,
) -> io::Result<()> {
    let mut head = first;
    loop {
        pending.drain(..head.len);
        let mut out = head.bytes;
        let mut body = head.body;
        // What of the body has arrived goes out with the head, in one write.
        loop {
            let (used, done) = body
                .advance(&pending)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
            out.extend_from_slice(&pending[..used]);
            pending.drain(..used);
            if done {
                break;
            }
            if !out.is_empty() {
                server.write_all(&out).await?;
                out.clear();
            }
            if fill(&mut hub, &mut pending).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the hub closed the stream within a request's body",
                ));
            }
        }
        if !out.is_empty() {
            server.write_all(&out).await?;
        }
        server.flush().await?;
        if head.upgrade {
            server.write_all(&pending).await?;
            tokio::io::copy(&mut hub, &mut server).await?;
            return server.shutdown().await;
        }
        head = match upstream.next_head(&mut hub, &mut pending).await? {
            Some(next) => next,
            None => return server.shutdown().await,
        };
    }
}

/// Reads what `hub` has into the spare room of `pending`; 0 at the end of the stream.
async fn fill(hub: &mut (impl AsyncRead + Unpin), pending: &mut Vec<u8>) -> io::Result<usize> {
    // Only a head is ever held back for more, and `head::parse` refuses one past its limit.
    pending.reserve(READ);
    hub.read_buf(pending).await
}

/// Answers the hub's request with a Kubernetes `Status` and closes the stream.
async fn answer(
    hub: &mut TunnelStream,
    code: StatusCode,
    reason: &str,
    message: &str,
) -> io::Result<()> {
    let body = kubeshape::status::failure(code.as_u16(), reason, message);
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        code.as_u16(),
        code.canonical_reason().unwrap_or_default(),
        body.len()
    );
    hub.write_all(head.as_bytes()).await?;
    hub.write_all(body.as_bytes()).await?;
    hub.shutdown().await
}
