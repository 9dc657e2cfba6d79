//! The authentication proxy: `https://HUB/k8s/clusters/<cluster>/<kube path>`.
//!
//! The caller is authenticated and must hold a role on the cluster; their own `Authorization`,
//! `Impersonate-*` and hop-by-hop headers are dropped; `Impersonate-User` (and
//! `Impersonate-Group` for their roles) are set; the request goes through the cluster-agent's
//! tunnel to its `kube-api` service, which forwards it with the agent's own credential.
//! Responses stream (watches are not buffered) and upgrades (`exec`, `attach`,
//! `port-forward`) are spliced through.
//!
//! When the cluster has no cluster-agent connected but a node-agent is, the request goes
//! through the node-agent's tunnel instead (it serves `kube-api` the same way), and the
//! response carries `X-Drover-Route: node-agent`; once a cluster-agent is back, it serves again.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Path, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tunnel::{Registry, Session, pool::Http1Pool};

use crate::{
    api::{Api, ApiError, allow},
    auth::{Principal, Verb},
    model::{Kind, Status},
    replicas::Replicas,
};

mod cache;
mod drain;
mod relay;
pub(crate) mod route;
mod session;

pub use cache::{cache, overview};
pub use drain::drain;
pub use proto::KUBE_API_SERVICE;
pub use relay::relay;
pub use route::{
    Agents, GROUP_PREFIX, Pools, ProxyState, RELAY_PREFIX, agent_session, downstream_groups,
};
use route::{
    Connection, Route, connect_local, connect_route, from_api, impersonate, kube_status,
    newest_session,
};

/// The response header that says a request went the fallback way.
pub const ROUTE_HEADER: &str = "x-drover-route";

/// Headers that describe one hop, not the request (RFC 9110 §7.6.1).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
    )
}

/// The headers a request goes on with: the caller's credentials (`Authorization`, cookies),
/// any `Impersonate-*` of theirs (user, group, uid, extra), method overrides (the method
/// judged is the method sent) and hop-by-hop headers (but an upgrade's) dropped; then who the
/// caller is, as `Impersonate-User` and `Impersonate-Group`.
fn forwarded(
    incoming: &HeaderMap,
    upgrade: bool,
    principal: &Principal,
) -> Result<HeaderMap, ApiError> {
    // Room for what is kept and the impersonation added, so the map is not grown as it fills.
    let mut headers = HeaderMap::with_capacity(incoming.len() + 4);
    for (name, value) in incoming {
        // Header names are lowercase here, however the caller spelled them.
        let lower = name.as_str();
        if lower == "authorization"
            || lower.starts_with("impersonate-")
            || lower == "cookie"
            || matches!(
                lower,
                "x-http-method-override" | "x-http-method" | "x-method-override"
            )
            || (hop_by_hop(name) && !upgrade)
        {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    if upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    }
    impersonate(&mut headers, principal)?;
    Ok(headers)
}

/// Whether a request only reads: GET/HEAD without an upgrade (`exec`, `attach` and
/// `port-forward` upgrade and act on the workload), or a question about the caller's own
/// permissions (`kubectl auth can-i`).
fn reads(method: &http::Method, path: &str, upgrade: bool) -> bool {
    if upgrade || acts_on_workload(path) {
        return false;
    }
    match *method {
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS => true,
        http::Method::POST => {
            path.starts_with("apis/authorization.k8s.io/")
                && (path.ends_with("/selfsubjectaccessreviews")
                    || path.ends_with("/selfsubjectrulesreviews"))
        }
        _ => false,
    }
}

/// Whether `path` is exec, attach or port-forward into a pod, or a proxy to a pod, service or
/// node (or the old `/api/v1/proxy/…`): each acts on the workload whatever the method (a GET
/// without an Upgrade header reaches the container or the service behind), so none is a read.
fn acts_on_workload(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.split('/').collect();
    let after_version = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return false,
    };
    let mut rest = segments.get(after_version..).unwrap_or_default();
    if rest.first() == Some(&"proxy") {
        return true;
    }
    // `namespaces/<ns>/<resource>/<name>/<subresource>`, or `<resource>/<name>/<subresource>`.
    if rest.first() == Some(&"namespaces") && rest.len() > 3 {
        rest = &rest[2..];
    }
    rest.get(2)
        .is_some_and(|sub| matches!(*sub, "exec" | "attach" | "portforward" | "proxy"))
}

