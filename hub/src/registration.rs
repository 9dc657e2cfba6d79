//! Registering clusters and hosts: the commands an operator runs, and the registration token
//! they carry. The token's value appears only in those commands; the hub keeps its hash.

use axum::{
    extract::{Path, State},
    http::header,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    api::{Api, ApiError},
    auth::secret::{self, NewToken, TokenKind},
    model::{ClusterSpec, ClusterType, Kind},
    store::{Object, StoreError},
};

/// The import manifest's template (see `deploy/import.yaml`).
const IMPORT_TEMPLATE: &str = include_str!("../../deploy/import.yaml");

/// Checks a registration token's value; returns its cluster's name and spec.
pub async fn verify(api: &Api, value: &str) -> Result<(String, ClusterSpec), ApiError> {
    let bad = || {
        ApiError::unauthorized(
            "unknown, expired or revoked registration token; get a new command from the hub",
        )
    };
    let Some((TokenKind::Registration, name, token_secret)) = secret::parse_token(value) else {
        return Err(bad());
    };
    let registration = match api.store.get(Kind::RegistrationToken.name(), name).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => return Err(bad()),
        Err(e) => return Err(e.into()),
    };
    if !secret::opens(&registration, token_secret) {
        return Err(bad());
    }
    let cluster = registration
        .spec
        .get("cluster")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let spec = api.store.get(Kind::Cluster.name(), &cluster).await?.spec;
    let spec: ClusterSpec =
        serde_json::from_value(spec).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok((cluster, spec))
}

/// A hub setting's value, or `default`.
async fn setting(api: &Api, name: &str, default: String) -> Result<String, ApiError> {
    match api.store.get(Kind::Setting.name(), name).await {
        Ok(s) => Ok(s
            .spec
            .get("value")
            .and_then(Value::as_str)
            .map_or(default, str::to_owned)),
        Err(StoreError::NotFound { .. }) => Ok(default),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v3/import/<token>.yaml`: the manifest that installs the agents into an imported
/// cluster. The token in the URL is the credential; 404 for anything but a valid one.
pub async fn import_manifest(
    State(api): State<Api>,
    Path(file): Path<String>,
) -> Result<Response, ApiError> {
    let not_found =
        || ApiError::not_found("no import manifest here; get a new import command from the hub");
    let value = file.strip_suffix(".yaml").ok_or_else(not_found)?;
    let (cluster, spec) = verify(&api, value).await.map_err(|_| not_found())?;
    if spec.cluster_type != ClusterType::Imported {
        return Err(ApiError::not_found(format!(
            "cluster {cluster:?} is a custom cluster; its hosts register with the host command, not a manifest"
        )));
    }
    let version = env!("CARGO_PKG_VERSION");
    let cluster_image = setting(
        &api,
        "cluster-agent-image",
        format!("drover/cluster-agent:{version}"),
    )
    .await?;
    let node_image = setting(
        &api,
        "node-agent-image",
        format!("drover/node-agent:{version}"),
    )
    .await?;
    let manifest = IMPORT_TEMPLATE
        .replace("{{HUB_URL}}", &api.server_url)
        .replace("{{TOKEN}}", value)
        .replace("{{CA_CHECKSUM}}", &api.ca_checksum)
        .replace("{{CLUSTER}}", &cluster)
        .replace("{{CLUSTER_AGENT_IMAGE}}", &cluster_image)
        .replace("{{NODE_AGENT_IMAGE}}", &node_image);
    Ok(([(header::CONTENT_TYPE, "application/yaml")], manifest).into_response())
}

/// The RegistrationToken object for a new token of `cluster`.
pub fn token_object(cluster: &str, token: &NewToken) -> Object {
    Object::new(
        Kind::RegistrationToken.name(),
        &token.name,
        json!({"cluster": cluster, "secretHash": token.hash}),
    )
}

/// The commands that register agents with `token`: for an imported cluster the manifest to
/// apply, for a custom cluster the host install script (flags pick the host's roles).
pub fn commands(api: &Api, cluster_type: ClusterType, token: &str) -> Value {
    let url = &api.server_url;
    match cluster_type {
        ClusterType::Imported => json!({
            "token": token,
            "manifestUrl": format!("{url}/v3/import/{token}.yaml"),
            "importCommand": format!("kubectl apply -f {url}/v3/import/{token}.yaml"),
            // The hub's own CA is not in kubectl's trust store; the manifest carries the CA
            // checksum the agents then verify.
            "importCommandInsecure": format!("curl --insecure -sfL {url}/v3/import/{token}.yaml | kubectl apply -f -"),
        }),
        ClusterType::Custom => json!({
            "token": token,
            "hostCommand": format!(
                "curl --insecure -fsSL {url}/system-agent-install.sh | sudo sh -s - --server {url} --token {token} --ca-checksum {}",
                api.ca_checksum
            ),
            "roleFlags": ["--etcd", "--controlplane", "--worker", "--all-roles"],
        }),
    }
}
