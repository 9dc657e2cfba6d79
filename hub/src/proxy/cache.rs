//! Lists from the cluster-agent's watch-driven caches, for users the cluster's own RBAC lets
//! list them (asked of the cluster as the user).

use super::*;

/// `GET /v1/clusters/{cluster}/cache/{resource}?namespace=&labelSelector=`: a list answered
/// from the cluster-agent's watch-driven cache, without a request to the cluster's API server.
/// Any role on the cluster may read it.
pub async fn cache(
    State(state): State<Arc<ProxyState>>,
    Path((cluster, resource)): Path<(String, String)>,
    request: Request,
) -> Response {
    // The cache lives in the cluster-agent: no fallback.
    let (principal, route, _) = match authorize(&state, request.headers(), &cluster, false).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let Some(cached) = proto::cached_resource(&resource) else {
        let names = proto::CACHED_RESOURCES.map(|r| r.name).join(", ");
        return kube_status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{resource:?} is not cached; the cached resources are {names}"),
        );
    };
    // The cache answers only what the cluster's RBAC lets the caller list, as the proxy would:
    // a namespaced kind in the namespace asked for (every namespace without one), a
    // cluster-scoped kind to those who may list it. Admins are cluster-admin there.
    let namespace = axum::extract::Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .ok()
        .and_then(|q| q.0.get("namespace").cloned())
        .filter(|n| !n.is_empty() && cached.namespaced);
    if !principal.admin {
        match may_list(
            &state,
            &route,
            &principal,
            &cluster,
            cached,
            namespace.as_deref(),
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => {
                let scope = match &namespace {
                    Some(n) => format!("in namespace {n:?}"),
                    None if cached.namespaced => {
                        "in every namespace (ask for one you may read with ?namespace=)".to_owned()
                    }
                    None => "(a cluster-wide kind)".to_owned(),
                };
                return kube_status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!(
                        "user {:?} may not list {} {scope} on cluster {cluster:?}",
                        principal.user, cached.name
                    ),
                );
            }
            Err(response) => return response,
        }
    }
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (mut sender, path, pool) = match connect_route(
        &state,
        &route,
        proto::CLUSTER_CACHE_SERVICE,
        &cluster,
        &format!("/{resource}{query}"),
        true,
    )
    .await
    {
        Ok(connected) => connected,
        Err(response) => return response,
    };
    let Ok(outbound) = http::Request::get(path)
        .header(header::HOST, "cluster-cache")
        .body(Body::empty())
    else {
        return kube_status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("{resource:?} is not a resource name"),
        );
    };
    match send(&mut sender, outbound, &cluster).await {
        Ok(response) => {
            if let Some(pool) = pool {
                pool.put(sender);
            }
            response.map(Body::new)
        }
        Err(response) => response,
    }
}

/// Whether the cluster's RBAC lets `principal` list `resource` in `namespace` (every namespace
/// when `None`), asked of the cluster as the user (a `SelfSubjectAccessReview`, as `kubectl
/// auth can-i` asks).
async fn may_list(
    state: &ProxyState,
    route: &Route,
    principal: &Principal,
    cluster: &str,
    resource: proto::CachedResource,
    namespace: Option<&str>,
) -> Result<bool, Response> {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {
            "verb": "list",
            "group": resource.group,
            "resource": resource.name,
            "namespace": namespace.unwrap_or_default(),
        }},
    });
    let (mut sender, path, pool) = connect_route(
        state,
        route,
        KUBE_API_SERVICE,
        cluster,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        true,
    )
    .await?;
    let mut headers = HeaderMap::new();
    headers.insert(header::HOST, HeaderValue::from_static("kubernetes"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    impersonate(&mut headers, principal).map_err(from_api)?;
    let mut request = http::Request::post(path)
        .body(Body::from(review.to_string()))
        .unwrap_or_default();
    *request.headers_mut() = headers;
    let response = send(&mut sender, request, cluster).await?;
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Some(pool) = pool {
        pool.put(sender);
    }
    if !status.is_success() {
        return Err(kube_status(
            StatusCode::BAD_GATEWAY,
            "BadGateway",
            format!("cluster {cluster:?} could not say what the caller may list: HTTP {status}"),
        ));
    }
    let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    Ok(answer.pointer("/status/allowed") == Some(&serde_json::Value::Bool(true)))
}
