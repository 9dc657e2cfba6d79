//! Who may spend a CloudCredential. An admin may; so may the users and groups its
//! `spec.allowed` grants. The API asks it of the caller who names a credential on a cluster
//! (`api::uses`); the planner and the import manifest ask it of the cluster itself before they
//! put a credential's secret where the cluster's owners can read it (the manifest they fetch
//! with their registration token, the plans their hosts receive): the cluster may have it only
//! if every one of its owners (whoever may read its plans or make its registration tokens)
//! may.

use serde_json::Value;

use crate::{
    auth::roles_of,
    model::{Allowed, Granted, HUB_GROUP, Kind, RoleBindingSpec, UserSpec},
    refs::Liveness,
    roles::Catalog,
    store::{LabelSelector, Store, StoreError},
};

/// Whether `allowed` grants `user`, a member of `groups`, the use of a credential.
pub fn granted(allowed: &Allowed, user: &str, groups: &[String]) -> bool {
    allowed.users.iter().any(|u| u == user)
        || allowed.groups.iter().any(|g| groups.iter().any(|m| m == g))
}

/// The credential `name`'s grants, if it exists.
pub async fn grants_of(store: &dyn Store, name: &str) -> Result<Option<Allowed>, StoreError> {
    match store.get(Kind::CloudCredential.name(), name).await {
        Ok(found) => Ok(Some(allowed_of(&found.spec))),
        Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether cluster `cluster` may carry credential `credential`'s secret: `Ok` when every owner
/// of the cluster (its live `cluster-owner` bindings, users and groups) is an admin or granted
/// the credential; otherwise which owner is not, as a sentence. A credential that does not
/// exist is left to the caller (it says so in its own words).
pub async fn cluster_may_use(
    store: &dyn Store,
    cluster: &str,
    credential: &str,
) -> Result<Result<(), String>, StoreError> {
    let Some(allowed) = grants_of(store, credential).await? else {
        return Ok(Ok(()));
    };
    let (bindings, _) = store
        .list(Kind::RoleBinding.name(), &LabelSelector::everything())
        .await?;
    let bindings = Liveness::new(store).keep_live(bindings).await?;
    let catalog = Catalog::read(store).await?;
    // Whoever a binding makes able to read the cluster's secrets (its plans, its tokens):
    // on this cluster, or on every cluster through a global role.
    let owning_template = |template: &str| {
        let rules = catalog.rules_of(template);
        let may = |verb: &str, kind: Kind| {
            crate::roles::allows(&rules, verb, HUB_GROUP, kind.plural(), None)
        };
        may("get", Kind::Plan) || may("create", Kind::RegistrationToken)
    };
    let owning = |spec: &RoleBindingSpec| match spec.granted() {
        Some(Granted::Template(template)) => {
            spec.cluster.as_deref() == Some(cluster)
                && spec.project.is_none()
                && owning_template(&template)
        }
        Some(Granted::Global(name)) => catalog
            .global(&name)
            .is_some_and(|g| g.inherited_cluster_roles.iter().any(|t| owning_template(t))),
        None => false,
    };
    let admin_groups = admin_groups_of(&bindings, &catalog, credential);
    for binding in &bindings {
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec.clone()) else {
            continue;
        };
        if !owning(&spec) {
            continue;
        }
        let ok = match (&spec.user, &spec.group) {
            (Some(user), _) => {
                let groups = groups_of(store, user).await?;
                let roles = roles_of(&bindings, &catalog, user, &groups);
                roles.admin
                    || uses_any(&roles.global, credential)
                    || granted(&allowed, user, &groups)
            }
            (None, Some(group)) => {
                admin_groups.contains(group) || allowed.groups.iter().any(|g| g == group)
            }
            (None, None) => true,
        };
        if !ok {
            let who = spec.user.map_or_else(
                || format!("group {:?}", spec.group.unwrap_or_default()),
                |u| format!("user {u:?}"),
            );
            return Ok(Err(format!(
                "CloudCredential {credential:?} is not granted to {who}, an owner of cluster {cluster:?} (role binding {:?}), who could read it from the cluster's manifests and plans; an admin grants it in the credential's spec.allowed",
                binding.metadata.name
            )));
        }
    }
    Ok(Ok(()))
}

/// Whether global rules let their holder use `credential`.
fn uses_any(rules: &[crate::model::PolicyRule], credential: &str) -> bool {
    crate::roles::allows(
        rules,
        "use",
        HUB_GROUP,
        Kind::CloudCredential.plural(),
        Some(credential),
    )
}

/// The groups bound to a global role that lets them use `credential` (as `admin` does).
fn admin_groups_of(
    bindings: &[crate::store::Object],
    catalog: &Catalog,
    credential: &str,
) -> Vec<String> {
    bindings
        .iter()
        .filter_map(|b| serde_json::from_value::<RoleBindingSpec>(b.spec.clone()).ok())
        .filter(|b| {
            let Some(Granted::Global(name)) = b.granted() else {
                return false;
            };
            catalog
                .global(&name)
                .is_some_and(|g| uses_any(&g.rules, credential))
        })
        .filter_map(|b| b.group)
        .collect()
}

/// A user's groups as stored (local and the directory's last known), none if no such user.
async fn groups_of(store: &dyn Store, user: &str) -> Result<Vec<String>, StoreError> {
    match store.get(Kind::User.name(), user).await {
        Ok(found) => Ok(serde_json::from_value::<UserSpec>(found.spec)
            .map(|mut spec| {
                spec.groups.append(&mut spec.provider_groups);
                spec.groups
            })
            .unwrap_or_default()),
        Err(StoreError::NotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// A credential's `spec.allowed` (none granted if absent).
fn allowed_of(spec: &Value) -> Allowed {
    spec.get("allowed")
        .and_then(|a| serde_json::from_value(a.clone()).ok())
        .unwrap_or_default()
}