/// The part of a request's path after its first `skip` segments, exactly as received (still
/// percent-encoded): what the proxy decides on is what it forwards, byte for byte. Refused
/// (with why) when the bytes could mean another path to the server behind: a dot segment, an
/// empty one, or an encoded `/`, `?`, `#`, `%`, `\` or `.` (none of which a Kubernetes
/// name holds).
pub fn raw_rest(path: &str, skip: usize) -> Result<&str, String> {
    let mut rest = path.strip_prefix('/').unwrap_or(path);
    for _ in 0..skip {
        rest = rest.split_once('/').map_or("", |(_, r)| r);
    }
    // Every proxied request passes here: no allocation.
    let encoded = |w: &[u8]| {
        w[0] == b'%'
            && matches!(
                (w[1], w[2].to_ascii_lowercase()),
                (b'2', b'f' | b'e' | b'5' | b'3') | (b'3', b'f') | (b'5', b'c')
            )
    };
    let ambiguous = |segment: &str| {
        segment.is_empty()
            || segment == "."
            || segment == ".."
            || segment.contains('\\')
            || segment.as_bytes().windows(3).any(encoded)
    };
    if !rest.is_empty() && rest.split('/').any(ambiguous) {
        return Err(format!(
            "the path {path:?} is ambiguous (an empty or dot segment, or an encoded '/', '?', '#', '%', '\\' or '.'); send the path as the API server names it"
        ));
    }
    Ok(rest)
}

/// The caller, and the route to the cluster's agent, if the caller holds a role on the cluster
/// and the agent is connected (to this replica or another); otherwise the response that says
/// which is missing. With `fallback`, a node-agent serves when no cluster-agent is connected;
/// the flag returned says whether it did.
async fn authorize(
    state: &ProxyState,
    headers: &HeaderMap,
    cluster: &str,
    fallback: bool,
) -> Result<(Arc<Principal>, Route, bool), Response> {
    let principal = state
        .api
        .shared_principal(headers)
        .await
        .map_err(from_api)?;
    // Any role on the cluster lets a user through; what they may do there is the cluster's
    // RBAC's to decide, for the identity the proxy sets. Without one, a missing cluster and an
    // existing one answer alike (kubectl shows a 403 as "forbidden", a 404 as a missing kind).
    let no_role = || {
        kube_status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} has no role on cluster {cluster:?} (or there is no such cluster); ask an admin or the cluster's owner",
                principal.user
            ),
        )
    };
    let object = match state
        .api
        .known
        .cluster(state.api.store.as_ref(), cluster)
        .await
    {
        Ok(object) => object,
        Err(crate::store::StoreError::NotFound { .. }) if !principal.admin => return Err(no_role()),
        Err(e) => return Err(from_api(e.into())),
    };
    if allow(&principal, Verb::Get, Kind::Cluster, &object).is_err() {
        return Err(no_role());
    }
    let kinds: &[&'static str] = if fallback {
        &[crate::identity::CLUSTER_AGENT, crate::identity::NODE_AGENT]
    } else {
        &[crate::identity::CLUSTER_AGENT]
    };
    for &kind in kinds {
        if let Some(session) = newest_session(&state.registry, kind, cluster) {
            return Ok((
                principal,
                Route::Local(session),
                kind == crate::identity::NODE_AGENT,
            ));
        }
    }
    if state.peers.is_some() {
        for &kind in kinds {
            if let Some(url) = state.replicas.locate(kind, cluster).await {
                return Ok((
                    principal,
                    Route::Peer { url, kind },
                    kind == crate::identity::NODE_AGENT,
                ));
            }
        }
    }
    let status = Status::of(&object);
    let since = status
        .condition("Connected")
        .map(|c| format!(" since {}", c.last_transition_time))
        .unwrap_or_else(|| " yet (its agent has never connected)".to_owned());
    let detail = if fallback {
        "; check its cluster-agent (no node-agent is connected either)"
    } else {
        "; check its cluster-agent (the cache lives there)"
    };
    Err(kube_status(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        format!("cluster {cluster:?} is not connected{since}{detail}"),
    ))
}

