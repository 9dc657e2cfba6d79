//! Writes of roles and of what grants them, checked against the others: a template inherits
//! only what exists, fits its context and leads back to nothing; a binding names a template
//! of its scope that is not locked, and grants no more than its author holds there (as
//! Kubernetes refuses a RoleBinding that escalates); a role in use does not go.

use axum::http::StatusCode;
use serde_json::Value;

use super::ApiError;
use crate::{
    auth::Principal,
    model::{GlobalRoleSpec, Granted, Kind, RoleBindingSpec, RoleTemplateSpec, TemplateContext},
    roles::{Catalog, builtin, covers},
    store::{LabelSelector, Object, Store},
};

fn builtin_refused(kind: Kind, name: &str) -> ApiError {
    ApiError::invalid(format!(
        "{} {name:?} is builtin: the hub keeps it as it is; make your own that inherits it",
        kind.name()
    ))
}

fn is_builtin(kind: Kind, name: &str) -> bool {
    match kind {
        Kind::RoleTemplate => builtin::templates().iter().any(|(n, _)| n == name),
        _ => builtin::globals().iter().any(|(n, _)| n == name),
    }
}

async fn bindings(store: &dyn Store) -> Result<Vec<(String, RoleBindingSpec)>, ApiError> {
    let (all, _) = store
        .list(Kind::RoleBinding.name(), &LabelSelector::everything())
        .await?;
    Ok(all
        .into_iter()
        .filter_map(|b| {
            let spec = serde_json::from_value(b.spec).ok()?;
            Some((b.metadata.name, spec))
        })
        .collect())
}

/// "role bindings a, b and 3 more".
fn naming(what: &str, names: &[String]) -> String {
    let shown: Vec<String> = names.iter().take(5).map(|n| format!("{n:?}")).collect();
    let more = names.len().saturating_sub(5);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{what} {}{tail}", shown.join(", "))
}

/// Checks a write of `kind` `name` with `spec` (`current`: the spec it replaces).
pub(super) async fn check(
    store: &dyn Store,
    principal: &Principal,
    kind: Kind,
    name: &str,
    spec: &Value,
    current: Option<&Value>,
) -> Result<(), ApiError> {
    match kind {
        Kind::RoleTemplate => {
            let typed: RoleTemplateSpec = parse(spec)?;
            if is_builtin(kind, name) {
                return Err(builtin_refused(kind, name));
            }
            if typed.builtin {
                return Err(ApiError::invalid(
                    "spec.builtin: only the hub's own templates are builtin; leave it out",
                ));
            }
            let catalog = Catalog::read(store).await?;
            catalog
                .check_inherits(name, &typed)
                .map_err(ApiError::invalid)?;
            let before =
                current.and_then(|c| serde_json::from_value::<RoleTemplateSpec>(c.clone()).ok());
            if let Some(before) = before
                && before.context != typed.context
            {
                let bound: Vec<String> = bindings(store)
                    .await?
                    .into_iter()
                    .filter(|(_, b)| b.template().as_deref() == Some(name))
                    .map(|(n, _)| n)
                    .collect();
                if !bound.is_empty() {
                    return Err(ApiError::invalid(format!(
                        "spec.context: {name:?} is bound as a {} template by {}; it cannot become a {} template while bound",
                        before.context.label(),
                        naming("role bindings", &bound),
                        typed.context.label()
                    )));
                }
                if let Some(heir) = catalog.heirs(name).into_iter().next() {
                    return Err(ApiError::invalid(format!(
                        "spec.context: {heir:?} inherits {name:?}, and templates inherit only templates of their own context; take it out of {heir:?}'s spec.inherits first"
                    )));
                }
            }
            Ok(())
        }
        Kind::GlobalRole => {
            let typed: GlobalRoleSpec = parse(spec)?;
            if is_builtin(kind, name) {
                return Err(builtin_refused(kind, name));
            }
            if typed.builtin {
                return Err(ApiError::invalid(
                    "spec.builtin: only the hub's own global roles are builtin; leave it out",
                ));
            }
            let catalog = Catalog::read(store).await?;
            for (i, template) in typed.inherited_cluster_roles.iter().enumerate() {
                match catalog.template(template).map(|t| t.context) {
                    None => {
                        return Err(ApiError::invalid(format!(
                            "spec.inheritedClusterRoles[{i}]: RoleTemplate {template:?} does not exist; create it first"
                        )));
                    }
                    Some(TemplateContext::Project) => {
                        return Err(ApiError::invalid(format!(
                            "spec.inheritedClusterRoles[{i}]: {template:?} is a project template; a global role grants cluster templates on every cluster"
                        )));
                    }
                    Some(TemplateContext::Cluster) => {}
                }
            }
            Ok(())
        }
        Kind::User => user_covered(store, principal, name, Some(spec)).await,
        Kind::RoleBinding => {
            let typed: RoleBindingSpec = parse(spec)?;
            let before =
                current.and_then(|c| serde_json::from_value::<RoleBindingSpec>(c.clone()).ok());
            binding(store, principal, &typed, before.as_ref()).await
        }
        _ => Ok(()),
    }
}

