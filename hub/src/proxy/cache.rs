//! Lists from the cluster-agent's watch-driven caches, for users the cluster's own RBAC lets
//! list them (asked of the cluster as the user).

use super::*;

/// The label that puts a namespace in a project (what the cluster-agent's RBAC sync reads).
const PROJECT_LABEL: &str = "drover.io/project";

/// Whether the query asks only for the namespaces of a project the caller has a role on
/// (`namespaces?labelSelector=drover.io/project=P`): as in Rancher, a project's members see
/// which namespaces it has, though the cluster's RBAC gives them no right to list namespaces
/// (their roles are bound inside those namespaces).
fn own_projects_namespaces(
    principal: &Principal,
    cluster: &str,
    cached: proto::CachedResource,
    params: &HashMap<String, String>,
) -> bool {
    cached.name == "namespaces"
        && params.len() == 1
        && params
            .get("labelSelector")
            .and_then(|s| s.strip_prefix(PROJECT_LABEL))
            .and_then(|s| s.strip_prefix('='))
            .and_then(|project| principal.projects.get(project))
            .is_some_and(|(c, _)| c == cluster)
}

/// The namespaces a cache query asks for (`namespace=a,b` or `namespace=a&namespace=b`); none
/// for a cluster-scoped kind, where the cluster-agent refuses the parameter.
fn namespaces_asked(query: &str, cached: proto::CachedResource) -> Vec<String> {
    if !cached.namespaced {
        return Vec::new();
    }
    let mut namespaces: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "namespace")
        .flat_map(|(_, v)| {
            v.split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    namespaces.sort();
    namespaces.dedup();
    namespaces
}

/// `GET /v1/clusters/{cluster}/cache/{resource}?namespace=&labelSelector=&name=&sort=&limit=&continue=`:
/// a list (or, asked with the API server's Table `Accept`, its Table) answered from the
/// cluster-agent's watch-driven cache, without a request to the cluster's API server. Any role
/// on the cluster may ask; the cluster's RBAC decides what it sees.
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
    // a namespaced kind in each namespace asked for (every namespace without one), a
    // cluster-scoped kind to those who may list it. Admins are cluster-admin there.
    let params = axum::extract::Query::<HashMap<String, String>>::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let namespaces = namespaces_asked(request.uri().query().unwrap_or_default(), cached);
    if !principal.admin && !own_projects_namespaces(&principal, &cluster, cached, &params) {
        let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().map(|n| Some(n.as_str())).collect()
        };
        for namespace in scopes {
            match crate::downstream::may_list(
                &state, &route, &principal, &cluster, cached, namespace,
            )
            .await
            {
                Ok(true) => {}
                Ok(false) => {
                    let scope = match namespace {
                        Some(n) => format!("in namespace {n:?}"),
                        None if cached.namespaced => {
                            "in every namespace (ask for those you may read with ?namespace=)"
                                .to_owned()
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
    }
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let accept = request.headers().get(header::ACCEPT).cloned();
    ask_cache(
        &state,
        &route,
        &cluster,
        &format!("/{resource}{query}"),
        accept,
    )
    .await
}

/// `GET /v1/clusters/{cluster}/overview`: the cluster at a glance
/// ([`proto::overview::Overview`]), summed by the cluster-agent from its caches. It sums every
/// node, pod, deployment and event, so it is for those the cluster's RBAC lets list all of
/// them (admins, and the cluster's owners and read-only users).
pub async fn overview(
    State(state): State<Arc<ProxyState>>,
    Path(cluster): Path<String>,
    request: Request,
) -> Response {
    let (principal, route, _) = match authorize(&state, request.headers(), &cluster, false).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    if !principal.admin {
        for name in ["nodes", "pods", "deployments", "events"] {
            let Some(cached) = proto::cached_resource(name) else {
                continue;
            };
            match crate::downstream::may_list(&state, &route, &principal, &cluster, cached, None)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    let scope = if cached.namespaced {
                        "in every namespace of"
                    } else {
                        "of"
                    };
                    return kube_status(
                        StatusCode::FORBIDDEN,
                        "Forbidden",
                        format!(
                            "user {:?} may not list {name} {scope} cluster {cluster:?}, which \
                             the overview sums; a role that reads the whole cluster (read-only \
                             or cluster-owner) may see it",
                            principal.user
                        ),
                    );
                }
                Err(response) => return response,
            }
        }
    }
    ask_cache(&state, &route, &cluster, proto::overview::PATH, None).await
}

/// Sends `GET path` to the cluster-agent's `cluster-cache` service and hands back its answer.
async fn ask_cache(
    state: &ProxyState,
    route: &Route,
    cluster: &str,
    path: &str,
    accept: Option<http::HeaderValue>,
) -> Response {
    let (mut connection, path) = match connect_route(
        state,
        route,
        proto::CLUSTER_CACHE_SERVICE,
        cluster,
        path,
        true,
    )
    .await
    {
        Ok(connected) => connected,
        Err(response) => return response,
    };
    // The cache answers Tables as the API server does, when asked with the same header.
    let mut outbound = http::Request::get(path).header(header::HOST, "cluster-cache");
    if let Some(accept) = accept {
        outbound = outbound.header(header::ACCEPT, accept);
    }
    let Ok(outbound) = outbound.body(Body::empty()) else {
        return kube_status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the request names no resource the cache knows".to_owned(),
        );
    };
    match connection.send(outbound, cluster).await {
        Ok(response) => {
            connection.keep();
            response.map(Body::new)
        }
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_members_may_list_only_their_projects_namespaces() {
        let pat = Principal::holding(
            "pat",
            false,
            &[],
            &[("shop", "prod", crate::model::Role::ProjectMember)],
        );
        let namespaces = proto::cached_resource("namespaces").unwrap();
        let query = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let own = query(&[("labelSelector", "drover.io/project=shop")]);
        assert!(own_projects_namespaces(&pat, "prod", namespaces, &own));
        // Another cluster's project of that name, another project, any other selector or
        // kind: the cluster's RBAC decides as usual.
        assert!(!own_projects_namespaces(&pat, "dev", namespaces, &own));
        for other in [
            query(&[("labelSelector", "drover.io/project=bank")]),
            query(&[("labelSelector", "drover.io/project=shop,x")]),
            query(&[("labelSelector", "drover.io/project!=shop")]),
            query(&[]),
            query(&[
                ("labelSelector", "drover.io/project=shop"),
                ("namespace", "a"),
            ]),
        ] {
            assert!(
                !own_projects_namespaces(&pat, "prod", namespaces, &other),
                "{other:?}"
            );
        }
        let pods = proto::cached_resource("pods").unwrap();
        assert!(!own_projects_namespaces(&pat, "prod", pods, &own));
    }

    #[test]
    fn every_namespace_asked_for_is_checked() {
        let pods = proto::cached_resource("pods").unwrap();
        assert_eq!(
            namespaces_asked(
                "namespace=b,a&labelSelector=x&namespace=c&namespace=a",
                pods
            ),
            ["a", "b", "c"]
        );
        assert!(namespaces_asked("namespace=", pods).is_empty());
        let nodes = proto::cached_resource("nodes").unwrap();
        assert!(namespaces_asked("namespace=a", nodes).is_empty());
    }
}
