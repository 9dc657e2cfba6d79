//! Who may do what in each cluster, as the cluster-agent needs it to keep the cluster's RBAC in
//! step with the hub: the cluster's role bindings (users and groups) and the templates they
//! name, its projects with their members and secrets. Sent whole at connect and again whenever one of those objects changes
//! (`ClusterAgent.WatchAccess`); the agent compares and writes only what differs.

use std::{pin::Pin, sync::Arc, time::Duration};

use base64::Engine as _;
use futures::Stream;
use proto::cluster::v1::{
    AccessSnapshot, AuthorizedEndpoint, ClusterToken, Grant, ProjectAccess, ProjectSecret, Rule,
    Subject, Template,
};
use serde_json::Value;

use crate::{
    model::{
        ClusterSpec, Granted, HUB_GROUP, Kind, ProjectSecretSpec, ProjectSpec, RoleBindingSpec,
        TemplateContext, TokenSpec, UserSpec,
    },
    roles::Catalog,
    store::{LabelSelector, Object, Store, StoreError},
};

mod changes;

pub use changes::Changes;

fn grant(spec: &RoleBindingSpec, template: &str) -> Option<Grant> {
    let subject = match (&spec.user, &spec.group) {
        (Some(user), _) => Subject {
            kind: "User".into(),
            name: user.clone(),
        },
        (None, Some(group)) => Subject {
            kind: "Group".into(),
            name: group.clone(),
        },
        (None, None) => return None,
    };
    Some(Grant {
        role: template.to_owned(),
        subject: Some(subject),
    })
}

fn sort_grants(grants: &mut [Grant]) {
    grants.sort_by(|a, b| {
        let key = |g: &Grant| {
            let s = g.subject.clone().unwrap_or_default();
            (g.role.clone(), s.kind, s.name)
        };
        key(a).cmp(&key(b))
    });
}

/// The access `cluster`'s agent must set up, from the store as it is now.
pub async fn snapshot(store: &dyn Store, cluster: &str) -> Result<AccessSnapshot, StoreError> {
    let everything = LabelSelector::everything();
    let of_cluster = |o: &Object| o.spec.get("cluster").and_then(Value::as_str) == Some(cluster);
    // Only what was made for this very cluster (and project, and user) counts: a binding left
    // behind by a deleted namesake grants nothing here (see `crate::refs`).
    let list = async |kind: Kind| store.list(kind.name(), &everything).await.map(|(o, _)| o);
    let all_projects = list(Kind::Project).await?;
    let users = list(Kind::User).await?;
    let bindings = list(Kind::RoleBinding).await?;
    let secrets = list(Kind::ProjectSecret).await?;
    let mine = |objects: Vec<Object>| objects.into_iter().filter(of_cluster).collect::<Vec<_>>();
    let mut liveness = crate::refs::Liveness::new(store)
        .knowing(Kind::Project, &all_projects)
        .knowing(Kind::User, &users);
    let projects = liveness.keep_live(mine(all_projects.clone())).await?;
    let catalog = Catalog::read(store).await?;
    let endpoint = endpoint(store, cluster, &users, &bindings, &catalog, &mut liveness).await?;
    let global_bindings = liveness
        .keep_live(
            bindings
                .iter()
                .filter(|b| b.spec.get("cluster").is_none())
                .cloned()
                .collect(),
        )
        .await?
        .into_iter()
        .filter_map(|b| serde_json::from_value::<RoleBindingSpec>(b.spec).ok())
        .collect::<Vec<_>>();
    let bindings = liveness.keep_live(mine(bindings)).await?;
    let secrets = liveness.keep_live(mine(secrets)).await?;
    let mut snapshot = AccessSnapshot {
        endpoint,
        ..AccessSnapshot::default()
    };
    for project in projects {
        let Ok(spec) = serde_json::from_value::<ProjectSpec>(project.spec) else {
            continue;
        };
        if spec.cluster == cluster {
            snapshot.projects.push(ProjectAccess {
                name: project.metadata.name,
                ..ProjectAccess::default()
            });
        }
    }
    snapshot.projects.sort_by(|a, b| a.name.cmp(&b.name));
    let context_of = |template: &str| catalog.template(template).map(|t| t.context);
    for binding in bindings {
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec) else {
            continue;
        };
        if spec.cluster.as_deref() != Some(cluster) {
            continue;
        }
        let Some(template) = spec.template() else {
            continue;
        };
        // A binding to a template that does not exist, or of the other context, grants
        // nothing (validation refuses both; a template cannot go while bound).
        match (&spec.project, context_of(&template)) {
            (None, Some(TemplateContext::Cluster)) => {
                snapshot.cluster_grants.extend(grant(&spec, &template));
            }
            // A binding to a project that does not exist (yet) grants nothing.
            (Some(project), Some(TemplateContext::Project)) => {
                if let Some(p) = snapshot.projects.iter_mut().find(|p| &p.name == project) {
                    p.grants.extend(grant(&spec, &template));
                }
            }
            _ => {}
        }
    }
    // Global roles that hold cluster templates hold them here too.
    for spec in global_bindings {
        let Some(Granted::Global(name)) = spec.granted() else {
            continue;
        };
        for template in catalog
            .global(&name)
            .map_or(&[][..], |g| &g.inherited_cluster_roles)
        {
            if context_of(template) == Some(TemplateContext::Cluster) {
                snapshot.cluster_grants.extend(grant(&spec, template));
            }
        }
    }
    snapshot.templates = templates(&catalog, &snapshot);
    for secret in secrets {
        let Ok(spec) = serde_json::from_value::<ProjectSecretSpec>(secret.spec) else {
            continue;
        };
        if spec.cluster != cluster {
            continue;
        }
        let Some(project) = snapshot
            .projects
            .iter_mut()
            .find(|p| p.name == spec.project)
        else {
            continue;
        };
        let data = spec
            .data
            .iter()
            .filter_map(|(k, v)| {
                let bytes = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
                Some((k.clone(), bytes))
            })
            .collect();
        project.secrets.push(ProjectSecret {
            name: secret.metadata.name,
            r#type: spec.secret_type,
            data,
        });
    }
    sort_grants(&mut snapshot.cluster_grants);
    for project in &mut snapshot.projects {
        sort_grants(&mut project.grants);
        project.secrets.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(snapshot)
}

