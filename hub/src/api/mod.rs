//! The REST API under `/v1/`: list, get, create, update, patch, delete and watch for every
//! kind, login and logout. Every request is authenticated and authorised before it touches the
//! store, and secrets never leave it (only hashes are stored; values are shown once).

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    auth::{self, Principal, Verb, authorize},
    model::{Kind, Status, derive_state},
    store::{LabelSelector, Object},
};

mod body;
pub mod device;
pub mod error;
pub mod kube;
mod kubeconfig;
mod login;
mod objects;
pub mod openapi;
pub mod paging;
pub(crate) mod recordings;
mod roles;
mod sso;
pub mod state;
mod uses;
mod watch;
mod webhook;

pub use device::{DeviceLoginRequest, DevicePoll};
pub use error::ApiError;
pub use login::{LoginRequest, ProviderTest, form_login};
pub use objects::check_body;
pub use state::Api;

/// The API's version in `apiVersion`: the hub's kinds are one Kubernetes API group, which
/// kubectl reaches at `/apis/management.drover.io/v1` (see `crate::kube`) and roles name.
pub const API_VERSION: &str = "management.drover.io/v1";

/// What objects were written as before the group had its Kubernetes name; still taken.
pub const OLD_API_VERSION: &str = "drover.io/v1";

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/login", post(login::login))
        .route("/v1/login/providers", get(login::login_providers))
        .route("/v1/login/{provider}/start", get(sso::start))
        .route("/v1/login/{provider}/device", post(device::start))
        .route("/v1/login/device/token", post(device::poll))
        .route("/v1/login/{provider}/callback", get(sso::callback))
        .route("/v1/logout", post(login::logout))
        .route("/v1/authproviders/{name}/test", post(login::test_provider))
        .route("/v1/me", get(me))
        .route("/v1/audit", get(audit_log))
        .route("/v1/openapi.json", get(openapi_document))
        .route("/v1/clusters/{name}/kubeconfig", post(kubeconfig::create))
        .route("/v1/kubeconfig", post(kubeconfig::hub))
        .route(
            "/v1/gitrepos/{name}/webhook",
            post(webhook::gitrepo_webhook),
        )
        .route("/v1/recordings", get(recordings::list))
        .route("/v1/recordings/{id}", get(recordings::one))
        .route("/v1/recordings/{id}/cast", get(recordings::cast))
        .route(
            "/v1/{plural}",
            get(objects::list_or_watch).post(objects::create),
        )
        .route(
            "/v1/{plural}/{name}",
            get(objects::get_one)
                .put(objects::update)
                .patch(objects::patch)
                .delete(objects::delete),
        )
        .with_state(api)
}

impl Api {
    /// The caller, or 401 with what to do.
    pub async fn principal(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
        Ok(Principal::clone(&*self.shared_principal(headers).await?))
    }

    /// As [`Api::principal`], shared rather than copied (the proxy's hot path only reads it).
    pub async fn shared_principal(
        &self,
        headers: &HeaderMap,
    ) -> Result<std::sync::Arc<Principal>, ApiError> {
        let Some(value) = auth::credential(headers) else {
            return Err(ApiError::unauthorized(UNAUTHENTICATED));
        };
        let principal = self.known.shared(self.store.as_ref(), value).await?;
        crate::audit::note_principal(&principal);
        Ok(principal)
    }
}

/// What a request without a credential is told.
const UNAUTHENTICATED: &str = "log in first: send Authorization: Bearer <API token> (drover-hub login prints one), \
     or use the dashboard's session";

