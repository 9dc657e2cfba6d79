//! Requests another hub replica relays for an agent connected to this one.

use super::*;

/// `/v3/relay/<agent kind>/<cluster>/<service>/<path>`: a request another hub replica has
/// already authenticated, authorised and rewritten (impersonation set), for an agent connected
/// to this replica. Only a peer presenting its replica certificate may send one.
pub async fn relay(
    State(state): State<Arc<ProxyState>>,
    Path((kind, cluster, service, _)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    // `/v3/relay/<kind>/<cluster>/<service>/<rest>`: forwarded as received, as `handle` does.
    let rest = match raw_rest(request.uri().path(), 5) {
        Ok(rest) => rest.to_owned(),
        Err(why) => return kube_status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    if request
        .extensions()
        .get::<tunnel::listener::CertifiedClient>()
        .is_none()
    {
        return kube_status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "only another hub replica, presenting its certificate, may relay requests".into(),
        );
    }
    let kind = match kind.as_str() {
        crate::identity::CLUSTER_AGENT => crate::identity::CLUSTER_AGENT,
        crate::identity::NODE_AGENT => crate::identity::NODE_AGENT,
        _ => {
            return kube_status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no agent kind {kind:?}"),
            );
        }
    };
    let service = match service.as_str() {
        KUBE_API_SERVICE => KUBE_API_SERVICE,
        proto::CLUSTER_CACHE_SERVICE => proto::CLUSTER_CACHE_SERVICE,
        _ => {
            return kube_status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no service {service:?}"),
            );
        }
    };
    let Some(session) = newest_session(&state.registry, kind, &cluster) else {
        return kube_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "the {kind} of cluster {cluster:?} is not connected to this hub replica (any more)"
            ),
        );
    };
    let (mut parts, body) = request.into_parts();
    let upgrade = parts.headers.contains_key(header::UPGRADE);
    let (on_upgrade, query) = upgrade_and_query(&mut parts, upgrade);
    let relayed = |incoming: &HeaderMap| {
        let mut headers = HeaderMap::with_capacity(incoming.len());
        for (name, value) in incoming {
            if hop_by_hop(name) && !upgrade {
                continue;
            }
            headers.append(name.clone(), value.clone());
        }
        headers
    };
    let headers = relayed(&parts.headers);
    let mut connection = match connect_local(&state, &session, service, &cluster, !upgrade).await {
        Ok(connection) => connection,
        Err(response) => return response,
    };
    let mut outbound = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("/{rest}{query}"))
        .body(body)
        .unwrap_or_default();
    let uri = outbound.uri().clone();
    *outbound.headers_mut() = headers;
    // The replica the caller came through counts the caller's streams and records sessions.
    let again = || {
        let mut copy = http::Request::new(Body::empty());
        *copy.method_mut() = parts.method.clone();
        *copy.uri_mut() = uri;
        *copy.headers_mut() = relayed(&parts.headers);
        Some(copy)
    };
    let response = exchange(
        &mut connection,
        (outbound, again),
        on_upgrade,
        &cluster,
        None,
        None,
    )
    .await;
    connection.keep();
    response
}
