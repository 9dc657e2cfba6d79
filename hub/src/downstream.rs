//! The hub's own calls into a cluster (not a user's requests, which the proxy carries):
//! cordoning and draining a node before its host upgrades, making it schedulable again,
//! deleting the node of a removed host, cleaning up what the import manifest created in a
//! cluster being removed, and asking the cluster, as a user, whether they may list a kind
//! (before the proxy answers from the cluster-agent's cache). The same drain also serves the
//! dashboard's drain button, as the user who pressed it (impersonated, as the proxy would).
//! Each goes to the cluster's API server as its cluster-agent, through the agent's session on
//! this replica or the replica it is connected to (the proxy's routes). Each is one pass that
//! says why it is not done yet, so a slow cluster never holds up the planner's other work.

use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use axum::body::Body;

pub use crate::proxy::route::Agents;
use crate::{
    auth::Principal,
    identity,
    proxy::route::{self, ProxyState, Route, connect_route, from_api, impersonate, kube_status},
};

/// The label the cluster-agent puts on the RBAC objects and secrets it keeps.
const SYNCED: &str = "drover.io/sync";

/// Where the objects the agent keeps live, for checking they are gone.
const SYNCED_KINDS: [&str; 4] = [
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "/apis/rbac.authorization.k8s.io/v1/rolebindings",
    "/api/v1/secrets",
];

/// What the import manifest created, deleted in this order as the agent's service account:
/// the agent's cluster-wide binding before its namespace, since the namespace holds the
/// account (its token dies with it); the manifest's `drover-agent-removal` RoleBinding, in the
/// namespace, lets the agent delete the namespace once the cluster-wide binding is gone.
const IMPORTED: [&str; 3] = [
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/drover-admin",
    AGENT_BINDING,
    "/api/v1/namespaces/drover-system",
];
const AGENT_BINDING: &str = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/drover-agent";

/// A request to `cluster`'s API server as its cluster-agent (no impersonation): through its
/// session on this replica, else relayed by the replica it is connected to. A JSON body and
/// answer.
pub async fn call(
    agents: &Agents,
    cluster: &str,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: Option<&serde_json::Value>,
) -> Result<(StatusCode, serde_json::Value), String> {
    call_as(agents, cluster, None, method, path, content_type, body).await
}

/// [`call`], as `user` (impersonated, as the proxy sends a user's requests) when given, so
/// the cluster's RBAC judges the user's own action.
async fn call_as(
    agents: &Agents,
    cluster: &str,
    user: Option<&Principal>,
    method: http::Method,
    path: &str,
    content_type: &str,
    body: Option<&serde_json::Value>,
) -> Result<(StatusCode, serde_json::Value), String> {
    let (mut sender, path) = match route::agent_session(&agents.registry, cluster) {
        Some(session) => {
            let sender = route::connect(&session, proto::KUBE_API_SERVICE, cluster)
                .await
                .map_err(|r| format!("cannot reach cluster {cluster:?}: HTTP {}", r.status()))?;
            (sender, path.to_owned())
        }
        // With replicas, through the one its agent is connected to.
        None => {
            let url = match &agents.peers {
                Some(_) => {
                    agents
                        .replicas
                        .locate(identity::CLUSTER_AGENT, cluster)
                        .await
                }
                None => None,
            }
            .ok_or_else(|| format!("the cluster-agent of {cluster:?} is not connected"))?;
            let sender = route::connect_peer(agents.peers.clone(), &url, cluster)
                .await
                .map_err(|r| format!("cannot reach cluster {cluster:?}: HTTP {}", r.status()))?;
            let relayed = format!(
                "{}/{}/{cluster}/{}{path}",
                route::RELAY_PREFIX,
                identity::CLUSTER_AGENT,
                proto::KUBE_API_SERVICE
            );
            (sender, relayed)
        }
    };
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "kubernetes")
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ACCEPT, "application/json")
        .body(Body::from(bytes))
        .map_err(|e| e.to_string())?;
    if let Some(user) = user {
        impersonate(request.headers_mut(), user).map_err(|e| e.message)?;
    }
    let response = route::send(&mut sender, request, cluster)
        .await
        .map_err(|r| format!("cluster {cluster:?}: HTTP {}", r.status()))?;
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    ))
}

/// Why a drain pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum NotDrained {
    /// Pods are still leaving, or the cluster could not be reached: another pass may finish.
    #[error("{0}")]
    Pending(String),
    /// The cluster refused a step (its RBAC does not let the caller do it, or there is no
    /// such node): another pass will not help.
    #[error("{step}: HTTP {code}: {message}")]
    Refused {
        code: StatusCode,
        step: String,
        message: String,
    },
}

impl NotDrained {
    fn of(code: StatusCode, step: &str, answer: &Value) -> Self {
        let message = answer["message"].as_str().unwrap_or_default().to_owned();
        if matches!(
            code,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
        ) {
            Self::Refused {
                code,
                step: step.to_owned(),
                message,
            }
        } else {
            Self::Pending(format!("{step}: HTTP {code}: {message}"))
        }
    }
}

