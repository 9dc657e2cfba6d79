//! The generic verbs on `/v1/{plural}[/{name}]`, with each kind's own rules on the way in.

use std::collections::HashMap;

use axum::{
    Json,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Map, Value, json};

use super::{
    Api, ApiError, DeleteParams, PathKindName, QueryList, allow,
    body::{Body, JsonBody, body},
    kind_of, present, watch,
};
use crate::{
    auth::{Principal, Verb, secret},
    model::{ClusterSpec, Kind, validate_name},
    registration,
    store::{Object, ObjectMeta, Op, ReadOnce, Store, StoreError},
};

type QueryRejection = axum::extract::rejection::QueryRejection;

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::bad_request(format!("query parameters: {}", e.body_text()))
}

pub(super) async fn list_or_watch(
    State(api): State<Api>,
    axum::extract::Path(plural): axum::extract::Path<String>,
    params: Result<QueryList, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    let Query(params) = params.map_err(query_error)?;
    let kind = kind_of(&plural)?;
    crate::auth::may_list(&principal, kind)?;
    let selector = params.selector()?;
    let revision = params.revision()?;
    if params.watch.unwrap_or(false) {
        return watch::serve(api, principal, kind, selector, revision).await;
    }
    let start = super::paging::start(params.continue_token.as_deref())?;
    let (objects, revision) = api.store.list(kind.name(), &selector).await?;
    let readable: Vec<Object> = objects
        .into_iter()
        .filter(|o| allow(&principal, Verb::List, kind, o).is_ok())
        .collect();
    let page = super::paging::page(
        readable,
        |o| o.metadata.name.as_str(),
        params.limit,
        &start,
        revision,
    );
    let mut metadata = json!({"resourceVersion": page.revision.to_string()});
    if let Some(next) = page.next {
        metadata["continue"] = json!(next);
        metadata["remainingItemCount"] = json!(page.remaining);
    }
    let items: Vec<Value> = page.items.into_iter().map(|o| present(kind, o)).collect();
    Ok(Json(json!({
        "apiVersion": super::API_VERSION,
        "kind": format!("{}List", kind.name()),
        "metadata": metadata,
        "items": items,
    }))
    .into_response())
}

pub(super) async fn get_one(
    State(api): State<Api>,
    axum::extract::Path((plural, name)): PathKindName,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    let object = super::readable(&api, &principal, kind, &name).await?;
    Ok(Json(present(kind, object)))
}

/// What create and replace check of a body before anything else: the right kind, a valid
/// name, metadata the store can keep, and a spec without the fields only the hub writes.
/// Returns that metadata and spec. Needs no store, so the fuzzer calls it too
/// (`fuzz/fuzz_targets/api_body.rs`).
pub fn check_body(kind: Kind, value: &Value, name: &str) -> Result<(ObjectMeta, Value), ApiError> {
    kind_matches(value, kind)?;
    validate_name(kind, name).map_err(ApiError::invalid)?;
    let spec = spec_from(value)?;
    match kind {
        Kind::Setting => {
            crate::auth::lifetimes::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            crate::model::agentconfig::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            crate::recording::validate_setting(name, &spec).map_err(ApiError::invalid)?;
            if name == crate::auth::providers::REFRESH_SETTING {
                let value = spec.get("value").and_then(Value::as_str).unwrap_or("");
                crate::auth::providers::parse_interval(value).map_err(|e| {
                    ApiError::invalid(format!(
                        "spec.value: {e} (setting {name}: how often directory users' groups are read again)"
                    ))
                })?;
            }
        }
        Kind::AuthProvider => {
            crate::model::validate_provider_name(name).map_err(ApiError::invalid)?;
        }
        _ => {}
    }
    Ok((metadata_from(value, name)?, spec))
}

