//! `POST /v1/gitrepos/{name}/webhook`: a git host says a branch moved, and the GitRepo is read
//! at once instead of at its next poll. No token: the body's HMAC-SHA256 with the GitRepo's
//! `webhookSecret` (`X-Hub-Signature-256: sha256=HEX`, as GitHub and Gitea send it) is the
//! proof. A GitRepo that does not exist, has no secret, or a signature that does not match are
//! all answered alike, "not found"; wrong signatures count against the sender's address as
//! failed logins do.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
};
use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::{
    delivery::git::{WEBHOOK_ANNOTATION, signed},
    model::Kind,
    store::{Modifier, Op, StoreError},
};

pub(super) async fn gitrepo_webhook(
    State(api): State<Api>,
    Path(name): Path<String>,
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let addr = remote.map(|r| r.0.0.ip());
    let key = vec![crate::auth::login_key("gitrepo-webhook", &name)];
    if let Err(wait) = api.limiter.check(&key, addr) {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!(
                "too many unsigned calls; try again in {} s",
                wait.as_secs() + 1
            ),
        ));
    }
    let missing = || ApiError::not_found(format!("gitrepos {name:?} not found"));
    let repo = match api.store.get(Kind::GitRepo.name(), &name).await {
        Ok(repo) => Some(repo),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let signature = headers
        .get("x-hub-signature-256")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let proven = repo.as_ref().is_some_and(|r| {
        let secret = r
            .spec
            .get("webhookSecret")
            .and_then(Value::as_str)
            .unwrap_or("");
        !secret.is_empty() && signed(secret, &body, signature)
    });
    if !proven {
        api.limiter.failed(&key, addr);
        return Err(missing());
    }
    let at = crate::store::now_rfc3339();
    let nonce = crate::store::new_uid();
    let op = Op::Modify {
        kind: Kind::GitRepo.name().into(),
        name: name.clone(),
        change: Modifier::new(move |o| {
            // Unique per call, so two calls in one second both wake the reader.
            o.metadata
                .annotations
                .insert(WEBHOOK_ANNOTATION.into(), format!("{at} {nonce}"));
        }),
    };
    match api.store.transact(vec![op]).await {
        Ok(_) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"message": format!("gitrepo {name} will be read now")})),
        )),
        Err(StoreError::NotFound { .. }) => Err(missing()),
        Err(e) => Err(e.into()),
    }
}
