//! The command line's sign-in with a provider that signs users in at its own page, as a device
//! authorisation (RFC 8628's shape). The CLI makes its token (the secret never leaves it) and
//! asks for a sign-in; the hub answers a user code to show and a device code to poll with. A
//! person opens the hub's `/login/device` page, signs in with the provider, types the code,
//! sees what asks for access (the command line, its address, when it started) and confirms:
//! only then is the CLI's token made, as that person. A link alone signs no one in, and a
//! person who did not start the sign-in has no code to type.

use std::net::IpAddr;

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::{
    auth::{Principal, providers::DEVICE_KIND, secret},
    store::{Object, Op, StoreError},
};

/// How long a command line waits for its confirmation.
pub const DEVICE_FOR: time::Duration = time::Duration::minutes(10);

/// How often the command line asks whether it was confirmed, in seconds.
const POLL_SECONDS: u64 = 2;

/// The page where a person confirms a command line's sign-in.
pub const VERIFICATION_PATH: &str = "/login/device";

/// What the CLI sends to start: the token it made (name and secret hash), and its own id.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceLoginRequest {
    pub token_name: String,
    pub token_hash: String,
    #[serde(default)]
    pub client: Option<String>,
}

/// `POST /v1/login/{provider}/device`: a command line's sign-in starts; the answer is the code
/// to show, the page to open and the device code to poll with.
pub(super) async fn start(
    State(api): State<Api>,
    Path(provider): Path<String>,
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    body: Result<Json<DeviceLoginRequest>, axum::extract::rejection::JsonRejection>,
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
    let client = login.client.unwrap_or_default();
    if client.len() > 128 {
        return Err(ApiError::bad_request("client: at most 128 characters"));
    }
    // The provider must be one whose users sign in at its page (else the CLI asks for a
    // password).
    super::sso::client_of(&api, &provider).await?;
    let addr: Option<IpAddr> = remote.map(|r| r.0.0.ip());
    let source = crate::auth::source_of(addr);
    super::sso::make_room(&api, DEVICE_KIND, &provider, &source).await?;
    let user_code = secret::user_code();
    let stored = secret::normal_user_code(&user_code)
        .ok_or_else(|| ApiError::internal("a fresh user code is not one"))?;
    let device_secret = secret::random_text::<32>();
    let spec = json!({
        "provider": provider,
        "source": source,
        "address": addr.map(|a| a.to_string()).unwrap_or_default(),
        "client": client,
        "tokenName": login.token_name,
        "tokenHash": login.token_hash,
        "secretHash": secret::token_hash(&device_secret),
        "state": "pending",
        "startedAt": crate::store::now_rfc3339(),
        "expiresAt": crate::auth::lifetimes::expiry(DEVICE_FOR),
    });
    match api
        .store
        .create(Object::new(DEVICE_KIND, &stored, spec))
        .await
    {
        Ok(_) => {}
        // Two sign-ins drew one code (one in 20⁸): the CLI asks again.
        Err(StoreError::AlreadyExists { .. }) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "try again: the code drawn is in use",
            ));
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Json(json!({
        "deviceCode": format!("{stored}.{device_secret}"),
        "userCode": user_code,
        "verificationUri": format!("{}{VERIFICATION_PATH}", api.server_url.trim_end_matches('/')),
        "expiresIn": DEVICE_FOR.whole_seconds(),
        "interval": POLL_SECONDS,
    })))
}

/// A field of a stored sign-in's spec as text (empty if absent).
fn text(spec: &Value, name: &str) -> String {
    spec.get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// What the CLI polls with.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicePoll {
    pub device_code: String,
}

/// An answer to a poll that is not yet (or never) a sign-in: RFC 8628 3.5's error codes.
fn not_yet(error: &str, message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": error, "message": message})),
    )
        .into_response()
}

/// `POST /v1/login/device/token`: whether the command line's sign-in was confirmed. Once it
/// was, the answer names the user (the CLI's token works from then on) and the sign-in is
/// over.
pub(super) async fn poll(
    State(api): State<Api>,
    body: Result<Json<DevicePoll>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(poll)) = body else {
        return not_yet("invalid_request", "send {\"deviceCode\"}");
    };
    let unknown = || {
        not_yet(
            "expired_token",
            "this sign-in is over (it expired, or was used or denied): run drover-hub login again",
        )
    };
    let Some((stored, device_secret)) = poll.device_code.split_once('.') else {
        return unknown();
    };
    if secret::normal_user_code(stored).as_deref() != Some(stored) {
        return unknown();
    }
    let login = match api.store.get(DEVICE_KIND, stored).await {
        Ok(login) => login,
        Err(StoreError::NotFound { .. }) => return unknown(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let field = |name: &str| text(&login.spec, name);
    if !secret::same(
        secret::token_hash(device_secret).as_bytes(),
        field("secretHash").as_bytes(),
    ) {
        return unknown();
    }
    if crate::model::expired(&login.spec) {
        return unknown();
    }
    match field("state").as_str() {
        "approved" => {
            let user = field("user");
            // Over: the code cannot be used again.
            if let Err(e) = api
                .store
                .delete(
                    DEVICE_KIND,
                    stored,
                    login.metadata.resource_version.parse().ok(),
                )
                .await
                && !matches!(e, StoreError::NotFound { .. })
            {
                return ApiError::from(e).into_response();
            }
            Json(json!({"user": user})).into_response()
        }
        "denied" => {
            let _ = api.store.delete(DEVICE_KIND, stored, None).await;
            not_yet(
                "access_denied",
                "the person at the browser denied this sign-in",
            )
        }
        _ => not_yet(
            "authorization_pending",
            "not confirmed yet: open the page shown, sign in and enter the code",
        ),
    }
}

/// A command line waiting for its sign-in to be confirmed, as the confirmation page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The user code as shown (`BCDF-GHJK`).
    pub code: String,
    pub provider: String,
    /// The command line's own id (`drover-hub` sends one).
    pub client: String,
    /// The address the sign-in was started from.
    pub address: String,
    pub started_at: String,
}

