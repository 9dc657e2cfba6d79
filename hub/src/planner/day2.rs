//! Day-2 operations on a provisioned custom cluster, carried out. Each is decided apart, as
//! tasks (the hosts' second plan slot, applied beside their plans, so a plan is never run
//! again because an operation came and went) and status: etcd snapshots (`snapshots.rs`),
//! restore (`restore.rs`), certificate rotation (`rotation.rs`). This module writes what they
//! decide.
//!
//! One operation at a time per cluster: a restore first, then a rotation, then snapshots being
//! deleted, then snapshots being taken. A restore owns the hosts while it runs: the planner
//! writes no plans to them until it is over.

use proto::plan::v1::Plan;
use serde_json::Value;
use time::OffsetDateTime;

use super::{
    FINALIZER, Planner,
    snapshots::{self, Step},
    tasks::Cluster,
};
use crate::{
    model::update_status,
    model::{Kind, Status},
    plans::TASK,
    store::{Op, StoreError},
};

impl Planner {
    /// Runs the cluster's operations one pass further. True while a restore owns the hosts
    /// (the planner then leaves their plans alone).
    pub(super) async fn day2(&self, c: &Cluster<'_>) -> Result<bool, StoreError> {
        if self.restore(c).await? {
            return Ok(true);
        }
        // New operations wait for a settled cluster (provisioned, not upgrading); one under way
        // goes on whatever its hosts' probes say meanwhile (a rotation restarts them).
        let settled = c.settled();
        if settled {
            self.schedule(c).await?;
        }
        // One operation at a time in the task slot: a snapshot under way finishes (its result
        // read) before a rotation may start, as a rotation under way does before a snapshot.
        let busy = if snapshots::under_way(c) {
            self.snapshots(c, settled).await? || self.rotate(c, false).await?
        } else {
            self.rotate(c, settled).await? || self.snapshots(c, settled).await?
        };
        if !busy {
            self.clear_tasks(c).await?;
        }
        Ok(false)
    }

    /// One pass of the cluster's restore, if one is requested: its tasks written, then its
    /// status. True while it owns the hosts.
    async fn restore(&self, c: &Cluster<'_>) -> Result<bool, StoreError> {
        let pass = super::restore::restore(c);
        for task in pass.tasks {
            self.write_task(c, Some(task)).await?;
        }
        if let Some(update) = &pass.update {
            match (update.restore.phase.as_str(), update.done) {
                ("Stopping", None) if pass.started => {
                    tracing::info!(cluster = %c.name(), snapshot = %update.restore.snapshot, host = %update.restore.host, "restoring etcd");
                }
                ("Restored", _) => {
                    tracing::info!(cluster = %c.name(), snapshot = %update.restore.snapshot, "etcd restored");
                }
                ("Failed", _) => tracing::warn!(cluster = %c.name(), "{}", update.message),
                _ => {}
            }
            let value = serde_json::to_value(&update.restore).unwrap_or(Value::Null);
            let reason = match update.done {
                Some(true) => "Restored",
                Some(false) => "RestoreFailed",
                None => "Restoring",
            };
            let (done, message) = (update.done, update.message.clone());
            update_status(self.store.as_ref(), Kind::Cluster, c.name(), move |s| {
                s.extra.insert("restore".into(), value.clone());
                s.set_condition_to("Restored", done, reason, &message);
            })
            .await?;
        }
        Ok(pass.owns_hosts)
    }

    /// Removes the cluster's finished tasks, once no operation needs them.
    async fn clear_tasks(&self, c: &Cluster<'_>) -> Result<(), StoreError> {
        let ops: Vec<Op> = c
            .plans
            .values()
            .filter(|p| {
                p.spec.get("slot").and_then(Value::as_str) == Some(TASK)
                    && p.spec.get("cluster").and_then(Value::as_str) == Some(c.name())
            })
            .map(|p| Op::Delete {
                kind: Kind::Plan.name().into(),
                name: p.metadata.name.clone(),
                resource_version: None,
            })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        self.store.transact(ops).await.map(drop)
    }

    // --- certificate rotation ---

    /// One pass of a certificate rotation (see `rotation.rs`): its tasks written, then its
    /// status. True while it is under way.
    async fn rotate(&self, c: &Cluster<'_>, may_start: bool) -> Result<bool, StoreError> {
        let Some(pass) = super::rotation::rotation(c, may_start) else {
            return Ok(false);
        };
        for task in pass.tasks {
            self.write_task(c, Some(task)).await?;
        }
        if pass.rotation.phase == "Rotated" {
            tracing::info!(cluster = %c.name(), hosts = pass.rotation.done.len(), "certificates rotated");
        }
        let value = serde_json::to_value(&pass.rotation).unwrap_or(Value::Null);
        let (done, reason, message) = (pass.done, pass.reason, pass.message.clone());
        update_status(self.store.as_ref(), Kind::Cluster, c.name(), move |s| {
            s.extra.insert("certificateRotation".into(), value.clone());
            s.set_condition_to("CertificatesRotated", done, reason, &message);
        })
        .await?;
        Ok(pass.rotation.phase == "Rotating")
    }

