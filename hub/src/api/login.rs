//! Signing in and out: the hub's own users by password, a directory's users through their
//! AuthProvider (linked to a hub User at their first login); the providers the login page
//! offers; and the test-connection action admins use to check a provider's settings.

use std::net::IpAddr;

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::{
    auth::{self, providers, secret},
    model::{AuthProviderSpec, Kind},
    store::{Object, StoreError},
};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    // Debug is written by hand below: the password never reaches a log.
    pub username: String,
    pub password: String,
    /// The AuthProvider to sign in with; the hub's own users (`local`) if absent.
    #[serde(default)]
    pub provider: Option<String>,
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
            .field("provider", &self.provider)
            .field("session", &self.session)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

fn yes() -> Option<bool> {
    Some(true)
}

pub(super) async fn login(
    State(api): State<Api>,
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    headers: HeaderMap,
    body: Result<Json<LoginRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(request) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "login body: {e}; send {{\"username\", \"password\"}}"
        ))
    })?;
    let addr: Option<IpAddr> = remote.map(|r| r.0.0.ip());
    let user = authenticate(&api, &request, addr).await?;
    let replaces = auth::cookie(&headers, auth::SESSION_COOKIE);
    issue(&api, &user, request, replaces).await
}

/// The user `request` signs in as, if its password is right and the name is not locked out.
async fn authenticate(
    api: &Api,
    request: &LoginRequest,
    addr: Option<IpAddr>,
) -> Result<String, ApiError> {
    let provider = request
        .provider
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| providers::LOCAL.to_owned());
    crate::audit::note_login(&request.username, &provider);
    // Failures are counted per provider and account, however the name is spelled: `alice`
    // of the directory is not the hub's, and `ALICE` is `alice`.
    let name_key = vec![auth::login_key(&provider, &request.username)];
    if let Err(wait) = api.limiter.check(&name_key, addr) {
        return Err(too_many(wait));
    }
    let user = if provider == providers::LOCAL {
        let user = local_user(api, request, addr).await?;
        api.limiter.succeeded(&name_key);
        user
    } else {
        directory_user(api, &provider, request, addr).await?
    };
    Ok(user)
}

fn too_many(wait: std::time::Duration) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "TooManyRequests",
        format!(
            "too many failed logins; try again in {} s",
            wait.as_secs() + 1
        ),
    );
    err.retry_after = Some(wait.as_secs() + 1);
    err
}

/// `POST /login`: the login page's form when its script did not run (a page still loading, a
/// script that failed to load, scripts off). The same sign-in as `POST /v1/login`, answered as a
/// browser expects: the session cookie and a redirect to `next`, or back to the form with the
/// reason. Without it the browser would send the form to its own address with GET, the
/// password in the URL. Only from the hub's own page (Origin or Sec-Fetch-Site): another site
/// must not sign a visitor in as someone else.
pub async fn form_login(
    api: &Api,
    addr: Option<IpAddr>,
    headers: &axum::http::HeaderMap,
    body: &[u8],
) -> Response {
    let mut fields: std::collections::HashMap<String, String> =
        form_urlencoded::parse(body).into_owned().collect();
    let next = super::next_path(fields.get("next").map(String::as_str));
    let back = |message: &str| {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("next", &next)
            .append_pair("error", message)
            .finish();
        axum::response::Redirect::to(&format!("/login?{query}")).into_response()
    };
    if !crate::websec::same_origin_headers(headers) {
        return back("sign in from this hub's own login page");
    }
    let (Some(username), Some(password)) = (fields.remove("username"), fields.remove("password"))
    else {
        return back("give a user name and a password");
    };
    let request = LoginRequest {
        username,
        password,
        provider: fields.remove("provider"),
        session: Some(true),
        description: None,
        client: None,
    };
    let user = match authenticate(api, &request, addr).await {
        Ok(user) => user,
        Err(e) => return back(&e.message),
    };
    let how = Issue {
        session: true,
        replaces: auth::cookie(headers, auth::SESSION_COOKIE),
        ..Issue::default()
    };
    match issue_token(api, &user, how).await {
        Ok(issued) => {
            let mut response = axum::response::Redirect::to(&next).into_response();
            set_session_cookie(&mut response, &issued);
            response
        }
        Err(e) => back(&e.message),
    }
}