/// `GET /v1/audit?user=&cluster=&since=&limit=`: the audit log's records, oldest first (the
/// newest `limit`, 1,000 by default), for admins.
async fn audit_log(
    State(api): State<Api>,
    headers: HeaderMap,
    query: Result<
        axum::extract::Query<crate::audit::AuditQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    if !principal.may_hub("get", "audit") {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} may not read the audit log: that is for admins, or a global role that allows get audit ({})",
                principal.user,
                crate::model::HUB_GROUP
            ),
        ));
    }
    let axum::extract::Query(query) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; ask with user=, cluster=, since= (RFC 3339) and limit="
        ))
    })?;
    let Some(path) = api.audit.path().map(std::path::Path::to_owned) else {
        return Err(ApiError::not_found(
            "this hub keeps no audit log (it was started with --audit-log off)",
        ));
    };
    let keep = api.audit_keep;
    // Everything answered before this request is in the file before it is read.
    api.audit.flushed().await;
    let records = tokio::task::spawn_blocking(move || crate::audit::read(&path, keep, &query))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => ApiError::bad_request(e.to_string()),
            _ => ApiError::internal(format!("cannot read the audit log: {e}")),
        })?;
    Ok(Json(
        json!({"kind": "AuditRecordList", "apiVersion": API_VERSION, "items": records}),
    ))
}

/// The kind a path segment names, or 404 listing the kinds there are.
pub fn kind_of(plural: &str) -> Result<Kind, ApiError> {
    Kind::from_plural(plural).ok_or_else(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.plural()).collect();
        ApiError::not_found(format!(
            "no kind {plural:?} here; the API serves /v1/{{{}}}",
            known.join(",")
        ))
    })
}

/// An object as the API shows it: secrets removed, `apiVersion` and the derived `state` added.
pub fn present(kind: Kind, mut object: Object) -> Value {
    // A plan's identity, as the agent computes it, so "applied?" is one comparison with
    // `status.appliedChecksum`: of the plan as the host has it, secret files and all.
    let checksum = (kind == Kind::Plan)
        .then(|| crate::model::parse_plan(object.spec.get("plan").unwrap_or(&Value::Null)).ok())
        .flatten()
        .map(|plan| proto::plan::v1::checksum(&plan));
    kind.redact(&mut object);
    let status = Status::of(&object);
    let state = derive_state(kind, &object.metadata, &status, &object.spec);
    let mut status = if object.status.is_null() {
        json!({})
    } else {
        object.status
    };
    if let (Some(checksum), Value::Object(fields)) = (checksum, &mut status) {
        fields.insert("planChecksum".into(), json!(checksum));
    }
    ready_condition(&mut status, &state);
    json!({
        "apiVersion": API_VERSION,
        "kind": object.kind,
        "metadata": object.metadata,
        "spec": object.spec,
        "status": status,
        "state": state,
    })
}

/// Adds a `Ready` condition that says whether the state is `active` (unless the object keeps
/// one of its own), so `kubectl wait --for=condition=Ready` waits on any kind as on a Pod.
fn ready_condition(status: &mut Value, state: &crate::model::State) {
    let Value::Object(fields) = status else {
        return;
    };
    let conditions = fields.entry("conditions").or_insert_with(|| json!([]));
    let Value::Array(conditions) = conditions else {
        return;
    };
    if conditions.iter().any(|c| c["type"] == "Ready") {
        return;
    }
    let active = state.state == "active";
    let mut reason: String = state.state.clone();
    if let Some(first) = reason.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    let mut ready = json!({
        "type": "Ready",
        "status": if active { "True" } else { "False" },
        "reason": reason,
    });
    if !state.message.is_empty() {
        ready["message"] = json!(state.message);
    }
    conditions.push(ready);
}

/// The object the caller names, if they may read it. One they may not read is "not found",
/// exactly as one that does not exist: the answer tells nothing about what exists.
pub async fn readable(
    api: &Api,
    principal: &Principal,
    kind: Kind,
    name: &str,
) -> Result<Object, ApiError> {
    let object = api.store.get(kind.name(), name).await?;
    if allow(principal, Verb::Get, kind, &object).is_err() {
        return Err(crate::store::StoreError::NotFound {
            kind: kind.name().to_owned(),
            name: name.to_owned(),
        }
        .into());
    }
    Ok(object)
}

/// Checks one object against the caller's rights.
pub fn allow(
    principal: &Principal,
    verb: Verb,
    kind: Kind,
    object: &Object,
) -> Result<(), ApiError> {
    Ok(authorize(principal, verb, kind, object)?)
}

async fn openapi_document() -> Json<Value> {
    static DOCUMENT: std::sync::LazyLock<Value> = std::sync::LazyLock::new(openapi::document);
    Json(DOCUMENT.clone())
}

