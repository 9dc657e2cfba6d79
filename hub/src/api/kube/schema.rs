//! The kinds' schemas as Kubernetes publishes them: OpenAPI v3 (an index and the group's
//! document, which `kubectl explain` and kubectl's validation read), OpenAPI v2 as JSON, and
//! one read-only `CustomResourceDefinition` per kind (`kubectl get crd`). All are built from
//! the Rust types that validate writes, so they cannot drift from what the hub takes.

use std::sync::LazyLock;

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use schemars::{SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use super::{CATEGORY, GROUP, VERSION, singular, table, verbs_of};
use crate::{
    api::{Api, ApiError},
    model::{Kind, State as ObjectState, Status},
    store::ObjectMeta,
};

/// A kind's name among the document's schemas, as Kubernetes names them (reversed group).
fn schema_name(kind: &str) -> String {
    format!("io.drover.management.{VERSION}.{kind}")
}

fn gvk(kind: &str) -> Value {
    json!([{"group": GROUP, "version": VERSION, "kind": kind}])
}

/// The group's OpenAPI v3 document: each kind and its list with their
/// `x-kubernetes-group-version-kind`, and each path's operations, whose `fieldValidation`
/// parameter tells kubectl to leave validation to the server.
fn v3_document() -> Value {
    let mut generator = SchemaGenerator::new(SchemaSettings::openapi3());
    let meta = generator.subschema_for::<ObjectMeta>();
    let status = generator.subschema_for::<Status>();
    let state = generator.subschema_for::<ObjectState>();
    let mut schemas = Map::new();
    let mut paths = Map::new();
    let field_validation = json!({"name": "fieldValidation", "in": "query", "schema": {"type": "string"},
        "description": "Strict, Warn or Ignore: the hub takes what it knows of a spec and leaves the rest"});
    for kind in Kind::ALL {
        let name = kind.name();
        let spec = kind.spec_schema(&mut generator);
        schemas.insert(
            schema_name(name),
            json!({
                "type": "object",
                "description": format!("A {name} of the Drover hub."),
                "properties": {
                    "apiVersion": {"type": "string", "description": format!("{GROUP}/{VERSION}")},
                    "kind": {"type": "string", "description": name},
                    "metadata": meta,
                    "spec": spec,
                    "status": status,
                    "state": state,
                },
                "x-kubernetes-group-version-kind": gvk(name),
            }),
        );
        let list = format!("{name}List");
        schemas.insert(
            schema_name(&list),
            json!({
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", schema_name(name))}},
                },
                "x-kubernetes-group-version-kind": gvk(&list),
            }),
        );
        let one = json!({"$ref": format!("#/components/schemas/{}", schema_name(name))});
        let op = |action: &str, with_validation: bool| {
            let mut op = json!({
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": one}}}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk(name)[0],
            });
            if with_validation {
                op["parameters"] = json!([field_validation]);
            }
            op
        };
        let mut patch = op("patch", true);
        patch["requestBody"] = json!({"content": {
            "application/json-patch+json": {"schema": {"type": "object"}},
            "application/merge-patch+json": {"schema": {"type": "object"}},
            "application/strategic-merge-patch+json": {"schema": {"type": "object"}},
            "application/apply-patch+yaml": {"schema": {"type": "object"}},
        }});
        let collection = format!("/apis/{GROUP}/{VERSION}/{}", kind.plural());
        paths.insert(
            collection.clone(),
            json!({"get": op("list", false), "post": op("post", true)}),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({"get": op("get", false), "put": op("put", true), "patch": patch, "delete": op("delete", false)}),
        );
    }
    for (name, schema) in generator.take_definitions(true) {
        schemas.insert(name, schema);
    }
    let mut schemas = Value::Object(schemas);
    as_kubernetes_writes(&mut schemas);
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Drover hub", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// Rewrites what schemars writes for an optional field (`anyOf` the type and `null`) as
/// Kubernetes' own documents have it (`allOf` the type, `nullable`), which kubectl explain
/// follows into the type's fields.
fn as_kubernetes_writes(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let optional = map
                .get("anyOf")
                .and_then(Value::as_array)
                .and_then(|choices| {
                    let [one, other] = choices.as_slice() else {
                        return None;
                    };
                    let null = |v: &Value| {
                        v.get("nullable") == Some(&json!(true))
                            || v.get("type") == Some(&json!("null"))
                    };
                    match (null(one), null(other)) {
                        (false, true) => Some(one.clone()),
                        (true, false) => Some(other.clone()),
                        _ => None,
                    }
                });
            if let Some(inner) = optional {
                map.remove("anyOf");
                map.insert("nullable".into(), json!(true));
                match inner {
                    Value::Object(fields) if !fields.contains_key("$ref") => {
                        for (k, v) in fields {
                            map.entry(k).or_insert(v);
                        }
                    }
                    reference => {
                        map.insert("allOf".into(), json!([reference]));
                    }
                }
            }
            for value in map.values_mut() {
                as_kubernetes_writes(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(as_kubernetes_writes),
        _ => {}
    }
}

static V3: LazyLock<Value> = LazyLock::new(v3_document);

/// The document's version in its URL (clients cache by it).
static V3_HASH: LazyLock<String> = LazyLock::new(|| {
    let digest = ring::digest::digest(&ring::digest::SHA256, V3.to_string().as_bytes());
    digest
        .as_ref()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
});

async fn known(api: &Api, headers: &HeaderMap) -> Result<(), ApiError> {
    api.principal(headers).await.map(drop)
}

/// `GET /openapi/v3`: where each group version's document is.
pub(super) async fn v3_index(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    Ok(Json(json!({"paths": {
        format!("apis/{GROUP}/{VERSION}"): {
            "serverRelativeURL": format!("/openapi/v3/apis/{GROUP}/{VERSION}?hash={}", *V3_HASH),
        },
    }})))
}

/// `GET /openapi/v3/apis/{group}/{version}`.
pub(super) async fn v3(
    State(api): State<Api>,
    Path((group, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    if group != GROUP || version != VERSION {
        return Err(ApiError::not_found(format!(
            "no OpenAPI document for {group}/{version}; the hub's kinds are {GROUP}/{VERSION}"
        )));
    }
    Ok(Json(V3.clone()))
}

/// The v3 document turned into Swagger 2.0: the same schemas under `definitions`.
fn v2_document() -> Value {
    let text = V3
        .to_string()
        .replace("#/components/schemas/", "#/definitions/");
    let v3: Value = serde_json::from_str(&text).unwrap_or_default();
    json!({
        "swagger": "2.0",
        "info": v3["info"],
        "paths": {},
        "definitions": v3["components"]["schemas"],
    })
}

static V2: LazyLock<Value> = LazyLock::new(v2_document);

/// `GET /openapi/v2`, as JSON. Its protobuf form is not served: a client that takes only that
/// is told so (406) and goes on without it, as from any server that has none.
pub(super) async fn v2(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    known(&api, &headers).await?;
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let json_ok = accept
        .split(',')
        .any(|t| t.contains("json") || t.trim().starts_with("*/*"));
    if !json_ok {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            "the hub serves OpenAPI v2 as JSON only (Accept: application/json); OpenAPI v3 is at /openapi/v3",
        ));
    }
    Ok(Json(V2.clone()).into_response())
}

/// One kind's schema for its CRD: structural, every reference inlined.
fn crd_of(kind: Kind, generator: &mut SchemaGenerator) -> Value {
    let name = kind.name();
    let spec = kind.spec_schema(generator);
    let meta_fields = json!({"type": "object"});
    let schema = json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": meta_fields,
            "spec": spec,
            "status": generator.subschema_for::<Status>(),
            "state": generator.subschema_for::<ObjectState>(),
        },
    });
    let mut schema = schema;
    as_kubernetes_writes(&mut schema);
    let names = json!({
        "plural": kind.plural(),
        "singular": singular(kind),
        "kind": name,
        "listKind": format!("{name}List"),
        "categories": [CATEGORY],
    });
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{GROUP}", kind.plural()),
            "creationTimestamp": *STARTED,
            "resourceVersion": "1",
            "generation": 1,
            "annotations": {"drover.io/read-only": "the hub's own kinds; they change with the hub, not through this API"},
        },
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": "Cluster",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": schema},
                "additionalPrinterColumns": table::printer_columns(kind),
                "x-drover-verbs": verbs_of(kind),
            }],
        },
        "status": {
            "acceptedNames": names,
            "storedVersions": [VERSION],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "lastTransitionTime": *STARTED},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "lastTransitionTime": *STARTED},
            ],
        },
    })
}