/// The hub's own user `request` names, if the password is theirs.
async fn local_user(
    api: &Api,
    request: &LoginRequest,
    addr: Option<IpAddr>,
) -> Result<String, ApiError> {
    let refused = || ApiError::unauthorized("wrong username or password");
    let user = match api.store.get(Kind::User.name(), &request.username).await {
        Ok(user) => Some(user),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let hash = user
        .as_ref()
        .and_then(|u| u.spec.get("passwordHash"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        // Hash something anyway, so a missing user (or a directory's, who has no password
        // here) takes as long as a wrong password.
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
        api.limiter.failed(
            &[auth::login_key(providers::LOCAL, &request.username)],
            addr,
        );
        tracing::info!(user = %request.username, addr = ?addr, "failed login");
        return Err(refused());
    }
    Ok(request.username.clone())
}

/// The hub User of the directory user `request` names, if the directory accepts the password
/// and the provider lets them in: created at their first login, their groups read now.
async fn directory_user(
    api: &Api,
    provider: &str,
    request: &LoginRequest,
    addr: Option<IpAddr>,
) -> Result<String, ApiError> {
    let spec = match api.store.get(Kind::AuthProvider.name(), provider).await {
        Ok(found) => serde_json::from_value::<AuthProviderSpec>(found.spec)
            .map_err(|e| ApiError::internal(format!("auth provider {provider:?}: {e}")))?,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::bad_request(format!(
                "there is no auth provider {provider:?}; GET /v1/login/providers lists them (or leave provider out for the hub's own users)"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let directory = providers::directory(&spec)
        .filter(|_| spec.enabled)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "auth provider {provider:?} is disabled; sign in with another, or ask an admin"
            ))
        })?;
    // The entry the name resolves to is checked before its password is tried: failures
    // under every spelling of it (a UPN, `DOMAIN\\name`) count against it.
    let may_try = |dn: &str| {
        api.limiter
            .check(&[auth::entry_key(provider, dn)], None)
            .is_ok()
    };
    let (dn, outcome) = directory
        .authenticate(&request.username, &request.password, &may_try)
        .await;
    let mut accounts = vec![auth::login_key(provider, &request.username)];
    accounts.extend(dn.as_deref().map(|dn| auth::entry_key(provider, dn)));
    let identity = match outcome {
        Ok(identity) => identity,
        Err(e) if e.unavailable() => {
            // The directory's trouble is the admins' to see, in the log; the user learns it
            // is down (the hub's own users still sign in).
            tracing::warn!(provider, error = %e, "a directory login could not be checked");
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!(
                    "the directory of {provider:?} cannot be used right now; try again later, or ask an admin (the hub's own users can still sign in)"
                ),
            ));
        }
        Err(providers::DirectoryError::Blocked) => {
            tracing::info!(user = %request.username, provider, addr = ?addr, "login refused: too many failures for the account");
            return Err(too_many(std::time::Duration::from_secs(60)));
        }
        Err(e) => {
            api.limiter.failed(&accounts, addr);
            tracing::info!(user = %request.username, provider, addr = ?addr, reason = %e, "failed login");
            return Err(ApiError::unauthorized("wrong username or password"));
        }
    };
    api.limiter.succeeded(&accounts);
    admit(api, provider, &spec, &identity).await
}

/// Lets a provider's user in, if the provider allows them: their hub User (made at their
/// first login) with their groups as of now, unless an admin disabled it. Notes them for the
/// audit log.
pub(super) async fn admit(
    api: &Api,
    provider: &str,
    spec: &AuthProviderSpec,
    identity: &providers::Identity,
) -> Result<String, ApiError> {
    if !providers::allowed(spec, identity) {
        tracing::info!(user = %identity.login, provider, "a provider's user who may not sign in tried");
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{:?} may not sign in with {provider:?}: the provider allows only some users and groups; ask an admin",
                identity.login
            ),
        ));
    }
    let user = providers::link(api.store.as_ref(), provider, spec.provider_type, identity).await?;
    let found = api.store.get(Kind::User.name(), &user).await?;
    if found.spec.get("disabled").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::unauthorized(format!(
            "user {user:?} is disabled; ask an admin"
        )));
    }
    crate::audit::note_caller(
        &user,
        &providers::prefixed(provider, &identity.groups),
        provider,
    );
    Ok(user)
}

