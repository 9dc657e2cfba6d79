//! Naming a credential is a permission. A cluster's spec names CloudCredentials (the agents'
//! pull credential, its registries' logins, a hosted cluster's cloud account) and MachineTemplates (its machine pools), and the
//! hub then spends them for the cluster: puts the password in its manifests and plans, makes
//! machines with the template's SSH key or cloud account. So a caller may name one only if
//! they are an admin or the credential grants them its use (`spec.allowed`: users, groups;
//! a template by its credential's). A refused name is answered exactly as a missing one:
//! which credentials exist, and their drivers, are the admins' to know.

use serde_json::Value;

use super::ApiError;
use crate::{
    auth::Principal,
    model::{ClusterSpec, Kind},
    store::{Store, StoreError},
};

/// What a cluster's or a GitRepo's spec names that it would spend: (field, kind, name).
fn named(kind: Kind, spec: &Value) -> Vec<(String, Kind, String)> {
    if kind == Kind::GitRepo {
        return spec
            .get("credential")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .map(|c| {
                (
                    "spec.credential".to_owned(),
                    Kind::CloudCredential,
                    c.to_owned(),
                )
            })
            .into_iter()
            .collect();
    }
    let Ok(cluster) = serde_json::from_value::<ClusterSpec>(spec.clone()) else {
        return Vec::new();
    };
    let mut named = Vec::new();
    if let Some(images) = &cluster.agent_images
        && !images.pull_credential.is_empty()
    {
        named.push((
            "spec.agentImages.pullCredential".to_owned(),
            Kind::CloudCredential,
            images.pull_credential.clone(),
        ));
    }
    if let Some(registries) = &cluster.registries {
        for (host, config) in &registries.configs {
            if !config.credential.is_empty() {
                named.push((
                    format!("spec.registries.configs[{host:?}].credential"),
                    Kind::CloudCredential,
                    config.credential.clone(),
                ));
            }
        }
    }
    if let Some(hosted) = &cluster.hosted {
        named.push((
            "spec.hosted.credential".to_owned(),
            Kind::CloudCredential,
            hosted.credential.clone(),
        ));
    }
    for (i, pool) in cluster.machine_pools.iter().enumerate() {
        named.push((
            format!("spec.machinePools[{i}].template"),
            Kind::MachineTemplate,
            pool.template.clone(),
        ));
    }
    named
}

/// Whether `principal` may use what `kind` `name` spends: a credential they are granted, or a
/// template whose credential they are granted.
async fn may_use(
    store: &dyn Store,
    principal: &Principal,
    kind: Kind,
    name: &str,
) -> Result<bool, ApiError> {
    let credential = match kind {
        Kind::MachineTemplate => match store.get(Kind::MachineTemplate.name(), name).await {
            Ok(template) => template
                .spec
                .get("credential")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            Err(StoreError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        },
        _ => name.to_owned(),
    };
    // A global role may let its holders use every credential (or those it names).
    if principal.may_globally("use", Kind::CloudCredential, Some(&credential)) {
        return Ok(crate::grants::grants_of(store, &credential)
            .await?
            .is_some());
    }
    Ok(crate::grants::grants_of(store, &credential)
        .await?
        .is_some_and(|allowed| {
            crate::grants::granted(&allowed, &principal.user, &principal.groups)
        }))
}

/// Refuses a cluster `spec` that names a credential or template `principal` may not use. Only
/// what the write adds is checked (a name `current` already had was allowed when it came), so
/// an owner can still scale the pools an admin set up. Admins may name anything, even what
/// does not exist yet (the cluster waits for it, saying so).
pub(super) async fn check(
    store: &dyn Store,
    principal: &Principal,
    kind: Kind,
    spec: &Value,
    current: Option<&Value>,
) -> Result<(), ApiError> {
    if !matches!(kind, Kind::Cluster | Kind::GitRepo) || principal.admin {
        return Ok(());
    }
    let had: Vec<(Kind, String)> = current
        .map(|c| named(kind, c))
        .unwrap_or_default()
        .into_iter()
        .map(|(_, kind, name)| (kind, name))
        .collect();
    for (field, kind, name) in named(kind, spec) {
        if had.contains(&(kind, name.clone())) {
            continue;
        }
        if !may_use(store, principal, kind, &name).await? {
            return Err(ApiError::invalid(format!(
                "{field}: there is no {} {name:?} you may use; an admin makes them and grants their use (a CloudCredential's spec.allowed)",
                kind.name()
            )));
        }
    }
    Ok(())
}
