//! Pod eviction (`POST pods/NAME/eviction`), which `kubectl drain` and the hub's drain use,
//! honouring PodDisruptionBudgets as kube-apiserver does; and each budget's `status`, kept as
//! the disruption controller keeps it. Nothing reschedules in the simulator: an evicted pod
//! is deleted and not replaced, so the budget counts the pods there are.

use std::sync::Arc;

use axum::{http::StatusCode, response::Response};
use kubeshape::LabelSelector;
use serde_json::{Value, json};

use super::{
    Sim,
    request::{Target, labels_of},
    resources,
    server::{ok_json, status, store_error},
    store::StoreError,
};

const BUDGETS: &str = "policy/poddisruptionbudgets";

/// Evicts the pod `target` names, unless a budget over it has no disruption to spare (429,
/// and the client tries again later, as `kubectl drain` does).
pub(super) fn evict(sim: &Arc<Sim>, target: &Target) -> Response {
    let Some(pod) = sim.store.get("pods", &target.key()) else {
        return store_error(target, StoreError::NotFound);
    };
    let namespace = target.namespace.clone().unwrap_or_default();
    let (budgets, _) = sim.store.list(BUDGETS, Some(&namespace));
    let covering: Vec<&Arc<Value>> = budgets
        .iter()
        .filter(|b| selector(b).is_some_and(|s| s.matches(&labels_of(&pod))))
        .collect();
    if covering.len() > 1 {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        );
    }
    // A pod that is not running cannot be disrupted further: it may always go.
    let running = pod["status"]["phase"] == "Running";
    if let (Some(budget), true) = (covering.first(), running) {
        let (pods, _) = sim.store.list("pods", Some(&namespace));
        let state = budget_status(budget, &pods);
        if state["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0 {
            let mut body: Value = serde_json::from_str(&kubeshape::status::failure(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            ))
            .unwrap_or_default();
            body["details"] = json!({"causes": [{
                "reason": "DisruptionBudget",
                "message": format!(
                    "The disruption budget {} needs {} healthy pods and has {} currently",
                    budget["metadata"]["name"].as_str().unwrap_or_default(),
                    state["desiredHealthy"], state["currentHealthy"],
                ),
            }]});
            return ok_json(StatusCode::TOO_MANY_REQUESTS, &body);
        }
    }
    match sim.store.delete("pods", &target.key()) {
        Ok(object) => {
            sim.after_delete(target.resource, &object);
            ok_json(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            )
        }
        Err(e) => store_error(target, e),
    }
}

/// Writes each budget's status in `namespace` anew from the pods there.
pub(super) fn refresh(sim: &Sim, namespace: &str) {
    let (budgets, _) = sim.store.list(BUDGETS, Some(namespace));
    if budgets.is_empty() {
        return;
    }
    let (pods, _) = sim.store.list("pods", Some(namespace));
    for budget in budgets {
        let next = budget_status(&budget, &pods);
        if budget["status"] == next {
            continue;
        }
        let key = (
            namespace.to_owned(),
            budget["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        let _ = sim.store.update(BUDGETS, &key, None, |current| {
            let mut updated = current.clone();
            updated["status"] = next.clone();
            updated
        });
    }
}

/// A budget's status from the pods of its namespace: how many of those it selects are
/// healthy (Ready), how many must stay so, and how many may go.
fn budget_status(budget: &Value, pods: &[Arc<Value>]) -> Value {
    let selector = selector(budget);
    let selected: Vec<&Arc<Value>> = pods
        .iter()
        .filter(|p| selector.as_ref().is_some_and(|s| s.matches(&labels_of(p))))
        .collect();
    let expected = selected.len() as i64;
    let healthy = selected
        .iter()
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count() as i64;
    let spec = &budget["spec"];
    let desired = if let Some(min) = spec.get("minAvailable") {
        scaled(min, expected)
    } else if let Some(max) = spec.get("maxUnavailable") {
        (expected - scaled(max, expected)).max(0)
    } else {
        expected
    };
    json!({
        "observedGeneration": budget["metadata"]["generation"].as_i64().unwrap_or(1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": (healthy - desired).max(0),
        "expectedPods": expected,
    })
}

/// An int-or-percent of `of` (a percentage rounds up, as Kubernetes rounds budgets).
fn scaled(value: &Value, of: i64) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(percent) => (of * percent + 99) / 100,
            None => s.parse().unwrap_or(0),
        },
        _ => 0,
    }
}

/// A budget's `spec.selector` (matchLabels and matchExpressions); `None` selects nothing,
/// as an absent selector does in policy/v1.
fn selector(budget: &Value) -> Option<LabelSelector> {
    let selector = budget["spec"].get("selector")?;
    let mut terms: Vec<String> = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = expression["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        terms.push(match expression["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    LabelSelector::parse(&terms.join(",")).ok()
}

/// Whether a write to this resource can change a budget's status.
pub(super) fn affects_budgets(resource: &resources::Resource) -> bool {
    matches!(resource.plural, "pods" | "poddisruptionbudgets")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(app: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"labels": {"app": app}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
    }

    #[test]
    fn a_budget_counts_the_healthy_pods_it_selects() {
        let pods = [
            pod("web", true),
            pod("web", true),
            pod("web", false),
            pod("db", true),
        ];
        let min = json!({"metadata": {"generation": 1}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
        let state = budget_status(&min, &pods);
        assert_eq!(
            state,
            json!({"observedGeneration": 1, "currentHealthy": 2, "desiredHealthy": 1, "disruptionsAllowed": 1, "expectedPods": 3})
        );
        let max = json!({"spec": {"maxUnavailable": "50%", "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]}}});
        // Four pods; half of them, rounded up, may be unavailable: two must stay healthy.
        let state = budget_status(&max, &pods);
        assert_eq!(
            (
                state["desiredHealthy"].as_i64(),
                state["disruptionsAllowed"].as_i64()
            ),
            (Some(2), Some(1))
        );
        let all =
            json!({"spec": {"minAvailable": "100%", "selector": {"matchLabels": {"app": "db"}}}});
        assert_eq!(budget_status(&all, &pods)["disruptionsAllowed"], 0);
    }
}
