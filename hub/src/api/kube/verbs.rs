//! kubectl's verbs on `/apis/management.drover.io/v1/{plural}[/{name}]`: each answered by the
//! same code as `/v1` (rights, validation, secrets), with what Kubernetes clients add: Tables,
//! field selectors, streamed watches, the patch formats, server-side apply and the field
//! ownership it keeps.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    fields::{Validation, check_fields, with_warnings},
    table::{Include, table},
};
use crate::{
    api::{Api, ApiError, DeleteParams, ListParams, kind_of, objects, present, readable},
    model::Kind,
};

type QueryRejection = axum::extract::rejection::QueryRejection;

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::bad_request(format!("query parameters: {}", e.body_text()))
}

/// A boolean query parameter in every spelling kube-apiserver takes (Go's `ParseBool`:
/// `watch=1`, `watch=true`, `watch=T`, …).
fn flag<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let text = String::deserialize(d)?;
    match text.as_str() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Some(true)),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(Some(false)),
        _ => Err(serde::de::Error::custom(format!(
            "{text:?} is not a boolean: write true or false"
        ))),
    }
}

/// The query of a list or watch, as Kubernetes clients send it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListQuery {
    label_selector: Option<String>,
    field_selector: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    watch: Option<bool>,
    resource_version: Option<String>,
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    allow_watch_bookmarks: Option<bool>,
    timeout_seconds: Option<u64>,
    include_object: Option<String>,
}

impl ListQuery {
    fn list_params(&self) -> ListParams {
        ListParams {
            label_selector: self.label_selector.clone(),
            watch: self.watch,
            resource_version: self.resource_version.clone(),
            limit: self.limit,
            continue_token: self.continue_token.clone(),
            field_selector: self.field_selector.clone(),
        }
    }
}

/// The query of a write.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WriteQuery {
    dry_run: Option<String>,
    field_validation: Option<String>,
    field_manager: Option<String>,
    #[serde(default, deserialize_with = "flag")]
    force: Option<bool>,
}

impl WriteQuery {
    /// Whether this is a dry run (`dryRun=All`): every check a write makes, nothing stored.
    fn dry_run(&self) -> Result<bool, ApiError> {
        dry_run_of(self.dry_run.as_deref())
    }

    /// Who this write is recorded as, as kube-apiserver names a field manager.
    fn manager(&self, headers: &HeaderMap) -> String {
        let agent = headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok());
        kubeshape::apply::manager_of(self.field_manager.as_deref(), agent)
    }

    /// What to do about spec fields the kind does not know; kube-apiserver's default is Warn.
    fn validation(&self) -> Result<Validation, ApiError> {
        match self.field_validation.as_deref() {
            Some("Strict") => Ok(Validation::Strict),
            None | Some("" | "Warn") => Ok(Validation::Warn),
            Some("Ignore") => Ok(Validation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation {other:?}: use Strict, Warn or Ignore"
            ))),
        }
    }
}

fn dry_run_of(value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "dryRun {other:?}: the only dry run is All"
        ))),
    }
}

fn now() -> String {
    crate::store::now_rfc3339()
}

fn answer(code: StatusCode, value: Value) -> Response {
    (code, Json(value)).into_response()
}

/// `GET …/{plural}`: a list (a Table when asked), or a watch.
pub(super) async fn list(
    State(api): State<Api>,
    Path(plural): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    crate::auth::may_list(&principal, kind)?;
    let params = query.list_params();
    let include = Include::parse(query.include_object.as_deref())?;
    let as_table = super::wants_table(&headers);
    if query.watch.unwrap_or(false) {
        return super::watch::serve(
            api,
            principal,
            kind,
            super::watch::Options {
                labels: params.selector()?,
                fields: params.fields()?,
                from: params.revision()?,
                bookmarks: query.allow_watch_bookmarks.unwrap_or(false),
                timeout: query.timeout_seconds,
                table: as_table.then_some(include),
            },
        )
        .await;
    }
    let mut list = objects::list(&api, &principal, kind, &params).await?;
    if !as_table {
        return Ok(Json(list).into_response());
    }
    let items = match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let metadata = list
        .get_mut("metadata")
        .map(Value::take)
        .unwrap_or_default();
    Ok(Json(table(kind, items, metadata, include, true)).into_response())
}