/// Whether the caller may only read on `cluster` (enforced here as well as by the cluster's
/// RBAC, so it holds on clusters whose RBAC Drover does not manage): when no role they hold
/// there, on the cluster or on one of its projects, has a rule that writes. Otherwise the
/// cluster's RBAC, which the same rules make, decides.
fn read_only(principal: &Principal, cluster: &str) -> bool {
    !principal.writes_in(cluster)
}

pub async fn handle(State(state): State<Arc<ProxyState>>, request: Request) -> Response {
    // `/k8s/clusters/<cluster>/<rest>`: the rest as received, not as decoded. Both are read
    // from the path here rather than through the router's `Path` (which copies every segment):
    // every proxied request passes.
    let (mut parts, body) = request.into_parts();
    let uri = parts.uri.clone();
    let (cluster, rest_at) = match target(uri.path()) {
        Ok(found) => found,
        Err(why) => return kube_status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    let (principal, route, fallback) = match authorize(&state, &parts.headers, &cluster, true).await
    {
        Ok(found) => found,
        Err(response) => return response,
    };
    let rest = uri.path().get(rest_at..).unwrap_or_default();
    let query = uri.query().unwrap_or_default();
    let upgrade = parts.headers.contains_key(header::UPGRADE);
    if read_only(&principal, &cluster) && !reads(&parts.method, rest, upgrade) {
        return kube_status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} is read-only on cluster {cluster:?}: {} {} is not allowed",
                principal.user,
                parts.method,
                parts.uri.path()
            ),
        );
    }
    // A watch, a followed log or an upgraded stream lasts: it counts against the user's limit
    // until it ends.
    let held = if upgrade || lasts(query) {
        match state.api.streams.open(&principal.user) {
            Ok(held) => Some(held),
            Err(e) => return from_api(e.into()),
        }
    } else {
        None
    };
    let mut headers = match forwarded(&parts.headers, upgrade, &principal) {
        Ok(headers) => headers,
        Err(e) => return from_api(e),
    };
    // An exec or attach is recorded: its messages must be read as they pass, so none is
    // compressed (the WebSocket extension that would is not offered on).
    let recorded = upgrade
        .then(|| {
            let audit_id = parts
                .extensions
                .get::<crate::audit::AuditId>()
                .map_or("", |id| id.0.as_str());
            session::session_of(rest, query, &principal, &cluster, audit_id)
        })
        .flatten();
    let recording = match recorded {
        Some(recorded) => match crate::recording::settings(&*state.api.store).await {
            Ok(settings) if !settings.record => None,
            Ok(settings) => {
                headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
                Some(session::Pending {
                    recordings: state.api.recordings.clone(),
                    session: recorded,
                    settings,
                })
            }
            Err(e) => return from_api(e.into()),
        },
        None => None,
    };
    let on_upgrade = upgrade
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();

    // Upgraded connections become the exec/attach/port-forward stream: never reused.
    let (mut connection, path) = match connect_route(
        &state,
        &route,
        KUBE_API_SERVICE,
        &cluster,
        &forward_path(&uri, rest_at),
        !upgrade,
    )
    .await
    {
        Ok(connected) => connected,
        Err(response) => return response,
    };
    let mut outbound = http::Request::builder()
        .method(parts.method.clone())
        .uri(path)
        .body(body)
        .unwrap_or_default();
    *outbound.headers_mut() = headers;
    // The same request again, should a kept stream turn out closed: made from what was
    // received only then.
    let sent_to = outbound.uri().clone();
    let again = || {
        let mut copy = http::Request::new(Body::empty());
        *copy.method_mut() = parts.method.clone();
        *copy.uri_mut() = sent_to;
        *copy.headers_mut() = forwarded(&parts.headers, upgrade, &principal).ok()?;
        Some(copy)
    };
    let mut response = exchange(
        &mut connection,
        (outbound, again),
        on_upgrade,
        &cluster,
        held,
        recording,
    )
    .await;
    connection.keep();
    if fallback {
        response.headers_mut().insert(
            HeaderName::from_static(ROUTE_HEADER),
            HeaderValue::from_static(crate::identity::NODE_AGENT),
        );
    }
    response
}