fn parse<T: serde::de::DeserializeOwned>(spec: &Value) -> Result<T, ApiError> {
    serde_json::from_value(spec.clone()).map_err(|e| ApiError::invalid(format!("spec: {e}")))
}

/// The field a binding names its role in, for messages.
fn field_of(spec: &RoleBindingSpec) -> &'static str {
    if spec.role.is_some() {
        "spec.role"
    } else if spec.global_role.is_some() {
        "spec.globalRole"
    } else {
        "spec.roleTemplate"
    }
}

async fn binding(
    store: &dyn Store,
    principal: &Principal,
    spec: &RoleBindingSpec,
    before: Option<&RoleBindingSpec>,
) -> Result<(), ApiError> {
    let field = field_of(spec);
    let Some(granted) = spec.granted() else {
        return Ok(());
    };
    let catalog = Catalog::read(store).await?;
    let new = before.and_then(RoleBindingSpec::granted) != Some(granted.clone());
    let escalates = |what: &str, uncovered: String| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} may not grant {what}: it allows {uncovered}, which you do not hold there; ask an admin",
                principal.user
            ),
        )
    };
    match granted {
        Granted::Template(template) => {
            let Some(found) = catalog.template(&template) else {
                return Err(ApiError::invalid(format!(
                    "{field}: RoleTemplate {template:?} does not exist; create it first"
                )));
            };
            let cluster = spec.cluster.clone().unwrap_or_default();
            match (found.context, &spec.project) {
                (TemplateContext::Cluster, Some(project)) => {
                    return Err(ApiError::invalid(format!(
                        "{field}: {template:?} is a cluster template; it is bound on a cluster (leave out spec.project {project:?}), or choose a project template"
                    )));
                }
                (TemplateContext::Project, None) => {
                    return Err(ApiError::invalid(format!(
                        "spec.project: {template:?} is a project template; name the project of cluster {cluster:?} it applies to"
                    )));
                }
                _ => {}
            }
            if new && found.locked {
                return Err(ApiError::invalid(format!(
                    "{field}: RoleTemplate {template:?} is locked: it takes no new bindings"
                )));
            }
            if !principal.admin {
                let mut held = principal.on_cluster(&cluster).rules;
                if let Some(access) = spec
                    .project
                    .as_deref()
                    .and_then(|p| principal.on_project(p))
                {
                    held.extend(access.rules.iter().cloned());
                }
                let place = match &spec.project {
                    Some(p) => format!("project {p:?}"),
                    None => format!("cluster {cluster:?}"),
                };
                covers(&held, &catalog.rules_of(&template)).map_err(|uncovered| {
                    escalates(&format!("{template:?} on {place}"), uncovered)
                })?;
            }
            Ok(())
        }
        Granted::Global(name) => {
            let Some(found) = catalog.global(&name) else {
                return Err(ApiError::invalid(format!(
                    "{field}: GlobalRole {name:?} does not exist; create it first"
                )));
            };
            if !principal.admin {
                covers(&principal.global, &found.rules)
                    .map_err(|u| escalates(&format!("global role {name:?}"), u))?;
                for template in &found.inherited_cluster_roles {
                    covers(&principal.everywhere.rules, &catalog.rules_of(template))
                        .map_err(|u| escalates(&format!("global role {name:?}"), u))?;
                }
            }
            Ok(())
        }
    }
}

