//! Signing in at a provider's own page (OpenID Connect, GitHub): the browser is sent there
//! with a fresh `state`, `nonce` and PKCE verifier kept in the store (any replica can take the
//! callback), and comes back to `/v1/login/<provider>/callback`, where the code is exchanged
//! and the ID token checked. A login is bound to the browser that started it (a cookie
//! holding its `state`). The command line signs in through a browser too, as a device
//! authorisation the person confirms ([`super::device`]).

use std::net::IpAddr;

use axum::{
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

/// Sign-ins under way at most per provider (each lives ten minutes unless it is finished):
/// anyone may start one, so a flood must not fill the store.
const MAX_PENDING_PER_PROVIDER: usize = 5000;

/// Sign-ins under way kept per source (an IPv4 address, an IPv6 /64): a source that starts
/// more loses its own oldest, so one address can neither fill a provider's share nor block
/// anyone else's sign-in. Enough for an office behind one NAT signing in at once.
const MAX_PENDING_PER_SOURCE: usize = 20;

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
pub(super) async fn client_of(
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

/// Makes room for one more sign-in (of `kind`: a browser's or a command line's) of
/// `provider` from `source`: refuses when the provider's share is full, and deletes the
/// source's oldest beyond its own share.
pub(super) async fn make_room(
    api: &Api,
    kind: &str,
    provider: &str,
    source: &str,
) -> Result<(), ApiError> {
    let (pending, _) = api
        .store
        .list(kind, &crate::store::LabelSelector::everything())
        .await?;
    let field =
        |p: &Object, name: &str| p.spec.get(name).and_then(Value::as_str).map(str::to_owned);
    let mut mine: Vec<&Object> = pending
        .iter()
        .filter(|p| field(p, "source").as_deref() == Some(source))
        .collect();
    if mine.len() >= MAX_PENDING_PER_SOURCE {
        mine.sort_by_key(|p| p.metadata.resource_version.parse::<u64>().unwrap_or(0));
        let oldest = &mine[..=mine.len() - MAX_PENDING_PER_SOURCE];
        let ops = oldest
            .iter()
            .map(|p| Op::Delete {
                kind: kind.to_owned(),
                name: p.metadata.name.clone(),
                resource_version: None,
            })
            .collect();
        match api.store.transact(ops).await {
            // Finished or deleted meanwhile: room either way.
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(
            source,
            provider,
            dropped = oldest.len(),
            "a source started more sign-ins than it may keep: its oldest were dropped"
        );
    }
    let of_provider = pending
        .iter()
        .filter(|p| field(p, "provider").as_deref() == Some(provider))
        .filter(|p| field(p, "source").as_deref() != Some(source))
        .count()
        + mine.len().min(MAX_PENDING_PER_SOURCE - 1);
    if of_provider >= MAX_PENDING_PER_PROVIDER {
        let mut refused = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many sign-ins are under way; try again in a few minutes",
        );
        refused.retry_after = Some(60);
        return Err(refused);
    }
    Ok(())
}

/// Starts a login at `provider` for a caller at `addr`: the URL to send the browser to, with
/// what the callback will need kept in the store under the login's `state`.
async fn begin(
    api: &Api,
    provider: &str,
    addr: Option<IpAddr>,
    more: Value,
) -> Result<(String, String), ApiError> {
    let (_, client) = client_of(api, provider).await?;
    let source = crate::auth::source_of(addr);
    make_room(api, PENDING_KIND, provider, &source).await?;
    let started = client
        .start(&redirect_uri(api, provider))
        .await
        .map_err(unavailable(provider))?;
    let mut spec = json!({
        "provider": provider,
        "source": source,
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
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    Query(query): Query<StartQuery>,
) -> Response {
    let next = next_path(query.next.as_deref());
    let addr = remote.map(|r| r.0.0.ip());
    match begin(
        &api,
        &provider,
        addr,
        json!({"browser": true, "next": next}),
    )
    .await
    {
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
    let replaces = crate::auth::cookie(&headers, crate::auth::SESSION_COOKIE);
    match finish(&api, &provider, query, browser_state.as_deref(), replaces).await {
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
}

async fn finish(
    api: &Api,
    provider: &str,
    query: Callback,
    browser_state: Option<&str>,
    replaces: Option<&str>,
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
    // A login finishes in the browser that started it: a link someone else started cannot
    // sign this browser in as them. (Logins stored by hubs before 2026-12 without `browser`
    // were the command line's, which now signs in as a device: refused here too.)
    if pending.spec["browser"].as_bool() != Some(true) || browser_state != Some(state.as_str()) {
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
    let issued = super::login::issue_token(
        api,
        &user,
        super::login::Issue {
            session: true,
            replaces,
            ..super::login::Issue::default()
        },
    )
    .await?;
    Ok(Done::Browser {
        issued,
        next: text("/next"),
    })
}