/// `GET …/{plural}/{name}`.
pub(super) async fn get(
    State(api): State<Api>,
    Path((plural, name)): Path<(String, String)>,
    query: Result<Query<ListQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let principal = api.principal(&headers).await?;
    let kind = kind_of(&plural)?;
    let object = present(kind, readable(&api, &principal, kind, &name).await?);
    if !super::wants_table(&headers) {
        return Ok(Json(object).into_response());
    }
    let include = Include::parse(query.include_object.as_deref())?;
    let metadata = json!({"resourceVersion": object["metadata"]["resourceVersion"]});
    Ok(Json(table(kind, vec![object], metadata, include, true)).into_response())
}

/// A write's body: JSON, or YAML (as server-side apply sends it).
fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("request body: it must be UTF-8"))?;
    let value: Value = if content_type(headers).contains("yaml") {
        serde_saphyr::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?
    } else {
        serde_json::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("request body: {e}")))?
    };
    if !value.is_object() && !value.is_array() {
        return Err(ApiError::bad_request(
            "the body must be an object with metadata and spec",
        ));
    }
    Ok(value)
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.split(';').next())
        .map(str::trim)
        .unwrap_or("application/json")
}

/// What every write starts from: its query checked, the caller, the kind, the body and who
/// the write is recorded as.
struct Write {
    principal: crate::auth::Principal,
    kind: Kind,
    body: Value,
    manager: String,
    force: bool,
    dry_run: bool,
    validation: Validation,
}

async fn write(
    api: &Api,
    plural: &str,
    query: Result<Query<WriteQuery>, QueryRejection>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Write, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let dry_run = query.dry_run()?;
    let principal = api.principal(headers).await?;
    let kind = kind_of(plural)?;
    Ok(Write {
        dry_run,
        validation: query.validation()?,
        principal,
        kind,
        body: parse_body(headers, body)?,
        manager: query.manager(headers),
        force: query.force.unwrap_or(false),
    })
}

/// `POST …/{plural}`.
pub(super) async fn create(
    State(api): State<Api>,
    Path(plural): Path<String>,
    query: Result<Query<WriteQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Write {
        principal,
        kind,
        body: mut value,
        manager,
        dry_run,
        validation,
        ..
    } = write(&api, &plural, query, &headers, &body).await?;
    let warnings = check_fields(kind, &value, validation)?;
    if value.get("kind").and_then(Value::as_str) == Some(kind.name()) {
        kubeshape::apply::record_update(None, &mut value, &manager, &now());
    }
    let created = objects::create_from(&api, &principal, kind, value, dry_run).await?;
    Ok(with_warnings(created, &warnings))
}

/// `PUT …/{plural}/{name}` (`kubectl replace`): the whole object, as read and changed.
pub(super) async fn update(
    State(api): State<Api>,
    Path((plural, name)): Path<(String, String)>,
    query: Result<Query<WriteQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Write {
        principal,
        kind,
        body,
        manager,
        dry_run,
        validation,
        ..
    } = write(&api, &plural, query, &headers, &body).await?;
    let warnings = check_fields(kind, &body, validation)?;
    let guarded = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty());
    let Json(updated) =
        objects::change(&api, &principal, kind, &name, guarded, dry_run, |object| {
            let before = std::mem::replace(object, body.clone());
            kubeshape::apply::record_update(Some(&before), object, &manager, &now());
            Ok(())
        })
        .await?;
    Ok(with_warnings(answer(StatusCode::OK, updated), &warnings))
}

/// The patch formats Kubernetes clients send, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchType {
    Merge,
    Strategic,
    Json,
    Apply,
}

fn patch_type(headers: &HeaderMap) -> Result<PatchType, ApiError> {
    match content_type(headers) {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({other}); accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
            ),
        )),
    }
}