/// When this hub started: its CRDs are as old as the hub serving them.
static STARTED: LazyLock<String> = LazyLock::new(crate::store::now_rfc3339);

static CRDS: LazyLock<Vec<Value>> = LazyLock::new(|| {
    let mut generator = SchemaGenerator::new(SchemaSettings::openapi3().with(|s| {
        s.inline_subschemas = true;
    }));
    Kind::ALL
        .into_iter()
        .map(|k| crd_of(k, &mut generator))
        .collect()
});

/// CRDs as `kubectl get crd` prints them: name and when created.
fn crd_table<'a>(crds: impl Iterator<Item = &'a Value>) -> Value {
    let rows: Vec<Value> = crds
        .map(|crd| {
            json!({
                "cells": [crd["metadata"]["name"], crd["metadata"]["creationTimestamp"]],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": crd["metadata"]},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "1"},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "The kind's resource and group", "priority": 0},
            {"name": "Created At", "type": "date", "format": "", "description": "When this hub started serving it", "priority": 0},
        ],
        "rows": rows,
    })
}

/// The fields of `spec` (of a `kind`) its schema does not know, as paths (`spec.distro`), for
/// `fieldValidation`: what serde would silently drop is a typo to point out.
pub(super) fn unknown_fields(kind: Kind, spec: &Value) -> Vec<String> {
    let Some(crd) = CRDS
        .iter()
        .find(|c| c["spec"]["names"]["kind"] == kind.name())
    else {
        return Vec::new();
    };
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut out = Vec::new();
    unknown_in(schema, spec, "spec", &mut out);
    out
}

/// The properties a schema allows on an object (its own and every branch's), and what any
/// other key may be (`None`: no other key; `Some(None)`: anything).
fn allowed(schema: &Value) -> (Map<String, Value>, Option<Option<Value>>) {
    let mut properties = Map::new();
    let mut other: Option<Option<Value>> = None;
    if let Some(own) = schema.get("properties").and_then(Value::as_object) {
        properties.extend(own.clone());
    }
    match schema.get("additionalProperties") {
        Some(Value::Bool(false)) | None => {}
        Some(Value::Bool(true)) => other = Some(None),
        Some(more) => other = Some(Some(more.clone())),
    }
    let mut branches = false;
    for key in ["allOf", "anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            branches = true;
            let (more, also) = allowed(branch);
            properties.extend(more);
            if also.is_some() {
                other = also;
            }
        }
    }
    // A schema that says nothing of its fields (a reference, free JSON) takes any.
    if properties.is_empty() && other.is_none() && !branches || schema.get("$ref").is_some() {
        other = Some(None);
    }
    (properties, other)
}

