//! Reading the hub's settings (`/v1/settings/{name}`), each with its default.

use serde_json::Value;

use super::Kind;
use crate::store::{Store, StoreError};

/// A hub setting's value, or `default`.
pub async fn setting(store: &dyn Store, name: &str, default: String) -> Result<String, StoreError> {
    match store.get(Kind::Setting.name(), name).await {
        Ok(s) => Ok(s
            .spec
            .get("value")
            .and_then(Value::as_str)
            .map_or(default, str::to_owned)),
        Err(StoreError::NotFound { .. }) => Ok(default),
        Err(e) => Err(e),
    }
}

/// Sets a hub setting (made if it is not there), as an admin's `drover-hub setting set` would.
pub async fn set_setting(store: &dyn Store, name: &str, value: &str) -> Result<(), StoreError> {
    let spec = serde_json::json!({"value": value});
    match store.get(Kind::Setting.name(), name).await {
        Ok(mut setting) if setting.spec != spec => {
            setting.spec = spec;
            store.update(setting).await.map(drop)
        }
        Ok(_) => Ok(()),
        Err(StoreError::NotFound { .. }) => store
            .create(crate::store::Object::new(Kind::Setting.name(), name, spec))
            .await
            .map(drop),
        Err(e) => Err(e),
    }
}

/// The cluster-agent's image (setting `cluster-agent-image`): the agents' manifest runs it,
/// and the authorized endpoint's authenticator, which ships in it.
pub async fn cluster_agent_image(store: &dyn Store) -> Result<String, StoreError> {
    setting(
        store,
        "cluster-agent-image",
        format!("drover/cluster-agent:{}", env!("CARGO_PKG_VERSION")),
    )
    .await
}