/// Why a code typed on the confirmation page leads nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWaiting {
    /// No command line waits for it: a typo, or it expired, was used or denied.
    Unknown,
    /// The command line signs in with another provider than the person's session.
    OtherProvider(String),
    /// Too many wrong codes: try again later.
    TooMany(u64),
}

/// The command line waiting for the code `typed`, for `principal` to confirm, and its object.
/// Wrong codes count against the person (five a minute), so codes cannot be guessed.
pub async fn waiting(
    api: &Api,
    principal: &Principal,
    typed: &str,
) -> Result<Result<(Waiting, Object), NotWaiting>, ApiError> {
    let guesses = vec![crate::auth::login_key("device-code", &principal.user)];
    if let Err(wait) = api.limiter.check(&guesses, None) {
        return Ok(Err(NotWaiting::TooMany(wait.as_secs() + 1)));
    }
    let found = match secret::normal_user_code(typed) {
        Some(stored) => match api.store.get(DEVICE_KIND, &stored).await {
            Ok(login) => Some(login),
            Err(StoreError::NotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        },
        None => None,
    };
    let Some(login) = found.filter(|l| {
        !crate::model::expired(&l.spec)
            && l.spec.get("state").and_then(Value::as_str) == Some("pending")
    }) else {
        api.limiter.failed(&guesses, None);
        return Ok(Err(NotWaiting::Unknown));
    };
    let field = |name: &str| text(&login.spec, name);
    let provider = field("provider");
    if provider != principal.provider {
        return Ok(Err(NotWaiting::OtherProvider(provider)));
    }
    let stored = login.metadata.name.to_ascii_uppercase();
    let waiting = Waiting {
        code: format!("{}-{}", &stored[..4], &stored[4..]),
        provider,
        client: field("client"),
        address: field("address"),
        started_at: field("startedAt"),
    };
    Ok(Ok((waiting, login)))
}

/// What came of a person's decision on a command line's sign-in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Signed in as this user: the CLI's token works now.
    Approved(String),
    Denied,
}

/// `principal` confirms (or denies) the command line waiting for `typed`: confirmed, the
/// CLI's token is made for them in the same write that marks the sign-in confirmed.
pub async fn decide(
    api: &Api,
    principal: &Principal,
    typed: &str,
    approve: bool,
) -> Result<Result<Decided, NotWaiting>, ApiError> {
    let (_, mut login) = match waiting(api, principal, typed).await? {
        Ok(found) => found,
        Err(why) => return Ok(Err(why)),
    };
    let field = |name: &str| text(&login.spec, name);
    let (token_name, token_hash, client) =
        (field("tokenName"), field("tokenHash"), field("client"));
    login.spec["state"] = if approve { "approved" } else { "denied" }.into();
    login.spec["user"] = principal.user.clone().into();
    login.spec["decidedAt"] = crate::store::now_rfc3339().into();
    // Guarded by what was read: a second decision (another tab, a replayed form) finds the
    // sign-in decided already.
    let mark = Op::Update(login);
    if !approve {
        return match api.store.transact(vec![mark]).await {
            Ok(_) => Ok(Ok(Decided::Denied)),
            Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {
                Ok(Err(NotWaiting::Unknown))
            }
            Err(e) => Err(e.into()),
        };
    }
    let issued = super::login::issue_token(
        api,
        &principal.user,
        super::login::Issue {
            session: false,
            description: Some("drover-hub CLI".into()),
            client: Some(client),
            given: Some((&token_name, &token_hash)),
            also: vec![mark],
            replaces: None,
        },
    )
    .await;
    match issued {
        Ok(_) => {
            tracing::info!(user = %principal.user, provider = %principal.provider, "a command line's sign-in was confirmed");
            Ok(Ok(Decided::Approved(principal.user.clone())))
        }
        Err(e) if e.code == StatusCode::CONFLICT || e.code == StatusCode::NOT_FOUND => {
            Ok(Err(NotWaiting::Unknown))
        }
        Err(e) => Err(e),
    }
}
