//! Signing in at a provider's own page (OpenID Connect): the browser is sent there with a
//! fresh `state`, `nonce` and PKCE verifier kept in the store (any replica can take the
//! callback), and comes back to `/v1/login/<provider>/callback`, where the code is exchanged
//! and the ID token checked. A dashboard login is bound to the browser that started it (a
//! cookie holding its `state`); a CLI login names the token the CLI made (its secret never
//! leaves the CLI), which the callback creates for the user while the CLI waits.

use axum::{
    Json,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Api, ApiError, next_path};
use crate::{
    auth::providers::{self, PENDING_FOR, PENDING_KIND},
    model::{AuthProviderSpec, Kind, PrincipalRef},
    store::{Object, Op, StoreError},
};

/// Sign-ins under way at most (each lives ten minutes unless it is finished).
const MAX_PENDING: usize = 1000;

/// The cookie binding a dashboard login under way to the browser that started it.
const LOGIN_COOKIE: &str = "drover_login";

/// Where the provider sends the browser back.
fn redirect_uri(api: &Api, provider: &str) -> String {
    format!(
        "{}/v1/login/{provider}/callback",
        api.server_url.trim_end_matches('/')
    )
}

/// The enabled redirecting provider `name`, and its client.
async fn client_of(
    api: &Api,
    name: &str,
) -> Result<(AuthProviderSpec, providers::Redirecting), ApiError> {
    let spec = match api.store.get(Kind::AuthProvider.name(), name).await {
        Ok(found) => serde_json::from_value::<AuthProviderSpec>(found.spec)
            .map_err(|e| ApiError::internal(format!("auth provider {name:?}: {e}")))?,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::not_found(format!(
                "there is no auth provider {name:?}; GET /v1/login/providers lists them"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    if !spec.enabled {
        return Err(ApiError::bad_request(format!(
            "auth provider {name:?} is disabled; sign in with another, or ask an admin"
        )));
    }
    let client = providers::redirecting(&spec)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "auth provider {name:?} takes a user name and password: POST /v1/login with \"provider\": {name:?}"
            ))
        })?
        .map_err(unavailable(name))?;
    Ok((spec, client))
}

fn unavailable(provider: &str) -> impl Fn(providers::DirectoryError) -> ApiError + '_ {
    move |e| {
        tracing::warn!(provider, error = %e, "a provider login could not be started or finished");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "the provider {provider:?} cannot be used right now; try again later, or ask an admin (the hub's own users can still sign in)"
            ),
        )
    }
}

/// Starts a login at `provider`: the URL to send the browser to, with what the callback will
/// need kept in the store under the login's `state`.
async fn begin(api: &Api, provider: &str, more: Value) -> Result<(String, String), ApiError> {
    let (_, client) = client_of(api, provider).await?;
    // Anyone may start a sign-in, and each is kept until it is used or expires: a flood of
    // them must not fill the store.
    let (pending, _) = api
        .store
        .list(PENDING_KIND, &crate::store::LabelSelector::everything())
        .await?;
    if pending.len() >= MAX_PENDING {
        let mut refused = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many sign-ins are under way; try again in a few minutes",
        );
        refused.retry_after = Some(60);
        return Err(refused);
    }
    let started = client
        .start(&redirect_uri(api, provider))
        .await
        .map_err(unavailable(provider))?;
    let mut spec = json!({
        "provider": provider,
        "nonce": started.nonce,
        "verifier": started.verifier,
        "expiresAt": crate::auth::lifetimes::expiry(PENDING_FOR),
    });
    if let (Value::Object(spec), Value::Object(more)) = (&mut spec, more) {
        spec.extend(more);
    }
    api.store
        .create(Object::new(PENDING_KIND, &started.state, spec))
        .await?;
    Ok((started.url, started.state))
}

#[derive(Debug, Deserialize)]
pub(super) struct StartQuery {
    #[serde(default)]
    next: Option<String>,
}

