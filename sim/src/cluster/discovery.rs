//! `/version` and API discovery (`/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`), in the
//! legacy (unaggregated) form every client understands, and a minimal OpenAPI v3 index so
//! kubectl's validation finds no schema to complain about.

use serde_json::{Value, json};

use super::resources::{RESOURCES, Resource, groups, verbs};

pub const GIT_VERSION: &str = "v1.33.4+drover-sim";

pub(crate) fn version(git_version: &str) -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-11-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub(crate) fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
}

fn group_entry(group: &str) -> Value {
    let gv = format!("{group}/v1");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"},
    })
}

pub(crate) fn group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups().into_iter().map(group_entry).collect::<Vec<_>>()})
}

pub(crate) fn group(name: &str) -> Option<Value> {
    groups().contains(&name).then(|| {
        let mut entry = group_entry(name);
        entry["kind"] = json!("APIGroup");
        entry["apiVersion"] = json!("v1");
        entry
    })
}

fn resource_entries(r: &Resource) -> Vec<Value> {
    let mut out = vec![json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": verbs(),
        "shortNames": r.short_names,
    })];
    for sub in r.subresources {
        // Each as kube-apiserver lists it; kubectl drain looks for pods/eviction of policy/v1.
        let (kind, verbs, group): (&str, &[&str], Option<&str>) = match *sub {
            "log" => ("Pod", &["get"], None),
            "scale" => ("Scale", &["get", "patch", "update"], Some("autoscaling")),
            "exec" => ("PodExecOptions", &["create", "get"], None),
            "attach" => ("PodAttachOptions", &["create", "get"], None),
            "portforward" => ("PodPortForwardOptions", &["create", "get"], None),
            "eviction" => ("Eviction", &["create"], Some("policy")),
            "token" => ("TokenRequest", &["create"], Some("authentication.k8s.io")),
            _ => (r.kind, &["get", "patch", "update"], None),
        };
        let mut entry = json!({
            "name": format!("{}/{sub}", r.plural),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": kind,
            "verbs": verbs,
        });
        if let Some(group) = group {
            entry["group"] = json!(group);
            entry["version"] = json!("v1");
        }
        out.push(entry);
    }
    out
}

/// The resource list of `group`/`version`, if served.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(resource_entries)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// The OpenAPI v3 index: one document per group-version.
pub(crate) fn openapi_index() -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"}),
    );
    for g in groups() {
        paths.insert(
            format!("apis/{g}/v1"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/v1?hash=sim")}),
        );
    }
    json!({"paths": paths})
}

/// A group-version's OpenAPI v3 document: each resource's write operations accept the
/// `fieldValidation` parameter, so kubectl validates on the server (which accepts the fields
/// it does not know, as a lenient API server would).
pub(crate) fn openapi_document(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    let field_validation =
        json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string"}});
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let collection = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{prefix}/{}", r.plural)
        };
        // kubectl finds a kind's operations by this extension, then looks for the parameter.
        let op = |action: &str| {
            json!({
                "parameters": [field_validation.clone()],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind},
            })
        };
        paths.insert(collection.clone(), json!({"post": op("post")}));
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"put": op("put"), "patch": op("patch")}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (drover-sim)", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