/// Cordons `node` and evicts its pods (not DaemonSet or mirror pods), as the cluster-agent
/// (the planner) or as `user` (the dashboard's drain). One pass: `Ok` once no such pod is
/// left, else why not yet.
pub async fn drain(
    agents: &Agents,
    cluster: &str,
    node: &str,
    user: Option<&Principal>,
) -> Result<(), NotDrained> {
    if node.is_empty() {
        return Err(NotDrained::Pending("the host has no node name".into()));
    }
    let (code, answer) = call_as(
        agents,
        cluster,
        user,
        Method::PATCH,
        &format!("/api/v1/nodes/{node}"),
        "application/merge-patch+json",
        Some(&json!({"spec": {"unschedulable": true}})),
    )
    .await
    .map_err(NotDrained::Pending)?;
    if !code.is_success() {
        return Err(NotDrained::of(code, "cordoning", &answer));
    }
    let (code, list) = call_as(
        agents,
        cluster,
        user,
        Method::GET,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
        "application/json",
        None,
    )
    .await
    .map_err(NotDrained::Pending)?;
    if !code.is_success() {
        return Err(NotDrained::of(code, "listing its pods", &list));
    }
    let evictable: Vec<&Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            let daemon = p["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["kind"] == "DaemonSet"));
            let mirror = p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string();
            !daemon && !mirror
        })
        .collect();
    if evictable.is_empty() {
        return Ok(());
    }
    for pod in &evictable {
        let (ns, pod_name) = (
            pod["metadata"]["namespace"].as_str().unwrap_or("default"),
            pod["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod_name, "namespace": ns}});
        let (code, answer) = call_as(
            agents,
            cluster,
            user,
            Method::POST,
            &format!("/api/v1/namespaces/{ns}/pods/{pod_name}/eviction"),
            "application/json",
            Some(&eviction),
        )
        .await
        .map_err(NotDrained::Pending)?;
        if matches!(code, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(NotDrained::of(
                code,
                &format!("evicting {ns}/{pod_name}"),
                &answer,
            ));
        }
        // An API server without the eviction subresource: delete instead (a disruption
        // budget's 429 means wait and try again).
        if code == StatusCode::NOT_FOUND || code == StatusCode::METHOD_NOT_ALLOWED {
            call_as(
                agents,
                cluster,
                user,
                Method::DELETE,
                &format!("/api/v1/namespaces/{ns}/pods/{pod_name}"),
                "application/json",
                None,
            )
            .await
            .map_err(NotDrained::Pending)?;
        }
    }
    Err(NotDrained::Pending(format!(
        "evicting {} pods",
        evictable.len()
    )))
}

/// Makes `node` schedulable again (a node that is gone needs nothing).
pub async fn uncordon(agents: &Agents, cluster: &str, node: &str) -> Result<(), String> {
    let (code, answer) = call(
        agents,
        cluster,
        Method::PATCH,
        &format!("/api/v1/nodes/{node}"),
        "application/merge-patch+json",
        Some(&json!({"spec": {"unschedulable": null}})),
    )
    .await?;
    done_or_gone(code, &answer)
}

/// Deletes the node object of a machine that is gone.
pub async fn delete_node(agents: &Agents, cluster: &str, node: &str) -> Result<(), String> {
    let (code, answer) = call(
        agents,
        cluster,
        Method::DELETE,
        &format!("/api/v1/nodes/{node}"),
        "application/json",
        None,
    )
    .await?;
    done_or_gone(code, &answer)
}

/// A write to a node: done, or not needed because the node is gone; else why not.
fn done_or_gone(code: StatusCode, answer: &Value) -> Result<(), String> {
    if code.is_success() || code == StatusCode::NOT_FOUND {
        Ok(())
    } else {
        Err(format!("HTTP {code}: {}", answer["message"]))
    }
}

/// Removes what Drover created in an imported cluster: waits until the agent has removed what
/// it kept for the hub's (now empty) access, then deletes what the import manifest created.
/// `Ok` once done; else why not yet.
pub async fn clean_imported(agents: &Agents, cluster: &str) -> Result<(), String> {
    for kind in SYNCED_KINDS {
        let (code, list) = call(
            agents,
            cluster,
            Method::GET,
            &format!("{kind}?labelSelector={SYNCED}"),
            "application/json",
            None,
        )
        .await?;
        if !code.is_success() {
            return Err(format!("listing {kind}: HTTP {code}"));
        }
        let left = list["items"].as_array().map_or(0, Vec::len);
        if left > 0 {
            return Err(format!(
                "waiting for the agent to remove {left} object(s) it kept ({kind})"
            ));
        }
    }
    for path in IMPORTED {
        let (code, answer) = call(
            agents,
            cluster,
            Method::DELETE,
            path,
            "application/json",
            None,
        )
        .await?;
        // A retry after the agent's binding went: the agent may no longer even read it,
        // which is what deleting it was for.
        let lost_rights = path == AGENT_BINDING && code == StatusCode::FORBIDDEN;
        if !code.is_success() && code != StatusCode::NOT_FOUND && !lost_rights {
            return Err(format!(
                "deleting {path}: HTTP {code}: {}",
                answer["message"]
            ));
        }
    }
    Ok(())
}

/// Whether the cluster's RBAC lets `principal` list `resource` in `namespace` (every namespace
/// when `None`), asked of the cluster as the user (a `SelfSubjectAccessReview`, as `kubectl
/// auth can-i` asks).
pub(crate) async fn may_list(
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
    let (mut connection, path) = connect_route(
        state,
        route,
        proto::KUBE_API_SERVICE,
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
    let response = connection.send(request, cluster).await?;
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    connection.keep();
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