/// The metadata a caller may set: the name, labels, annotations and the resourceVersion read.
/// Everything else (uid, finalizers, owner references, timestamps, generation) is the hub's;
/// a body may carry it back as read, but a different value is refused (see
/// [`hub_owned_unchanged`]).
fn metadata_from(value: &Value, name: &str) -> Result<ObjectMeta, ApiError> {
    let mut meta = value.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut meta {
        map.insert("name".into(), Value::String(name.to_owned()));
    }
    let given: ObjectMeta = serde_json::from_value(meta)
        .map_err(|e| ApiError::bad_request(format!("metadata: {e}")))?;
    if !given.resource_version.chars().all(|c| c.is_ascii_digit()) {
        return Err(ApiError::invalid(format!(
            "metadata.resourceVersion {:?} is not a resourceVersion; send back the one you read, or none",
            given.resource_version
        )));
    }
    for (key, value) in &given.labels {
        kubeshape::selector::key_of(key).map_err(ApiError::invalid)?;
        kubeshape::selector::value_of(value).map_err(ApiError::invalid)?;
    }
    Ok(ObjectMeta {
        name: name.to_owned(),
        resource_version: given.resource_version,
        labels: given.labels,
        annotations: given.annotations,
        ..ObjectMeta::default()
    })
}

/// Refuses a body that sets the metadata only the hub writes to anything but what is stored
/// (`current`; nothing for a new object): finalizers are the hub's promise to clean up, and
/// owner references say which objects this one was made for.
fn hub_owned_unchanged(value: &Value, current: Option<&ObjectMeta>) -> Result<(), ApiError> {
    let stored = current.cloned().unwrap_or_default();
    let sent = |field: &str| value.pointer(&format!("/metadata/{field}"));
    if let Some(finalizers) = sent("finalizers")
        && *finalizers != json!(stored.finalizers)
        && !(finalizers.is_null() && stored.finalizers.is_empty())
    {
        return Err(ApiError::invalid(
            "metadata.finalizers are the hub's: it adds them when it creates an object and removes them when its clean-up is done; leave them as read (or out)",
        ));
    }
    if let Some(refs) = sent("ownerReferences")
        && *refs != json!(stored.owner_references)
        && !(refs.is_null() && stored.owner_references.is_empty())
    {
        return Err(ApiError::invalid(
            "metadata.ownerReferences are the hub's: they name the objects this one was created for; leave them as read (or out)",
        ));
    }
    Ok(())
}

/// Spec fields only the hub writes: secret hashes, and a directory user's identity and groups
/// (an admin who could set them could make anyone anyone).
const HUB_WRITES: [&str; 5] = [
    "secretHash",
    "passwordHash",
    "principal",
    "providerGroups",
    "groupsRefreshedAt",
];

/// The spec as given, minus anything only the hub may write.
fn spec_from(value: &Value) -> Result<Value, ApiError> {
    let mut spec = value
        .get("spec")
        .cloned()
        .ok_or_else(|| ApiError::invalid("spec: every object needs a spec (`{}` for defaults)"))?;
    if let Value::Object(map) = &mut spec {
        for field in HUB_WRITES {
            map.remove(field);
        }
    }
    Ok(spec)
}

fn kind_matches(value: &Value, kind: Kind) -> Result<(), ApiError> {
    match value.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind.name() => Err(ApiError::bad_request(format!(
            "the body is a {k} but the URL is for {}; send it to /v1/{}",
            kind.name(),
            Kind::from_name(k).map_or("…", Kind::plural)
        ))),
        _ => Ok(()),
    }
}

async fn must_exist(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    field: &str,
) -> Result<(), ApiError> {
    match store.get(kind.name(), name).await {
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => Err(ApiError::invalid(format!(
            "{field}: {} {name:?} does not exist; create it first",
            kind.name()
        ))),
        Err(e) => Err(e.into()),
    }
}

fn set(spec: &mut Value, field: &str, value: Value) {
    if let Value::Object(map) = spec {
        map.insert(field.to_owned(), value);
    }
}

