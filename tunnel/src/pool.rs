//! Kept-alive HTTP/1 connections for reuse: the hub's connections over tunnel streams to an
//! agent's service, and the agent's connections to its API server. Opening a connection costs
//! a round trip through the tunnel (the stream's acknowledgement) or a TLS handshake; a
//! request on a kept connection costs neither.
//!
//! A connection goes back into the pool as soon as its response head has arrived; it is handed
//! out again only once hyper reports it ready, i.e. after that response's body has been read
//! to the end. A connection whose body is still streaming (a watch) is skipped, not waited for.

use std::sync::{Arc, Mutex};

use hyper::client::conn::http1::SendRequest;

/// Connections kept; past this, a finished connection is closed instead of kept.
const KEEP: usize = 128;

/// A set of HTTP/1 connections to one place. Cheap to clone (shared).
pub struct Http1Pool<B> {
    senders: Arc<Mutex<Vec<SendRequest<B>>>>,
}

impl<B> Clone for Http1Pool<B> {
    fn clone(&self) -> Self {
        Self {
            senders: self.senders.clone(),
        }
    }
}

impl<B> Default for Http1Pool<B> {
    fn default() -> Self {
        Self {
            senders: Arc::default(),
        }
    }
}

impl<B> std::fmt::Debug for Http1Pool<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Pool")
            .field("connections", &self.len())
            .finish()
    }
}

impl<B> Http1Pool<B> {
    /// A connection ready for a request, if one is kept; closed ones are dropped on the way.
    pub fn take(&self) -> Option<SendRequest<B>> {
        let mut senders = self.lock();
        senders.retain(|s| !s.is_closed());
        let ready = senders.iter().position(SendRequest::is_ready)?;
        Some(senders.swap_remove(ready))
    }

    /// Keeps a connection for later requests (whether or not its response is still being
    /// read).
    pub fn put(&self, sender: SendRequest<B>) {
        let mut senders = self.lock();
        if senders.len() < KEEP && !sender.is_closed() {
            senders.push(sender);
        }
    }

    /// Connections kept, busy or not.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SendRequest<B>>> {
        // The vector is valid whatever a panicking holder was doing.
        self.senders.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection to a hand-written HTTP/1.1 server on an in-memory pipe: `/stream` sends its
    /// head at once and its one-byte body only when `finish` fires; anything else gets "ok".
    async fn connect(mut finish: tokio::sync::mpsc::Receiver<()>) -> SendRequest<Empty<Bytes>> {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut buf = Vec::new();
            loop {
                let mut chunk = [0u8; 1024];
                let n = server.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                    continue;
                };
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                buf.drain(..end + 4);
                if head.starts_with("GET /stream ") {
                    server
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n")
                        .await
                        .unwrap();
                    finish.recv().await;
                    server.write_all(b"x").await.unwrap();
                } else {
                    server
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .unwrap();
                }
            }
        });
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender
    }

    fn get(path: &str) -> http::Request<Empty<Bytes>> {
        http::Request::get(path).body(Empty::new()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_reused_only_after_its_response_was_read() {
        let (finish, finish_rx) = tokio::sync::mpsc::channel(1);
        let pool = Http1Pool::default();
        let mut sender = connect(finish_rx).await;
        sender.ready().await.unwrap();

        // A response still streaming keeps its connection busy: nothing is ready to hand out.
        let streaming = sender.send_request(get("/stream")).await.unwrap();
        pool.put(sender);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(pool.take().is_none());
        assert_eq!(pool.len(), 1);

        // Once its body has been read to the end, the same connection serves the next request.
        finish.send(()).await.unwrap();
        let body = streaming.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"x");
        let mut again = None;
        for _ in 0..100 {
            again = pool.take();
            if again.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut again = again.expect("the connection came back ready");
        assert!(pool.is_empty());
        let response = again.send_request(get("/")).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}