/// The cluster a `/k8s/clusters/<cluster>/<rest>` path names (percent-decoded, as a router
/// parameter would be) and where its `<rest>` begins, as [`raw_rest`] finds and checks it.
fn target(path: &str) -> Result<(std::borrow::Cow<'_, str>, usize), String> {
    let rest = raw_rest(path, 3)?;
    let segment = path
        .trim_start_matches('/')
        .split('/')
        .nth(2)
        .unwrap_or_default();
    let cluster = if segment.contains('%') {
        let decoded = tunnel::percent_decode(segment).ok_or_else(|| {
            format!("the cluster name {segment:?} is not valid percent-encoded UTF-8")
        })?;
        std::borrow::Cow::Owned(decoded)
    } else {
        std::borrow::Cow::Borrowed(segment)
    };
    Ok((cluster, path.len() - rest.len()))
}

/// What a request to `uri` goes on as: `/<rest>` (from `rest_at` in its path) and its query,
/// a slice of what was received when it can be.
fn forward_path(uri: &http::Uri, rest_at: usize) -> std::borrow::Cow<'_, str> {
    let whole = uri
        .path_and_query()
        .map_or("", http::uri::PathAndQuery::as_str);
    match rest_at.checked_sub(1).and_then(|slash| whole.get(slash..)) {
        Some(from_slash) if from_slash.starts_with('/') => std::borrow::Cow::Borrowed(from_slash),
        _ => {
            let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
            let rest = uri.path().get(rest_at..).unwrap_or_default();
            std::borrow::Cow::Owned(format!("/{rest}{query}"))
        }
    }
}

/// The client's side of an upgrade (if the request asks for one), and the query (`?…` or
/// empty) to send on.
fn upgrade_and_query(
    parts: &mut http::request::Parts,
    upgrade: bool,
) -> (Option<hyper::upgrade::OnUpgrade>, String) {
    let on_upgrade = upgrade
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    (on_upgrade, query)
}

/// Whether a request with `query` (`?…` or empty) stays open: a watch, or a log that follows.
fn lasts(query: &str) -> bool {
    query
        .trim_start_matches('?')
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, value)| matches!(key, "watch" | "follow") && matches!(value, "true" | "1"))
}

/// Sends `outbound` (with what makes it again, should a kept stream turn out closed), splices
/// an upgrade through to `on_upgrade`'s side, and returns the response without its hop-by-hop
/// headers (but those of a protocol switch). `held` is kept until the upgraded stream or the
/// response body ends.
async fn exchange(
    connection: &mut Connection,
    (outbound, again): (
        http::Request<Body>,
        impl FnOnce() -> Option<http::Request<Body>>,
    ),
    on_upgrade: Option<hyper::upgrade::OnUpgrade>,
    cluster: &str,
    mut held: Option<crate::auth::streams::StreamGuard>,
    recording: Option<session::Pending>,
) -> Response {
    let mut response = match connection.send_else(outbound, cluster, again).await {
        Ok(response) => response,
        Err(response) => return response,
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_side) = on_upgrade
    {
        let agent_side = hyper::upgrade::on(&mut response);
        let held = held.take();
        let tap = match recording {
            Some(pending) => session::start(pending, response.headers()).await,
            None => None,
        };
        tokio::spawn(async move {
            let _held = held;
            if let (Ok(client), Ok(agent)) = (client_side.await, agent_side.await) {
                match tap {
                    Some(tap) => session::splice(client, agent, tap).await,
                    None => {
                        let _ = tokio::io::copy_bidirectional(
                            &mut TokioIo::new(client),
                            &mut TokioIo::new(agent),
                        )
                        .await;
                    }
                }
            }
        });
    }
    let (mut parts, body) = response.into_parts();
    let keep_upgrade = parts.status == StatusCode::SWITCHING_PROTOCOLS;
    parts
        .headers
        .retain_mut_compat(|name| keep_upgrade || !hop_by_hop(name));
    match held {
        Some(held) => {
            let frames = http_body_util::BodyExt::into_data_stream(body);
            let body = Body::from_stream(futures::StreamExt::map(frames, move |frame| {
                let _ = &held;
                frame
            }));
            Response::from_parts(parts, body)
        }
        None => Response::from_parts(parts, Body::new(body)),
    }
}