    // --- snapshots ---

    /// Keeps the schedule's progress (see `snapshots::schedule`), with the snapshot now due in
    /// the same write.
    async fn schedule(&self, c: &Cluster<'_>) -> Result<(), StoreError> {
        let Some(scheduled) = snapshots::schedule(c, OffsetDateTime::now_utc()) else {
            return Ok(());
        };
        if let Some(snapshot) = &scheduled.snapshot {
            tracing::info!(cluster = %c.name(), snapshot = %snapshot.metadata.name, "scheduled etcd snapshot due");
        }
        let mut cluster = self.store.get(Kind::Cluster.name(), c.name()).await?;
        let mut status = Status::of(&cluster);
        status
            .extra
            .insert("snapshotSchedule".into(), scheduled.progress);
        cluster.status = serde_json::to_value(status).unwrap_or(Value::Null);
        let mut ops: Vec<Op> = scheduled
            .snapshot
            .map(Op::Create)
            .into_iter()
            .chain([Op::Update(cluster)])
            .collect();
        crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
        self.store.transact(ops).await.map(drop)
    }

    /// One pass over the cluster's snapshots (see `snapshots::pass`). True while one is in
    /// flight.
    async fn snapshots(&self, c: &Cluster<'_>, may_start: bool) -> Result<bool, StoreError> {
        let pass = snapshots::pass(c, may_start, self.files.is_some());
        for name in &pass.expired {
            tracing::info!(cluster = %c.name(), snapshot = %name, "removing a scheduled snapshot past retention");
            match self
                .store
                .delete(Kind::EtcdSnapshot.name(), name, None)
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let Some(step) = pass.step else {
            return Ok(false);
        };
        match step {
            Step::Claim(snapshot) => {
                self.store.transact(vec![Op::Update(snapshot)]).await?;
            }
            Step::Save {
                snapshot,
                task,
                saved,
                message,
                record,
            } => {
                self.write_task(c, task).await?;
                if let Some(record) = &record {
                    tracing::info!(cluster = %c.name(), %snapshot, file = %record.file, size = record.size, "etcd snapshot saved");
                }
                let reason = match saved {
                    Some(true) => "Saved",
                    Some(false) => "SaveFailed",
                    None => "Saving",
                };
                let record = record.map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
                update_status(
                    self.store.as_ref(),
                    Kind::EtcdSnapshot,
                    &snapshot,
                    move |s| {
                        if let Some(Value::Object(fields)) = &record {
                            for (k, v) in fields {
                                s.extra.insert(k.clone(), v.clone());
                            }
                        }
                        s.set_condition_to("Saved", saved, reason, &message);
                    },
                )
                .await?;
            }
            Step::DeleteFile { task } => self.write_task(c, task).await?,
            Step::Release {
                snapshot,
                hub_copy,
                warning,
            } => {
                let name = &snapshot.metadata.name;
                match &warning {
                    Some(why) => tracing::warn!(cluster = %c.name(), snapshot = %name, "{why}"),
                    None => {
                        tracing::info!(cluster = %c.name(), snapshot = %name, "etcd snapshot deleted")
                    }
                }
                if let (Some(files), false) = (&self.files, hub_copy.is_empty()) {
                    match std::fs::remove_file(files.join(&hub_copy)) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            tracing::warn!(copy = %hub_copy, error = %e, "cannot delete the hub's copy of a snapshot");
                        }
                        _ => {}
                    }
                }
                let mut gone = snapshot;
                gone.metadata.finalizers.retain(|f| f != FINALIZER);
                self.store.transact(vec![Op::Update(gone)]).await?;
            }
        }
        Ok(true)
    }

    /// Writes a host's task, if a pass calls for one.
    async fn write_task(
        &self,
        c: &Cluster<'_>,
        task: Option<(String, Plan)>,
    ) -> Result<(), StoreError> {
        if let Some((name, plan)) = task
            && let Some((host, _)) = c.host(&name)
        {
            let stored = c
                .plans
                .get(&crate::plans::task_plan_name(&host.metadata.name));
            tracing::info!(host = %name, cluster = %c.name(), "task planned");
            self.write_plan(c.object, host, TASK, &plan, stored, Vec::new())
                .await?;
        }
        Ok(())
    }
}