async fn me(State(api): State<Api>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let p = api.principal(&headers).await?;
    let templates =
        |access: &crate::auth::Access| access.templates.iter().cloned().collect::<Vec<_>>();
    let clusters: serde_json::Map<String, Value> = p
        .clusters
        .iter()
        .map(|(c, a)| (c.clone(), json!(templates(a))))
        .collect();
    let projects: serde_json::Map<String, Value> = p
        .projects
        .iter()
        .map(|(name, (c, a))| {
            (
                name.clone(),
                json!({"cluster": c, "roleTemplates": templates(a)}),
            )
        })
        .collect();
    Ok(Json(json!({
        "user": p.user,
        "admin": p.admin,
        "clusters": clusters,
        "projects": projects,
        "everyCluster": templates(&p.everywhere),
    })))
}

/// Query parameters of list and watch.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    #[serde(default)]
    pub label_selector: Option<String>,
    #[serde(default)]
    pub watch: Option<bool>,
    #[serde(default)]
    pub resource_version: Option<String>,
    /// At most this many items (0 or absent: all); the rest in later pages.
    #[serde(default)]
    pub limit: Option<usize>,
    /// Where a page starts: the `metadata.continue` of the page before.
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
    /// `metadata.name=NAME` (or `!=`), as kubectl's `wait` and `delete --wait` ask.
    #[serde(default)]
    pub field_selector: Option<String>,
}

impl ListParams {
    pub fn selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    pub fn fields(&self) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(self.field_selector.as_deref().unwrap_or(""))
    }

    pub fn revision(&self) -> Result<Option<u64>, ApiError> {
        match self.resource_version.as_deref() {
            None | Some("") | Some("0") => Ok(None),
            Some(rv) => rv.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("resourceVersion {rv:?} is not a number"))
            }),
        }
    }
}

/// A field selector on the fields every hub object has: `metadata.name` (`=`, `==` or `!=`),
/// and `metadata.namespace`, which is empty for all of them (they belong to no namespace).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    /// (field, equal?, value), all of which must hold.
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(text: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "fieldSelector: {term:?} is not field=value or field!=value"
                )));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace") {
                return Err(ApiError::bad_request(format!(
                    "fieldSelector: {field:?} is not a field label the hub selects on; use metadata.name (hub objects belong to no namespace)"
                )));
            }
            terms.push((field.to_owned(), equal, value.trim().to_owned()));
        }
        Ok(FieldSelector { terms })
    }

    /// Whether an object named `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            let actual = if field == "metadata.name" { name } else { "" };
            (actual == value) == *equal
        })
    }
}

/// Parameters of delete.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteParams {
    #[serde(default)]
    pub resource_version: Option<u64>,
    /// A cluster only: removed without waiting for its hosts to uninstall (they are gone).
    #[serde(default)]
    pub force: bool,
    /// `All`: everything a deletion checks, and nothing deleted.
    #[serde(default)]
    pub dry_run: Option<String>,
}

pub(crate) type PathKindName = Path<(String, String)>;
pub(crate) type QueryList = Query<ListParams>;

/// Where to go after signing in: `next` if it is a path on this hub, else the clusters page.
/// The one check for every place that sends a browser on (the login page's script, its
/// no-script form, a provider's callback). A browser reads `\\` as `/` and drops tabs and
/// newlines from a URL, so `/\\evil.example` and `/<TAB>/evil.example` would leave the hub:
/// only a path of visible ASCII that stays a path once percent-decoded passes.
pub fn next_path(next: Option<&str>) -> String {
    next.filter(|n| same_origin_path(n))
        .unwrap_or("/clusters")
        .to_owned()
}

fn same_origin_path(next: &str) -> bool {
    let plain = |text: &str| {
        text.starts_with('/')
            && !text.starts_with("//")
            && !text.contains('\\')
            && !text.chars().any(|c| c.is_control() || c.is_whitespace())
    };
    // As a browser may decode it once more; a bad escape is no path of ours.
    let decoded = tunnel::percent_decode(next);
    next.len() <= 512
        && next.chars().all(|c| c.is_ascii_graphic())
        && plain(next)
        && decoded.is_some_and(|d| plain(&d))
}

#[cfg(test)]
mod tests;
