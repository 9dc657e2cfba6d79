//! Request handling: authentication and impersonation, then discovery or the resource verbs.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{Request, State},
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use kubeshape::{LabelSelector, apply, patch};
use serde_json::{Value, json};

use super::{
    Identity, Sim, discovery, paging, protobuf, rbac,
    request::{Target, field_matches, labels_of, parse_target, query, wants_table},
    store::{self, StoreError},
    table,
    verbs::{create, logs, scale, scale_of, watch_response},
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

pub(super) fn ok_json(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The caller after impersonation, or a refusal.
/// On refusal: the caller if known (for the audit log), and the response.
type Refusal = (Option<Identity>, Box<Response>);
async fn effective(sim: &Sim, headers: &HeaderMap) -> Result<(Identity, Option<String>), Refusal> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let caller = match token {
        Some(t) => sim.authenticate(t.trim()).await,
        None => None,
    };
    let Some(caller) = caller else {
        let response = status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        return Err((None, Box::new(response)));
    };
    // Header values as kube-apiserver reads them: their bytes, UTF-8 names included (Go's
    // server takes any byte from 0x80 up in a value).
    let text =
        |v: &axum::http::HeaderValue| std::str::from_utf8(v.as_bytes()).ok().map(str::to_owned);
    let Some(user) = headers.get("impersonate-user").and_then(text) else {
        return Ok((caller, None));
    };
    let user = user.as_str();
    let values =
        |name: &str| -> Vec<String> { headers.get_all(name).iter().filter_map(text).collect() };
    // As kube-apiserver's impersonation filter: the caller needs RBAC's `impersonate` on each
    // thing it asserts: the user (or service account), every group, the uid, every extra.
    let mut asked = Vec::new();
    let impersonate =
        |group: &str, resource: &str, sub: Option<&str>, ns: Option<&str>, name: &str| {
            rbac::Attributes {
                verb: "impersonate".into(),
                group: group.into(),
                resource: resource.into(),
                subresource: sub.map(str::to_owned),
                namespace: ns.map(str::to_owned),
                name: Some(name.to_owned()),
            }
        };
    let service_account = user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'));
    match service_account {
        Some((ns, name)) => asked.push(impersonate("", "serviceaccounts", None, Some(ns), name)),
        None => asked.push(impersonate("", "users", None, None, user)),
    }
    let groups = values("impersonate-group");
    for group in &groups {
        asked.push(impersonate("", "groups", None, None, group));
    }
    for uid in values("impersonate-uid") {
        asked.push(impersonate(
            "authentication.k8s.io",
            "uids",
            None,
            None,
            &uid,
        ));
    }
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-")
            && let Some(value) = text(value)
        {
            asked.push(impersonate(
                "authentication.k8s.io",
                "userextras",
                Some(key),
                None,
                &value,
            ));
        }
    }
    if let Some(refused) = asked
        .iter()
        .find(|a| rbac::allowed(&sim.store, &caller, a).is_none())
    {
        let response = status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            refused.forbidden(&caller),
        );
        return Err((Some(caller), Box::new(response)));
    }
    let identity = match service_account {
        Some((ns, name)) => {
            let mut identity = Identity::service_account(ns, name);
            identity.groups.extend(groups);
            identity
        }
        None => {
            let mut groups = groups;
            groups.push("system:authenticated".into());
            Identity {
                user: user.to_owned(),
                groups,
            }
        }
    };
    Ok((identity, Some(caller.user)))
}

pub(super) async fn handle(State(sim): State<Arc<Sim>>, request: Request) -> Response {
    let uri = request.uri().clone();
    let method = request.method().clone();
    if matches!(uri.path(), "/healthz" | "/livez" | "/readyz") {
        return "ok".into_response();
    }
    let (identity, impersonator) = match effective(&sim, request.headers()).await {
        Ok(who) => who,
        Err((caller, response)) => {
            sim.record(
                caller.as_ref(),
                None,
                &method,
                &uri,
                response.status().as_u16(),
            );
            return *response;
        }
    };
    let protobuf = protobuf::preferred(
        request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    ) && !is_watch(request.uri());
    let yaml = !protobuf
        && !is_watch(request.uri())
        && request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.trim_start().starts_with("application/yaml"));
    let mut response = route(&sim, &identity, request).await;
    if protobuf {
        response = in_protobuf(response).await;
    } else if yaml {
        response = in_yaml(response).await;
    }
    sim.record(
        Some(&identity),
        impersonator,
        &method,
        &uri,
        response.status().as_u16(),
    );
    response
}

