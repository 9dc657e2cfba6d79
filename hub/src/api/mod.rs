//! The REST API under `/v1/`: list, get, create, update, patch, delete and watch for every
//! kind, login and logout. Every request is authenticated and authorised before it touches the
//! store, and secrets never leave it (only hashes are stored; values are shown once).

use std::net::IpAddr;

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    auth::{self, Principal, Verb, authorize, secret},
    model::{Kind, Status, derive_state},
    store::{LabelSelector, Object},
};

pub mod error;
mod kubeconfig;
mod objects;
pub mod openapi;
pub mod state;
mod watch;

pub use error::ApiError;
pub use objects::check_body;
pub use state::Api;

/// The API's version in `apiVersion`.
pub const API_VERSION: &str = "drover.io/v1";

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/v1/login", post(login))
        .route("/v1/logout", post(logout))
        .route("/v1/me", get(me))
        .route("/v1/audit", get(audit_log))
        .route("/v1/openapi.json", get(openapi_document))
        .route("/v1/clusters/{name}/kubeconfig", post(kubeconfig::create))
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
        let Some(value) = auth::credential(headers) else {
            return Err(ApiError::unauthorized(
                "log in first: send Authorization: Bearer <API token> (drover-hub login prints one), \
                 or use the dashboard's session",
            ));
        };
        let principal = self.known.principal(self.store.as_ref(), value).await?;
        crate::audit::note_caller(&principal.user, &principal.groups);
        Ok(principal)
    }
}

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
    if !principal.admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} may not read the audit log: that is for admins",
                principal.user
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
    kind.redact(&mut object);
    let status = Status::of(&object);
    let state = derive_state(kind, &object.metadata, &status, &object.spec);
    let mut status = if object.status.is_null() {
        json!({})
    } else {
        object.status
    };
    // A plan's identity, as the agent computes it, so "applied?" is one comparison with
    // `status.appliedChecksum`.
    if kind == Kind::Plan
        && let (Ok(plan), Value::Object(fields)) = (
            crate::model::parse_plan(object.spec.get("plan").unwrap_or(&Value::Null)),
            &mut status,
        )
    {
        fields.insert(
            "planChecksum".into(),
            json!(proto::plan::v1::checksum(&plan)),
        );
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": object.kind,
        "metadata": object.metadata,
        "spec": object.spec,
        "status": status,
        "state": state,
    })
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

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    // Debug is written by hand below: the password never reaches a log.
    pub username: String,
    pub password: String,
    /// `true` (default) for a dashboard session (cookie; setting `session-ttl`, 16 h unless
    /// set); `false` for an API token for scripts and the CLI (`api-token-max-ttl`, 30 days).
    #[serde(default = "yes")]
    pub session: Option<bool>,
    #[serde(default)]
    pub description: Option<String>,
    /// The client logging in (the CLI sends an id of its own): the user's earlier API token
    /// from the same client is revoked by this login.
    #[serde(default)]
    pub client: Option<String>,
}

impl std::fmt::Debug for LoginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginRequest")
            .field("username", &self.username)
            .field("session", &self.session)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

fn yes() -> Option<bool> {
    Some(true)
}