/// `HeaderMap::retain` without a value borrow, for the one filter above.
trait RetainCompat {
    fn retain_mut_compat(&mut self, keep: impl Fn(&HeaderName) -> bool);
}

impl RetainCompat for HeaderMap {
    fn retain_mut_compat(&mut self, keep: impl Fn(&HeaderName) -> bool) {
        let drop: Vec<HeaderName> = self.keys().filter(|n| !keep(n)).cloned().collect();
        for name in drop {
            self.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(user: &str, groups: &[&str], admin: bool) -> Principal {
        Principal {
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            token: "t-1".into(),
            ..Principal::holding(user, admin, &[], &[])
        }
    }

    /// A request's headers, from `name: value` pairs (names as a client may spell them).
    fn request_headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    /// `name: value` lines of `headers`, sorted.
    fn lines(headers: &HeaderMap) -> Vec<String> {
        let mut lines: Vec<String> = headers
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn the_callers_credentials_and_impersonation_are_dropped_and_their_identity_set() {
        let incoming = request_headers(&[
            ("Authorization", "Bearer drt_callers-own-token"),
            ("Cookie", "drover_session=abc"),
            ("Impersonate-User", "kubernetes-admin"),
            ("impersonate-group", "system:masters"),
            ("IMPERSONATE-GROUP", "system:nodes"),
            ("Impersonate-Uid", "0"),
            ("Impersonate-Extra-Scopes", "everything"),
            ("impersonate-extra-reason%20x", "because"),
            ("X-HTTP-Method-Override", "DELETE"),
            ("X-Http-Method", "PUT"),
            ("X-Method-Override", "PATCH"),
            ("Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Authorization", "Basic eA=="),
            ("TE", "trailers"),
            ("Transfer-Encoding", "chunked"),
            ("Accept", "application/json"),
            ("User-Agent", "kubectl/v1.32.0"),
            ("Content-Type", "application/json"),
        ]);
        let sent = forwarded(&incoming, false, &principal("mia", &["dev"], false)).unwrap();
        assert_eq!(
            lines(&sent),
            [
                "accept: application/json",
                "content-type: application/json",
                "impersonate-group: dev",
                "impersonate-group: drover:authenticated",
                "impersonate-user: mia",
                "user-agent: kubectl/v1.32.0",
            ]
        );
        // An admin is also in drover:admin (a cluster-admin downstream).
        let sent = forwarded(&incoming, false, &principal("ann", &[], true)).unwrap();
        assert_eq!(
            sent.get_all("impersonate-group")
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect::<Vec<_>>(),
            ["drover:authenticated", "drover:admin"]
        );
    }

    #[test]
    fn an_upgrade_keeps_its_own_headers_and_nothing_of_the_callers_identity() {
        let incoming = request_headers(&[
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Protocol", "v5.channel.k8s.io"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
            ("Authorization", "Bearer drt_x"),
            ("Impersonate-User", "root"),
        ]);
        let sent = forwarded(&incoming, true, &principal("mia", &[], false)).unwrap();
        assert_eq!(
            lines(&sent),
            [
                "connection: Upgrade",
                "impersonate-group: drover:authenticated",
                "impersonate-user: mia",
                "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
                "sec-websocket-protocol: v5.channel.k8s.io",
                "sec-websocket-version: 13",
                "upgrade: websocket",
            ]
        );
    }

    #[test]
    fn read_only_allows_reads_and_own_permission_questions_only() {
        use http::Method;
        let pods = "api/v1/namespaces/default/pods";
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(reads(&method, pods, false), "{method}");
        }
        // Every write verb, on objects and on their subresources.
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            for path in [
                pods,
                "api/v1/namespaces/default/pods/web-0",
                "api/v1/namespaces/default/pods/web-0/status",
                "apis/apps/v1/namespaces/default/deployments/web/scale",
                "api/v1/namespaces/default/pods/web-0/eviction",
                "api/v1/namespaces/default/pods/web-0/binding",
            ] {
                assert!(!reads(&method, path, false), "{method} {path}");
            }
        }
        // exec, attach and port-forward: an upgrade acts on the workload, whatever its verb.
        for path in [
            "api/v1/namespaces/default/pods/web-0/exec?command=sh",
            "api/v1/namespaces/default/pods/web-0/attach",
            "api/v1/namespaces/default/pods/web-0/portforward",
        ] {
            assert!(!reads(&Method::GET, path, true), "{path}");
            assert!(!reads(&Method::POST, path, true), "{path}");
        }
        // ... and without an Upgrade header too (the API server answers 400 to some, but the
        // proxy must not be the one that decides), and so is a proxy to a pod, service or node.
        for path in [
            "api/v1/namespaces/default/pods/web-0/exec",
            "api/v1/namespaces/default/pods/web-0/exec?command=sh",
            "api/v1/namespaces/default/pods/web-0/attach",
            "api/v1/namespaces/default/pods/web-0/portforward",
            "api/v1/namespaces/default/pods/web-0/proxy",
            "api/v1/namespaces/default/pods/web-0:8080/proxy/admin/reset",
            "api/v1/namespaces/default/services/web/proxy/",
            "api/v1/namespaces/default/services/https:web:443/proxy/metrics",
            "api/v1/nodes/node-1/proxy/configz",
            "api/v1/proxy/namespaces/default/services/web",
        ] {
            for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
                assert!(!reads(&method, path, false), "{method} {path}");
            }
        }
        // Reads whose names only look like those words stay reads.
        for path in [
            "api/v1/namespaces/proxy/pods/exec",
            "api/v1/namespaces/exec/pods",
            "api/v1/namespaces/default/pods/web-0/log",
            "apis/apps/v1/namespaces/default/deployments/proxy",
            "api/v1/nodes/proxy",
        ] {
            assert!(reads(&Method::GET, path, false), "{path}");
        }
        // `kubectl auth can-i`: a question about the caller's own permissions.
        for review in ["selfsubjectaccessreviews", "selfsubjectrulesreviews"] {
            let path = format!("apis/authorization.k8s.io/v1/{review}");
            assert!(reads(&Method::POST, &path, false), "{path}");
        }
        // But not another user's (a SubjectAccessReview), nor a token review.
        for path in [
            "apis/authorization.k8s.io/v1/subjectaccessreviews",
            "apis/authentication.k8s.io/v1/tokenreviews",
        ] {
            assert!(!reads(&Method::POST, path, false), "{path}");
        }
    }