fn is_watch(uri: &axum::http::Uri) -> bool {
    matches!(
        query(uri).get("watch").map(String::as_str),
        Some("true" | "1")
    )
}

/// Re-encodes a JSON answer as protobuf for a client that prefers it, as kube-apiserver
/// negotiates; kinds without a protobuf schema (tables, discovery) stay JSON.
async fn in_protobuf(response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t == "application/json");
    if !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the answer could not be read back",
        );
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|value| protobuf::encode(&value));
    match encoded {
        Some(Ok(encoded)) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(protobuf::MEDIA_TYPE),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, encoded.into())
        }
        Some(Err(e)) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("the answer does not fit its protobuf schema: {e}"),
        ),
        None => Response::from_parts(parts, bytes.into()),
    }
}

/// Re-encodes a JSON answer as YAML for a client that asks for `application/yaml` first, as
/// kube-apiserver serves it (the dashboard's YAML view reads objects this way).
async fn in_yaml(response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t == "application/json");
    if !json || !response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let yaml = axum::body::to_bytes(body, usize::MAX)
        .await
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|value| serde_saphyr::to_string(&value).ok());
    let Some(yaml) = yaml else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the answer could not be written as YAML",
        );
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/yaml"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, yaml.into())
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
    // kube-apiserver 1.35 (AuthorizePodWebsocketUpgradeCreatePermission, on by default) also
    // asks for `create` when exec, attach or port-forward comes as a WebSocket GET.
    if attributes.verb == "get" && streams(&target) && creates_streams(&sim.version) {
        let create = rbac::Attributes {
            verb: "create".to_owned(),
            ..attributes
        };
        if rbac::allowed(&sim.store, identity, &create).is_none() {
            return forbidden(identity, &create);
        }
    }
    resource_request(sim, identity, target, request).await
}

/// exec, attach and port-forward: a stream into a pod.
fn streams(target: &Target) -> bool {
    matches!(
        target.sub.as_deref(),
        Some("exec" | "attach" | "portforward")
    )
}

/// Whether a cluster of `git_version` asks for `create` on a stream opened with GET too (1.35
/// and later).
fn creates_streams(git_version: &str) -> bool {
    let minor = git_version
        .trim_start_matches('v')
        .split(['.', '+', '-'])
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_some_and(|m| m >= 35)
}

