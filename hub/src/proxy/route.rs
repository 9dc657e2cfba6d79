//! Where a request for a cluster goes: the newest session of its cluster-agent (or, as a
//! fallback, a node-agent) on this replica, or the replica the agent is connected to; and the
//! HTTP/1 connections to the agent's services, kept and reused per session.

use super::*;

/// How the hub's own controllers reach clusters' cluster-agents: a session of this replica, or
/// (with replicas) the replica the agent is connected to, over mutual TLS.
#[derive(Clone, Debug)]
pub struct Agents {
    pub registry: Registry,
    pub replicas: Arc<Replicas>,
    pub peers: Option<Arc<rustls::ClientConfig>>,
}

impl Agents {
    /// Whether the cluster's cluster-agent is connected to this replica or to another.
    pub async fn connected(&self, cluster: &str) -> bool {
        agent_session(&self.registry, cluster).is_some()
            || (self.peers.is_some()
                && self
                    .replicas
                    .locate(crate::identity::CLUSTER_AGENT, cluster)
                    .await
                    .is_some())
    }
}

/// Where a request for a cluster goes: through an agent session of this replica, or to the
/// replica the agent is connected to.
pub(crate) enum Route {
    Local(Session),
    Peer { url: String, kind: &'static str },
}

/// Kept HTTP/1 connections over tunnel streams, per agent session and service, so that a
/// request does not wait for a new stream's acknowledgement.
#[derive(Clone, Debug, Default)]
pub struct Pools(Arc<Mutex<HashMap<PoolKey, Http1Pool<Body>>>>);

/// A session's id and one of its agent's services.
type PoolKey = (u64, &'static str);

impl Pools {
    pub(super) fn of(
        &self,
        registry: &Registry,
        session: &Session,
        service: &'static str,
    ) -> Http1Pool<Body> {
        let mut pools = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = (session.info().id, service);
        if let Some(pool) = pools.get(&key) {
            return pool.clone();
        }
        // A new session: forget the pools of sessions that have ended.
        let live: HashSet<u64> = registry.sessions().iter().map(|s| s.info().id).collect();
        pools.retain(|(id, _), _| live.contains(id));
        pools.entry(key).or_default().clone()
    }
}

/// A cluster-agent session of `cluster`, if one is connected.
///
/// When there are several (a new leader connected before the old one's session was seen to
/// end, e.g. after a network cut), the newest wins: the old leader has lost its lease.
pub fn agent_session(registry: &Registry, cluster: &str) -> Option<Session> {
    newest_session(registry, crate::identity::CLUSTER_AGENT, cluster)
}

/// The newest session of an agent of `kind` belonging to `cluster`. Node-agents serve
/// `kube-api` too (and may dial only the cluster's API server): the way in when no
/// cluster-agent is connected. Looks at that agent's copies only: every proxied request asks,
/// and a scan of all sessions grew with every host connected to the hub.
pub(super) fn newest_session(registry: &Registry, kind: &str, cluster: &str) -> Option<Session> {
    // The range holds `<id>` and `<id>/…` only, all of which belong to `cluster`.
    let id = crate::identity::cluster_agent_id(kind, cluster)?;
    registry.newest_of(&id, |info| info.peer.kind == kind)
}

/// The path prefix a peer replica relays under (`/v3/relay/<agent kind>/<cluster>/<service>`).
pub const RELAY_PREFIX: &str = "/v3/relay";

/// An HTTP/1 connection to an agent's service (through a session of this replica or a peer
/// replica), ready for one request.
pub(crate) struct Connection {
    sender: SendRequest<Body>,
    /// Where the connection is kept for the next request once this one is answered.
    pool: Option<Http1Pool<Body>>,
    /// For a kept connection: the session and service to open a new one on if it turns out to
    /// have closed (see [`Connection::send`]).
    reopen: Option<(Session, &'static str)>,
}

impl Connection {
    /// Sends `request` and waits for the response head (not the body, which streams).
    ///
    /// A kept connection may have been closed by the agent just as the request went out on it
    /// (the agent closes a stream when the API server closes its connection): a GET or HEAD
    /// without a body that fails so is sent once more on a new stream, as Go's HTTP client
    /// does; anything else could have had an effect and gets the error.
    pub(crate) async fn send(
        &mut self,
        request: http::Request<Body>,
        cluster: &str,
    ) -> Result<http::Response<hyper::body::Incoming>, Response> {
        let copy = (self.reopen.is_some() && resendable(&request)).then(|| {
            let mut copy = http::Request::new(Body::empty());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.headers_mut() = request.headers().clone();
            copy
        });
        self.send_else(request, cluster, move || copy).await
    }

    /// As [`Connection::send`], with the request to send again made by `again` only when it
    /// is needed (a copy of every request, made in case, cost the proxy's hot path more than
    /// the rare resend).
    pub(crate) async fn send_else(
        &mut self,
        request: http::Request<Body>,
        cluster: &str,
        again: impl FnOnce() -> Option<http::Request<Body>>,
    ) -> Result<http::Response<hyper::body::Incoming>, Response> {
        let reopen = self.reopen.take().filter(|_| resendable(&request));
        match send(&mut self.sender, request, cluster).await {
            Err(failed) if failed.status() == StatusCode::BAD_GATEWAY => {
                let Some(((session, service), copy)) = reopen.zip(again()) else {
                    return Err(failed);
                };
                tracing::debug!(
                    cluster,
                    "a kept stream to the agent was closed; sending again on a new one"
                );
                self.sender = connect(&session, service, cluster).await?;
                send(&mut self.sender, copy, cluster).await
            }
            other => other,
        }
    }

    /// Keeps the connection for later requests if it is pooled (the response head has come;
    /// the pool hands it out again once the body has been read).
    pub(crate) fn keep(self) {
        if let Some(pool) = self.pool {
            pool.put(self.sender);
        }
    }
}

/// Whether `request` may be sent again after a kept stream turned out closed: a GET or HEAD
/// without a body, which cannot have had an effect.
fn resendable(request: &http::Request<Body>) -> bool {
    matches!(*request.method(), http::Method::GET | http::Method::HEAD)
        && hyper::body::Body::is_end_stream(request.body())
}

/// A connection to `service` of the cluster's agent along `route`, and the path to send `path`
/// (the agent's own path, with its query) as. With `pooled`, a kept connection is used if one
/// is ready, and the connection is kept afterwards.
pub(crate) async fn connect_route(
    state: &ProxyState,
    route: &Route,
    service: &'static str,
    cluster: &str,
    path: &str,
    pooled: bool,
) -> Result<(Connection, String), Response> {
    match route {
        Route::Local(session) => {
            let connection = connect_local(state, session, service, cluster, pooled).await?;
            Ok((connection, path.to_owned()))
        }
        Route::Peer { url, kind } => {
            let sender = connect_peer(state.peers.clone(), url, cluster).await?;
            let relayed = format!("{RELAY_PREFIX}/{kind}/{cluster}/{service}{path}");
            let connection = Connection {
                sender,
                pool: None,
                reopen: None,
            };
            Ok((connection, relayed))
        }
    }
}

/// A connection to `service` through `session`: a kept one when `pooled` and one is ready.
pub(crate) async fn connect_local(
    state: &ProxyState,
    session: &Session,
    service: &'static str,
    cluster: &str,
    pooled: bool,
) -> Result<Connection, Response> {
    let pool = pooled.then(|| state.pools.of(&state.registry, session, service));
    if let Some(sender) = pool.as_ref().and_then(Http1Pool::take) {
        return Ok(Connection {
            sender,
            pool,
            reopen: Some((session.clone(), service)),
        });
    }
    let sender = connect(session, service, cluster).await?;
    Ok(Connection {
        sender,
        pool,
        reopen: None,
    })
}

/// A new HTTP/1 connection to the peer replica at `url`, over mutual TLS.
pub(crate) async fn connect_peer(
    peers: Option<Arc<rustls::ClientConfig>>,
    url: &str,
    cluster: &str,
) -> Result<SendRequest<Body>, Response> {
    let bad_gateway = |why: String| {
        kube_status(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!(
                "cluster {cluster:?} is connected to the hub replica at {url}, which cannot be reached: {why}"
            ),
        )
    };
    let Some(tls) = peers else {
        return Err(bad_gateway("this replica has no peer credentials".into()));
    };
    let uri: http::Uri = url.parse().map_err(|e| bad_gateway(format!("{e}")))?;
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let name = rustls_pki_types::ServerName::try_from(host.clone())
        .map_err(|e| bad_gateway(e.to_string()))?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| bad_gateway("no answer within 5 s".into()))?
    .map_err(|e| bad_gateway(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| bad_gateway(e.to_string()))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| bad_gateway(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// A new HTTP/1 connection to one of the agent's services, over a new tunnel stream.
pub(crate) async fn connect(
    session: &Session,
    service: &str,
    cluster: &str,
) -> Result<SendRequest<Body>, Response> {
    let stream = session.open_service(service).await.map_err(|e| {
        kube_status(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("cannot reach cluster {cluster:?} through its agent: {e}"),
        )
    })?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| {
            kube_status(
                StatusCode::BAD_GATEWAY,
                "BadGateway",
                format!("cluster {cluster:?}: {e}"),
            )
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// Sends `request` on `sender` and waits for the response head (not the body, which streams).
pub(crate) async fn send(
    sender: &mut SendRequest<Body>,
    request: http::Request<Body>,
    cluster: &str,
) -> Result<http::Response<hyper::body::Incoming>, Response> {
    match tokio::time::timeout(Duration::from_secs(60), sender.send_request(request)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(kube_status(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("cluster {cluster:?}: {e}"),
        )),
        Err(_) => Err(kube_status(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!("cluster {cluster:?} did not answer within 60 s"),
        )),
    }
}

// Groups of the hub's own set on proxied requests: `drover:authenticated` for everyone and
// `drover:admin` for the hub's admins (bound to cluster-admin by the import manifest).
pub use crate::auth::{GROUP_PREFIX, downstream_groups};

#[derive(Clone, Debug)]
pub struct ProxyState {
    pub api: Api,
    pub registry: Registry,
    pub pools: Pools,
    pub replicas: Arc<Replicas>,
    /// How this replica calls its peers (mutual TLS); `None` with a single replica.
    pub peers: Option<Arc<rustls::ClientConfig>>,
}

pub(crate) fn kube_status(code: StatusCode, reason: &str, message: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        kubeshape::status::failure(code.as_u16(), reason, &message),
    )
        .into_response()
}

pub(crate) fn from_api(e: ApiError) -> Response {
    kube_status(e.code, e.reason, e.message)
}

/// Sets who the request acts as downstream: the caller, with their groups. Names are sent as
/// their UTF-8 bytes, as kube-apiserver reads them (a directory group `Entwickler München`
/// arrives as such); one that no header can carry (a control character) refuses the request,
/// saying which, rather than acting with fewer groups than the caller has.
pub(crate) fn impersonate(headers: &mut HeaderMap, principal: &Principal) -> Result<(), ApiError> {
    let value = |what: &str, name: &str| {
        HeaderValue::from_bytes(name.as_bytes()).map_err(|_| {
            tracing::warn!(user = %principal.user, name = ?name, "a name cannot be sent to the cluster as an impersonation header");
            ApiError::bad_request(format!(
                "the {what} {name:?} holds a character no HTTP header can carry, so the cluster cannot be told who is asking; ask an admin to rename it"
            ))
        })
    };
    // Names made once: one given as a `&str` is copied into every request's map.
    const USER: HeaderName = HeaderName::from_static("impersonate-user");
    const GROUP: HeaderName = HeaderName::from_static("impersonate-group");
    if let Some([user, groups @ ..]) = principal.impersonation_values() {
        headers.insert(USER, user.clone());
        for group in groups {
            headers.append(GROUP, group.clone());
        }
        return Ok(());
    }
    // A name no header can carry: say which.
    headers.insert(USER, value("user name", &principal.user)?);
    for group in downstream_groups(principal.admin, &principal.groups) {
        headers.append(GROUP, value("group", group)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tunnel::{AcceptorConfig, Connector, testing::*};

    use super::*;

    const SERVICE: &str = "kube-api";

    /// A test hub and an agent whose `kube-api` answers the first request on each stream (with
    /// its path) and closes the stream when the next one arrives, unanswered, as the agent does
    /// when its API server has just closed the connection; and how many streams it was opened.
    async fn agent_closing_kept_streams() -> (TestHub, Session, Arc<AtomicUsize>) {
        let hub = TestHub::start(AcceptorConfig::default()).await;
        let streams = Arc::new(AtomicUsize::new(0));
        let opened = streams.clone();
        let mut config = agent_config(&hub, "cluster-agent");
        config.services = tunnel::Services::default().add(SERVICE, move |mut stream| {
            opened.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut head = Vec::new();
                let mut buf = [0; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(n @ 1..) => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                let path = String::from_utf8_lossy(&head)
                    .split(' ')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
                    path.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                // The next request closes the stream.
                let _ = stream.read(&mut buf).await;
            }
        });
        let agent = Connector::new(config).unwrap().connect().await.unwrap();
        std::mem::forget(agent);
        let session = hub.session("cluster-agent").await;
        (hub, session, streams)
    }

    fn request(method: &str, path: &str, body: &'static str) -> http::Request<Body> {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from(body))
            .unwrap()
    }

    async fn text(response: http::Response<hyper::body::Incoming>) -> String {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_that_meets_a_closed_kept_stream_is_sent_again_and_a_write_is_not() {
        let (_hub, session, streams) = agent_closing_kept_streams().await;
        let pool = Http1Pool::default();
        let kept = |sender| Connection {
            sender,
            pool: Some(pool.clone()),
            reopen: Some((session.clone(), SERVICE)),
        };
        let mut first = Connection {
            sender: connect(&session, SERVICE, "prod").await.unwrap(),
            pool: Some(pool.clone()),
            reopen: None,
        };
        let answer = first
            .send(request("GET", "/one", ""), "prod")
            .await
            .unwrap();
        assert_eq!(text(answer).await, "/one");
        // hyper marks a connection ready in its own task once the body has been read: wait for
        // that, or the pool may rightly hand out nothing.
        first.sender.ready().await.unwrap();
        first.keep();

        // A read on the kept stream, which closes: answered on a new stream, as made again
        // then (and only then).
        let mut second = kept(pool.take().unwrap());
        let made = AtomicUsize::new(0);
        let answer = second
            .send_else(request("GET", "/two", ""), "prod", || {
                made.fetch_add(1, Ordering::SeqCst);
                Some(request("GET", "/two", ""))
            })
            .await
            .unwrap();
        assert_eq!(text(answer).await, "/two");
        assert_eq!(streams.load(Ordering::SeqCst), 2);
        assert_eq!(made.load(Ordering::SeqCst), 1);
        second.sender.ready().await.unwrap();
        second.keep();

        // A write could have had its effect: its error is the caller's, and it is not resent.
        let mut third = kept(pool.take().unwrap());
        let failed = third
            .send(request("POST", "/three", "{}"), "prod")
            .await
            .unwrap_err();
        assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(streams.load(Ordering::SeqCst), 2);
    }
}
