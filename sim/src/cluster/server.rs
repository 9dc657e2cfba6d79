//! Request handling: authentication and impersonation, then discovery or the resource verbs.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use kubeshape::LabelSelector;
use serde_json::{Value, json};

use super::{
    Identity, Sim, discovery, patch, rbac,
    resources::{self, Resource},
    store::{Change, Key, StoreError},
    table,
};

/// A Kubernetes `Status` failure.
pub(super) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        kubeshape::status::failure(code.as_u16(), reason, &message.into()),
    )
        .into_response()
}

fn ok_json(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// Where a resource request points.
#[derive(Debug)]
struct Target {
    resource: &'static Resource,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn key(&self) -> Key {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    fn describe(&self) -> String {
        match &self.name {
            Some(name) => format!("{} \"{name}\"", self.resource.plural),
            None => self.resource.plural.to_owned(),
        }
    }
}

fn parse_target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let found = |plural: &str| resources::find(group, version, plural);
    let owned = |s: &&str| Some((*s).to_owned());
    match rest {
        ["namespaces", ns, plural, tail @ ..] if found(plural).is_some_and(|r| r.namespaced) => {
            let resource = found(plural)?;
            match tail {
                [] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: None,
                    sub: None,
                }),
                [name] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: owned(name),
                    sub: None,
                }),
                [name, sub] => Some(Target {
                    resource,
                    namespace: owned(ns),
                    name: owned(name),
                    sub: owned(sub),
                }),
                _ => None,
            }
        }
        [plural, tail @ ..] => {
            let resource = found(plural)?;
            match (tail, resource.namespaced) {
                ([], _) => Some(Target {
                    resource,
                    namespace: None,
                    name: None,
                    sub: None,
                }),
                ([name], false) => Some(Target {
                    resource,
                    namespace: None,
                    name: owned(name),
                    sub: None,
                }),
                ([name, sub], false) => Some(Target {
                    resource,
                    namespace: None,
                    name: owned(name),
                    sub: owned(sub),
                }),
                _ => None,
            }
        }
        [] => None,
    }
}

fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `field=value`, `field==value`, `field!=value`, joined by commas, on dotted JSON paths.
fn field_matches(selector: &str, object: &Value) -> bool {
    selector
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .all(|part| {
            let (path, negate, want) = if let Some((p, v)) = part.split_once("!=") {
                (p, true, v)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, false, v)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, false, v)
            } else {
                return true;
            };
            let pointer = format!("/{}", path.trim().replace('.', "/"));
            let got = object
                .pointer(&pointer)
                .and_then(Value::as_str)
                .unwrap_or_default();
            (got == want.trim()) != negate
        })
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// The caller after impersonation, or a refusal.
/// On refusal: the caller if known (for the audit log), and the response.
type Refusal = (Option<Identity>, Box<Response>);

fn effective(sim: &Sim, headers: &HeaderMap) -> Result<(Identity, Option<String>), Refusal> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(caller) = token.and_then(|t| sim.identity(t.trim())) else {
        let response = status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        return Err((None, Box::new(response)));
    };
    let Some(user) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        return Ok((caller, None));
    };
    if !caller.impersonator {
        let message = format!(
            "users \"{user}\" is forbidden: User \"{}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
            caller.user
        );
        let response = status(StatusCode::FORBIDDEN, "Forbidden", message);
        return Err((Some(caller), Box::new(response)));
    }
    let mut groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    groups.push("system:authenticated".into());
    Ok((
        Identity {
            user: user.to_owned(),
            groups,
            impersonator: false,
        },
        Some(caller.user),
    ))
}

pub(super) async fn handle(State(sim): State<Arc<Sim>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        return "ok".into_response();
    }
    let (identity, impersonator) = match effective(&sim, request.headers()) {
        Ok(who) => who,
        Err((caller, response)) => {
            sim.record(
                caller.as_ref(),
                None,
                &method,
                &path,
                response.status().as_u16(),
            );
            return *response;
        }
    };
    let response = route(&sim, &identity, request).await;
    sim.record(
        Some(&identity),
        impersonator,
        &method,
        &path,
        response.status().as_u16(),
    );
    response
}

