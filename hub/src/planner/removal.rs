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
//!
//! What each step writes is decided from what was read (`revocations`, `cleaning`,
//! `after_failed_cleaning`, `last_write`); `Planner::remove_cluster` reads and writes.

use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;

use super::{Ctx, FINALIZER, Planner};
use crate::{
    model::update_status,
    model::{ClusterSpec, ClusterType, Kind, REMOVE_ANYWAY, REMOVED_ANYWAY},
    store::{LabelSelector, Object, Op, StoreError},
};

/// A host's name as a person knows it: its node's, and the hub's.
fn host_label(host: &Object) -> String {
    match host.spec.get("nodeName").and_then(Value::as_str) {
        Some(node) if !node.is_empty() => format!("{node} ({})", host.metadata.name),
        _ => host.metadata.name.clone(),
    }
}

/// What a cluster removed anyway leaves behind: its hosts, which may still run the
/// distribution.
fn left_running(hosts: &[&Object]) -> String {
    let names: Vec<String> = hosts.iter().map(|h| host_label(h)).collect();
    format!(
        "removed without uninstalling from its hosts, which may still run its distribution: {}; \
         on each, run /usr/local/bin/k3s-uninstall.sh (k3s-agent-uninstall.sh on a worker, \
         rke2-uninstall.sh for RKE2) and drover-system-agent-uninstall.sh",
        names.join(", ")
    )
}

/// What an ordinary removal waits on: each host and where it stands, since when, and the way
/// out. Nothing in it moves by itself (no elapsed time): the planner wakes on its own writes,
/// and a message that changed every pass would be written every pass.
fn waiting_on(cluster: &Object, hosts: &[&Object]) -> String {
    let hosts: Vec<String> = hosts
        .iter()
        .map(|h| {
            let state = crate::model::derive_state(
                Kind::Host,
                &h.metadata,
                &crate::model::Status::of(h),
                &h.spec,
            );
            match state.message.is_empty() {
                true => format!("{} ({})", host_label(h), state.state),
                false => format!("{} ({}: {})", host_label(h), state.state, state.message),
            }
        })
        .collect();
    let since = cluster
        .metadata
        .deletion_timestamp
        .as_deref()
        .map(|t| format!(" since {t}"))
        .unwrap_or_default();
    format!(
        "removing: waiting{since} for {} host(s) to run their uninstall plan: {}; if they are \
         gone for good, `drover-hub cluster delete {} --force` removes the cluster without them",
        hosts.len(),
        hosts.join("; "),
        cluster.metadata.name
    )
}

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
        // 1. Hosts: each uninstalls, then goes; removed anyway, they go at once.
        if !hosts.is_empty() {
            let anyway = cluster.metadata.annotations.contains_key(REMOVE_ANYWAY);
            if anyway {
                // Said before they are forgotten, and kept on the cluster to its last write,
                // whose deletion the hub's events report as a warning.
                let message = left_running(hosts);
                update_status(self.store.as_ref(), Kind::Cluster, name, move |s| {
                    s.set_condition_to("Removed", None, REMOVED_ANYWAY, &message);
                })
                .await?;
            }
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
                } else if anyway {
                    tracing::warn!(cluster = %name, host = %host.metadata.name, "removed anyway: the host is forgotten without uninstalling");
                    let ops = self.release(host).await?;
                    self.store.transact(ops).await?;
                } else if let Some(ctx) = ctx {
                    self.remove(ctx, cluster, host, plans, false).await?;
                }
            }
            if anyway {
                return Ok(());
            }
            let message = waiting_on(cluster, hosts);
            return update_status(self.store.as_ref(), Kind::Cluster, name, move |s| {
                s.set_condition_to("Removed", None, "Removing", &message);
            })
            .await;
        }
        // 2. Who may do what in it: gone first, so its agent removes what it kept for them.
        let revoke = revocations(name, &self.list(&ACCESS).await?);
        if !revoke.is_empty() {
            self.store.transact(revoke).await?;
        }
        let connected = match &self.agents {
            Some(agents) => agents.connected(name).await,
            None => false,
        };
        match cleaning(cluster, connected) {
            Cleaning::Nothing => {}
            Cleaning::LeftBehind(what) => {
                tracing::warn!(cluster = %name, "removed without cleaning the cluster (its agent is not connected): {what}");
            }
            Cleaning::ThroughAgent => {
                let cleaned = match &self.agents {
                    Some(agents) => crate::downstream::clean_imported(agents, name).await,
                    None => Ok(()),
                };
                if let Err(why) = cleaned {
                    match after_failed_cleaning(cluster, &why, OffsetDateTime::now_utc()) {
                        Err(message) => {
                            return update_status(
                                self.store.as_ref(),
                                Kind::Cluster,
                                name,
                                move |s| {
                                    s.set_condition_to("Removed", None, "Removing", &message);
                                },
                            )
                            .await;
                        }
                        Ok(left) => {
                            tracing::warn!(cluster = %name, "removed without cleaning the cluster ({why}): {left}")
                        }
                    }
                }
            }
        }
        // 3. Credentials, plans, snapshots, and the cluster itself, in one write.
        let ops = last_write(cluster, &self.list(&OWNED).await?);
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

    /// Every object of `kinds`, by kind.
    async fn list(&self, kinds: &[Kind]) -> Result<Vec<(Kind, Vec<Object>)>, StoreError> {
        let everything = LabelSelector::everything();
        let mut listed = Vec::new();
        for kind in kinds {
            listed.push((*kind, self.store.list(kind.name(), &everything).await?.0));
        }
        Ok(listed)
    }
}

