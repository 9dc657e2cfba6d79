//! Day-2 operations on a provisioned custom cluster, each carried out as tasks (the hosts'
//! second plan slot, applied beside their plans, so a plan is never run again because an
//! operation came and went):
//!
//! - **etcd snapshots**, on demand (an EtcdSnapshot object) and on the cluster's schedule
//!   (`spec.etcdSnapshots`, with retention): the distribution's `etcd-snapshot save` on the
//!   init host, whose output gives the file, its size and checksum; deleting the object
//!   deletes the file (`etcd-snapshot delete`) first.
//! - **restore** (`spec.restore`): stop the distribution on every host; reset etcd from the
//!   snapshot on the host that holds it and start it there; then start the other servers one
//!   at a time (their old etcd data removed, so they rejoin), then the workers, each step gated
//!   by the hosts' probes. The phase is kept in the cluster's status, so a hub that restarts
//!   carries on where it was; and each step's task has its own checksum, so no step runs twice.
//! - **certificate rotation** (`spec.rotateCertificates`): host by host within the upgrade
//!   strategy's concurrency, servers before workers.
//!
//! One operation at a time per cluster: a restore first, then a rotation, then snapshots being
//! deleted, then snapshots being taken. A restore owns the hosts while it runs: the planner
//! writes no plans to them until it is over.