async fn route(sim: &Arc<Sim>, identity: &Identity, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let get = request.method() == Method::GET;
    match path.trim_end_matches('/') {
        "/version" if get => return ok_json(StatusCode::OK, &discovery::version(&sim.version)),
        "/api" if get => return ok_json(StatusCode::OK, &discovery::core_versions()),
        "/apis" if get => return ok_json(StatusCode::OK, &discovery::group_list()),
        "/openapi/v3" if get => return ok_json(StatusCode::OK, &discovery::openapi_index()),
        "/sim/audit" if get => {
            if !identity.groups.iter().any(|g| g == "system:masters") {
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    "the audit log is for cluster admins",
                );
            }
            return ok_json(StatusCode::OK, &json!(sim.audit()));
        }
        _ => {}
    }
    if get {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let discovered = match segments.as_slice() {
            ["api", version] => discovery::resource_list("", version),
            ["apis", group] => discovery::group(group),
            ["apis", group, version] => discovery::resource_list(group, version),
            ["openapi", "v3", "api", version] => discovery::openapi_document("", version),
            ["openapi", "v3", "apis", group, version] => {
                discovery::openapi_document(group, version)
            }
            _ => None,
        };
        if let Some(value) = discovered {
            return ok_json(StatusCode::OK, &value);
        }
    }
    if request.method() == Method::POST
        && path.trim_end_matches('/') == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    {
        return self_review(sim, identity, request).await;
    }
    let Some(target) = parse_target(&path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let attributes = attributes(&target, request.method(), request.uri());
    if rbac::allowed(&sim.store, identity, &attributes).is_none() {
        return forbidden(identity, &attributes);
    }
    resource_request(sim, identity, target, request).await
}

/// The verb and resource RBAC judges a resource request by, as kube-apiserver derives them.
fn attributes(target: &Target, method: &Method, uri: &axum::http::Uri) -> rbac::Attributes {
    let watch = matches!(
        query(uri).get("watch").map(String::as_str),
        Some("true" | "1")
    );
    let verb = match (method.as_str(), &target.name) {
        ("GET" | "HEAD", None) if watch => "watch",
        ("GET" | "HEAD", None) => "list",
        ("GET" | "HEAD", Some(_)) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", None) => "deletecollection",
        ("DELETE", Some(_)) => "delete",
        (other, _) => other,
    };
    rbac::Attributes {
        verb: verb.to_owned(),
        group: target.resource.group.to_owned(),
        resource: target.resource.plural.to_owned(),
        subresource: target.sub.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    }
}

/// 403 with the Status body kube-apiserver sends when RBAC refuses.
fn forbidden(identity: &Identity, attributes: &rbac::Attributes) -> Response {
    let mut body = serde_json::from_str::<Value>(&kubeshape::status::failure(
        403,
        "Forbidden",
        &attributes.forbidden(identity),
    ))
    .unwrap_or_default();
    body["details"] = json!({"kind": attributes.resource});
    if let Some(name) = &attributes.name {
        body["details"]["name"] = json!(name);
    }
    ok_json(StatusCode::FORBIDDEN, &body)
}

/// `SelfSubjectAccessReview`: may the caller do what the body asks? (`kubectl auth can-i`)
async fn self_review(sim: &Arc<Sim>, identity: &Identity, request: Request) -> Response {
    let protobuf = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("protobuf"));
    let review = rbac::Attributes {
        verb: "create".into(),
        group: "authorization.k8s.io".into(),
        resource: "selfsubjectaccessreviews".into(),
        subresource: None,
        namespace: None,
        name: None,
    };
    if rbac::allowed(&sim.store, identity, &review).is_none() {
        return forbidden(identity, &review);
    }
    let bytes = match axum::body::to_bytes(request.into_body(), 1 << 20).await {
        Ok(bytes) => bytes,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let asked = match rbac::review_attributes(&bytes, protobuf) {
        Ok(asked) => asked,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let reason = rbac::allowed(&sim.store, identity, &asked);
    let mut attributes =
        json!({"verb": asked.verb, "group": asked.group, "resource": asked.resource});
    for (key, value) in [
        ("namespace", &asked.namespace),
        ("subresource", &asked.subresource),
        ("name", &asked.name),
    ] {
        if let Some(value) = value {
            attributes[key] = json!(value);
        }
    }
    ok_json(
        StatusCode::CREATED,
        &json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "spec": {"resourceAttributes": attributes},
            "status": {"allowed": reason.is_some(), "reason": reason.unwrap_or_default()},
        }),
    )
}

async fn body_json(request: Request, limit: usize) -> Result<(HeaderMap, Value), Response> {
    let (parts, body) = request.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.contains("protobuf") || content_type.contains("cbor") {
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the simulated cluster reads JSON and YAML bodies, not {content_type}"),
        ));
    }
    let value = if content_type.contains("yaml") {
        serde_saphyr::from_slice(&bytes)
            .map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is not JSON: {e}"),
            )
        })?
    };
    Ok((parts.headers, value))
}

