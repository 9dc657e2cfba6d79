//! Creating objects: one, or a list of them in one transaction, with what the answer shows
//! once (a new token's secret, a cluster's registration commands).

use std::collections::HashMap;

use axum::{
    Json,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Map, Value, json};

use super::{
    checks::{check_body, hub_owned_unchanged, set},
    spec::checked_spec,
};
use crate::{
    api::{Api, ApiError, allow, body::Body, kind_of, present},
    auth::{Principal, Verb, secret},
    model::{ClusterSpec, Kind},
    registration,
    store::{Object, Op, ReadOnce, Store, StoreError},
};

pub(in crate::api) async fn create(
    State(api): State<Api>,
    axum::extract::Path(plural): axum::extract::Path<String>,
    headers: HeaderMap,
    Body(body_result): Body,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    create_from(&api, &principal, kind, body_result?, false).await
}

/// Creates what `value` describes (one object, or a list of them) for the caller; a dry run
/// checks everything a creation does and answers what it would create, storing nothing.
pub(in crate::api) async fn create_from(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    mut value: Value,
    dry_run: bool,
) -> Result<Response, ApiError> {
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
        return create_all(api, principal, kind, items, &reads, dry_run).await;
    }
    let (mut ops, shown_once) = new_object(api, principal, kind, &value, &reads).await?;
    crate::refs::stamp_all(&reads, &mut ops).await?;
    let written = write(api, ops, dry_run).await?;
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
pub(in crate::api) const MAX_CREATED_AT_ONCE: usize = 1000;

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
    dry_run: bool,
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
        write(api, ops, dry_run).await?
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
            "apiVersion": crate::api::API_VERSION,
            "kind": format!("{}List", kind.name()),
            "metadata": {"resourceVersion": revision.to_string()},
            "items": created,
        })),
    )
        .into_response())
}

/// Commits what a creation writes, or (a dry run) only says what it would write: the
/// objects as given, without what the store would add (uid, resourceVersion, times).
async fn write(api: &Api, ops: Vec<Op>, dry_run: bool) -> Result<Vec<Object>, ApiError> {
    if !dry_run {
        return Ok(api.store.transact(ops).await?);
    }
    Ok(ops
        .into_iter()
        .filter_map(|op| match op {
            Op::Create(object) => Some(object),
            _ => None,
        })
        .collect())
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
    crate::api::uses::check(reads, principal, kind, &spec, None).await?;
    crate::api::roles::check(reads, principal, kind, &name, &spec, None).await?;
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
        // And a hosted one with the cloud's: nothing is made there before it is on.
        if object.spec.get("type").and_then(Value::as_str) == Some("hosted") {
            object
                .metadata
                .finalizers
                .push(crate::model::HOSTED_FINALIZER.to_owned());
        }
    }

    match kind {
        Kind::Cluster => {
            // A new cluster comes with its first registration token and commands.
            let cluster: ClusterSpec = serde_json::from_value(object.spec.clone())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            let token = secret::new_token(secret::TokenKind::Registration);
            also.push(Op::Create(registration::token_object(&name, &token)));
            // Who may create clusters without being an admin owns what they create.
            also.extend(crate::api::roles::creator_owns(principal, &name).map(Op::Create));
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