use proto::plan::v1::{Instruction, Plan, Upload};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{
    FINALIZER, Planner,
    tasks::{Cluster, SnapshotStatus, Task, step, task_plan, task_state},
};
use crate::{
    cron::Cron,
    model::update_status,
    model::{Kind, Status},
    plans::TASK,
    store::{Object, Op, StoreError},
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
        let busy = self.rotate(c, settled).await? || self.snapshots(c, settled).await?;
        if !busy {
            self.clear_tasks(c).await?;
        }
        Ok(false)
    }

    /// Drives `plan` as `host`'s task.
    async fn task(&self, c: &Cluster<'_>, host: &Object, plan: Plan) -> Result<Task, StoreError> {
        let (task, write) = task_state(c, &host.metadata.name, &plan);
        if write {
            self.write_plan(c.name(), host, TASK, &plan, Vec::new())
                .await?;
        }
        Ok(task)
    }

    /// One pass of the cluster's restore, if one is requested: its tasks written, then its
    /// status. True while it owns the hosts.
    async fn restore(&self, c: &Cluster<'_>) -> Result<bool, StoreError> {
        let pass = super::restore::restore(c);
        for (name, plan) in &pass.tasks {
            if let Some((host, _)) = c.host(name) {
                self.write_plan(c.name(), host, TASK, plan, Vec::new())
                    .await?;
            }
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
            update_status(self.store.as_ref(), Kind::Cluster, c.name(), |s| {
                s.extra.insert("restore".into(), value.clone());
                s.set_condition_to("Restored", update.done, reason, &update.message);
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
        for (name, plan) in &pass.tasks {
            if let Some((host, _)) = c.host(name) {
                self.write_plan(c.name(), host, TASK, plan, Vec::new())
                    .await?;
            }
        }
        if pass.rotation.phase == "Rotated" {
            tracing::info!(cluster = %c.name(), hosts = pass.rotation.done.len(), "certificates rotated");
        }
        let value = serde_json::to_value(&pass.rotation).unwrap_or(Value::Null);
        update_status(self.store.as_ref(), Kind::Cluster, c.name(), |s| {
            s.extra.insert("certificateRotation".into(), value.clone());
            s.set_condition_to("CertificatesRotated", pass.done, pass.reason, &pass.message);
        })
        .await?;
        Ok(pass.rotation.phase == "Rotating")
    }

    // --- snapshots ---

    /// Takes a scheduled snapshot when one is due: the latest due time only (a hub that was
    /// down for hours takes one, not one per missed slot), named after that time, created in
    /// the same write as the schedule's progress so it is never taken twice.
    async fn schedule(&self, c: &Cluster<'_>) -> Result<(), StoreError> {
        let Some(schedule) = &c.spec.etcd_snapshots else {
            return Ok(());
        };
        let Ok(cron) = Cron::parse(&schedule.schedule) else {
            return Ok(());
        };
        let now = OffsetDateTime::now_utc();
        let kept = c.status().extra.get("snapshotSchedule").cloned();
        let last = kept
            .as_ref()
            .filter(|k| k["schedule"] == schedule.schedule.as_str())
            .and_then(|k| k["last"].as_str())
            .and_then(|t| {
                OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
            });
        // What to write: the schedule's progress, and the snapshot now due (if one is).
        let (last, snapshot) = match last {
            // A new schedule counts from now.
            None => (now, None),
            Some(last) => {
                let mut due = None;
                let mut at = last;
                while let Some(next) = cron.next_after(at) {
                    if next > now {
                        break;
                    }
                    due = Some(next);
                    at = next;
                }
                let Some(due) = due else {
                    return Ok(());
                };
                let stamp = due
                    .format(time::macros::format_description!(
                        "[year][month][day][hour][minute]"
                    ))
                    .unwrap_or_default();
                let prefix: String = c.name().chars().take(44).collect();
                let name = format!("{}-{stamp}", prefix.trim_end_matches('-'));
                let mut spec = json!({"cluster": c.name(), "scheduled": true});
                if schedule.copy_to_hub {
                    spec["copyToHub"] = json!(true);
                }
                tracing::info!(cluster = %c.name(), snapshot = %name, "scheduled etcd snapshot due");
                (
                    due,
                    Some(Object::new(Kind::EtcdSnapshot.name(), &name, spec)),
                )
            }
        };
        let mut cluster = self.store.get(Kind::Cluster.name(), c.name()).await?;
        let mut status = Status::of(&cluster);
        status.extra.insert(
            "snapshotSchedule".into(),
            json!({"schedule": schedule.schedule, "last": rfc3339(last)}),
        );
        cluster.status = serde_json::to_value(status).unwrap_or(Value::Null);
        let mut ops: Vec<Op> = snapshot
            .map(Op::Create)
            .into_iter()
            .chain([Op::Update(cluster)])
            .collect();
        crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
        self.store.transact(ops).await.map(drop)
    }

    /// Snapshots being deleted (their files first), then retention, then snapshots to take
    /// (one being taken goes on; a new one starts only if `may_start`). True while one is in
    /// flight.
    async fn snapshots(&self, c: &Cluster<'_>, may_start: bool) -> Result<bool, StoreError> {
        let mut ordered = c.snapshots.clone();
        ordered.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name)
                .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        });
        for snapshot in ordered
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_some())
        {
            if snapshot.metadata.finalizers.iter().any(|f| f == FINALIZER) {
                return self.delete_snapshot(c, snapshot).await.map(|_| true);
            }
        }
        self.retain(c, &ordered).await?;
        let pending = ordered.iter().find(|s| {
            let started = s.metadata.finalizers.iter().any(|f| f == FINALIZER);
            s.metadata.deletion_timestamp.is_none()
                && (started || may_start)
                && !Status::of(s)
                    .conditions
                    .iter()
                    .any(|c| c.kind == "Saved" && c.status != "Unknown")
        });
        match pending {
            Some(snapshot) => self.take_snapshot(c, snapshot).await.map(|_| true),
            None => Ok(false),
        }
    }

    async fn take_snapshot(&self, c: &Cluster<'_>, snapshot: &Object) -> Result<(), StoreError> {
        let name = &snapshot.metadata.name;
        let Some((host, host_spec)) = c.host(c.init) else {
            return Ok(());
        };
        if !snapshot.metadata.finalizers.iter().any(|f| f == FINALIZER) {
            // Kept until its file is deleted too.
            let mut kept = snapshot.clone();
            kept.metadata.finalizers.push(FINALIZER.into());
            let mut status = Status::of(&kept);
            status.set_condition_to("Saved", None, "Saving", &format!("saving on {}", c.init));
            kept.status = serde_json::to_value(status).unwrap_or(Value::Null);
            return self.store.transact(vec![Op::Update(kept)]).await.map(drop);
        }
        let dist = c.dist.name();
        let script = format!(
            "set -e\n{dist} etcd-snapshot save --name \"$1\"\n\
             f=$(ls -1t {data}/server/db/snapshots/\"$1\"-* | head -n 1)\n\
             echo \"file=$f\"\necho \"size=$(stat -c %s \"$f\")\"\n\
             echo \"sha256=$(sha256sum \"$f\" | cut -d ' ' -f 1)\"\n",
            data = c.data_dir()
        );
        let mut plan = task_plan(
            &snapshot.metadata.uid,
            vec![Instruction {
                name: "etcd-snapshot".into(),
                script,
                args: vec![name.clone()],
                save_output: true,
                ..Instruction::default()
            }],
            Vec::new(),
        );
        let hub_copy = hub_copy_name(c.name(), name);
        let copy = snapshot.spec.get("copyToHub").and_then(Value::as_bool) == Some(true)
            && self.files.is_some();
        if copy {
            plan.uploads.push(Upload {
                path: format!("{}/server/db/snapshots/{name}-*", c.data_dir()),
                name: hub_copy.clone(),
            });
        }
        let (saved, message, record) = match self.task(c, host, plan).await? {
            Task::Running(what) => {
                let message = format!("saving on {}: {what}", c.init);
                (None, message, None)
            }
            Task::Failed(why) => (
                Some(false),
                format!("saving on {} failed: {why}", c.init),
                None,
            ),
            Task::Done(report) => {
                let fields = report.output("etcd-snapshot");
                let field = |k: &str| fields.get(k).cloned().unwrap_or_default();
                let version = c
                    .status()
                    .extra
                    .get("version")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_default();
                let record = SnapshotStatus {
                    host: host.metadata.name.clone(),
                    node: host_spec.node_name.clone(),
                    file: field("file"),
                    size: field("size").parse().unwrap_or(0),
                    sha256: field("sha256"),
                    created_at: report.finished("etcd-snapshot"),
                    version: format!("{dist} {version}"),
                    hub_copy: if copy { hub_copy } else { String::new() },
                };
                tracing::info!(cluster = %c.name(), snapshot = %name, file = %record.file, size = record.size, "etcd snapshot saved");
                (Some(true), String::new(), Some(record))
            }
        };
        let reason = match saved {
            Some(true) => "Saved",
            Some(false) => "SaveFailed",
            None => "Saving",
        };
        let record = record.map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
        update_status(self.store.as_ref(), Kind::EtcdSnapshot, name, |s| {
            if let Some(Value::Object(fields)) = &record {
                for (k, v) in fields {
                    s.extra.insert(k.clone(), v.clone());
                }
            }
            s.set_condition_to("Saved", saved, reason, &message);
        })
        .await
    }

    /// The snapshot's file deleted on its host, then the snapshot.
    async fn delete_snapshot(&self, c: &Cluster<'_>, snapshot: &Object) -> Result<(), StoreError> {
        let record: SnapshotStatus =
            serde_json::from_value(snapshot.status.clone()).unwrap_or_default();
        let file_name = record
            .file
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let release = async {
            if let (Some(files), false) = (&self.files, record.hub_copy.is_empty()) {
                match std::fs::remove_file(files.join(&record.hub_copy)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(copy = %record.hub_copy, error = %e, "cannot delete the hub's copy of a snapshot");
                    }
                    _ => {}
                }
            }
            let mut gone = snapshot.clone();
            gone.metadata.finalizers.retain(|f| f != FINALIZER);
            self.store.transact(vec![Op::Update(gone)]).await.map(drop)
        };
        let Some((host, _)) = c.host(&record.host).filter(|_| !file_name.is_empty()) else {
            // Never saved, or its host is gone (and the file with it).
            return release.await;
        };
        let plan = task_plan(
            &format!("{}/delete", snapshot.metadata.uid),
            vec![step(
                "etcd-snapshot-delete",
                c.dist.name(),
                &["etcd-snapshot", "delete", &file_name],
            )],
            Vec::new(),
        );
        match self.task(c, host, plan).await? {
            Task::Running(_) => Ok(()),
            Task::Done(_) => {
                tracing::info!(cluster = %c.name(), snapshot = %snapshot.metadata.name, "etcd snapshot deleted");
                release.await
            }
            Task::Failed(why) => {
                // The record goes anyway (the user asked for it); what was left is said.
                tracing::warn!(cluster = %c.name(), snapshot = %snapshot.metadata.name, host = %record.host, file = %record.file, "deleting the snapshot's file failed; remove it by hand: {why}");
                release.await
            }
        }
    }

    /// Keeps the newest `retention` saved scheduled snapshots (and anything newer), deleting
    /// older scheduled ones; snapshots taken on demand are the user's to delete.
    async fn retain(&self, c: &Cluster<'_>, ordered: &[&Object]) -> Result<(), StoreError> {
        let Some(schedule) = &c.spec.etcd_snapshots else {
            return Ok(());
        };
        let scheduled: Vec<&&Object> = ordered
            .iter()
            .filter(|s| {
                s.metadata.deletion_timestamp.is_none()
                    && s.spec.get("scheduled").and_then(Value::as_bool) == Some(true)
            })
            .collect();
        let saved = |s: &Object| {
            Status::of(s)
                .conditions
                .iter()
                .any(|c| c.kind == "Saved" && c.status == "True")
        };
        let mut kept = 0u32;
        let mut old = Vec::new();
        for snapshot in scheduled.iter().rev() {
            if kept >= schedule.retention {
                old.push(snapshot.metadata.name.clone());
            } else if saved(snapshot) {
                kept += 1;
            }
        }
        for name in old {
            tracing::info!(cluster = %c.name(), snapshot = %name, retention = schedule.retention, "removing a scheduled snapshot past retention");
            match self
                .store
                .delete(Kind::EtcdSnapshot.name(), &name, None)
                .await
            {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Where the hub keeps copies of a cluster's snapshots, under its files directory.
pub(super) fn hub_copies(cluster: &str) -> String {
    format!("etcd-snapshots/{cluster}")
}

/// The name of the hub's copy of a snapshot, under its files directory.
fn hub_copy_name(cluster: &str, snapshot: &str) -> String {
    format!("{}/{snapshot}", hub_copies(cluster))
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}