fn store_error(target: &Target, e: StoreError) -> Response {
    let what = target.describe();
    match e {
        StoreError::NotFound => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{what} not found"),
        ),
        StoreError::AlreadyExists => status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{what} already exists"),
        ),
        StoreError::Conflict => status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        ),
        StoreError::Gone(from, oldest) => status(
            StatusCode::GONE,
            "Expired",
            format!("too old resource version: {from} ({oldest})"),
        ),
    }
}

async fn resource_request(
    sim: &Arc<Sim>,
    identity: &Identity,
    target: Target,
    request: Request,
) -> Response {
    let _ = identity;
    let method = request.method().clone();
    let params = query(request.uri());
    let table = wants_table(request.headers());
    let resource = target.resource;
    let store_key = resource.key();
    match (&method, &target.name, target.sub.as_deref()) {
        (&Method::GET, None, _) => {
            let watch = matches!(params.get("watch").map(String::as_str), Some("true" | "1"));
            let selector = match LabelSelector::parse(
                params.get("labelSelector").map_or("", String::as_str),
            ) {
                Ok(s) => s,
                Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
            };
            let fields = params.get("fieldSelector").cloned().unwrap_or_default();
            if watch {
                return watch_response(sim, &target, selector, fields, &params, table);
            }
            let (items, revision) = sim.store.list(&store_key, target.namespace.as_deref());
            let items: Vec<Arc<Value>> = items
                .into_iter()
                .filter(|o| selector.matches(&labels_of(o)) && field_matches(&fields, o))
                .collect();
            if table {
                return ok_json(
                    StatusCode::OK,
                    &table::table(resource, items.iter().map(|o| &**o), revision, true),
                );
            }
            let list = json!({
                "kind": format!("{}List", resource.kind),
                "apiVersion": resource.api_version(),
                "metadata": {"resourceVersion": revision.to_string()},
                "items": items.iter().map(|o| &**o).collect::<Vec<_>>(),
            });
            ok_json(StatusCode::OK, &list)
        }
        (&Method::GET, Some(_), None) => match sim.store.get(&store_key, &target.key()) {
            Some(object) if table => ok_json(
                StatusCode::OK,
                &table::table(resource, [&*object], sim.store.revision(), true),
            ),
            Some(object) => ok_json(StatusCode::OK, &object),
            None => store_error(&target, StoreError::NotFound),
        },
        (&Method::GET, Some(_), Some("log")) if resource.plural == "pods" => {
            logs(sim, &target, &params)
        }
        (&Method::GET, Some(_), Some("status")) => match sim.store.get(&store_key, &target.key()) {
            Some(object) => ok_json(StatusCode::OK, &object),
            None => store_error(&target, StoreError::NotFound),
        },
        (&Method::GET, Some(_), Some("scale")) if resource.plural == "deployments" => {
            match sim.store.get(&store_key, &target.key()) {
                Some(object) => ok_json(StatusCode::OK, &scale_of(&object)),
                None => store_error(&target, StoreError::NotFound),
            }
        }
        (&Method::POST, None, None) => {
            let (_, body) = match body_json(request, 8 << 20).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            create(sim, &target, body)
        }
        (&Method::PUT, Some(_), sub) => {
            let (_, body) = match body_json(request, 8 << 20).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            if sub == Some("scale") {
                let replicas = body.pointer("/spec/replicas").cloned().unwrap_or(json!(1));
                return scale(sim, &target, replicas, None);
            }
            let expected = body
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let result =
                sim.store
                    .update(&store_key, &target.key(), expected.as_deref(), |current| {
                        let mut next = body.clone();
                        next["kind"] = json!(resource.kind);
                        next["apiVersion"] = json!(resource.api_version());
                        if sub == Some("status") {
                            let mut keep = current.clone();
                            keep["status"] = next["status"].clone();
                            return keep;
                        }
                        next
                    });
            match result {
                Ok(object) => {
                    sim.after_write(resource, &object);
                    ok_json(StatusCode::OK, &object)
                }
                Err(e) => store_error(&target, e),
            }
        }
        (&Method::PATCH, Some(_), sub) => {
            let (headers, body) = match body_json(request, 8 << 20).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            if sub == Some("scale") {
                let replicas = body.pointer("/spec/replicas").cloned();
                return scale(sim, &target, replicas.unwrap_or(Value::Null), Some(body));
            }
            let mut failure = None;
            let result = sim
                .store
                .update(&store_key, &target.key(), None, |current| {
                    let mut next = current.clone();
                    if content_type.contains("json-patch") {
                        if let Err(e) = patch::json_patch(&mut next, &body) {
                            failure = Some(e);
                            return current.clone();
                        }
                    } else if content_type.contains("strategic-merge-patch") {
                        patch::strategic(&mut next, &body);
                    } else {
                        patch::merge(&mut next, &body);
                    }
                    next
                });
            if let Some(e) = failure {
                return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e);
            }
            match result {
                Ok(object) => {
                    sim.after_write(resource, &object);
                    ok_json(StatusCode::OK, &object)
                }
                Err(e) => store_error(&target, e),
            }
        }
        (&Method::DELETE, Some(_), None) => match sim.store.delete(&store_key, &target.key()) {
            Ok(object) => {
                if resource.plural == "namespaces" {
                    sim.store
                        .delete_namespace_contents(target.name.as_deref().unwrap_or_default());
                }
                sim.after_delete(resource, &object);
                ok_json(StatusCode::OK, &object)
            }
            Err(e) => store_error(&target, e),
        },
        (&Method::DELETE, None, None) => {
            let selector =
                LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))
                    .unwrap_or_default();
            let (items, _) = sim.store.list(&store_key, target.namespace.as_deref());
            let mut deleted = Vec::new();
            for o in items.iter().filter(|o| selector.matches(&labels_of(o))) {
                let key = (
                    o.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    o.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                );
                if let Ok(object) = sim.store.delete(&store_key, &key) {
                    deleted.push(object);
                }
            }
            let list = json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(), "metadata": {}, "items": deleted.iter().map(|o| &**o).collect::<Vec<_>>()});
            ok_json(StatusCode::OK, &list)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not supported on {}", target.describe()),
        ),
    }
}

