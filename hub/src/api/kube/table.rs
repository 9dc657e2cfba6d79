//! `kubectl get` of the hub's kinds: a `meta.k8s.io/v1` Table whose columns say what each kind
//! needs (every kind: name, state, age; a cluster its type, Kubernetes version and nodes; what
//! belongs to a cluster, that cluster), and the same columns as the CRDs' printer columns.

use serde_json::{Value, json};

use crate::model::Kind;

/// What a cell shows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cell {
    /// The string (or number) at a JSON pointer into the object as the API shows it.
    At(&'static str),
    /// A cluster's nodes, ready of total.
    Nodes,
    /// A role binding's user or group.
    Subject,
    /// What a role binding grants.
    Grants,
    /// Since `metadata.creationTimestamp`, as Kubernetes prints ages.
    Age,
}

/// One column: its name, type, what it means, its priority (1: only with `-o wide`) and cell.
type Column = (&'static str, &'static str, &'static str, u8, Cell);

const NAME: Column = (
    "Name",
    "string",
    "The object's name",
    0,
    Cell::At("/metadata/name"),
);
const STATE: Column = (
    "State",
    "string",
    "What the hub makes of the object's conditions",
    0,
    Cell::At("/state/state"),
);
const CLUSTER: Column = (
    "Cluster",
    "string",
    "The cluster it belongs to",
    0,
    Cell::At("/spec/cluster"),
);
const AGE: Column = (
    "Age",
    "string",
    "Since the object was created",
    0,
    Cell::Age,
);
const MESSAGE: Column = (
    "Message",
    "string",
    "Why the state is what it is",
    1,
    Cell::At("/state/message"),
);

/// The columns of `kind`, in order.
fn columns(kind: Kind) -> Vec<Column> {
    let middle: Vec<Column> = match kind {
        Kind::Cluster => vec![
            (
                "Type",
                "string",
                "custom (provisioned by the hub) or imported",
                0,
                Cell::At("/spec/type"),
            ),
            (
                "Version",
                "string",
                "The Kubernetes version its agent reports",
                0,
                Cell::At("/status/kubernetesVersion"),
            ),
            ("Nodes", "string", "Ready nodes of all", 0, Cell::Nodes),
        ],
        Kind::Host
        | Kind::Machine
        | Kind::Project
        | Kind::ProjectSecret
        | Kind::EtcdSnapshot
        | Kind::RegistrationToken
        | Kind::BundleDeployment => vec![CLUSTER],
        Kind::Plan => vec![
            CLUSTER,
            (
                "Host",
                "string",
                "The host it is for",
                0,
                Cell::At("/spec/host"),
            ),
        ],
        Kind::Token => vec![
            (
                "User",
                "string",
                "Whose token it is",
                0,
                Cell::At("/spec/user"),
            ),
            (
                "Expires",
                "string",
                "When it stops working",
                0,
                Cell::At("/spec/expiresAt"),
            ),
        ],
        Kind::RoleBinding => vec![
            (
                "Subject",
                "string",
                "The user or group it grants to",
                0,
                Cell::Subject,
            ),
            (
                "Grants",
                "string",
                "The role, role template or global role",
                0,
                Cell::Grants,
            ),
            (
                "Cluster",
                "string",
                "The cluster it applies on (none: the hub)",
                0,
                Cell::At("/spec/cluster"),
            ),
        ],
        Kind::GitRepo => vec![
            (
                "Repo",
                "string",
                "The repository it follows",
                0,
                Cell::At("/spec/repo"),
            ),
            (
                "Commit",
                "string",
                "The commit deployed",
                0,
                Cell::At("/status/commit"),
            ),
        ],
        Kind::Setting => vec![(
            "Value",
            "string",
            "The setting's value",
            0,
            Cell::At("/spec/value"),
        )],
        _ => Vec::new(),
    };
    let mut all = vec![NAME, STATE];
    all.extend(middle);
    all.extend([AGE, MESSAGE]);
    all
}

fn text(value: Option<&Value>) -> Value {
    match value {
        Some(Value::String(s)) => json!(s),
        Some(v @ Value::Number(_)) => json!(v.to_string()),
        Some(Value::Bool(b)) => json!(b.to_string()),
        _ => json!("<none>"),
    }
}

fn cell(object: &Value, cell: Cell) -> Value {
    match cell {
        Cell::At(pointer) => text(object.pointer(pointer)),
        Cell::Nodes => match (
            object.pointer("/status/nodes/ready"),
            object.pointer("/status/nodes/total"),
        ) {
            (Some(ready), Some(total)) => json!(format!("{ready}/{total}")),
            _ => json!("<none>"),
        },
        Cell::Subject => match (object.pointer("/spec/user"), object.pointer("/spec/group")) {
            (Some(Value::String(user)), _) => json!(format!("user/{user}")),
            (_, Some(Value::String(group))) => json!(format!("group/{group}")),
            _ => json!("<none>"),
        },
        Cell::Grants => ["role", "roleTemplate", "globalRole"]
            .into_iter()
            .find_map(|field| {
                let name = object.pointer(&format!("/spec/{field}"))?.as_str()?;
                Some(json!(format!("{field}/{name}")))
            })
            .unwrap_or_else(|| json!("<none>")),
        Cell::Age => {
            let created = object
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(crate::model::parse_time);
            match created {
                Some(at) => json!(kubeshape::duration::human(
                    (time::OffsetDateTime::now_utc() - at).whole_seconds()
                )),
                None => json!("<unknown>"),
            }
        }
    }
}

/// What a Table row carries of its object (the `includeObject` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Include {
    None,
    Metadata,
    Object,
}