async fn login(
    State(api): State<Api>,
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    body: Result<Json<LoginRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(request) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "login body: {e}; send {{\"username\", \"password\"}}"
        ))
    })?;
    let addr: Option<IpAddr> = remote.map(|r| r.0.0.ip());
    crate::audit::note_login(&request.username);
    if let Err(wait) = api.limiter.check(&request.username, addr) {
        let mut err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!(
                "too many failed logins; try again in {} s",
                wait.as_secs() + 1
            ),
        );
        err.retry_after = Some(wait.as_secs() + 1);
        return Err(err);
    }
    let refused = || ApiError::unauthorized("wrong username or password");
    let user = match api.store.get(Kind::User.name(), &request.username).await {
        Ok(user) => Some(user),
        Err(crate::store::StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let hash = user
        .as_ref()
        .and_then(|u| u.spec.get("passwordHash"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        // Hash something anyway, so a missing user takes as long as a wrong password.
        .unwrap_or_else(|| "$argon2id$v=19$m=19456,t=2,p=1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into());
    let password = request.password.clone();
    let ok = tokio::task::spawn_blocking(move || secret::verify_password(&password, &hash))
        .await
        .unwrap_or(false);
    let disabled = user
        .as_ref()
        .and_then(|u| u.spec.get("disabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !ok || user.is_none() || disabled {
        api.limiter.failed(&request.username, addr);
        tracing::info!(user = %request.username, addr = ?addr, "failed login");
        return Err(refused());
    }
    api.limiter.succeeded(&request.username);
    let session = request.session.unwrap_or(true);
    let lifetimes = auth::lifetimes::read(api.store.as_ref()).await?;
    let lifetime = if session {
        lifetimes.session
    } else {
        lifetimes.api_max
    };
    let expires_at = auth::lifetimes::expiry(lifetime);
    let client = request
        .client
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty() && !session)
        .map(str::to_owned);
    if client.as_ref().is_some_and(|c| c.len() > 128) {
        return Err(ApiError::bad_request(
            "client: at most 128 characters (the CLI sends an id of its own)",
        ));
    }
    let token = secret::new_token(secret::TokenKind::Token);
    let description = request.description.unwrap_or_else(|| {
        if session {
            "dashboard session"
        } else {
            "API token from login"
        }
        .to_owned()
    });
    let mut object = Object::new(
        Kind::Token.name(),
        &token.name,
        json!({
            "user": request.username,
            "description": description,
            "session": session,
            "expiresAt": expires_at,
            "client": client.clone().unwrap_or_default(),
            "secretHash": token.hash,
        }),
    );
    object.metadata.labels.insert(
        auth::lifetimes::USER_LABEL.to_owned(),
        request.username.clone(),
    );
    let mut ops = vec![crate::store::Op::Create(object)];
    // A new login from the same client replaces that client's earlier token, in the same
    // write: a user who logs in again does not leave the old token valid.
    if let Some(client) = &client {
        let selector = crate::store::LabelSelector::parse(&format!(
            "{}={}",
            auth::lifetimes::USER_LABEL,
            request.username
        ))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let (tokens, _) = api.store.list(Kind::Token.name(), &selector).await?;
        for old in tokens {
            let same_user = old.spec.get("user").and_then(Value::as_str) == Some(&request.username);
            let same_client = old.spec.get("client").and_then(Value::as_str) == Some(client);
            if same_user && same_client {
                ops.push(crate::store::Op::Delete {
                    kind: Kind::Token.name().to_owned(),
                    name: old.metadata.name,
                    resource_version: old.metadata.resource_version.parse().ok(),
                });
            }
        }
    }
    crate::refs::stamp_all(api.store.as_ref(), &mut ops).await?;
    api.store.transact(ops).await?;
    let mut response = Json(json!({
        "token": token.value,
        "expiresAt": expires_at,
        "user": request.username,
    }))
    .into_response();
    if session {
        let cookie = format!(
            "{}={}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
            auth::SESSION_COOKIE,
            token.value,
            lifetime.whole_seconds()
        );
        if let Ok(value) = cookie.parse() {
            response
                .headers_mut()
                .insert(axum::http::header::SET_COOKIE, value);
        }
    }
    Ok(response)
}

/// Ends the caller's session (or revokes the API token used for this request).
async fn logout(State(api): State<Api>, headers: HeaderMap) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    api.store
        .delete(Kind::Token.name(), &principal.token, None)
        .await?;
    let clear = format!(
        "{}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0",
        auth::SESSION_COOKIE
    );
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = clear.parse() {
        response
            .headers_mut()
            .insert(axum::http::header::SET_COOKIE, value);
    }
    Ok(response)
}

async fn openapi_document() -> Json<Value> {
    static DOCUMENT: std::sync::LazyLock<Value> = std::sync::LazyLock::new(openapi::document);
    Json(DOCUMENT.clone())
}

async fn me(State(api): State<Api>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let p = api.principal(&headers).await?;
    Ok(Json(json!({
        "user": p.user,
        "admin": p.admin,
        "clusters": p.clusters,
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
}

impl ListParams {
    pub fn selector(&self) -> Result<LabelSelector, ApiError> {
        LabelSelector::parse(self.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))
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

/// Parameters of delete.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteParams {
    #[serde(default)]
    pub resource_version: Option<u64>,
}

pub(crate) type PathKindName = Path<(String, String)>;
pub(crate) type QueryList = Query<ListParams>;

#[cfg(test)]
mod tests;
