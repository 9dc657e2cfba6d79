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

/// An HTTP/1 connection to `service` of the cluster's agent along `route`, and the path to
/// send `path` (the agent's own path, with its query) as.
pub(crate) async fn connect_route(
    state: &ProxyState,
    route: &Route,
    service: &'static str,
    cluster: &str,
    path: &str,
    pooled: bool,
) -> Result<(SendRequest<Body>, String, Option<Http1Pool<Body>>), Response> {
    match route {
        Route::Local(session) => {
            let pool = pooled.then(|| state.pools.of(&state.registry, session, service));
            let sender = connect(session, service, cluster, pool.as_ref()).await?;
            Ok((sender, path.to_owned(), pool))
        }
        Route::Peer { url, kind } => {
            let sender = connect_peer(state.peers.clone(), url, cluster).await?;
            let relayed = format!("{RELAY_PREFIX}/{kind}/{cluster}/{service}{path}");
            Ok((sender, relayed, None))
        }
    }
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

/// An HTTP/1 connection to one of the agent's services: a kept one if `pool` has one ready,
/// else over a new tunnel stream.
pub(crate) async fn connect(
    session: &Session,
    service: &str,
    cluster: &str,
    pool: Option<&Http1Pool<Body>>,
) -> Result<SendRequest<Body>, Response> {
    if let Some(sender) = pool.and_then(Http1Pool::take) {
        return Ok(sender);
    }
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

/// Sends `request` and waits for the response head (not the body, which streams).
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
    headers.insert("impersonate-user", value("user name", &principal.user)?);
    for group in downstream_groups(principal.admin, &principal.groups) {
        headers.append("impersonate-group", value("group", &group)?);
    }
    Ok(())
}
