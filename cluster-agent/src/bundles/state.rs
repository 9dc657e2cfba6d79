//! What an applied object is now: drifted from what was applied (which fields), and ready or
//! not (by its status, as `kubectl rollout status` and Fleet read it).

use serde_json::Value;

/// The fields `applied` sets that `live` holds otherwise, as kubectl names fields
/// (`.spec.template.spec.containers[name="web"].image`). Fields the server adds are not
/// drift; lists of named objects are matched by name, other lists compared whole.
pub fn drifted(applied: &Value, live: &Value) -> Vec<String> {
    let mut out = Vec::new();
    compare(applied, live, &mut String::new(), &mut out);
    out
}

fn compare(applied: &Value, live: &Value, at: &mut String, out: &mut Vec<String>) {
    match (applied, live) {
        (Value::Object(a), Value::Object(l)) => {
            for (key, value) in a {
                if at.is_empty() && matches!(key.as_str(), "status" | "apiVersion" | "kind") {
                    continue;
                }
                let len = at.len();
                at.push('.');
                at.push_str(key);
                match l.get(key) {
                    Some(found) => compare(value, found, at, out),
                    None if value.is_null() => {}
                    None => out.push(at.clone()),
                }
                at.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(l)) if named(a) => {
            for item in a {
                let name = &item["name"];
                let len = at.len();
                at.push_str(&format!("[name={name}]"));
                match l.iter().find(|x| &x["name"] == name) {
                    Some(found) => compare(item, found, at, out),
                    None => out.push(at.clone()),
                }
                at.truncate(len);
            }
        }
        (Value::Number(a), Value::Number(l)) if a.as_f64() == l.as_f64() => {}
        (a, l) if a == l => {}
        _ => out.push(at.clone()),
    }
}

fn named(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|i| i["name"].is_string())
}

/// `Ready`, or `NotReady` with why, from the object's status.
pub fn readiness(live: &Value) -> (&'static str, String) {
    let status = &live["status"];
    if live["kind"] == "Deployment" || live["kind"] == "StatefulSet" {
        let wanted = live["spec"]["replicas"].as_u64().unwrap_or(1);
        let ready = status["readyReplicas"].as_u64().unwrap_or(0);
        let generation = live["metadata"]["generation"].as_u64().unwrap_or(0);
        let observed = status["observedGeneration"].as_u64().unwrap_or(0);
        if observed < generation {
            return (
                "NotReady",
                "its controller has not seen the latest spec yet".into(),
            );
        }
        if ready < wanted {
            return ("NotReady", format!("{ready} of {wanted} replicas ready"));
        }
        return ("Ready", String::new());
    }
    let not_ready = status["conditions"].as_array().and_then(|c| {
        c.iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "False")
    });
    match not_ready {
        Some(c) => (
            "NotReady",
            format!(
                "Ready=False: {}",
                c["message"].as_str().or(c["reason"].as_str()).unwrap_or("")
            ),
        ),
        None => ("Ready", String::new()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn drift_is_what_was_applied_and_holds_otherwise_not_what_the_server_added() {
        let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:1.27"}]}}}});
        let mut live = applied.clone();
        live["metadata"]["uid"] = json!("u");
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        live["status"] = json!({"readyReplicas": 2});
        assert!(drifted(&applied, &live).is_empty());
        live["spec"]["replicas"] = json!(5);
        live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:evil");
        live["metadata"]["labels"] = json!({});
        assert_eq!(
            drifted(&applied, &live),
            [
                ".metadata.labels.app",
                ".spec.replicas",
                ".spec.template.spec.containers[name=\"web\"].image"
            ]
        );
    }

    #[test]
    fn readiness_reads_replicas_and_ready_conditions() {
        let deployment = |ready: u64| {
            json!({"kind": "Deployment", "metadata": {"generation": 2},
                   "spec": {"replicas": 3}, "status": {"readyReplicas": ready, "observedGeneration": 2}})
        };
        assert_eq!(readiness(&deployment(3)), ("Ready", String::new()));
        assert_eq!(
            readiness(&deployment(1)),
            ("NotReady", "1 of 3 replicas ready".to_owned())
        );
        let custom = json!({"kind": "Thing", "status": {"conditions": [
            {"type": "Ready", "status": "False", "message": "waiting for a volume"}]}});
        assert_eq!(
            readiness(&custom),
            ("NotReady", "Ready=False: waiting for a volume".to_owned())
        );
        assert_eq!(readiness(&json!({"kind": "ConfigMap"})).0, "Ready");
    }
}