/// The templates `snapshot`'s grants name, each with its rules and what it inherits (those
/// on the hub's own objects left out: the cluster has none of those).
fn templates(catalog: &Catalog, snapshot: &AccessSnapshot) -> Vec<Template> {
    let named: std::collections::BTreeSet<&str> = snapshot
        .cluster_grants
        .iter()
        .chain(snapshot.projects.iter().flat_map(|p| &p.grants))
        .map(|g| g.role.as_str())
        .collect();
    named
        .into_iter()
        .filter_map(|name| {
            let spec = catalog.template(name)?;
            let rules = if spec.builtin {
                Vec::new()
            } else {
                catalog
                    .rules_of(name)
                    .into_iter()
                    .filter_map(|rule| {
                        let api_groups: Vec<String> = rule
                            .api_groups
                            .into_iter()
                            .filter(|g| g != HUB_GROUP)
                            .collect();
                        let keep = !api_groups.is_empty() || !rule.non_resource_urls.is_empty();
                        keep.then_some(Rule {
                            api_groups,
                            resources: rule.resources,
                            resource_names: rule.resource_names,
                            verbs: rule.verbs,
                            non_resource_urls: rule.non_resource_urls,
                        })
                    })
                    .collect()
            };
            Some(Template {
                name: name.to_owned(),
                builtin: spec.builtin,
                context: spec.context.label().to_owned(),
                rules,
            })
        })
        .collect()
}