/// The verb and resource RBAC judges a resource request by, as kube-apiserver derives them.
fn attributes(target: &Target, method: &Method, uri: &axum::http::Uri) -> rbac::Attributes {
    let watch = is_watch(uri);
    let verb = match (method.as_str(), &target.name) {
        // As kube-apiserver derives it from the method: a WebSocket exec, attach or
        // port-forward comes as GET and is a `get` (1.35 also asks for `create`: see the
        // caller), SPDY's POST a `create`.
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
    // As kube-apiserver reads `/api/v1/namespaces/NAME`: a namespace's own namespace is its
    // name, so a RoleBinding in it can grant rights on the namespace object itself.
    let namespace = match (target.resource.plural, &target.name) {
        ("namespaces", Some(name)) => Some(name.clone()),
        _ => target.namespace.clone(),
    };
    rbac::Attributes {
        verb: verb.to_owned(),
        group: target.resource.group.to_owned(),
        resource: target.resource.plural.to_owned(),
        subresource: target.sub.clone(),
        namespace,
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
    let body = match body_json(request, 1 << 20).await {
        Ok((_, body)) => body,
        Err(response) => return response,
    };
    let asked = match rbac::review_attributes(&body) {
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
    if content_type.contains("cbor") {
        return Err(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the simulated cluster reads JSON, YAML and protobuf bodies, not {content_type}"
            ),
        ));
    }
    let value = if content_type.starts_with(protobuf::MEDIA_TYPE) {
        protobuf::decode(&bytes).map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", e))?
    } else if content_type.contains("yaml") {
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

pub(super) fn store_error(target: &Target, e: StoreError) -> Response {
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
    let manager = apply::manager_of(
        params.get("fieldManager").map(String::as_str),
        request
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
    );
    let table = match wants_table(request.headers(), &params) {
        Ok(table) => table,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
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
            let page = match paging::Page::of(&params) {
                Ok(page) => page,
                Err(response) => return *response,
            };
            let (items, revision) = sim.store.list_after(
                &store_key,
                target.namespace.as_deref(),
                page.after().as_ref(),
            );
            let unselected = selector.is_everything() && fields.is_empty();
            let items: Vec<Arc<Value>> = if unselected {
                items
            } else {
                items
                    .into_iter()
                    .filter(|o| selector.matches(&labels_of(o)) && field_matches(&fields, o))
                    .collect()
            };
            let (items, more) = page.cut(items, revision, !unselected);
            let revision = more.revision;
            let mut answer = if let Some(include) = table {
                table::table(
                    resource,
                    items.iter().map(|o| &**o),
                    revision,
                    true,
                    include,
                )
            } else {
                json!({
                    "kind": format!("{}List", resource.kind),
                    "apiVersion": resource.api_version(),
                    "metadata": {"resourceVersion": revision.to_string()},
                    "items": items.iter().map(|o| &**o).collect::<Vec<_>>(),
                })
            };
            more.describe(&mut answer["metadata"]);
            ok_json(StatusCode::OK, &answer)
        }
        (&Method::GET, Some(_), None) => match sim.store.get(&store_key, &target.key()) {
            Some(object) if let Some(include) = table => ok_json(
                StatusCode::OK,
                &table::table(resource, [&*object], sim.store.revision(), true, include),
            ),
            Some(object) => ok_json(StatusCode::OK, &object),
            None => store_error(&target, StoreError::NotFound),
        },
        (&Method::GET | &Method::POST, Some(_), Some("portforward"))
            if resource.plural == "pods" =>
        {
            super::portforward::forward(sim, &target, request)
        }
        (&Method::GET | &Method::POST, Some(_), Some("exec" | "attach"))
            if resource.plural == "pods" =>
        {
            super::exec::stream(sim, &target, request)
        }
        (&Method::POST, Some(name), Some("eviction")) if resource.plural == "pods" => {
            let (_, eviction) = match body_json(request, 1 << 20).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            if eviction["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n != name)
            {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("name in URL does not match name in Eviction object: {name}"),
                );
            }
            super::eviction::evict(sim, &target)
        }
        (&Method::POST, Some(name), Some("token")) if resource.plural == "serviceaccounts" => {
            // The body first: a refused request issues no token.
            let (_, request) = match body_json(request, 1 << 20).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            let namespace = target.namespace.clone().unwrap_or_default();
            let Some(token) = sim.issue_token(&namespace, name) else {
                return store_error(&target, StoreError::NotFound);
            };
            let seconds = request
                .pointer("/spec/expirationSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(3600);
            let expires = time::OffsetDateTime::now_utc() + time::Duration::seconds(seconds);
            ok_json(
                StatusCode::CREATED,
                &json!({
                    "kind": "TokenRequest",
                    "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"audiences": request.pointer("/spec/audiences").cloned().unwrap_or(json!([])), "expirationSeconds": seconds},
                    "status": {
                        "token": token,
                        "expirationTimestamp": expires
                            .replace_nanosecond(0)
                            .ok()
                            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
                    },
                }),
            )
        }
        (&Method::GET, Some(_), Some("log")) if resource.plural == "pods" => {
            logs(sim, &target, &params)
        }
        (&Method::GET, Some(_), Some("status")) => match sim.store.get(&store_key, &target.key()) {
            Some(object) => ok_json(StatusCode::OK, &object),
            None => store_error(&target, StoreError::NotFound),
        },
        (&Method::GET, Some(_), Some("scale")) if resource.subresources.contains(&"scale") => {
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
            create(sim, &target, body, Some(&manager))
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
                        apply::record_update(Some(current), &mut next, &manager, &store::now());
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
            if content_type.contains("apply-patch") {
                let force = params.get("force").is_some_and(|f| f == "true");
                let field_manager = params.get("fieldManager").map(String::as_str);
                return server_side_apply(sim, &target, body, field_manager, force);
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
                    if sub.is_none() {
                        apply::record_update(Some(current), &mut next, &manager, &store::now());
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

/// `PATCH` with `application/apply-patch+yaml`: server-side apply (see [`apply`]). An apply
/// that changes nothing writes nothing, as kube-apiserver's does.
fn server_side_apply(
    sim: &Arc<Sim>,
    target: &Target,
    mut config: Value,
    field_manager: Option<&str>,
    force: bool,
) -> Response {
    let Some(manager) = field_manager.filter(|m| !m.is_empty()) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "PATCH, application/apply-patch+yaml: fieldManager is required for apply requests",
        );
    };
    let resource = target.resource;
    let name = target.name.clone().unwrap_or_default();
    for (field, want) in [
        ("kind", resource.kind),
        ("apiVersion", &resource.api_version()),
    ] {
        match config.get(field).and_then(Value::as_str) {
            Some(given) if given == want => {}
            given => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!(
                        "the applied configuration's {field} is {given:?}, not {want:?} as the request's path says"
                    ),
                );
            }
        }
    }
    if config
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| n != name)
    {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        );
    }
    config["metadata"]["name"] = json!(name);
    let now = store::now();
    // Read, decide, write at that resourceVersion; a writer in between means deciding again.
    for _ in 0..5 {
        let live = sim.store.get(&resource.key(), &target.key());
        let next = match apply::apply(live.as_deref(), &config, manager, force, &now) {
            Ok(next) => next,
            Err(conflicts) => return apply_conflict(&conflicts),
        };
        let Some(live) = live else {
            let collection = Target {
                name: None,
                ..target.clone()
            };
            return create(sim, &collection, next, None);
        };
        if next == *live {
            return ok_json(StatusCode::OK, &live);
        }
        let expected = live
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str);
        match sim
            .store
            .update(&resource.key(), &target.key(), expected, |_| next.clone())
        {
            Ok(object) => {
                sim.after_write(resource, &object);
                return ok_json(StatusCode::OK, &object);
            }
            Err(StoreError::Conflict | StoreError::NotFound) => continue,
            Err(e) => return store_error(target, e),
        }
    }
    status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "{} kept changing while it was applied; retry",
            target.describe()
        ),
    )
}

