//! The verbs with more to them than reading or writing a stored object: create (generated
//! names, defaults), the scale subresource, pod logs, and watches.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use kubeshape::LabelSelector;
use serde_json::{Value, json};
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

use super::{
    Sim,
    request::{Target, field_matches, labels_of},
    server::{ok_json, status, store_error},
    store::{Change, StoreError},
    table,
};

/// Creates `body`; a `manager` is recorded as the owner of every field (`None`: the caller,
/// a server-side apply, recorded its own).
pub(super) fn create(
    sim: &Arc<Sim>,
    target: &Target,
    mut body: Value,
    manager: Option<&str>,
) -> Response {
    let resource = target.resource;
    if let Some(kind) = body.get("kind").and_then(Value::as_str)
        && kind != resource.kind
    {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("the body is a {kind}, not a {}", resource.kind),
        );
    }
    body["kind"] = json!(resource.kind);
    body["apiVersion"] = json!(resource.api_version());
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    let meta = &mut body["metadata"];
    if meta["name"].as_str().is_none_or(str::is_empty) {
        match meta["generateName"].as_str() {
            Some(prefix) => meta["name"] = json!(format!("{prefix}{}", sim.random_suffix())),
            None => {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        resource.kind
                    ),
                );
            }
        }
    }
    match (&target.namespace, resource.namespaced) {
        (Some(ns), true) => {
            if meta["namespace"].as_str().is_some_and(|n| n != ns) {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                );
            }
            meta["namespace"] = json!(ns);
            if sim
                .store
                .get("namespaces", &(String::new(), ns.clone()))
                .is_none()
            {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                );
            }
        }
        (None, true) => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
        _ => {
            if let Value::Object(m) = meta {
                m.remove("namespace");
            }
        }
    }
    sim.defaults(resource, &mut body);
    if let Some(manager) = manager {
        kubeshape::apply::record_update(None, &mut body, manager, &super::store::now());
    }
    let named = Target {
        resource,
        namespace: target.namespace.clone(),
        name: body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_owned),
        sub: None,
    };
    match sim.store.create(&resource.key(), body) {
        Ok(object) => {
            sim.after_write(resource, &object);
            ok_json(StatusCode::CREATED, &object)
        }
        Err(e) => store_error(&named, e),
    }
}

pub(super) fn scale_of(deployment: &Value) -> Value {
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": deployment["metadata"]["name"],
            "namespace": deployment["metadata"]["namespace"],
            "resourceVersion": deployment["metadata"]["resourceVersion"],
            "uid": deployment["metadata"]["uid"],
        },
        "spec": {"replicas": deployment.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": deployment.pointer("/status/replicas").cloned().unwrap_or(json!(0))},
    })
}

pub(super) fn scale(
    sim: &Arc<Sim>,
    target: &Target,
    replicas: Value,
    _patch: Option<Value>,
) -> Response {
    let Some(replicas) = replicas.as_u64() else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.replicas must be a non-negative integer",
        );
    };
    let result = sim
        .store
        .update(&target.resource.key(), &target.key(), None, |current| {
            let mut next = current.clone();
            next["spec"]["replicas"] = json!(replicas);
            next
        });
    match result {
        Ok(object) => {
            sim.after_write(target.resource, &object);
            ok_json(StatusCode::OK, &scale_of(&object))
        }
        Err(e) => store_error(target, e),
    }
}