async fn hash_password(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || secret::hash_password(&password))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Kind-specific rules for a new or replaced spec: references must exist, passwords are hashed,
/// secret hashes are kept from `current`. Returns the spec to store.
/// A bundle's objects (`spec.resources` or `spec.manifests`) stored as content-addressed
/// chunks and named by `spec.content`; an update that gives none keeps the content it had. A
/// `spec.content` the caller wrote is never taken: only the hub names chunks.
async fn bundle_content(
    store: &dyn Store,
    spec: &mut Value,
    current: Option<&Object>,
) -> Result<(), ApiError> {
    use crate::delivery::content;
    let Value::Object(map) = spec else {
        return Ok(());
    };
    let objects = match (map.remove("resources"), map.remove("manifests")) {
        (Some(Value::Array(list)), _) => Some(content::check_objects(list)),
        (_, Some(Value::String(yaml))) => Some(content::parse_manifests(&yaml)),
        _ => None,
    };
    map.remove("content");
    let content = match objects {
        Some(objects) => {
            let objects = objects.map_err(ApiError::invalid)?;
            if objects.is_empty() {
                return Err(ApiError::invalid(
                    "spec.resources, spec.manifests: a bundle needs at least one object",
                ));
            }
            let stored = content::store_objects(store, &objects).await?;
            serde_json::to_value(stored).map_err(|e| ApiError::invalid(e.to_string()))?
        }
        None => match current.and_then(|c| c.spec.get("content")) {
            Some(kept) => kept.clone(),
            None => {
                return Err(ApiError::invalid(
                    "spec.resources or spec.manifests: a bundle needs its objects, as a list of Kubernetes objects or as YAML",
                ));
            }
        },
    };
    map.insert("content".into(), content);
    Ok(())
}