/// `PATCH …/{plural}/{name}`: a merge, strategic merge or JSON patch, or a server-side apply.
pub(super) async fn patch(
    State(api): State<Api>,
    Path((plural, name)): Path<(String, String)>,
    query: Result<Query<WriteQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let kind_of_patch = patch_type(&headers)?;
    let Write {
        principal,
        kind,
        body,
        manager,
        force,
        dry_run,
        validation,
    } = write(&api, &plural, query, &headers, &body).await?;
    if kind_of_patch == PatchType::Apply {
        let applier = Applier {
            manager: &manager,
            force,
            dry_run,
            validation,
        };
        return apply(&api, &principal, kind, &name, body, applier).await;
    }
    let guarded = body.pointer("/metadata/resourceVersion").is_some();
    // The object as patched is checked (a patch alone is no whole spec).
    let warnings = std::sync::Mutex::new(Vec::new());
    let Json(patched) =
        objects::change(&api, &principal, kind, &name, guarded, dry_run, |object| {
            let before = object.clone();
            match kind_of_patch {
                PatchType::Merge => kubeshape::patch::merge(object, &body),
                PatchType::Strategic => kubeshape::patch::strategic(object, &body),
                PatchType::Json => kubeshape::patch::json_patch(object, &body)
                    .map_err(|e| ApiError::invalid(format!("the JSON patch: {e}")))?,
                PatchType::Apply => {}
            }
            *lock(&warnings) = check_fields(kind, object, validation)?;
            kubeshape::apply::record_update(Some(&before), object, &manager, &now());
            Ok(())
        })
        .await?;
    let warnings = lock(&warnings).clone();
    Ok(with_warnings(answer(StatusCode::OK, patched), &warnings))
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Who applies, whether over others' fields, whether for real, and how its fields are checked.
struct Applier<'a> {
    manager: &'a str,
    force: bool,
    dry_run: bool,
    validation: Validation,
}

/// Server-side apply: `config` as `manager`'s whole intent for the object. What another
/// manager set to a different value is a conflict unless forced; what this manager applied
/// before and leaves out now is removed. An object that does not exist is created.
async fn apply(
    api: &Api,
    principal: &crate::auth::Principal,
    kind: Kind,
    name: &str,
    config: Value,
    applier: Applier<'_>,
) -> Result<Response, ApiError> {
    let Applier {
        manager,
        force,
        dry_run,
        validation,
    } = applier;
    if config
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| n != name)
    {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let mut config = config;
    config["metadata"]["name"] = json!(name);
    let exists = match readable(api, principal, kind, name).await {
        Ok(_) => true,
        Err(e) if e.code == StatusCode::NOT_FOUND => false,
        Err(e) => return Err(e),
    };
    if !exists {
        let created = kubeshape::apply::apply(None, &config, manager, force, &now())
            .map_err(|conflicts| conflict(&conflicts))?;
        let warnings = check_fields(kind, &created, validation)?;
        let created = objects::create_from(api, principal, kind, created, dry_run).await?;
        return Ok(with_warnings(created, &warnings));
    }
    let warnings = std::sync::Mutex::new(Vec::new());
    let Json(applied) = objects::change(api, principal, kind, name, false, dry_run, |live| {
        *live = kubeshape::apply::apply(Some(live), &config, manager, force, &now())
            .map_err(|conflicts| conflict(&conflicts))?;
        *lock(&warnings) = check_fields(kind, live, validation)?;
        Ok(())
    })
    .await?;
    let warnings = lock(&warnings).clone();
    Ok(with_warnings(answer(StatusCode::OK, applied), &warnings))
}

/// 409 as kube-apiserver refuses an apply over another manager's fields (kubectl prints the
/// message, which names each field and its manager).
fn conflict(conflicts: &[kubeshape::apply::Conflict]) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        kubeshape::apply::conflict_message(conflicts),
    )
}

/// `DELETE …/{plural}/{name}`: the object as it is then (kept with a deletion timestamp while
/// the hub's clean-up runs, which `kubectl delete --wait` waits out by watching).
pub(super) async fn delete(
    State(api): State<Api>,
    Path((plural, name)): Path<(String, String)>,
    query: Result<Query<WriteQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    // DeleteOptions in the body: a dry run, preconditions on the resourceVersion; propagation
    // is the hub's own (what an object brings goes with it).
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("DeleteOptions: {e}")))?
    };
    let in_body = options
        .get("dryRun")
        .and_then(Value::as_array)
        .and_then(|d| d.first())
        .and_then(Value::as_str);
    let dry_run = query.dry_run()? || dry_run_of(in_body)?;
    let resource_version = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        .map(|rv| {
            rv.parse().map_err(|_| {
                ApiError::bad_request(format!(
                    "preconditions.resourceVersion {rv:?} is not a number"
                ))
            })
        })
        .transpose()?;
    let Json(deleted) = objects::delete(
        State(api),
        Path((plural, name)),
        Ok(Query(DeleteParams {
            resource_version,
            force: false,
            dry_run: dry_run.then(|| "All".to_owned()),
        })),
        headers,
    )
    .await?;
    Ok(answer(StatusCode::OK, deleted))
}