impl Include {
    pub(super) fn parse(text: Option<&str>) -> Result<Include, crate::api::ApiError> {
        match text {
            None | Some("" | "Metadata") => Ok(Include::Metadata),
            Some("None") => Ok(Include::None),
            Some("Object") => Ok(Include::Object),
            Some(other) => Err(crate::api::ApiError::bad_request(format!(
                "includeObject {other:?}: use None, Metadata or Object"
            ))),
        }
    }
}

fn column_definitions(kind: Kind) -> Vec<Value> {
    columns(kind)
        .into_iter()
        .map(|(name, kind, description, priority, cell)| {
            let mut column = json!({
                "name": name, "type": kind, "format": "", "description": description,
                "priority": priority,
            });
            if cell == Cell::At("/metadata/name") {
                column["format"] = json!("name");
            }
            column
        })
        .collect()
}

fn row(kind: Kind, object: Value, include: Include) -> Value {
    let cells: Vec<Value> = columns(kind)
        .into_iter()
        .map(|(.., c)| cell(&object, c))
        .collect();
    let mut row = json!({"cells": cells});
    match include {
        Include::None => {}
        Include::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
            });
        }
        Include::Object => row["object"] = object,
    }
    row
}

/// A Table of `objects` (as the API shows them), with the list's metadata (`resourceVersion`,
/// `continue`); `columns: false` leaves the column definitions out, as a watch does after its
/// first event.
pub(super) fn table(
    kind: Kind,
    objects: Vec<Value>,
    metadata: Value,
    include: Include,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objects.into_iter().map(|o| row(kind, o, include)).collect();
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "rows": rows,
    });
    if with_columns {
        table["columnDefinitions"] = json!(column_definitions(kind));
    }
    table
}

/// The same columns as a CRD's `additionalPrinterColumns` (name is always first there, and
/// not listed; the computed ones point at what they are computed from).
pub(super) fn printer_columns(kind: Kind) -> Vec<Value> {
    columns(kind)
        .into_iter()
        .filter(|(.., c)| *c != Cell::At("/metadata/name"))
        .map(|(name, kind, description, priority, cell)| {
            let path = match cell {
                Cell::At(pointer) => pointer.replace('/', "."),
                Cell::Nodes => ".status.nodes.ready".into(),
                Cell::Subject => ".spec.user".into(),
                Cell::Grants => ".spec.roleTemplate".into(),
                Cell::Age => ".metadata.creationTimestamp".into(),
            };
            let kind = if cell == Cell::Age { "date" } else { kind };
            json!({"name": name, "type": kind, "description": description, "priority": priority, "jsonPath": path})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clusters_row_says_its_state_type_version_nodes_and_age() {
        let created = crate::model::format_time(
            time::OffsetDateTime::now_utc() - time::Duration::seconds(190),
        );
        let cluster = json!({
            "metadata": {"name": "edge", "creationTimestamp": created},
            "spec": {"type": "custom"},
            "status": {"kubernetesVersion": "v1.33.4+k3s1", "nodes": {"ready": 2, "total": 3}},
            "state": {"state": "active"},
        });
        let t = table(Kind::Cluster, vec![cluster], json!({}), Include::None, true);
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name", "State", "Type", "Version", "Nodes", "Age", "Message"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "edge",
                "active",
                "custom",
                "v1.33.4+k3s1",
                "2/3",
                "3m10s",
                "<none>"
            ])
        );
        assert!(t["rows"][0].get("object").is_none());
    }

    #[test]
    fn a_role_binding_shows_whom_it_grants_what_and_where() {
        let binding = json!({
            "metadata": {"name": "b"},
            "spec": {"group": "corp:ops", "roleTemplate": "deployer", "cluster": "edge"},
            "state": {"state": "active"},
        });
        let t = table(
            Kind::RoleBinding,
            vec![binding],
            json!({}),
            Include::Metadata,
            false,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "b",
                "active",
                "group/corp:ops",
                "roleTemplate/deployer",
                "edge",
                "<unknown>",
                "<none>"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "b");
        assert!(t.get("columnDefinitions").is_none());
    }
}
