//! The first administrator. On the first start, with no users at all, the hub creates `admin`
//! with a random password that it prints once; only its hash is kept. `drover-hub
//! reset-admin-password` sets a new one when it is lost. The builtin role templates and global
//! roles are written as this hub defines them at every start.

use serde_json::json;

use crate::{
    auth::secret,
    model::Kind,
    store::{LabelSelector, Object, Op, Store, StoreError},
};

pub const ADMIN: &str = "admin";
const ADMIN_BINDING: &str = "admin-is-admin";

fn admin_binding() -> Object {
    Object::new(
        Kind::RoleBinding.name(),
        ADMIN_BINDING,
        json!({"user": ADMIN, "role": "admin"}),
    )
}

async fn hashed(password: &str) -> Result<String, StoreError> {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || secret::hash_password(&password))
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))
}

/// Creates `admin` if the store has no user; returns the password to show, once.
pub async fn first_admin(store: &dyn Store) -> Result<Option<String>, StoreError> {
    let (users, _) = store
        .list(Kind::User.name(), &LabelSelector::everything())
        .await?;
    if !users.is_empty() {
        return Ok(None);
    }
    let password = secret::random_password();
    let user = Object::new(
        Kind::User.name(),
        ADMIN,
        json!({"displayName": "Administrator", "passwordHash": hashed(&password).await?}),
    );
    let mut ops = vec![Op::Create(user), Op::Create(admin_binding())];
    crate::refs::stamp_all(store, &mut ops).await?;
    match store.transact(ops).await {
        Ok(_) => Ok(Some(password)),
        // Another process created it first: that one shows the password.
        Err(StoreError::AlreadyExists { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the builtin role templates and global roles as this hub defines them, where the
/// store lacks them or holds another version (a hub of another release wrote it). What they
/// grant comes from the code whatever the store holds (`crate::roles::Catalog`): these copies
/// are for the API's lists and watches.
pub async fn builtin_roles(store: &dyn Store) -> Result<(), StoreError> {
    let templates = crate::roles::builtin::templates()
        .iter()
        .map(|(name, spec)| {
            (
                Kind::RoleTemplate,
                name,
                serde_json::to_value(spec.as_ref()),
            )
        });
    let globals = crate::roles::builtin::globals()
        .iter()
        .map(|(name, spec)| (Kind::GlobalRole, name, serde_json::to_value(spec.as_ref())));
    for (kind, name, spec) in templates.chain(globals) {
        let spec = spec.map_err(|e| StoreError::Backend(e.to_string()))?;
        let written = match store.get(kind.name(), name).await {
            Ok(found) if found.spec == spec => continue,
            Ok(mut found) => {
                found.spec = spec;
                store.update(found).await.map(drop)
            }
            Err(StoreError::NotFound { .. }) => store
                .create(Object::new(kind.name(), name, spec))
                .await
                .map(drop),
            Err(e) => Err(e),
        };
        match written {
            // Another replica wrote it at the same moment.
            Ok(()) | Err(StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Gives `admin` a new random password (creating the user and its admin binding if they are
/// gone, and enabling it); returns the password to show, once.
pub async fn reset_admin_password(store: &dyn Store) -> Result<String, StoreError> {
    let password = secret::random_password();
    let hash = hashed(&password).await?;
    let mut ops = Vec::new();
    match store.get(Kind::User.name(), ADMIN).await {
        Ok(mut user) => {
            if let serde_json::Value::Object(spec) = &mut user.spec {
                spec.insert("passwordHash".into(), hash.into());
                spec.insert("disabled".into(), false.into());
            }
            ops.push(Op::Update(user));
        }
        Err(StoreError::NotFound { .. }) => ops.push(Op::Create(Object::new(
            Kind::User.name(),
            ADMIN,
            json!({"displayName": "Administrator", "passwordHash": hash}),
        ))),
        Err(e) => return Err(e),
    }
    match store.get(Kind::RoleBinding.name(), ADMIN_BINDING).await {
        Err(StoreError::NotFound { .. }) => ops.push(Op::Create(admin_binding())),
        // Made for an `admin` user deleted since (and `admin` is new): made again for this one.
        Ok(binding) if !crate::refs::Liveness::new(store).live(&binding).await? => {
            ops.push(Op::Delete {
                kind: Kind::RoleBinding.name().into(),
                name: ADMIN_BINDING.into(),
                resource_version: None,
            });
            ops.push(Op::Create(admin_binding()));
        }
        Ok(_) => {}
        Err(e) => return Err(e),
    }
    crate::refs::stamp_all(store, &mut ops).await?;
    store.transact(ops).await?;
    Ok(password)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn a_reset_after_admin_was_deleted_binds_the_new_admin() {
        let dir = std::env::temp_dir().join(format!("drover-bootstrap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap());
        first_admin(store.as_ref()).await.unwrap().unwrap();
        // The user goes; its binding is left behind (as until the collector runs).
        store.delete(Kind::User.name(), ADMIN, None).await.unwrap();
        reset_admin_password(store.as_ref()).await.unwrap();
        let binding = store
            .get(Kind::RoleBinding.name(), ADMIN_BINDING)
            .await
            .unwrap();
        let mut liveness = crate::refs::Liveness::new(store.as_ref());
        assert!(liveness.live(&binding).await.unwrap(), "{binding:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