    #[test]
    fn names_go_downstream_as_their_utf8_bytes_and_one_no_header_can_carry_is_refused() {
        let incoming = request_headers(&[("Accept", "application/json")]);
        let mia = principal("mia", &["Entwickler München"], false);
        // Made once and then kept: the second request carries the same headers.
        for _ in 0..2 {
            let sent = forwarded(&incoming, false, &mia).unwrap();
            let groups: Vec<&[u8]> = sent
                .get_all("impersonate-group")
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            assert_eq!(
                groups,
                [
                    &b"drover:authenticated"[..],
                    "Entwickler München".as_bytes()
                ]
            );
            assert_eq!(sent["impersonate-user"], "mia");
        }
        let bell = principal("bo", &["ops\u{7}"], false);
        for _ in 0..2 {
            let refused = forwarded(&incoming, false, &bell).unwrap_err();
            assert_eq!(refused.code, StatusCode::BAD_REQUEST);
            assert!(
                refused.message.contains("the group \"ops\\u{7}\""),
                "{}",
                refused.message
            );
        }
    }

    #[test]
    fn the_cluster_is_read_from_the_path_and_the_rest_goes_on_as_received() {
        let on = |uri: &str| {
            let uri: http::Uri = uri.parse().unwrap();
            let (cluster, rest_at) = target(uri.path()).unwrap();
            (
                cluster.into_owned(),
                forward_path(&uri, rest_at).into_owned(),
            )
        };
        assert_eq!(
            on("/k8s/clusters/prod/api/v1/namespaces/shop/pods?watch=1&labelSelector=app%3Dweb"),
            (
                "prod".to_owned(),
                "/api/v1/namespaces/shop/pods?watch=1&labelSelector=app%3Dweb".to_owned()
            )
        );
        // A cluster's name is decoded, as the router decoded it; the rest is not.
        assert_eq!(
            on("/k8s/clusters/pr%6Fd/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aview"),
            (
                "prod".to_owned(),
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aview".to_owned()
            )
        );
        assert_eq!(on("/k8s/clusters/c/"), ("c".to_owned(), "/".to_owned()));
        assert_eq!(
            on("/k8s/clusters/c/?x=1"),
            ("c".to_owned(), "/?x=1".to_owned())
        );
        assert_eq!(on("/k8s/clusters/c"), ("c".to_owned(), "/".to_owned()));
        // A name that decodes to no text, or a path that could mean another, is refused.
        assert!(target("/k8s/clusters/%ff/api").is_err());
        assert!(target("/k8s/clusters/c/api/../secrets").is_err());
    }