/// `GET /v1/login/{provider}/start?next=/path`: the dashboard's "Sign in with …".
pub(super) async fn start(
    State(api): State<Api>,
    Path(provider): Path<String>,
    Query(query): Query<StartQuery>,
) -> Response {
    let next = next_path(query.next.as_deref());
    match begin(&api, &provider, json!({"browser": true, "next": next})).await {
        Ok((url, state)) => {
            let mut response = Redirect::to(&url).into_response();
            let cookie = format!(
                "{LOGIN_COOKIE}={state}; Path=/v1/login/; HttpOnly; Secure; SameSite=Lax; Max-Age={}",
                PENDING_FOR.whole_seconds()
            );
            if let Ok(value) = cookie.parse() {
                response.headers_mut().append(header::SET_COOKIE, value);
            }
            response
        }
        Err(e) => back_to_login(&e.message),
    }
}

/// What the CLI sends to start a browser login: the token it made (name and secret hash).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CliLogin {
    pub token_name: String,
    pub token_hash: String,
    #[serde(default)]
    pub client: Option<String>,
}

/// `POST /v1/login/{provider}/cli`: the URL the CLI prints; once the user signs in there, the
/// CLI's token works.
pub(super) async fn cli_start(
    State(api): State<Api>,
    Path(provider): Path<String>,
    body: Result<Json<CliLogin>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(login) = body.map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; send {{\"tokenName\", \"tokenHash\"}} (drover-hub login --provider makes them)"
        ))
    })?;
    let name_ok = login.token_name.len() == 13
        && login.token_name.starts_with('t')
        && login
            .token_name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let hash_ok = login.token_hash.len() == 64
        && login
            .token_hash
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    if !name_ok || !hash_ok {
        return Err(ApiError::invalid(
            "tokenName must be t and 12 lowercase letters or digits, tokenHash the secret's sha256 in hex",
        ));
    }
    if login.client.as_ref().is_some_and(|c| c.len() > 128) {
        return Err(ApiError::bad_request("client: at most 128 characters"));
    }
    let (url, _) = begin(
        &api,
        &provider,
        json!({"browser": false, "cli": {"tokenName": login.token_name, "tokenHash": login.token_hash,
               "client": login.client.unwrap_or_default()}}),
    )
    .await?;
    Ok(Json(json!({"url": url})))
}

#[derive(Debug, Deserialize)]
pub(super) struct Callback {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    error_description: Option<String>,
}

/// The dashboard's login page, saying why signing in failed.
fn back_to_login(message: &str) -> Response {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("error", message)
        .finish();
    Redirect::to(&format!("/login?{query}")).into_response()
}

/// Takes the login under way named `state` (once: a second callback finds nothing).
async fn take_pending(api: &Api, state: &str) -> Result<Object, ApiError> {
    let gone = || {
        ApiError::bad_request(
            "this sign-in link was used already or has expired; start signing in again",
        )
    };
    let pending = match api.store.get(PENDING_KIND, state).await {
        Ok(p) => p,
        Err(StoreError::NotFound { .. }) => return Err(gone()),
        Err(e) => return Err(e.into()),
    };
    match api
        .store
        .transact(vec![Op::Delete {
            kind: PENDING_KIND.to_owned(),
            name: state.to_owned(),
            resource_version: pending.metadata.resource_version.parse().ok(),
        }])
        .await
    {
        Ok(_) => {}
        Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => return Err(gone()),
        Err(e) => return Err(e.into()),
    }
    if crate::model::expired(&pending.spec) {
        return Err(gone());
    }
    Ok(pending)
}

