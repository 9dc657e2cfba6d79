//! `Table` responses (server-side printing), which is what `kubectl get` asks for: the columns
//! kube-apiserver prints for the common kinds, NAME and AGE for the rest.

use serde_json::{Value, json};

use super::resources::Resource;

fn age(object: &Value) -> String {
    let Some(created) = object
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
    else {
        return "<unknown>".into();
    };
    let Ok(created) =
        time::OffsetDateTime::parse(created, &time::format_description::well_known::Rfc3339)
    else {
        return "<unknown>".into();
    };
    kubeshape::duration::human((time::OffsetDateTime::now_utc() - created).whole_seconds())
}

/// The time at `pointer` (RFC 3339), if there is one.
fn time_at(object: &Value, pointer: &str) -> Option<time::OffsetDateTime> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
}

fn s<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn n(object: &Value, pointer: &str) -> u64 {
    object.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

fn count(object: &Value, pointer: &str) -> usize {
    match object.pointer(pointer) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

/// Kinds kube-apiserver prints with their creation time instead of an age.
fn created_at(resource: &Resource) -> bool {
    matches!(
        resource.plural,
        "roles" | "clusterroles" | "customresourcedefinitions"
    )
}

/// A custom resource's cell at a printer column's JSON path (`.spec.chart`), as text.
fn at_path(o: &Value, path: &str) -> Value {
    let pointer = path.replace('.', "/");
    match o.pointer(&pointer) {
        Some(Value::String(s)) => json!(s),
        Some(Value::Null) | None => Value::Null,
        Some(other) => other.clone(),
    }
}

fn columns(resource: &Resource) -> Vec<(&'static str, &'static str)> {
    let mut columns = vec![("Name", "string")];
    columns.extend(
        resource
            .printer_columns
            .iter()
            .map(|(name, kind, _)| (*name, *kind)),
    );
    if created_at(resource) {
        columns.push(("Created At", "date"));
        return columns;
    }
    columns.extend(match resource.plural {
        "pods" => vec![
            ("Ready", "string"),
            ("Status", "string"),
            ("Restarts", "string"),
        ],
        "nodes" => vec![("Status", "string"), ("Roles", "string")],
        "deployments" => vec![
            ("Ready", "string"),
            ("Up-to-date", "integer"),
            ("Available", "integer"),
        ],
        "daemonsets" | "replicasets" => vec![
            ("Desired", "integer"),
            ("Current", "integer"),
            ("Ready", "integer"),
        ],
        "statefulsets" => vec![("Ready", "string")],
        "jobs" => vec![
            ("Status", "string"),
            ("Completions", "string"),
            ("Duration", "string"),
        ],
        "cronjobs" => vec![
            ("Schedule", "string"),
            ("Timezone", "string"),
            ("Suspend", "boolean"),
            ("Active", "integer"),
            ("Last Schedule", "string"),
        ],
        "services" => vec![
            ("Type", "string"),
            ("Cluster-IP", "string"),
            ("External-IP", "string"),
            ("Port(s)", "string"),
        ],
        "namespaces" => vec![("Status", "string")],
        "configmaps" => vec![("Data", "integer")],
        "secrets" => vec![("Type", "string"), ("Data", "integer")],
        "events" => vec![
            ("Type", "string"),
            ("Reason", "string"),
            ("Object", "string"),
            ("Message", "string"),
        ],
        "leases" => vec![("Holder", "string")],
        "serviceaccounts" => vec![("Secrets", "integer")],
        "rolebindings" | "clusterrolebindings" => vec![("Role", "string")],
        "poddisruptionbudgets" => vec![
            ("Min Available", "string"),
            ("Max Unavailable", "string"),
            ("Allowed Disruptions", "integer"),
        ],
        _ => vec![],
    });
    columns.push(("Age", "string"));
    if resource.plural == "nodes" {
        columns.push(("Version", "string"));
    }
    columns
}

/// The columns kube-apiserver's printers add at priority 1, which `kubectl get -o wide` shows.
fn wide_columns(resource: &Resource) -> Vec<(&'static str, &'static str)> {
    if created_at(resource) {
        return Vec::new();
    }
    match resource.plural {
        "pods" => vec![
            ("IP", "string"),
            ("Node", "string"),
            ("Nominated Node", "string"),
            ("Readiness Gates", "string"),
        ],
        "deployments" | "replicasets" | "jobs" => vec![
            ("Containers", "string"),
            ("Images", "string"),
            ("Selector", "string"),
        ],
        "statefulsets" | "cronjobs" => vec![("Containers", "string"), ("Images", "string")],
        "nodes" => vec![
            ("Internal-IP", "string"),
            ("External-IP", "string"),
            ("OS-Image", "string"),
            ("Kernel-Version", "string"),
            ("Container-Runtime", "string"),
        ],
        "services" => vec![("Selector", "string")],
        _ => Vec::new(),
    }
}

/// `text`, or what kubectl prints for nothing.
fn or_none(text: impl Into<String>) -> Value {
    let text = text.into();
    json!(if text.is_empty() {
        "<none>".to_owned()
    } else {
        text
    })
}

/// `k=v,k=v` of a map of labels.
fn pairs(o: &Value, pointer: &str) -> String {
    o.pointer(pointer)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// The cells of [`wide_columns`].
fn wide_cells(resource: &Resource, o: &Value) -> Vec<Value> {
    if created_at(resource) {
        return Vec::new();
    }
    let template = if resource.plural == "cronjobs" {
        "/spec/jobTemplate/spec/template/spec/containers"
    } else {
        "/spec/template/spec/containers"
    };
    let containers = |field: &str| {
        o.pointer(template)
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| c[field].as_str().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let address = |kind: &str| {
        o.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|a| a["type"] == kind))
            .map(|a| a["address"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    match resource.plural {
        "pods" => vec![
            or_none(s(o, "/status/podIP")),
            or_none(s(o, "/spec/nodeName")),
            or_none(s(o, "/status/nominatedNodeName")),
            json!("<none>"),
        ],
        "deployments" | "replicasets" | "jobs" => vec![
            json!(containers("name")),
            json!(containers("image")),
            or_none(pairs(o, "/spec/selector/matchLabels")),
        ],
        "statefulsets" | "cronjobs" => vec![json!(containers("name")), json!(containers("image"))],
        "nodes" => vec![
            or_none(address("InternalIP")),
            or_none(address("ExternalIP")),
            json!(s(o, "/status/nodeInfo/osImage")),
            json!(s(o, "/status/nodeInfo/kernelVersion")),
            json!(s(o, "/status/nodeInfo/containerRuntimeVersion")),
        ],
        "services" => vec![or_none(pairs(o, "/spec/selector"))],
        _ => Vec::new(),
    }
}

fn cells(resource: &Resource, o: &Value) -> Vec<Value> {
    let mut cells = vec![json!(s(o, "/metadata/name"))];
    cells.extend(
        resource
            .printer_columns
            .iter()
            .map(|(_, _, path)| at_path(o, path)),
    );
    if created_at(resource) {
        cells.push(json!(s(o, "/metadata/creationTimestamp")));
        return cells;
    }
    match resource.plural {
        "pods" => {
            let statuses = o
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array);
            let total = o
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses.map_or(0, |c| c.iter().filter(|c| c["ready"] == true).count());
            let restarts: u64 = statuses.map_or(0, |c| {
                c.iter()
                    .map(|c| c["restartCount"].as_u64().unwrap_or(0))
                    .sum()
            });
            cells.extend([
                json!(format!("{ready}/{total}")),
                json!(s(o, "/status/phase")),
                json!(restarts.to_string()),
            ]);
        }
        "nodes" => {
            let ready = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
            let roles: Vec<&str> = o
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .collect()
                })
                .unwrap_or_default();
            let roles = if roles.is_empty() {
                "<none>".to_owned()
            } else {
                roles.join(",")
            };
            let mut status = if ready { "Ready" } else { "NotReady" }.to_owned();
            if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
                status.push_str(",SchedulingDisabled");
            }
            cells.extend([json!(status), json!(roles)]);
        }
        "deployments" => cells.extend([
            json!(format!(
                "{}/{}",
                n(o, "/status/readyReplicas"),
                n(o, "/spec/replicas")
            )),
            json!(n(o, "/status/updatedReplicas")),
            json!(n(o, "/status/availableReplicas")),
        ]),
        "daemonsets" => cells.extend([
            json!(n(o, "/status/desiredNumberScheduled")),
            json!(n(o, "/status/currentNumberScheduled")),
            json!(n(o, "/status/numberReady")),
        ]),
        "replicasets" => cells.extend([
            json!(n(o, "/spec/replicas")),
            json!(n(o, "/status/replicas")),
            json!(n(o, "/status/readyReplicas")),
        ]),
        "statefulsets" => cells.push(json!(format!(
            "{}/{}",
            n(o, "/status/readyReplicas"),
            n(o, "/spec/replicas")
        ))),
        "jobs" => {
            let done = |kind: &str| {
                o.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == kind && c["status"] == "True")
                    })
            };
            let state = if done("Complete") {
                "Complete"
            } else if done("Failed") {
                "Failed"
            } else {
                "Running"
            };
            let wanted = o
                .pointer("/spec/completions")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            let took = match (
                time_at(o, "/status/startTime"),
                time_at(o, "/status/completionTime"),
            ) {
                (Some(start), Some(end)) => {
                    kubeshape::duration::human((end - start).whole_seconds())
                }
                (Some(start), None) => kubeshape::duration::human(
                    (time::OffsetDateTime::now_utc() - start).whole_seconds(),
                ),
                _ => String::new(),
            };
            cells.extend([
                json!(state),
                json!(format!("{}/{wanted}", n(o, "/status/succeeded"))),
                json!(took),
            ]);
        }
        "cronjobs" => cells.extend([
            json!(s(o, "/spec/schedule")),
            or_none(s(o, "/spec/timeZone")),
            json!(
                o.pointer("/spec/suspend")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            ),
            json!(count(o, "/status/active")),
            or_none(
                time_at(o, "/status/lastScheduleTime")
                    .map(|t| {
                        kubeshape::duration::human(
                            (time::OffsetDateTime::now_utc() - t).whole_seconds(),
                        )
                    })
                    .unwrap_or_default(),
            ),
        ]),
        "services" => {
            let ports: Vec<String> = o
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let ports = if ports.is_empty() {
                "<none>".to_owned()
            } else {
                ports.join(",")
            };
            cells.extend([
                json!(s(o, "/spec/type")),
                json!(s(o, "/spec/clusterIP")),
                json!("<none>"),
                json!(ports),
            ]);
        }
        "namespaces" => cells.push(json!(s(o, "/status/phase"))),
        "configmaps" => cells.push(json!(count(o, "/data"))),
        "secrets" => cells.extend([json!(s(o, "/type")), json!(count(o, "/data"))]),
        "events" => cells.extend([
            json!(s(o, "/type")),
            json!(s(o, "/reason")),
            json!(format!(
                "{}/{}",
                s(o, "/involvedObject/kind").to_lowercase(),
                s(o, "/involvedObject/name")
            )),
            json!(s(o, "/message")),
        ]),
        "leases" => cells.push(json!(s(o, "/spec/holderIdentity"))),
        "serviceaccounts" => cells.push(json!(count(o, "/secrets"))),
        "rolebindings" | "clusterrolebindings" => cells.push(json!(format!(
            "{}/{}",
            s(o, "/roleRef/kind"),
            s(o, "/roleRef/name")
        ))),
        "poddisruptionbudgets" => {
            let bound = |field: &str| match o["spec"].get(field) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "N/A".to_owned(),
            };
            cells.extend([
                json!(bound("minAvailable")),
                json!(bound("maxUnavailable")),
                json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
            ]);
        }
        _ => {}
    }
    cells.push(json!(age(o)));
    if resource.plural == "nodes" {
        cells.push(json!(s(o, "/status/nodeInfo/kubeletVersion")));
    }
    cells.extend(wide_cells(resource, o));
    cells
}