/// A stand-in container's log: it writes a line every [`LOG_EVERY`] from its pod's creation,
/// and the kubelet keeps the last [`LOG_KEPT`]. Answered as the kubelet would: `tailLines`
/// (the last N), `sinceSeconds`, `timestamps`, `container` (required when the pod has several),
/// `previous` (there is none: no container here ever restarted), `follow`.
pub(super) fn logs(sim: &Arc<Sim>, target: &Target, params: &BTreeMap<String, String>) -> Response {
    let Some(pod) = sim.store.get("pods", &target.key()) else {
        return store_error(target, StoreError::NotFound);
    };
    let name = target.name.clone().unwrap_or_default();
    let container = match container_of(&pod, &name, params) {
        Ok(container) => container,
        Err(response) => return *response,
    };
    let bad = |message: String| status(StatusCode::BAD_REQUEST, "BadRequest", message);
    if matches!(
        params.get("previous").map(String::as_str),
        Some("true" | "1")
    ) {
        return bad(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        ));
    }
    let number = |key: &str| params.get(key).and_then(|v| v.parse::<u64>().ok());
    let started = pod
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .unwrap_or_else(OffsetDateTime::now_utc);
    let at = move |k: u64| started + LOG_EVERY * u32::try_from(k).unwrap_or(u32::MAX);
    let written = |now: OffsetDateTime| {
        let since = (now - started).whole_milliseconds().max(0) as u64;
        since / LOG_EVERY.whole_milliseconds() as u64
    };
    let now = OffsetDateTime::now_utc();
    let last = written(now);
    let mut first = last.saturating_sub(LOG_KEPT - 1);
    if let Some(seconds) = number("sinceSeconds") {
        let from = now - time::Duration::seconds(i64::try_from(seconds).unwrap_or(i64::MAX));
        while first <= last && at(first) < from {
            first += 1;
        }
    }
    if let Some(tail) = number("tailLines") {
        first = first.max((last + 1).saturating_sub(tail));
    }
    let timestamps = matches!(
        params.get("timestamps").map(String::as_str),
        Some("true" | "1")
    );
    let line = move |k: u64| {
        let text = log_line(&name, &container, k);
        Bytes::from(if timestamps {
            let stamp = at(k)
                .format(time::macros::format_description!(
                    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z"
                ))
                .unwrap_or_default();
            format!("{stamp} {text}")
        } else {
            text
        })
    };
    let head: Vec<Result<Bytes, std::convert::Infallible>> =
        (first..=last).map(|k| Ok(line(k))).collect();
    let head = futures::stream::iter(head);
    let follow = matches!(params.get("follow").map(String::as_str), Some("true" | "1"));
    let body = if follow {
        // Each next line when the container writes it.
        let more = futures::stream::unfold(last + 1, move |k| {
            let line = line.clone();
            async move {
                let wait = at(k) - OffsetDateTime::now_utc();
                if wait.is_positive() {
                    tokio::time::sleep(Duration::from_millis(wait.whole_milliseconds() as u64))
                        .await;
                }
                Some((Ok(line(k)), k + 1))
            }
        });
        Body::from_stream(head.chain(more))
    } else {
        Body::from_stream(head)
    };
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// The container a log, exec or attach request names (`container=`), or the pod's only one;
/// a name the pod does not have, or none with several, is refused as kube-apiserver does.
pub(super) fn container_of(
    pod: &Value,
    name: &str,
    params: &BTreeMap<String, String>,
) -> Result<String, Box<Response>> {
    let containers: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    let bad = |message: String| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", message));
    match params.get("container") {
        Some(c) if containers.contains(c) => Ok(c.clone()),
        Some(c) => Err(bad(format!("container {c} is not valid for pod {name}"))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => Err(bad(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// A stand-in container's log line `k` (what `logs` and `attach` show).
pub(super) fn log_line(pod: &str, container: &str, k: u64) -> String {
    format!("log line {k} from {pod}/{container}\n")
}

/// How often a stand-in container writes a log line, and how many lines are kept.
pub(super) const LOG_EVERY: time::Duration = time::Duration::milliseconds(100);
const LOG_KEPT: u64 = 1000;

pub(super) fn watch_response(
    sim: &Arc<Sim>,
    target: &Target,
    selector: LabelSelector,
    fields: String,
    params: &BTreeMap<String, String>,
    table: Option<table::Include>,
) -> Response {
    let resource = target.resource;
    let from = params
        .get("resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0);
    let (replay, live, current) = match sim.store.watch(from) {
        Ok(w) => w,
        Err(e) => return store_error(target, e),
    };
    let store_key = resource.key();
    let namespace = target.namespace.clone();
    let wanted = move |c: &Change| -> bool {
        c.resource == store_key
            && namespace.as_deref().is_none_or(|ns| {
                c.object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    == Some(ns)
            })
            && selector.matches(&labels_of(&c.object))
            && field_matches(&fields, &c.object)
    };
    // Without a resourceVersion a watch starts with the current objects, as ADDED events.
    let mut first: Vec<(String, Arc<Value>)> = Vec::new();
    if from.is_none() {
        let (items, _) = sim.store.list(&resource.key(), target.namespace.as_deref());
        for object in items {
            let change = Change {
                revision: 0,
                resource: resource.key(),
                kind: "ADDED",
                object,
            };
            if wanted(&change) {
                first.push(("ADDED".into(), change.object));
            }
        }
    }
    for change in replay.iter().filter(|c| wanted(c)) {
        first.push((change.kind.into(), change.object.clone()));
    }
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let deadline = tokio::time::Instant::now() + timeout;
    let encode = move |kind: &str, object: &Value, columns: bool| -> Bytes {
        let object = if let Some(include) = table {
            let revision = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            table::table(resource, [object], revision, columns, include)
        } else {
            object.clone()
        };
        Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
    };
    let mut columns_sent = false;
    let mut head = Vec::new();
    for (kind, object) in &first {
        head.push(Ok::<_, std::convert::Infallible>(encode(
            kind,
            object,
            !columns_sent,
        )));
        columns_sent = true;
    }
    // Live changes after the replayed ones; a watcher that falls behind gets one ERROR (410)
    // and the end of the stream, and lists again.
    let live_stream = futures::stream::unfold(Some((live, columns_sent)), move |state| {
        let wanted = wanted.clone();
        async move {
            let (mut live, columns_sent) = state?;
            loop {
                match tokio::time::timeout_at(deadline, live.recv()).await {
                    Err(_) | Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                        return None;
                    }
                    Ok(Ok(change)) if change.revision <= current => continue,
                    Ok(Ok(change)) => {
                        if wanted(&change) {
                            let bytes = encode(change.kind, &change.object, !columns_sent);
                            return Some((Ok(bytes), Some((live, true))));
                        }
                    }
                    Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                        let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "the watch fell behind; list again"});
                        let bytes =
                            Bytes::from(format!("{}\n", json!({"type": "ERROR", "object": gone})));
                        return Some((Ok(bytes), None));
                    }
                }
            }
        }
    });
    let body = Body::from_stream(futures::stream::iter(head).chain(live_stream));
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}