fn create(sim: &Arc<Sim>, target: &Target, mut body: Value) -> Response {
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

fn scale_of(deployment: &Value) -> Value {
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

fn scale(sim: &Arc<Sim>, target: &Target, replicas: Value, _patch: Option<Value>) -> Response {
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

fn logs(sim: &Arc<Sim>, target: &Target, params: &BTreeMap<String, String>) -> Response {
    let Some(pod) = sim.store.get("pods", &target.key()) else {
        return store_error(target, StoreError::NotFound);
    };
    let name = target.name.clone().unwrap_or_default();
    let container = params
        .get("container")
        .cloned()
        .or_else(|| {
            pod.pointer("/spec/containers/0/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let tail: usize = params
        .get("tailLines")
        .and_then(|t| t.parse().ok())
        .unwrap_or(10);
    let line = move |i: u64| Bytes::from(format!("log line {i} from {name}/{container}\n"));
    let first: Vec<Result<Bytes, std::convert::Infallible>> =
        (1..=tail as u64).map(|i| Ok(line(i))).collect();
    let follow = matches!(params.get("follow").map(String::as_str), Some("true" | "1"));
    let head = futures::stream::iter(first);
    let body = if follow {
        let more = futures::stream::unfold(tail as u64 + 1, move |i| {
            let line = line.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Some((Ok(line(i)), i + 1))
            }
        });
        Body::from_stream(head.chain(more))
    } else {
        Body::from_stream(head)
    };
    let _ = sim;
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

fn watch_response(
    sim: &Arc<Sim>,
    target: &Target,
    selector: LabelSelector,
    fields: String,
    params: &BTreeMap<String, String>,
    table: bool,
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
        let object = if table {
            let revision = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            table::table(resource, [object], revision, columns)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource_namespace_name_and_subresource() {
        let t = parse_target("/api/v1/namespaces/default/pods/web-1/log").unwrap();
        assert_eq!(
            (
                t.resource.plural,
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.sub.as_deref()
            ),
            ("pods", Some("default"), Some("web-1"), Some("log"))
        );
        let t = parse_target("/api/v1/namespaces/kube-system").unwrap();
        assert_eq!(
            (t.resource.plural, t.name.as_deref()),
            ("namespaces", Some("kube-system"))
        );
        let t = parse_target("/apis/apps/v1/deployments").unwrap();
        assert_eq!((t.resource.plural, t.namespace), ("deployments", None));
        assert!(
            parse_target("/api/v1/pods/x").is_none(),
            "namespaced objects need their namespace"
        );
        assert!(parse_target("/apis/batch/v1/jobs").is_none());
    }

    #[test]
    fn field_selectors_follow_dotted_paths() {
        let pod = json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(field_matches("spec.nodeName=n1,status.phase!=Failed", &pod));
        assert!(!field_matches("metadata.name==b", &pod));
        assert!(field_matches("", &pod));
    }

    #[test]
    fn query_strings_are_decoded() {
        let q = query(
            &"/x?labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1"
                .parse()
                .unwrap(),
        );
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
    }
}