/// 409 as kube-apiserver refuses an apply over another manager's fields.
fn apply_conflict(conflicts: &[apply::Conflict]) -> Response {
    let mut body: Value = serde_json::from_str(&kubeshape::status::failure(
        409,
        "Conflict",
        &apply::conflict_message(conflicts),
    ))
    .unwrap_or_default();
    body["details"] = json!({"causes": conflicts.iter().map(|c| json!({
        "type": "FieldManagerConflict",
        "message": format!("conflict with {:?} using {}", c.manager, c.api_version),
        "field": c.path,
    })).collect::<Vec<_>>()});
    ok_json(StatusCode::CONFLICT, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_websocket_exec_is_a_get_spdys_a_create_and_1_35_asks_for_create_too() {
        for sub in ["exec", "attach", "portforward"] {
            let path = format!("/api/v1/namespaces/default/pods/web-0/{sub}");
            let target = parse_target(&path).unwrap();
            let uri: axum::http::Uri = format!("{path}?command=sh").parse().unwrap();
            assert_eq!(attributes(&target, &Method::GET, &uri).verb, "get", "{sub}");
            assert_eq!(attributes(&target, &Method::POST, &uri).verb, "create");
            assert!(streams(&target));
        }
        for (version, both) in [
            ("v1.33.4+k3s1", false),
            ("v1.34.2", false),
            ("v1.35.0", true),
            ("v1.36.1+rke2r1", true),
            ("nonsense", false),
        ] {
            assert_eq!(creates_streams(version), both, "{version}");
        }
    }
}