async fn checked_spec(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    spec: Value,
    current: Option<&Object>,
) -> Result<Value, ApiError> {
    let mut spec = kind.validate_spec(&spec).map_err(ApiError::invalid)?;
    // What only the hub writes survives an update untouched.
    if let (Some(current), Value::Object(map)) = (current, &mut spec) {
        for field in HUB_WRITES {
            if let Some(v) = current.spec.get(field) {
                map.insert(field.to_owned(), v.clone());
            }
        }
    }
    // A secret the caller cannot read back is kept when an update leaves it out.
    if let Some(current) = current {
        crate::model::agentconfig::keep_env_passwords(&mut spec, &current.spec);
        crate::model::keep_plan_files(&mut spec, &current.spec);
        for pointer in crate::model::SECRET_FIELDS {
            let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            if let (Some(kept), Some(Value::Object(map))) =
                (current.spec.pointer(pointer), spec.pointer_mut(parent))
            {
                map.entry(field).or_insert_with(|| kept.clone());
            }
        }
    }
    match kind {
        Kind::CloudCredential => {
            let parsed: crate::model::CloudCredentialSpec = serde_json::from_value(spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            if let Some(field) = crate::model::missing_secret(&parsed) {
                return Err(ApiError::invalid(format!(
                    "{field}: a {} credential needs it",
                    parsed.driver.label()
                )));
            }
        }
        Kind::MachineTemplate => {
            let parsed: crate::model::MachineTemplateSpec = serde_json::from_value(spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            match store
                .get(Kind::CloudCredential.name(), &parsed.credential)
                .await
            {
                Ok(found) => {
                    let driver = found.spec.get("driver").and_then(Value::as_str);
                    if driver != Some(parsed.driver.label()) {
                        return Err(ApiError::invalid(format!(
                            "spec.credential: {:?} is a credential for driver {}, not {}",
                            parsed.credential,
                            driver.unwrap_or("?"),
                            parsed.driver.label()
                        )));
                    }
                }
                Err(StoreError::NotFound { .. }) => {
                    return Err(ApiError::invalid(format!(
                        "spec.credential: no CloudCredential {:?}; create it first",
                        parsed.credential
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Kind::User => {
            let password = spec
                .get("password")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if let Value::Object(map) = &mut spec {
                map.remove("password");
            }
            match password {
                Some(p) => set(
                    &mut spec,
                    "passwordHash",
                    Value::String(hash_password(p).await?),
                ),
                None if current.is_none() => {
                    return Err(ApiError::invalid(
                        "spec.password: a new user needs a password of at least 12 characters",
                    ));
                }
                None => {}
            }
        }
        Kind::Bundle => bundle_content(store, &mut spec, current).await?,
        Kind::Host | Kind::RegistrationToken => {
            let cluster = spec
                .get("cluster")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            must_exist(store, Kind::Cluster, &cluster, "spec.cluster").await?;
        }
        Kind::Plan => {
            // One plan per host and slot, named after them: the host's own plan as the host, its
            // task `task-<host>`.
            let (host, cluster) = (
                spec.get("host").and_then(Value::as_str).unwrap_or_default(),
                spec.get("cluster")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
            let task = spec.get("slot").and_then(Value::as_str) == Some(crate::plans::TASK);
            let expected = if task {
                crate::plans::task_plan_name(host)
            } else {
                host.to_owned()
            };
            if expected != name {
                return Err(ApiError::invalid(format!(
                    "metadata.name: a {} is named after its host; name it {expected:?}",
                    if task { "host's task" } else { "plan" }
                )));
            }
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            match store.get(Kind::Host.name(), host).await {
                Ok(h) if h.spec.get("cluster").and_then(Value::as_str) == Some(cluster) => {}
                Ok(_) => {
                    return Err(ApiError::invalid(format!(
                        "spec.host: host {host:?} is not in cluster {cluster:?}"
                    )));
                }
                Err(StoreError::NotFound { .. }) => {
                    return Err(ApiError::invalid(format!(
                        "spec.host: Host {host:?} does not exist; hosts register with the host command"
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Kind::RoleBinding => {
            if let Some(cluster) = spec.get("cluster").and_then(Value::as_str) {
                must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            }
            if let Some(user) = spec.get("user").and_then(Value::as_str) {
                must_exist(store, Kind::User, user, "spec.user").await?;
            }
            if let Some(project) = spec.get("project").and_then(Value::as_str) {
                in_project(store, &spec, project).await?;
            }
        }
        Kind::Project => {
            let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
        }
        Kind::ProjectSecret => {
            let project = spec.get("project").and_then(Value::as_str).unwrap_or("");
            in_project(store, &spec, project).await?;
        }
        Kind::EtcdSnapshot => {
            let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
            must_exist(store, Kind::Cluster, cluster, "spec.cluster").await?;
            let found = store.get(Kind::Cluster.name(), cluster).await?;
            if found.spec.get("type").and_then(Value::as_str) != Some("custom") {
                return Err(ApiError::invalid(format!(
                    "spec.cluster: {cluster:?} is an imported cluster; Drover snapshots the etcd of clusters it provisioned (custom clusters) only"
                )));
            }
            if let Some(current) = current
                && current.spec != spec
            {
                return Err(ApiError::invalid(
                    "spec: a snapshot's spec cannot change; take a new snapshot instead",
                ));
            }
        }
        _ => {}
    }
    Ok(spec)
}

/// `project` exists and belongs to the cluster `spec` names.
async fn in_project(store: &dyn Store, spec: &Value, project: &str) -> Result<(), ApiError> {
    let cluster = spec.get("cluster").and_then(Value::as_str).unwrap_or("");
    match store.get(Kind::Project.name(), project).await {
        Ok(p) if p.spec.get("cluster").and_then(Value::as_str) == Some(cluster) => Ok(()),
        Ok(p) => Err(ApiError::invalid(format!(
            "spec.cluster: project {project:?} is in cluster {}, not {cluster:?}",
            p.spec.get("cluster").unwrap_or(&Value::Null)
        ))),
        Err(StoreError::NotFound { .. }) => Err(ApiError::invalid(format!(
            "spec.project: Project {project:?} does not exist; create it first"
        ))),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn create(
    State(api): State<Api>,
    axum::extract::Path(plural): axum::extract::Path<String>,
    headers: HeaderMap,
    Body(body_result): Body,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    let mut value = body_result?;
    if kind == Kind::Machine {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "machines are made by the hub from a cluster's spec.machinePools: change a pool's quantity instead",
        ));
    }
    if kind == Kind::BundleDeployment {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "bundle deployments are made by the hub from a bundle's spec.targets: change the bundle's targets instead",
        ));
    }
    // Each object the new ones name is read once, for its checks and for its references.
    let reads = ReadOnce::new(api.store.clone());
    if let Some(items) = list_items(kind, &mut value)? {
        return create_all(&api, &principal, kind, items, &reads).await;
    }
    let (mut ops, shown_once) = new_object(&api, &principal, kind, &value, &reads).await?;
    crate::refs::stamp_all(&reads, &mut ops).await?;
    let written = api.store.transact(ops).await?;
    let Some(created) = written.into_iter().next() else {
        return Err(StoreError::Backend("creation returned nothing".into()).into());
    };
    Ok((
        StatusCode::CREATED,
        Json(with_shown_once(present(kind, created), shown_once)),
    )
        .into_response())
}

/// The most objects one list may create: one transaction holds them all, and the store's
/// other writers wait behind it.
pub(super) const MAX_CREATED_AT_ONCE: usize = 1000;

/// The items of a body that is a list (`kind` `PlanList` for plans, or `List`), or `None` for
/// a body that is one object.
fn list_items(kind: Kind, value: &mut Value) -> Result<Option<Vec<Value>>, ApiError> {
    let list_kind = format!("{}List", kind.name());
    match value.get("kind").and_then(Value::as_str) {
        Some(k) if k == list_kind || k == "List" => {}
        Some(k) if let Some(other) = k.strip_suffix("List").and_then(Kind::from_name) => {
            return Err(ApiError::bad_request(format!(
                "the body is a {k} but the URL is for {}; send it to /v1/{}",
                kind.name(),
                other.plural()
            )));
        }
        _ => return Ok(None),
    }
    let Some(Value::Array(items)) = value.get_mut("items").map(Value::take) else {
        return Err(ApiError::bad_request(format!(
            "items: a {list_kind} to create needs an array of items"
        )));
    };
    if items.len() > MAX_CREATED_AT_ONCE {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!(
                "items: {} objects in one list, at most {MAX_CREATED_AT_ONCE} are created at once; send them in several lists",
                items.len()
            ),
        ));
    }
    Ok(Some(items))
}

/// Creates every item of a list in one transaction: all of them, or (any one refused) none,
/// with the refusal naming the item. Answers the list as created.
async fn create_all(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    items: Vec<Value>,
    reads: &ReadOnce,
) -> Result<Response, ApiError> {
    // What the items name (a plan's cluster and host), read in one trip per kind rather than
    // one per item.
    let mut named: HashMap<Kind, Vec<String>> = HashMap::new();
    for item in &items {
        if let Some(spec) = item.get("spec") {
            for referent in crate::refs::referents(kind, spec) {
                named.entry(referent.kind).or_default().push(referent.name);
            }
        }
    }
    for (named_kind, names) in named {
        reads.prefetch(named_kind.name(), names).await?;
    }
    let mut ops = Vec::new();
    // Where each item's object is among the ops (an item may bring others along), and what
    // it shows once.
    let mut made = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let in_item = |e: ApiError| ApiError {
            message: format!("items[{i}]: {}", e.message),
            ..e
        };
        if !item.is_object() {
            return Err(in_item(ApiError::bad_request(
                "each item must be a JSON object with metadata and spec",
            )));
        }
        let (item_ops, shown_once) = new_object(api, principal, kind, item, reads)
            .await
            .map_err(in_item)?;
        made.push((ops.len(), shown_once));
        ops.extend(item_ops);
    }
    crate::refs::stamp_all(reads, &mut ops).await?;
    let written = if ops.is_empty() {
        Vec::new()
    } else {
        api.store.transact(ops).await?
    };
    let revision = written.first().map_or(0, Object::revision);
    let mut made = made.into_iter().peekable();
    let mut created = Vec::with_capacity(items.len());
    for (i, object) in written.into_iter().enumerate() {
        if let Some((_, shown_once)) = made.next_if(|(at, _)| *at == i) {
            created.push(with_shown_once(present(kind, object), shown_once));
        }
    }
    if made.peek().is_some() {
        return Err(StoreError::Backend("creation returned too little".into()).into());
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "apiVersion": super::API_VERSION,
            "kind": format!("{}List", kind.name()),
            "metadata": {"resourceVersion": revision.to_string()},
            "items": created,
        })),
    )
        .into_response())
}

fn with_shown_once(mut presented: Value, shown_once: Map<String, Value>) -> Value {
    if let Value::Object(map) = &mut presented {
        map.extend(shown_once);
    }
    presented
}

/// What creating the object `value` describes writes (the object first, then what comes with
/// it), checked against the caller's rights and the kind's rules, and what its answer shows
/// once (a new token's secret, a cluster's registration commands).
async fn new_object(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    value: &Value,
    reads: &ReadOnce,
) -> Result<(Vec<Op>, Map<String, Value>), ApiError> {
    let mut shown_once = Map::new();
    let mut also = Vec::new();
    // Token-like kinds are named by the hub: the name is half of the secret's lookup.
    let new_secret = match kind {
        Kind::Token => Some(secret::new_token(secret::TokenKind::Token)),
        Kind::RegistrationToken => Some(secret::new_token(secret::TokenKind::Registration)),
        _ => None,
    };
    let name = match &new_secret {
        Some(token) => token.name.clone(),
        None => value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid("metadata.name: every object needs a name"))?
            .to_owned(),
    };
    let (mut metadata, mut spec) = check_body(kind, value, &name)?;
    hub_owned_unchanged(value, None)?;
    if kind == Kind::Token && spec.get("user").is_none() && spec.get("agent").is_none() {
        set(&mut spec, "user", Value::String(principal.user.clone()));
    }
    if kind == Kind::Token
        && let Some(user) = spec.get("user").and_then(Value::as_str).map(str::to_owned)
    {
        // A user's API token lives no longer than the longest lifetime set, and is labelled
        // with its user, for admins to list and revoke one user's tokens.
        let lifetimes = crate::auth::lifetimes::read(api.store.as_ref()).await?;
        let expires = crate::auth::lifetimes::api_token_expiry(
            spec.get("expiresAt").and_then(Value::as_str),
            lifetimes.api_max,
        )
        .map_err(ApiError::invalid)?;
        set(&mut spec, "expiresAt", Value::String(expires));
        metadata
            .labels
            .insert(crate::auth::lifetimes::USER_LABEL.to_owned(), user);
    }
    // The caller's rights first, on the spec as given (its shape checked, nothing looked up):
    // a caller who may not create it learns nothing about which objects exist.
    let shaped = kind.validate_spec(&spec).map_err(ApiError::invalid)?;
    allow(
        principal,
        Verb::Create,
        kind,
        &Object::new(kind.name(), &name, shaped),
    )?;
    let mut spec = checked_spec(reads, kind, &name, spec, None).await?;
    super::uses::check(reads, principal, kind, &spec, None).await?;
    super::roles::check(reads, principal, kind, &name, &spec, None).await?;
    if let Some(token) = &new_secret {
        set(&mut spec, "secretHash", Value::String(token.hash.clone()));
        shown_once.insert("token".into(), Value::String(token.value.clone()));
    }
    let mut object = Object {
        kind: kind.name().to_owned(),
        metadata,
        spec,
        status: Value::Null,
    };
    if kind == Kind::Cluster {
        // Set with the cluster, in the same write: no cluster is ever without its clean-up.
        object.metadata.finalizers = vec![crate::model::CLEANUP_FINALIZER.to_owned()];
    }

    match kind {
        Kind::Cluster => {
            // A new cluster comes with its first registration token and commands.
            let cluster: ClusterSpec = serde_json::from_value(object.spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            let token = secret::new_token(secret::TokenKind::Registration);
            also.push(Op::Create(registration::token_object(&name, &token)));
            // Who may create clusters without being an admin owns what they create.
            also.extend(super::roles::creator_owns(principal, &name).map(Op::Create));
            shown_once.insert(
                "registration".into(),
                registration::commands(api, cluster.cluster_type, &token.value),
            );
        }
        Kind::RegistrationToken => {
            let cluster_name = object
                .spec
                .get("cluster")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let cluster = reads.get(Kind::Cluster.name(), cluster_name).await?;
            let cluster: ClusterSpec = serde_json::from_value(cluster.spec)
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            let value = shown_once
                .get("token")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            shown_once.insert(
                "registration".into(),
                registration::commands(api, cluster.cluster_type, &value),
            );
        }
        _ => {}
    }

    let mut ops = vec![Op::Create(object)];
    ops.extend(also);
    Ok((ops, shown_once))
}

/// Replaces `current` with what `value` describes (metadata the caller may set, and spec).
async fn replace(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    current: Object,
    value: Value,
) -> Result<Json<Value>, ApiError> {
    allow(principal, Verb::Update, kind, &current)?;
    let name = current.metadata.name.clone();
    if let Some(other) = value.pointer("/metadata/name").and_then(Value::as_str)
        && other != name
    {
        return Err(ApiError::bad_request(format!(
            "metadata.name {other:?} differs from the URL's {name:?}; names cannot change"
        )));
    }
    let (mut metadata, spec) = check_body(kind, &value, &name)?;
    hub_owned_unchanged(&value, Some(&current.metadata))?;
    metadata.finalizers = current.metadata.finalizers.clone();
    metadata.owner_references = current.metadata.owner_references.clone();
    let spec = checked_spec(api.store.as_ref(), kind, &name, spec, Some(&current)).await?;
    super::uses::check(
        api.store.as_ref(),
        principal,
        kind,
        &spec,
        Some(&current.spec),
    )
    .await?;
    super::roles::check(
        api.store.as_ref(),
        principal,
        kind,
        &name,
        &spec,
        Some(&current.spec),
    )
    .await?;
    // As Cluster API's: machines made from a template are what it says, for good.
    if kind == Kind::MachineTemplate && spec != current.spec {
        return Err(ApiError::invalid(
            "spec: a MachineTemplate cannot change once created; create a new template and point the pool's template at it",
        ));
    }
    // What an object was made for is fixed: a host never moves to another cluster, a binding
    // never to another user, cluster or project. Make a new object instead.
    let before = crate::refs::referents(kind, &current.spec);
    let after = crate::refs::referents(kind, &spec);
    if let Some(changed) = after
        .iter()
        .chain(&before)
        .find(|r| !before.contains(r) || !after.contains(r))
    {
        return Err(ApiError::invalid(format!(
            "{}: cannot change once created (it names the {} this {} was made for); create a new {} instead",
            changed.field,
            changed.kind.name(),
            kind.name(),
            kind.name()
        )));
    }
    let object = Object {
        kind: kind.name().to_owned(),
        metadata,
        spec,
        // Status belongs to the hub's controllers.
        status: current.status.clone(),
    };
    // Moving an object (say, a host to another cluster) needs rights on both ends.
    allow(principal, Verb::Update, kind, &object)?;
    // As kube-apiserver: an update that changes nothing writes nothing (no new
    // resourceVersion, no watch event); a resourceVersion it names must still be the current one.
    let unchanged = object.spec == current.spec
        && object.metadata.labels == current.metadata.labels
        && object.metadata.annotations == current.metadata.annotations;
    let rv = &object.metadata.resource_version;
    if unchanged && (rv.is_empty() || *rv == current.metadata.resource_version) {
        return Ok(Json(present(kind, current)));
    }
    let updated = api.store.update(object).await?;
    Ok(Json(present(kind, updated)))
}

pub(super) async fn update(
    State(api): State<Api>,
    axum::extract::Path((plural, name)): PathKindName,
    headers: HeaderMap,
    body_result: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    let value = body(body_result)?;
    let current = super::readable(&api, &principal, kind, &name).await?;
    replace(&api, &principal, kind, current, value).await
}

pub(super) async fn patch(
    State(api): State<Api>,
    axum::extract::Path((plural, name)): PathKindName,
    headers: HeaderMap,
    body_result: JsonBody,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    let patch = body(body_result)?;
    // A patch that names a resourceVersion is refused if the object moved on; one that does
    // not applies to the object as it is, so a concurrent write (a controller's status, say)
    // makes it read again and re-apply, as kube-apiserver does, rather than fail with 409.
    let guarded = patch.pointer("/metadata/resourceVersion").is_some();
    let mut attempts = 0;
    loop {
        let current = super::readable(&api, &principal, kind, &name).await?;
        // Patch what the caller sees; the resourceVersion just read guards the write.
        let mut value =
            serde_json::to_value(&current).map_err(|e| ApiError::bad_request(e.to_string()))?;
        kind.redact_value(&mut value);
        kubeshape::patch::merge(&mut value, &patch);
        match replace(&api, &principal, kind, current, value).await {
            Err(e) if !guarded && e.reason == "Conflict" && attempts < PATCH_ATTEMPTS => {
                attempts += 1;
            }
            result => return result,
        }
    }
}

/// How often an unguarded patch is re-applied after losing a race to another writer.
const PATCH_ATTEMPTS: usize = 16;

pub(super) async fn delete(
    State(api): State<Api>,
    axum::extract::Path((plural, name)): PathKindName,
    params: Result<Query<DeleteParams>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let Query(params) = params.map_err(query_error)?;
    let kind = kind_of(&plural)?;
    let current = super::readable(&api, &principal, kind, &name).await?;
    allow(&principal, Verb::Delete, kind, &current)?;
    super::roles::check_delete(api.store.as_ref(), &principal, kind, &current).await?;
    if kind == Kind::CloudCredential {
        let (templates, _) = api
            .store
            .list(
                Kind::MachineTemplate.name(),
                &crate::store::LabelSelector::everything(),
            )
            .await?;
        if let Some(user) = templates
            .iter()
            .find(|t| t.spec.get("credential").and_then(Value::as_str) == Some(name.as_str()))
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "CloudCredential {name:?} is used by MachineTemplate {:?}; delete the templates that use it first",
                    user.metadata.name
                ),
            ));
        }
    }
    if params.force {
        if kind != Kind::Cluster {
            return Err(ApiError::bad_request(format!(
                "force applies to clusters only (a cluster whose hosts are gone), not to {}",
                kind.name()
            )));
        }
        // Said on the cluster first, so the planner's removal (this delete's, or one already
        // waiting on its hosts) stops waiting for them.
        let asked = format!("{} at {}", principal.user, crate::store::now_rfc3339());
        api.store
            .transact(vec![crate::store::Op::Modify {
                kind: kind.name().into(),
                name: name.clone(),
                change: crate::store::Modifier::new(move |c| {
                    c.metadata
                        .annotations
                        .insert(crate::model::REMOVE_ANYWAY.to_owned(), asked.clone());
                }),
            }])
            .await?;
    }
    let deleted = api
        .store
        .delete(kind.name(), &name, params.resource_version)
        .await?;
    Ok(Json(present(kind, deleted)))
}