/// How a token is issued.
#[derive(Debug, Default)]
pub(super) struct Issue<'a> {
    /// A dashboard session (cookie, `session-ttl`) rather than an API token.
    pub(super) session: bool,
    pub(super) description: Option<String>,
    /// The client logging in: its earlier token of this user is revoked.
    pub(super) client: Option<String>,
    /// The token's name and secret hash, made by the client (the CLI's device login: the
    /// secret never leaves it); else the hub makes one.
    pub(super) given: Option<(&'a str, &'a str)>,
    /// More writes made in the same transaction as the token (a device login marked done).
    pub(super) also: Vec<crate::store::Op>,
    /// The session cookie the browser signing in still sends: a new session replaces that
    /// one (if it is a session and the secret opens it), so logging in again leaves no
    /// second session behind.
    pub(super) replaces: Option<&'a str>,
}

/// The deletion of the session `cookie` holds, if it is a live session token its secret opens
/// (a cookie naming someone else's token without its secret removes nothing).
async fn replaced_session(
    api: &Api,
    cookie: Option<&str>,
) -> Result<Option<crate::store::Op>, ApiError> {
    let Some((secret::TokenKind::Token, name, secret)) = cookie.and_then(secret::parse_token)
    else {
        return Ok(None);
    };
    let old = match api.store.get(Kind::Token.name(), name).await {
        Ok(old) => old,
        Err(crate::store::StoreError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let session = old.spec.get("session").and_then(Value::as_bool) == Some(true);
    if !session || !secret::opens(&old, secret) {
        return Ok(None);
    }
    Ok(Some(crate::store::Op::Delete {
        kind: Kind::Token.name().to_owned(),
        name: old.metadata.name,
        resource_version: old.metadata.resource_version.parse().ok(),
    }))
}

/// A token issued: its value (unless the client made it), expiry and lifetime.
#[derive(Debug)]
pub(super) struct Issued {
    value: Option<String>,
    expires_at: String,
    lifetime: time::Duration,
}

/// A new session or API token for `user`, as `request` asks.
async fn issue(
    api: &Api,
    user: &str,
    request: LoginRequest,
    replaces: Option<&str>,
) -> Result<Response, ApiError> {
    let session = request.session.unwrap_or(true);
    let issued = issue_token(
        api,
        user,
        Issue {
            session,
            description: request.description,
            client: request.client,
            replaces,
            ..Issue::default()
        },
    )
    .await?;
    let mut response = Json(json!({
        "token": issued.value,
        "expiresAt": issued.expires_at,
        "user": user,
    }))
    .into_response();
    if session {
        set_session_cookie(&mut response, &issued);
    }
    Ok(response)
}

pub(super) fn set_session_cookie(response: &mut Response, issued: &Issued) {
    let cookie = format!(
        "{}={}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
        auth::SESSION_COOKIE,
        issued.value.as_deref().unwrap_or_default(),
        issued.lifetime.whole_seconds()
    );
    if let Ok(value) = cookie.parse() {
        response
            .headers_mut()
            .append(axum::http::header::SET_COOKIE, value);
    }
}

pub(super) async fn issue_token(api: &Api, user: &str, how: Issue<'_>) -> Result<Issued, ApiError> {
    let session = how.session;
    let lifetimes = auth::lifetimes::read(api.store.as_ref()).await?;
    let lifetime = if session {
        lifetimes.session
    } else {
        lifetimes.api_max
    };
    let expires_at = auth::lifetimes::expiry(lifetime);
    let client = how
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
    let (name, hash, value) = match how.given {
        Some((name, hash)) => (name.to_owned(), hash.to_owned(), None),
        None => {
            let token = secret::new_token(secret::TokenKind::Token);
            (token.name, token.hash, Some(token.value))
        }
    };
    let description = how.description.unwrap_or_else(|| {
        if session {
            "dashboard session"
        } else {
            "API token from login"
        }
        .to_owned()
    });
    let mut object = Object::new(
        Kind::Token.name(),
        &name,
        json!({
            "user": user,
            "description": description,
            "session": session,
            "expiresAt": expires_at,
            "client": client.clone().unwrap_or_default(),
            "secretHash": hash,
        }),
    );
    object
        .metadata
        .labels
        .insert(auth::lifetimes::USER_LABEL.to_owned(), user.to_owned());
    let mut ops = vec![crate::store::Op::Create(object)];
    ops.extend(how.also);
    if session && let Some(old) = replaced_session(api, how.replaces).await? {
        ops.push(old);
    }
    // A new login from the same client replaces that client's earlier token, in the same
    // write: a user who logs in again does not leave the old token valid.
    if let Some(client) = &client {
        let selector = crate::store::LabelSelector::parse(&format!(
            "{}={}",
            auth::lifetimes::USER_LABEL,
            user
        ))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let (tokens, _) = api.store.list(Kind::Token.name(), &selector).await?;
        for old in tokens {
            let same_user = old.spec.get("user").and_then(Value::as_str) == Some(user);
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
    Ok(Issued {
        value,
        expires_at,
        lifetime,
    })
}

/// Ends the caller's session (or revokes the API token used for this request).
pub(super) async fn logout(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    api.store
        .delete(Kind::Token.name(), &principal.token, None)
        .await?;
    let clear = format!(
        "{}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0",
        auth::SESSION_COOKIE
    );
    // A user of an OpenID provider that offers it ends their session there too (RP-initiated
    // logout): the answer says where to send the browser.
    let end_session = match api
        .store
        .get(Kind::AuthProvider.name(), &principal.provider)
        .await
    {
        Ok(provider) => match serde_json::from_value::<AuthProviderSpec>(provider.spec)
            .ok()
            .as_ref()
            .and_then(providers::redirecting)
        {
            Some(Ok(client)) => {
                let after = format!("{}/login", api.server_url.trim_end_matches('/'));
                client.end_session(&after).await
            }
            _ => None,
        },
        Err(_) => None,
    };
    let mut response = match end_session {
        Some(url) => Json(json!({"endSession": url})).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    };
    if let Ok(value) = clear.parse() {
        response
            .headers_mut()
            .insert(axum::http::header::SET_COOKIE, value);
    }
    Ok(response)
}

/// `GET /v1/login/providers`: what the login page offers, for anyone (before they sign in):
/// the hub's own users and each enabled provider's name, type and display name.
pub(super) async fn login_providers(State(api): State<Api>) -> Result<Json<Value>, ApiError> {
    let items = providers::offered(api.store.as_ref()).await?;
    Ok(Json(json!({"items": items})))
}

/// What the test-connection action is asked: optionally a user to look up (and their
/// password to check).
#[derive(Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderTest {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
}

impl std::fmt::Debug for ProviderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderTest")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/authproviders/{name}/test` (admins): connects, binds the service account, and
/// with a username finds that user (checking the password if given) and their groups.
/// Answers `{ok, step, message, user?, groups?}`: `step` is the first that failed
/// (`connect`, `bind`, `user`, `groups`).
pub(super) async fn test_provider(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Option<Json<ProviderTest>>,
) -> Result<Json<Value>, ApiError> {
    let principal = api.principal(&headers).await?;
    let object = super::readable(&api, &principal, Kind::AuthProvider, &name).await?;
    let spec: AuthProviderSpec = serde_json::from_value(object.spec)
        .map_err(|e| ApiError::internal(format!("auth provider {name:?}: {e}")))?;
    let Json(asked) = body.unwrap_or_default();
    let directory = providers::directory(&spec)
        .ok_or_else(|| ApiError::invalid("spec.ldap: the provider has no directory settings"))?;
    let answer = match directory
        .test(asked.username.as_deref(), asked.password.as_deref())
        .await
    {
        Ok(None) => json!({"ok": true, "message": "connected and the service account bound"}),
        Ok(Some(identity)) if identity.groups.is_empty() => json!({
            "ok": false, "step": "groups",
            "message": format!("found {:?} ({}) but no groups: check spec.ldap.groupSearchBase, groupFilter and memberAttribute", identity.login, identity.id),
            "user": {"id": identity.id, "login": identity.login, "displayName": identity.display_name},
            "groups": [],
        }),
        Ok(Some(identity)) => json!({
            "ok": true,
            "message": format!("found {:?} in {} groups", identity.login, identity.groups.len()),
            "user": {"id": identity.id, "login": identity.login, "displayName": identity.display_name},
            "groups": providers::prefixed(&name, &identity.groups),
            "allowed": providers::allowed(&spec, &identity),
        }),
        Err(e) => json!({"ok": false, "step": e.step(), "message": e.to_string()}),
    };
    Ok(Json(answer))
}