    #[test]
    fn the_read_only_check_reads_the_path_that_is_forwarded() {
        // The probe's request: decoded, it reads as a self-review (which read-only users may
        // POST); forwarded, the API server would clean it into a configmap write.
        let probe = "/k8s/clusters/c/apis/authorization.k8s.io/../../api/v1/namespaces/default/configmaps%3F/selfsubjectaccessreviews";
        assert!(raw_rest(probe, 3).is_err());
        for ambiguous in [
            "/k8s/clusters/c/api/v1/namespaces/default/configmaps%3fx",
            "/k8s/clusters/c/api/v1/namespaces/a%2Fb/pods",
            "/k8s/clusters/c/api/v1/namespaces/%2e%2e/pods",
            "/k8s/clusters/c/api/v1//pods",
            "/k8s/clusters/c/api/./v1/pods",
            "/k8s/clusters/c/api/v1/pods%23frag",
            "/k8s/clusters/c/api/v1/pods%25",
            "/k8s/clusters/c/api/v1/a\\b",
        ] {
            assert!(raw_rest(ambiguous, 3).is_err(), "{ambiguous}");
        }
        assert_eq!(
            raw_rest("/k8s/clusters/c/api/v1/namespaces/default/pods", 3),
            Ok("api/v1/namespaces/default/pods")
        );
        // Encodings of other characters stay as sent (and are forwarded as sent).
        assert_eq!(
            raw_rest(
                "/k8s/clusters/c/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aview",
                3
            ),
            Ok("apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aview")
        );
        assert_eq!(
            raw_rest("/v3/relay/cluster-agent/c/kube-api/version", 5),
            Ok("version")
        );
        assert_eq!(raw_rest("/k8s/clusters/c/", 3), Ok(""));
        // And what is forwarded is judged as such: a write, however it is spelled.
        assert!(!reads(
            &http::Method::POST,
            "api/v1/namespaces/default/configmaps",
            false
        ));
    }
}
