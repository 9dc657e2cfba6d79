//! Who may do what in each cluster, as the cluster-agent needs it to keep the cluster's RBAC in
//! step with the hub: the cluster's role bindings (users and groups), its projects with their
//! members and secrets. Sent whole at connect and again whenever one of those objects changes
//! (`ClusterAgent.WatchAccess`); the agent compares and writes only what differs.

use std::{pin::Pin, sync::Arc, time::Duration};

use base64::Engine as _;
use futures::{Stream, StreamExt};
use proto::cluster::v1::{AccessSnapshot, Grant, ProjectAccess, ProjectSecret, Subject};
use serde_json::Value;

use crate::{
    model::{Kind, ProjectSecretSpec, ProjectSpec, Role, RoleBindingSpec},
    store::{LabelSelector, Object, Store, StoreError, WatchStream},
};

fn grant(spec: &RoleBindingSpec) -> Option<Grant> {
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
        role: spec.role.label().to_owned(),
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
    let bindings = liveness.keep_live(mine(bindings)).await?;
    let secrets = liveness.keep_live(mine(secrets)).await?;
    let mut snapshot = AccessSnapshot::default();
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
    for binding in bindings {
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec) else {
            continue;
        };
        if spec.cluster.as_deref() != Some(cluster) || spec.role == Role::Admin {
            continue;
        }
        let Some(grant) = grant(&spec) else { continue };
        match &spec.project {
            None => snapshot.cluster_grants.push(grant),
            // A binding to a project that does not exist (yet) grants nothing.
            Some(project) => {
                if let Some(p) = snapshot.projects.iter_mut().find(|p| &p.name == project) {
                    p.grants.push(grant);
                }
            }
        }
    }
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

/// The kinds a cluster's access is made of.
fn relevant(kind: &str) -> bool {
    [Kind::RoleBinding, Kind::Project, Kind::ProjectSecret]
        .iter()
        .any(|k| k.name() == kind)
}

/// Snapshots for `cluster`: the current one, then each new one as it comes about (an equal one
/// is not sent twice).
pub type Snapshots = Pin<Box<dyn Stream<Item = Result<AccessSnapshot, tonic::Status>> + Send>>;

struct Follow {
    store: Arc<dyn Store>,
    cluster: String,
    last: Option<AccessSnapshot>,
    changes: Option<WatchStream>,
}

impl Follow {
    /// The next snapshot that differs from the last one sent.
    async fn next(&mut self) -> AccessSnapshot {
        loop {
            if self.changes.is_none() {
                match self.relist().await {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(cluster = %self.cluster, error = %e, "cannot read the cluster's access; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                }
            } else if let Some(changes) = &mut self.changes {
                match changes.next().await {
                    Some(Ok(event)) if !relevant(&event.object.kind) => continue,
                    Some(Ok(_)) => {}
                    // Fell behind, or the store hiccuped: read it all again.
                    Some(Err(_)) | None => {
                        self.changes = None;
                        continue;
                    }
                }
            }
            match snapshot(self.store.as_ref(), &self.cluster).await {
                Ok(now) if self.last.as_ref() != Some(&now) => {
                    self.last = Some(now.clone());
                    return now;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(cluster = %self.cluster, error = %e, "cannot read the cluster's access");
                    self.changes = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn relist(&mut self) -> Result<(), StoreError> {
        let revision = self.store.revision().await?;
        self.changes = Some(self.store.watch(None, Some(revision)).await?);
        Ok(())
    }
}

/// Follows `cluster`'s access for as long as the stream is read.
pub fn follow(store: Arc<dyn Store>, cluster: String) -> Snapshots {
    let state = Follow {
        store,
        cluster,
        last: None,
        changes: None,
    };
    Box::pin(futures::stream::unfold(state, |mut state| async move {
        let snapshot = state.next().await;
        Some((Ok(snapshot), state))
    }))
}