/// The kinds that say who may do what in a cluster.
const ACCESS: [Kind; 3] = [Kind::RoleBinding, Kind::ProjectSecret, Kind::Project];

/// The kinds that go with a cluster in its last write.
const OWNED: [Kind; 4] = [
    Kind::Token,
    Kind::RegistrationToken,
    Kind::Plan,
    Kind::EtcdSnapshot,
];

/// The deletions of who may do what in `cluster`, from `listed` (every object of [`ACCESS`]).
fn revocations(cluster: &str, listed: &[(Kind, Vec<Object>)]) -> Vec<Op> {
    listed
        .iter()
        .flat_map(|(kind, items)| {
            items
                .iter()
                .filter(|o| of_cluster(o, cluster))
                .map(|o| Op::Delete {
                    kind: kind.name().into(),
                    name: o.metadata.name.clone(),
                    resource_version: None,
                })
        })
        .collect()
}

/// How the cluster itself is cleaned of what the import manifest created.
#[derive(Debug, PartialEq)]
enum Cleaning {
    /// Nothing to clean: the planner's hosts uninstalled a custom cluster's distribution.
    Nothing,
    /// Through its agent.
    ThroughAgent,
    /// It cannot be (no agent connected): what is left, for the log.
    LeftBehind(&'static str),
}

const LEFT_IMPORTED: &str = "delete its drover-system namespace, the drover-admin and drover-agent cluster role bindings and the objects labelled drover.io/sync by hand";

fn cleaning(cluster: &Object, connected: bool) -> Cleaning {
    let imported = serde_json::from_value::<ClusterSpec>(cluster.spec.clone())
        .is_ok_and(|s| s.cluster_type == ClusterType::Imported);
    match (imported, connected) {
        (false, _) => Cleaning::Nothing,
        (true, true) => Cleaning::ThroughAgent,
        (true, false) => Cleaning::LeftBehind(LEFT_IMPORTED),
    }
}

/// After cleaning through the agent failed with `why` at `now`: wait (`Err`: the status
/// message) until [`DOWNSTREAM_WAIT`] has passed since the deletion, then go on (`Ok`: what is
/// left, for the log).
fn after_failed_cleaning(
    cluster: &Object,
    why: &str,
    now: OffsetDateTime,
) -> Result<&'static str, String> {
    let since = cluster
        .metadata
        .deletion_timestamp
        .as_deref()
        .and_then(crate::model::parse_time);
    match since {
        Some(since) if now - since > DOWNSTREAM_WAIT => Ok(LEFT_IMPORTED),
        _ => Err(format!("removing: cleaning the cluster: {why}")),
    }
}

/// The cluster's last write, from `listed` (every object of [`OWNED`]): its objects deleted
/// (their finalizers cleared: their hosts are gone, and so is what the finalizers waited to
/// clean), and the cluster's finalizer taken off, which lets it go.
fn last_write(cluster: &Object, listed: &[(Kind, Vec<Object>)]) -> Vec<Op> {
    let name = &cluster.metadata.name;
    let mut ops = Vec::new();
    for (kind, items) in listed {
        for object in items.iter().filter(|o| of_cluster(o, name)) {
            if !object.metadata.finalizers.is_empty() {
                let mut released = object.clone();
                released.metadata.finalizers.clear();
                ops.push(Op::Update(released));
                if object.metadata.deletion_timestamp.is_some() {
                    // Already deleted: without its finalizers, it goes.
                    continue;
                }
            }
            ops.push(Op::Delete {
                kind: kind.name().into(),
                name: object.metadata.name.clone(),
                resource_version: None,
            });
        }
    }
    let mut gone = cluster.clone();
    gone.metadata.finalizers.retain(|f| f != FINALIZER);
    ops.push(Op::Update(gone));
    ops
}

#[cfg(test)]
mod tests;