/// Refuses to delete a role that something still names, saying what; or a user who holds
/// more than the caller (see [`user_covered`]).
pub(super) async fn check_delete(
    store: &dyn Store,
    principal: &Principal,
    kind: Kind,
    object: &Object,
) -> Result<(), ApiError> {
    let name = object.metadata.name.as_str();
    if kind == Kind::User {
        return user_covered(store, principal, name, None).await;
    }
    if !matches!(kind, Kind::RoleTemplate | Kind::GlobalRole) {
        return Ok(());
    }
    if is_builtin(kind, name) {
        return Err(builtin_refused(kind, name));
    }
    let bound: Vec<String> = bindings(store)
        .await?
        .into_iter()
        .filter(|(_, b)| match (kind, b.granted()) {
            (Kind::RoleTemplate, Some(Granted::Template(t))) => t == name,
            (Kind::GlobalRole, Some(Granted::Global(g))) => g == name,
            _ => false,
        })
        .map(|(n, _)| n)
        .collect();
    let conflict = |why: String| ApiError::new(StatusCode::CONFLICT, "Conflict", why);
    if !bound.is_empty() {
        return Err(conflict(format!(
            "{} {name:?} is in use by {}; delete those bindings first",
            kind.name(),
            naming("role bindings", &bound)
        )));
    }
    if kind == Kind::RoleTemplate {
        let catalog = Catalog::read(store).await?;
        let heirs = catalog.heirs(name);
        if !heirs.is_empty() {
            return Err(conflict(format!(
                "RoleTemplate {name:?} is inherited by {}; take it out of their spec.inherits first",
                naming("role templates", &heirs)
            )));
        }
        let globals = catalog.granting_globals(name);
        if !globals.is_empty() {
            return Err(conflict(format!(
                "RoleTemplate {name:?} is granted on every cluster by {}; take it out of their spec.inheritedClusterRoles first",
                naming("global roles", &globals)
            )));
        }
    }
    Ok(())
}

/// The binding that makes a cluster's creator its owner, when the creator is no admin (an
/// admin owns every cluster already).
pub(super) fn creator_owns(principal: &Principal, cluster: &str) -> Option<Object> {
    if principal.admin {
        return None;
    }
    let base: String = cluster.chars().take(50).collect();
    let spec = RoleBindingSpec {
        user: Some(principal.user.clone()),
        group: None,
        role: None,
        role_template: Some("cluster-owner".into()),
        global_role: None,
        cluster: Some(cluster.to_owned()),
        project: None,
    };
    Some(Object::new(
        Kind::RoleBinding.name(),
        &format!("{}-creator", base.trim_end_matches('-')),
        serde_json::to_value(spec).ok()?,
    ))
}

/// Whether `principal`, who may manage users without being an admin, may change user `name`
/// (to `after`, its spec; `None`: delete it): only if the user holds nothing, as they are and
/// as they would be (their groups count), that the caller does not hold too. Resetting an
/// admin's password, or putting someone in an admin group, would otherwise make the caller an
/// admin.
async fn user_covered(
    store: &dyn Store,
    principal: &Principal,
    name: &str,
    after: Option<&Value>,
) -> Result<(), ApiError> {
    if principal.admin {
        return Ok(());
    }
    let groups_of = |spec: &Value| -> Vec<String> {
        ["groups", "providerGroups"]
            .iter()
            .flat_map(|field| spec[*field].as_array().cloned().unwrap_or_default())
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect()
    };
    let mut states = Vec::new();
    match store.get(Kind::User.name(), name).await {
        Ok(current) => states.push(groups_of(&current.spec)),
        Err(crate::store::StoreError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    if let Some(after) = after {
        states.push(groups_of(after));
    }
    let (all, _) = store
        .list(Kind::RoleBinding.name(), &LabelSelector::everything())
        .await?;
    let catalog = Catalog::read(store).await?;
    let refused = |what: String| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} may not change user {name:?}: they would hold {what}, which you do not hold; ask an admin",
                principal.user
            ),
        )
    };
    for groups in states {
        let held = crate::auth::roles_of(&all, &catalog, name, &groups);
        covers(&principal.global, &held.global).map_err(|u| refused(format!("{u} on the hub")))?;
        covers(&principal.everywhere.rules, &held.everywhere.rules)
            .map_err(|u| refused(format!("{u} on every cluster")))?;
        for (cluster, access) in &held.clusters {
            covers(&principal.on_cluster(cluster).rules, &access.rules)
                .map_err(|u| refused(format!("{u} on cluster {cluster:?}")))?;
        }
        for (project, (cluster, access)) in &held.projects {
            let mut mine = principal.on_cluster(cluster).rules;
            if let Some(p) = principal.on_project(project) {
                mine.extend(p.rules.iter().cloned());
            }
            covers(&mine, &access.rules)
                .map_err(|u| refused(format!("{u} on project {project:?}")))?;
        }
    }
    Ok(())
}