/// What each row of a Table carries of its object (`includeObject=`), as the API server
/// allows: nothing, its metadata (the default, what kubectl asks for) or the whole object (what
/// a cache that keeps rows beside objects asks for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Include {
    None,
    #[default]
    Metadata,
    Object,
}

impl Include {
    /// The `includeObject` parameter, or what is wrong with it.
    pub(crate) fn of(value: Option<&str>) -> Result<Self, String> {
        match value {
            None | Some("" | "Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(other) => Err(format!(
                "includeObject {other:?} is not one of None, Metadata, Object"
            )),
        }
    }
}

/// A Table of `objects`; `with_columns` false for watch events after the first.
pub(crate) fn table<'a>(
    resource: &Resource,
    objects: impl IntoIterator<Item = &'a Value>,
    revision: u64,
    with_columns: bool,
    include: Include,
) -> Value {
    let definitions: Vec<Value> = if with_columns {
        let column = |(name, kind): (&str, &str), priority: u8| json!({"name": name, "type": kind, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": priority});
        columns(resource)
            .into_iter()
            .map(|c| column(c, 0))
            .chain(wide_columns(resource).into_iter().map(|c| column(c, 1)))
            .collect()
    } else {
        Vec::new()
    };
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| {
            let object = match include {
                Include::None => Value::Null,
                Include::Object => o.clone(),
                Include::Metadata => {
                    let mut partial = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"].clone()});
                    if let Value::Object(m) = &mut partial["metadata"] {
                        m.remove("managedFields");
                    }
                    partial
                }
            };
            json!({"cells": cells(resource, o), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": revision.to_string()},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_carry_as_much_of_their_object_as_asked() {
        let pods = super::super::resources::find("", "v1", "pods").unwrap();
        let pod = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "web", "namespace": "shop", "managedFields": [{}]},
            "spec": {"nodeName": "n1"}});
        let row = |include| table(pods, [&pod], 7, true, include)["rows"][0]["object"].clone();
        assert_eq!(row(Include::Object), pod);
        let partial = row(Include::Metadata);
        assert_eq!(partial["kind"], "PartialObjectMetadata");
        assert_eq!(partial["metadata"]["name"], "web");
        assert!(partial["metadata"].get("managedFields").is_none());
        assert!(partial.get("spec").is_none());
        assert_eq!(row(Include::None), Value::Null);
        assert_eq!(Include::of(None), Ok(Include::Metadata));
        let refused = Include::of(Some("Everything")).unwrap_err();
        assert!(refused.contains("None, Metadata, Object"), "{refused}");
    }

    #[test]
    fn wide_columns_come_last_at_priority_one_as_kube_apiserver_prints_them() {
        let pods = super::super::resources::find("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": "10.42.0.9"}});
        let answer = table(pods, [&pod], 7, true, Include::None);
        let columns: Vec<(String, u64)> = answer["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["priority"].as_u64().unwrap(),
                )
            })
            .collect();
        let expected = [
            ("Name", 0),
            ("Ready", 0),
            ("Status", 0),
            ("Restarts", 0),
            ("Age", 0),
            ("IP", 1),
            ("Node", 1),
            ("Nominated Node", 1),
            ("Readiness Gates", 1),
        ]
        .map(|(n, p)| (n.to_owned(), p));
        assert_eq!(columns, expected);
        let cells = &answer["rows"][0]["cells"];
        assert_eq!(
            (&cells[5], &cells[6], &cells[7]),
            (&json!("10.42.0.9"), &json!("n1"), &json!("<none>"))
        );
    }
}