fn unknown_in(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let (properties, other) = allowed(schema);
            for (key, field) in fields {
                let at = format!("{path}.{key}");
                match (properties.get(key), &other) {
                    (Some(inner), _) | (None, Some(Some(inner))) => {
                        unknown_in(inner, field, &at, out);
                    }
                    (None, Some(None)) => {}
                    (None, None) => out.push(at),
                }
            }
        }
        Value::Array(items) => {
            if let Some(inner) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    unknown_in(inner, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// `GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions` (a Table when asked).
pub(super) async fn crds(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    if super::wants_table(&headers) {
        return Ok(Json(crd_table(CRDS.iter())));
    }
    Ok(Json(json!({
        "kind": "CustomResourceDefinitionList",
        "apiVersion": "apiextensions.k8s.io/v1",
        "metadata": {"resourceVersion": "1"},
        "items": *CRDS,
    })))
}

/// `GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}`.
pub(super) async fn crd(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    known(&api, &headers).await?;
    let Some(crd) = CRDS.iter().find(|c| c["metadata"]["name"] == name.as_str()) else {
        return Err(ApiError::not_found(format!(
            "customresourcedefinitions.apiextensions.k8s.io {name:?} not found; the hub defines its own kinds only (kubectl get crd lists them)"
        )));
    };
    if super::wants_table(&headers) {
        return Ok(Json(crd_table(std::iter::once(crd))));
    }
    Ok(Json(crd.clone()))
}

/// Writes to the CRDs: refused, as they are the hub's own.
pub(super) async fn read_only() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the hub's CustomResourceDefinitions are read-only: its kinds change with the hub",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_field_is_found_wherever_it_is_and_known_ones_are_not() {
        let spec = json!({
            "type": "custom",
            "distribution": "k3s",
            "version": "v1.33.4+k3s1",
            "upgradeStrategy": {"workerConcurency": "2", "drain": true},
            "config": {"any-k3s-flag": "is a map's key"},
            "machinePools": [{"name": "w", "quantity": 1, "tempalte": "t"}],
            "distro": "k3s",
        });
        let mut found = unknown_fields(Kind::Cluster, &spec);
        found.sort();
        assert_eq!(
            found,
            [
                "spec.distro",
                "spec.machinePools[0].tempalte",
                "spec.upgradeStrategy.workerConcurency",
            ]
        );
        assert!(
            unknown_fields(Kind::User, &json!({"displayName": "D", "groups": ["ops"]})).is_empty()
        );
    }
}
