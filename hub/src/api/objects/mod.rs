//! The generic verbs on `/v1/{plural}[/{name}]`, with each kind's own rules on the way in.

mod checks;
mod create;
mod spec;

pub use checks::check_body;
use checks::hub_owned_unchanged;

pub(super) use create::{MAX_CREATED_AT_ONCE, create, create_from};
use spec::checked_spec;

use axum::{
    Json,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{
    Api, ApiError, DeleteParams, PathKindName, QueryList, allow,
    body::{JsonBody, body},
    kind_of, present, watch,
};
use crate::{
    auth::{Principal, Verb},
    model::Kind,
    store::Object,
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
    if params.watch.unwrap_or(false) {
        let selector = params.selector()?;
        let revision = params.revision()?;
        return watch::serve(api, principal, kind, selector, revision).await;
    }
    Ok(Json(list(&api, &principal, kind, &params).await?).into_response())
}

/// One page of the objects of `kind` the caller may read (the caller may list the kind), as
/// the API shows a list.
pub(in crate::api) async fn list(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    params: &super::ListParams,
) -> Result<Value, ApiError> {
    let selector = params.selector()?;
    let fields = params.fields()?;
    let start = super::paging::start(params.continue_token.as_deref())?;
    let (objects, revision) = api.store.list(kind.name(), &selector).await?;
    let readable: Vec<Object> = objects
        .into_iter()
        .filter(|o| fields.matches(&o.metadata.name))
        .filter(|o| allow(principal, Verb::List, kind, o).is_ok())
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
    Ok(json!({
        "apiVersion": super::API_VERSION,
        "kind": format!("{}List", kind.name()),
        "metadata": metadata,
        "items": items,
    }))
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

/// Replaces `current` with what `value` describes (metadata the caller may set, and spec); a
/// dry run checks all the same and answers what it would store.
pub(in crate::api) async fn replace(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    current: Object,
    value: Value,
    dry_run: bool,
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
    // Who set which fields stays as it was unless the writer says (as Kubernetes clients do).
    if value.pointer("/metadata/managedFields").is_none() {
        metadata
            .managed_fields
            .clone_from(&current.metadata.managed_fields);
    }
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
    if kind == Kind::Cluster
        && let (Ok(before), Ok(after)) = (
            serde_json::from_value::<crate::model::ClusterSpec>(current.spec.clone()),
            serde_json::from_value::<crate::model::ClusterSpec>(spec.clone()),
        )
    {
        crate::model::validate_hosted_change(&before, &after).map_err(ApiError::invalid)?;
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
        && object.metadata.annotations == current.metadata.annotations
        && same_owners(
            &object.metadata.managed_fields,
            &current.metadata.managed_fields,
        );
    let rv = &object.metadata.resource_version;
    if unchanged && (rv.is_empty() || *rv == current.metadata.resource_version) {
        return Ok(Json(present(kind, current)));
    }
    if dry_run {
        return Ok(Json(present(kind, object)));
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
    replace(&api, &principal, kind, current, value, false).await
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
    let guarded = patch.pointer("/metadata/resourceVersion").is_some();
    change(&api, &principal, kind, &name, guarded, false, |object| {
        kubeshape::patch::merge(object, &patch);
        Ok(())
    })
    .await
}

/// Changes the object the caller names as `edit` changes what the caller sees of it (secrets
/// left out, which the write keeps), and writes the result as an update.
///
/// A change that names a resourceVersion (`guarded`) is refused if the object moved on; one
/// that does not applies to the object as it is, so a concurrent write (a controller's status,
/// say) makes it read again and re-apply, as kube-apiserver does, rather than fail with 409.
pub(in crate::api) async fn change(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    name: &str,
    guarded: bool,
    dry_run: bool,
    edit: impl Fn(&mut Value) -> Result<(), ApiError>,
) -> Result<Json<Value>, ApiError> {
    let mut attempts = 0;
    loop {
        let current = super::readable(api, principal, kind, name).await?;
        // Patch what the caller sees; the resourceVersion just read guards the write.
        let mut value =
            serde_json::to_value(&current).map_err(|e| ApiError::bad_request(e.to_string()))?;
        kind.redact_value(&mut value);
        if let Value::Object(map) = &mut value {
            map.insert("apiVersion".into(), json!(super::API_VERSION));
        }
        edit(&mut value)?;
        match replace(api, principal, kind, current, value, dry_run).await {
            Err(e) if !guarded && e.reason == "Conflict" && attempts < PATCH_ATTEMPTS => {
                attempts += 1;
            }
            result => return result,
        }
    }
}

/// Whether two sets of managed-field entries name the same managers and fields (when each was
/// last written aside: an apply that changes nothing writes nothing, as in kube-apiserver).
fn same_owners(a: &[Value], b: &[Value]) -> bool {
    let timeless = |entries: &[Value]| -> Vec<Value> {
        entries
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if let Value::Object(map) = &mut e {
                    map.remove("time");
                }
                e
            })
            .collect()
    };
    timeless(a) == timeless(b)
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
    if params.dry_run.as_deref().is_some_and(|d| !d.is_empty()) {
        return Ok(Json(present(kind, current)));
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