/// The authorized endpoint's part of `cluster`'s access, when it is on: every kubeconfig token
/// made for this cluster that may open it now (live, unexpired, of an enabled user who holds
/// a role on the cluster or is an admin), with who it acts as downstream.
async fn endpoint(
    store: &dyn Store,
    cluster: &str,
    users: &[Object],
    bindings: &[Object],
    catalog: &Catalog,
    liveness: &mut crate::refs::Liveness<'_>,
) -> Result<Option<AuthorizedEndpoint>, StoreError> {
    let spec = match store.get(Kind::Cluster.name(), cluster).await {
        Ok(c) => serde_json::from_value::<ClusterSpec>(c.spec).ok(),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    if !spec.is_some_and(|s| s.endpoint_enabled()) {
        return Ok(None);
    }
    let (tokens, _) = store
        .list(Kind::Token.name(), &LabelSelector::everything())
        .await?;
    let tokens = tokens
        .into_iter()
        .filter(|t| t.spec.get("cluster").and_then(Value::as_str) == Some(cluster))
        .filter(|t| !crate::model::expired(&t.spec) && t.metadata.deletion_timestamp.is_none())
        .collect();
    let tokens = liveness.keep_live(tokens).await?;
    let bindings = liveness.keep_live(bindings.to_vec()).await?;
    let mut out = Vec::new();
    for token in tokens {
        let Ok(spec) = serde_json::from_value::<TokenSpec>(token.spec) else {
            continue;
        };
        let Some(user) = spec.user else { continue };
        let Some(user_spec) = users
            .iter()
            .find(|u| u.metadata.name == user)
            .and_then(|u| serde_json::from_value::<UserSpec>(u.spec.clone()).ok())
        else {
            continue;
        };
        if user_spec.disabled {
            continue;
        }
        let mut groups = user_spec.groups;
        groups.extend(user_spec.provider_groups);
        let roles = crate::auth::roles_of(&bindings, catalog, &user, &groups);
        if !roles.reaches(cluster) {
            continue;
        }
        out.push(ClusterToken {
            name: token.metadata.name,
            hash: spec.secret_hash,
            groups: crate::auth::downstream_groups(roles.admin, &groups)
                .map(str::to_owned)
                .collect(),
            user,
            expires_at: spec.expires_at.unwrap_or_default(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(AuthorizedEndpoint {
        image: crate::model::cluster_agent_image(store).await?,
        tokens: out,
    }))
}

/// Snapshots for `cluster`: the current one, then each new one as it comes about (an equal one
/// is not sent twice).
pub type Snapshots = Pin<Box<dyn Stream<Item = Result<AccessSnapshot, tonic::Status>> + Send>>;

/// Follows `cluster`'s access for as long as the stream is read, woken by `changes`.
pub fn follow(store: Arc<dyn Store>, changes: &Changes, cluster: String) -> Snapshots {
    let subscription = changes.subscribe(&cluster);
    let state = (store, cluster, subscription, None::<AccessSnapshot>);
    Box::pin(futures::stream::unfold(
        state,
        |(store, cluster, mut changes, last)| async move {
            if last.is_some() {
                changes.changed().await?;
            }
            loop {
                // Seen before the read: a change after it wakes the next read.
                changes.seen();
                match snapshot(store.as_ref(), &cluster).await {
                    Ok(now) if last.as_ref() != Some(&now) => {
                        return Some((Ok(now.clone()), (store, cluster, changes, Some(now))));
                    }
                    Ok(_) => changes.changed().await?,
                    Err(e) => {
                        tracing::warn!(cluster = %cluster, error = %e, "cannot read the cluster's access; trying again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::store::{Op, sqlite::SqliteStore};

    async fn create(store: &dyn Store, kind: Kind, name: &str, spec: Value) {
        let mut ops = vec![Op::Create(Object::new(kind.name(), name, spec))];
        crate::refs::stamp_all(store, &mut ops).await.unwrap();
        store.transact(ops).await.unwrap();
    }

    #[tokio::test]
    async fn the_endpoint_carries_the_live_tokens_of_users_who_reach_the_cluster() {
        let dir = std::env::temp_dir().join(format!("drover-access-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("state.db")).unwrap();
        let store: &dyn Store = &store;
        let custom = |endpoint: bool| {
            json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
                   "authorizedEndpoint": {"enabled": endpoint}})
        };
        create(store, Kind::Cluster, "edge", custom(true)).await;
        create(store, Kind::Cluster, "other", custom(true)).await;
        for (user, spec) in [
            ("ann", json!({"groups": ["ops"]})),
            ("bob", json!({})),
            ("carl", json!({"disabled": true})),
            ("root", json!({})),
            ("dana", json!({"providerGroups": ["ldap:devs"]})),
        ] {
            create(store, Kind::User, user, spec).await;
        }
        for (name, spec) in [
            (
                "b1",
                json!({"user": "ann", "role": "cluster-member", "cluster": "edge"}),
            ),
            (
                "b2",
                json!({"user": "carl", "role": "cluster-owner", "cluster": "edge"}),
            ),
            ("b3", json!({"user": "root", "role": "admin"})),
            (
                "b4",
                json!({"user": "bob", "role": "read-only", "cluster": "other"}),
            ),
            (
                "b5",
                json!({"group": "ldap:devs", "role": "read-only", "cluster": "edge"}),
            ),
        ] {
            create(store, Kind::RoleBinding, name, spec).await;
        }
        let token = |user: &str, cluster: Option<&str>, expires: &str| {
            let mut spec =
                json!({"user": user, "secretHash": "ab".repeat(32), "expiresAt": expires});
            if let Some(c) = cluster {
                spec["cluster"] = json!(c);
            }
            spec
        };
        let later = "2999-01-01T00:00:00Z";
        for (name, spec) in [
            ("tann", token("ann", Some("edge"), later)),
            ("tannother", token("ann", Some("other"), later)),
            ("tannsession", token("ann", None, later)),
            (
                "tannold",
                token("ann", Some("edge"), "2001-01-01T00:00:00Z"),
            ),
            ("tbob", token("bob", Some("edge"), later)),
            ("tcarl", token("carl", Some("edge"), later)),
            ("troot", token("root", Some("edge"), later)),
            ("tdana", token("dana", Some("edge"), later)),
        ] {
            create(store, Kind::Token, name, spec).await;
        }
        let endpoint = snapshot(store, "edge").await.unwrap().endpoint.unwrap();
        let seen: Vec<(&str, &str, Vec<&str>)> = endpoint
            .tokens
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.user.as_str(),
                    t.groups.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("tann", "ann", vec!["drover:authenticated", "ops"]),
                ("tdana", "dana", vec!["drover:authenticated", "ldap:devs"]),
                (
                    "troot",
                    "root",
                    vec!["drover:authenticated", "drover:admin"]
                ),
            ]
        );
        assert_eq!(endpoint.tokens[0].hash, "ab".repeat(32));
        assert_eq!(endpoint.tokens[0].expires_at, later);
        assert_eq!(
            endpoint.image,
            format!("drover/cluster-agent:{}", env!("CARGO_PKG_VERSION"))
        );
        // Off: nothing of it.
        let mut edge = store.get(Kind::Cluster.name(), "edge").await.unwrap();
        edge.spec = custom(false);
        store.transact(vec![Op::Update(edge)]).await.unwrap();
        assert!(snapshot(store, "edge").await.unwrap().endpoint.is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
