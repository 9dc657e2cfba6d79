//! Streams the peer opens: read the header, then dial (if the allow-list permits), serve a gRPC
//! call or hand the stream to a named service. Every header is answered, success or failure, at
//! once (a call's with its response, in the same write), so the opener never waits on a timeout
//! and yamux's acknowledgement backlog drains.

use std::{collections::HashMap, fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use proto::tunnel::v1::{Dial, StreamHeader, stream_error::Kind, stream_header};
use tokio::net::TcpStream;

use crate::{allow::AllowList, header, session::TunnelStream};

/// Buffer per direction when splicing a stream onto a TCP connection.
const COPY_BUFFER: usize = 64 * 1024;

/// What this side offers to streams the peer opens.
#[derive(Clone, Debug)]
pub(crate) struct Inbound {
    pub(crate) allow: AllowList,
    pub(crate) dial_timeout: Duration,
    pub(crate) control: Option<Control>,
    pub(crate) services: Services,
}

type Handler = Arc<dyn Fn(TunnelStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// In-process services the peer may open streams to, by name. A service gets each stream
/// after it has been acknowledged and owns it until it returns.
#[derive(Clone, Default)]
pub struct Services {
    handlers: HashMap<String, Handler>,
}

impl fmt::Debug for Services {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.handlers.keys()).finish()
    }
}

impl Services {
    /// Adds (or replaces) the service called `name`.
    pub fn add<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(TunnelStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |stream| Box::pin(handler(stream)));
        self.handlers.insert(name.into(), handler);
        self
    }
}

/// The gRPC services served to calls the peer opens, and request extensions they all receive
/// (the session's [`crate::SessionInfo`] is always added).
#[derive(Clone, Debug)]
pub(crate) struct Control {
    pub(crate) routes: tonic::service::Routes,
    pub(crate) extensions: http::Extensions,
}

impl Inbound {
    pub(crate) fn spawn(&self, stream: TunnelStream) {
        let this = self.clone();
        tokio::spawn(async move { this.handle(stream).await });
    }

    async fn handle(self, mut stream: TunnelStream) {
        let session = stream.session().id;
        let header: StreamHeader = match header::read(&mut stream).await {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(session, error = %e, "inbound stream without a usable header");
                let reply = header::refused(Kind::Unsupported, format!("bad stream header: {e}"));
                let _ = header::write(&mut stream, &reply).await;
                return;
            }
        };
        match header.kind {
            Some(stream_header::Kind::Dial(dial)) => self.dial(stream, dial).await,
            Some(stream_header::Kind::Call(call)) => match self.control {
                // Acknowledged with the response's head.
                Some(control) => {
                    let info = stream.session().clone();
                    crate::call::serve(stream, call, control.routes, control.extensions, info)
                        .await;
                }
                None => refuse(stream, "this side serves no gRPC calls".into()).await,
            },
            Some(stream_header::Kind::Control(_)) => {
                let message = format!(
                    "this side speaks tunnel protocol {}, where each gRPC call is a stream of its \
                     own; the HTTP/2 control channel of protocol 1 is gone: install the agent \
                     from this hub's release",
                    proto::TUNNEL_PROTOCOL_VERSION
                );
                refuse(stream, message).await;
            }
            Some(stream_header::Kind::Service(service)) => {
                match self.services.handlers.get(&service.name) {
                    Some(handler) => {
                        if accept(&mut stream).await {
                            handler(stream).await;
                        }
                    }
                    None => {
                        let message = format!("this side runs no service named {:?}", service.name);
                        refuse(stream, message).await;
                    }
                }
            }
            None => {
                let message = "stream header names no known kind; upgrade this side".into();
                refuse(stream, message).await;
            }
        }
    }

    async fn dial(&self, mut stream: TunnelStream, dial: Dial) {
        let address = dial.address;
        let reply = if dial.network != "tcp" {
            Err(header::refused(
                Kind::Unsupported,
                format!("dial {}/{address}: only tcp is supported", dial.network),
            ))
        } else if !self.allow.allows(&address) {
            Err(header::refused(
                Kind::NotAllowed,
                format!("dial tcp/{address}: not allowed by this agent's allow-list"),
            ))
        } else {
            match tokio::time::timeout(self.dial_timeout, TcpStream::connect(&address)).await {
                Err(_) => Err(header::refused(
                    Kind::TimedOut,
                    format!(
                        "dial tcp/{address}: no answer within {:?}",
                        self.dial_timeout
                    ),
                )),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    Err(header::refused(
                        Kind::Refused,
                        format!("dial tcp/{address}: connection refused (nothing listens there)"),
                    ))
                }
                Ok(Err(e)) => Err(header::refused(
                    Kind::Unreachable,
                    format!("dial tcp/{address}: {e}"),
                )),
                Ok(Ok(tcp)) => Ok(tcp),
            }
        };
        let session = stream.session().id;
        match reply {
            Err(refusal) => {
                if let Some(err) = &refusal.error {
                    tracing::debug!(session, reason = %err.message, "dial refused");
                }
                let _ = header::write(&mut stream, &refusal).await;
            }
            Ok(mut tcp) => {
                let _ = tcp.set_nodelay(true);
                if header::write(&mut stream, &header::accepted())
                    .await
                    .is_err()
                {
                    return;
                }
                if let Err(e) = tokio::io::copy_bidirectional_with_sizes(
                    &mut stream,
                    &mut tcp,
                    COPY_BUFFER,
                    COPY_BUFFER,
                )
                .await
                {
                    tracing::debug!(session, %address, error = %e, "dialled stream ended with an error");
                }
            }
        }
    }
}

/// Acknowledges a stream; false if the opener has gone.
async fn accept(stream: &mut TunnelStream) -> bool {
    header::write(stream, &header::accepted()).await.is_ok()
}

async fn refuse(mut stream: TunnelStream, message: String) {
    let _ = header::write(&mut stream, &header::refused(Kind::Unsupported, message)).await;
}
