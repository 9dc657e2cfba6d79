//! `POST /v1/clusters/{cluster}/nodes/{node}/drain[?timeoutSeconds=N]`: the dashboard's drain.
//! The planner's drain (cordon, then evict every pod but DaemonSet and mirror pods) done as
//! the caller, so the cluster's RBAC judges each step; passes repeat, as `kubectl drain`'s do,
//! until the node is empty, the cluster refuses a step, or the time is up.

use std::time::Duration;

use axum::extract::Query;

use super::*;
use crate::downstream::{self, NotDrained};

/// Between passes: how long evicted pods get to go.
const PASS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, serde::Deserialize)]
pub struct DrainQuery {
    #[serde(rename = "timeoutSeconds", default)]
    timeout_seconds: Option<u64>,
}

pub async fn drain(
    State(state): State<Arc<ProxyState>>,
    Path((cluster, node)): Path<(String, String)>,
    Query(query): Query<DrainQuery>,
    headers: HeaderMap,
) -> Response {
    let (principal, _, _) = match authorize(&state, &headers, &cluster, false).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    if read_only(&principal, &cluster) {
        return kube_status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} is read-only on cluster {cluster:?}: draining a node is not allowed",
                principal.user
            ),
        );
    }
    let timeout = Duration::from_secs(query.timeout_seconds.unwrap_or(60).clamp(1, 600));
    let deadline = tokio::time::Instant::now() + timeout;
    let agents = Agents {
        registry: state.registry.clone(),
        replicas: state.replicas.clone(),
        peers: state.peers.clone(),
    };
    loop {
        let why = match downstream::drain(&agents, &cluster, &node, Some(&principal)).await {
            Ok(()) => {
                let body = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Success",
                    "message": format!("node {node:?} drained: cordoned, and every pod but DaemonSet and mirror pods evicted"),
                });
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response();
            }
            Err(NotDrained::Refused {
                code,
                step,
                message,
            }) => {
                let reason = if code == StatusCode::NOT_FOUND {
                    "NotFound"
                } else {
                    "Forbidden"
                };
                return kube_status(code, reason, format!("{step}: {message}"));
            }
            Err(NotDrained::Pending(why)) => why,
        };
        if tokio::time::Instant::now() + PASS_EVERY > deadline {
            return kube_status(
                StatusCode::GATEWAY_TIMEOUT,
                "Timeout",
                format!(
                    "node {node:?} is cordoned but not yet drained after {}s: {why}; drain again to keep waiting",
                    timeout.as_secs()
                ),
            );
        }
        tokio::time::sleep(PASS_EVERY).await;
    }
}
