//! `POST /v1/clusters/{name}/kubeconfig`: a kubeconfig for the caller that points `kubectl` at
//! the hub's authentication proxy for that cluster (`/k8s/clusters/{name}`), with a new API
//! token of the caller's own, so it can be revoked on its own.

use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::Engine as _;
use serde_json::json;

use super::{Api, ApiError};
use crate::{
    auth::{lifetimes, secret},
    model::Kind,
    store::{Object, Op},
};

pub(super) async fn create(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = api.principal(&headers).await?;
    super::readable(&api, &principal, Kind::Cluster, &name).await?;
    let token = secret::new_token(secret::TokenKind::Token);
    let lifetimes = lifetimes::read(api.store.as_ref()).await?;
    let mut object = Object::new(
        Kind::Token.name(),
        &token.name,
        json!({
            "user": principal.user,
            "description": format!("kubeconfig for cluster {name}"),
            "expiresAt": lifetimes::expiry(lifetimes.kubeconfig),
            "secretHash": token.hash,
        }),
    );
    object
        .metadata
        .labels
        .insert(lifetimes::USER_LABEL.to_owned(), principal.user.clone());
    let mut ops = vec![Op::Create(object)];
    crate::refs::stamp_all(api.store.as_ref(), &mut ops).await?;
    api.store.transact(ops).await?;
    let ca = base64::engine::general_purpose::STANDARD.encode(api.ca_pem.as_bytes());
    let user = format!("{}@{name}", principal.user);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: {name}\n    cluster:\n      server: {url}/k8s/clusters/{name}\n      certificate-authority-data: {ca}\nusers:\n  - name: {user}\n    user:\n      token: {value}\ncontexts:\n  - name: {name}\n    context:\n      cluster: {name}\n      user: {user}\ncurrent-context: {name}\n",
        url = api.server_url,
        value = token.value,
    );
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/yaml")],
        kubeconfig,
    )
        .into_response())
}
