//! Removing a cluster cleans up after it. The planner puts its finalizer on every cluster;
//! when one is deleted:
//!
//! - a custom cluster's hosts are removed as any host is: each runs its uninstall plan first;
//! - the cluster's role bindings, projects and project secrets go, so an imported cluster's
//!   agent removes the RBAC objects it kept for them; then the hub deletes, through the agent,
//!   what the import manifest created (the `drover-admin` binding, the `drover-system`
//!   namespace with the agents, and last the agent's own binding);
//! - every credential of the cluster's agents and its registration tokens are revoked (the
//!   sessions using them end at once and no agent of the cluster can connect again), and its
//!   plans and snapshot records go;
//! - the finalizer goes, and with it the cluster. What is left on the hub is the event saying
//!   it was removed.
//!
//! An imported cluster whose agent is not connected cannot be cleaned: the hub removes it at
//! once and says (in its log) what was left behind. One whose agent is connected but slow is
//! waited for up to [`DOWNSTREAM_WAIT`].

use std::time::Duration;

use serde_json::Value;

use super::{Ctx, FINALIZER, Planner};
use crate::{
    model::update_status,
    model::{ClusterSpec, ClusterType, Kind},
    store::{LabelSelector, Object, Op, StoreError},
};

/// How long an imported cluster's removal waits for its agent to clean the cluster.
const DOWNSTREAM_WAIT: Duration = Duration::from_secs(120);

/// Whether `object` belongs to `cluster` (through `spec.cluster`, or a token's agent).
fn of_cluster(object: &Object, cluster: &str) -> bool {
    let named = object
        .spec
        .get("cluster")
        .or_else(|| object.spec.get("agent").and_then(|a| a.get("cluster")))
        .and_then(Value::as_str);
    named == Some(cluster)
}

impl Planner {
    /// Puts the finalizer on a cluster that lacks it (a cluster is never removed without its
    /// cleanup).
    pub(super) async fn keep_cluster(&self, cluster: &Object) -> Result<(), StoreError> {
        if cluster.metadata.finalizers.iter().any(|f| f == FINALIZER)
            || cluster.metadata.deletion_timestamp.is_some()
        {
            return Ok(());
        }
        let mut kept = cluster.clone();
        kept.metadata.finalizers.push(FINALIZER.into());
        self.store.transact(vec![Op::Update(kept)]).await.map(drop)
    }

    /// One pass of removing `cluster` (deleted, finalizer still on).
    pub(super) async fn remove_cluster(
        &self,
        cluster: &Object,
        hosts: &[&Object],
        plans: &std::collections::HashMap<String, Object>,
        ctx: Option<&Ctx<'_>>,
    ) -> Result<(), StoreError> {
        let name = &cluster.metadata.name;
        if !cluster.metadata.finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        // 1. Hosts: each uninstalls, then goes.
        if !hosts.is_empty() {
            for host in hosts {
                if host.metadata.deletion_timestamp.is_none() {
                    match self
                        .store
                        .delete(Kind::Host.name(), &host.metadata.name, None)
                        .await
                    {
                        Ok(_) | Err(StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                } else if let Some(ctx) = ctx {
                    self.remove(ctx, host, plans.get(&host.metadata.name), false)
                        .await?;
                }
            }
            let message = format!(
                "removing: waiting for {} host(s) to run their uninstall plan",
                hosts.len()
            );
            return update_status(self.store.as_ref(), Kind::Cluster, name, |s| {
                s.set_condition_to("Removed", None, "Removing", &message);
            })
            .await;
        }
        let everything = LabelSelector::everything();
        // 2. Who may do what in it: gone first, so its agent removes what it kept for them.
        let mut access = Vec::new();
        for kind in [Kind::RoleBinding, Kind::ProjectSecret, Kind::Project] {
            let (items, _) = self.store.list(kind.name(), &everything).await?;
            access.extend(
                items
                    .into_iter()
                    .filter(|o| of_cluster(o, name))
                    .map(|o| Op::Delete {
                        kind: kind.name().into(),
                        name: o.metadata.name,
                        resource_version: None,
                    }),
            );
        }
        if !access.is_empty() {
            self.store.transact(access).await?;
        }
        let imported = serde_json::from_value::<ClusterSpec>(cluster.spec.clone())
            .is_ok_and(|s| s.cluster_type == ClusterType::Imported);
        let connected = match &self.agents {
            Some(agents) => agents.connected(name).await,
            None => false,
        };
        if imported && !connected {
            tracing::warn!(cluster = %name, "removed without cleaning the cluster (its agent is not connected): delete its drover-system namespace, the drover-admin and drover-agent cluster role bindings and the objects labelled drover.io/sync by hand");
        } else if imported
            && let Some(agents) = &self.agents
            && let Err(why) = crate::downstream::clean_imported(agents, name).await
        {
            if !waited_long_enough(cluster) {
                let message = format!("removing: cleaning the cluster: {why}");
                return update_status(self.store.as_ref(), Kind::Cluster, name, |s| {
                    s.set_condition_to("Removed", None, "Removing", &message);
                })
                .await;
            }
            tracing::warn!(cluster = %name, "removed without cleaning the cluster ({why}): delete its drover-system namespace and the drover-admin and drover-agent cluster role bindings by hand");
        }
        // 3. Credentials, plans, snapshots, and the cluster itself, in one write.
        let mut ops = Vec::new();
        for kind in [
            Kind::Token,
            Kind::RegistrationToken,
            Kind::Plan,
            Kind::EtcdSnapshot,
        ] {
            let (items, _) = self.store.list(kind.name(), &everything).await?;
            for mut object in items.into_iter().filter(|o| of_cluster(o, name)) {
                if !object.metadata.finalizers.is_empty() {
                    // Their hosts are gone; so is what the finalizer waited to clean.
                    object.metadata.finalizers.clear();
                    if object.metadata.deletion_timestamp.is_some() {
                        ops.push(Op::Update(object));
                        continue;
                    }
                    ops.push(Op::Update(object.clone()));
                }
                ops.push(Op::Delete {
                    kind: kind.name().into(),
                    name: object.metadata.name,
                    resource_version: None,
                });
            }
        }
        let mut gone = cluster.clone();
        gone.metadata.finalizers.retain(|f| f != FINALIZER);
        ops.push(Op::Update(gone));
        if let Some(files) = &self.files {
            let copies = files.join(super::snapshots::hub_copies(name));
            match std::fs::remove_dir_all(&copies) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(dir = %copies.display(), error = %e, "cannot delete the hub's copies of the cluster's snapshots");
                }
                _ => {}
            }
        }
        tracing::info!(cluster = %name, objects = ops.len() - 1, "cluster removed; its agents' credentials are revoked");
        self.store.transact(ops).await.map(drop)
    }
}

/// Whether the cluster has been waiting for its agent for [`DOWNSTREAM_WAIT`].
fn waited_long_enough(cluster: &Object) -> bool {
    cluster
        .metadata
        .deletion_timestamp
        .as_deref()
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .is_some_and(|since| time::OffsetDateTime::now_utc() - since > DOWNSTREAM_WAIT)
}