/// `GET /v1/login/{provider}/callback`: where the provider sends the browser back.
pub(super) async fn callback(
    State(api): State<Api>,
    Path(provider): Path<String>,
    Query(query): Query<Callback>,
    headers: HeaderMap,
) -> Response {
    let browser_state = crate::auth::cookie(&headers, LOGIN_COOKIE).map(str::to_owned);
    match finish(&api, &provider, query, browser_state.as_deref()).await {
        Ok(Done::Browser { issued, next }) => {
            // A page of this hub moves on: a cookie set in answer to the provider's
            // (cross-site) redirect would not be sent on a redirect of that same navigation.
            let page = format!(
                "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={next}\"><title>Signed in</title><p>Signed in. <a href=\"{next}\">Continue</a></p>"
            );
            let mut response =
                ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response();
            super::login::set_session_cookie(&mut response, &issued);
            clear_login_cookie(&mut response);
            response
        }
        Ok(Done::Cli { user }) => {
            let query = form_urlencoded::Serializer::new(String::new())
                .append_pair("cli", &user)
                .finish();
            Redirect::to(&format!("/login?{query}")).into_response()
        }
        Err(e) => {
            let mut response = back_to_login(&e.message);
            clear_login_cookie(&mut response);
            response
        }
    }
}

fn clear_login_cookie(response: &mut Response) {
    let clear =
        format!("{LOGIN_COOKIE}=; Path=/v1/login/; HttpOnly; Secure; SameSite=Lax; Max-Age=0");
    if let Ok(value) = clear.parse() {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

enum Done {
    Browser {
        issued: super::login::Issued,
        next: String,
    },
    Cli {
        user: String,
    },
}

async fn finish(
    api: &Api,
    provider: &str,
    query: Callback,
    browser_state: Option<&str>,
) -> Result<Done, ApiError> {
    let state = query
        .state
        .ok_or_else(|| ApiError::bad_request("the provider sent no state back; start again"))?;
    let pending = take_pending(api, &state).await?;
    let text = |field: &str| {
        pending
            .spec
            .pointer(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    if text("/provider") != provider {
        return Err(ApiError::bad_request(
            "this sign-in was started with another provider; start again",
        ));
    }
    let browser = pending.spec["browser"].as_bool().unwrap_or(false);
    // A dashboard login finishes in the browser that started it: a link someone else
    // started cannot sign this browser in as them.
    if browser && browser_state != Some(state.as_str()) {
        return Err(ApiError::bad_request(
            "this sign-in was started in another browser (or its cookie expired); start again here",
        ));
    }
    if let Some(error) = query.error {
        crate::audit::note_login("", provider);
        return Err(ApiError::unauthorized(format!(
            "the provider refused: {error} {}",
            query.error_description.unwrap_or_default()
        )));
    }
    let code = query
        .code
        .ok_or_else(|| ApiError::bad_request("the provider sent no code back; start again"))?;
    let (spec, client) = client_of(api, provider).await?;
    let finished = match client
        .finish(
            &redirect_uri(api, provider),
            &code,
            &text("/verifier"),
            &text("/nonce"),
        )
        .await
    {
        Ok(finished) => finished,
        Err(e) if e.unavailable() => return Err(unavailable(provider)(e)),
        Err(e) => {
            crate::audit::note_login("", provider);
            tracing::info!(provider, reason = %e, "a provider login was refused");
            return Err(ApiError::unauthorized(format!("sign-in refused: {e}")));
        }
    };
    let identity = finished.identity;
    crate::audit::note_login(&identity.login, provider);
    let user = super::login::admit(api, provider, &spec, &identity).await?;
    let principal = PrincipalRef {
        provider: provider.to_owned(),
        id: identity.id.clone(),
        login: identity.login.clone(),
    };
    providers::keep_session(
        api.store.as_ref(),
        &principal,
        finished.refresh_token.as_deref(),
    )
    .await?;
    if browser {
        let issued = super::login::issue_token(
            api,
            &user,
            super::login::Issue {
                session: true,
                ..super::login::Issue::default()
            },
        )
        .await?;
        return Ok(Done::Browser {
            issued,
            next: text("/next"),
        });
    }
    let (name, hash) = (text("/cli/tokenName"), text("/cli/tokenHash"));
    let client_id = text("/cli/client");
    super::login::issue_token(
        api,
        &user,
        super::login::Issue {
            session: false,
            description: Some("drover-hub CLI".into()),
            client: Some(client_id),
            given: Some((&name, &hash)),
        },
    )
    .await?;
    Ok(Done::Cli { user })
}
