//! etcd snapshots of a custom cluster, decided apart from their effects: from the cluster, its
//! hosts, their tasks and its EtcdSnapshot objects, what to write next. Snapshots come on
//! demand (an EtcdSnapshot object) and on the cluster's schedule (`spec.etcdSnapshots`, with
//! retention); each is the distribution's `etcd-snapshot save` on the init host, whose output
//! gives the file, its size and checksum. Deleting a snapshot deletes its file first
//! (`etcd-snapshot delete`). The planner carries a pass out (`Planner::snapshots`,
//! `Planner::schedule`).

use proto::plan::v1::{Instruction, Plan, Upload};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{
    FINALIZER,
    tasks::{Cluster, SnapshotStatus, Task, step, task_plan, task_state},
};
use crate::{
    cron::Cron,
    model::{Kind, Status},
    store::Object,
};

/// What the schedule calls for now: its progress to keep, and the snapshot due (if one is),
/// written together so a due snapshot is never taken twice.
#[derive(Debug, PartialEq)]
pub(super) struct Scheduled {
    /// `status.snapshotSchedule`.
    pub progress: Value,
    pub snapshot: Option<Object>,
}

/// The cluster's schedule at `now`: `None` when nothing is to be written. Only the latest due
/// time is taken (a hub that was down for hours takes one, not one per missed slot), named
/// after that time; a schedule new or changed counts from now.
pub(super) fn schedule(c: &Cluster<'_>, now: OffsetDateTime) -> Option<Scheduled> {
    let schedule = c.spec.etcd_snapshots.as_ref()?;
    let cron = Cron::parse(&schedule.schedule).ok()?;
    let kept = c.status().extra.get("snapshotSchedule").cloned();
    let last = kept
        .as_ref()
        .filter(|k| k["schedule"] == schedule.schedule.as_str())
        .and_then(|k| k["last"].as_str())
        .and_then(crate::model::parse_time);
    let progress =
        |last: OffsetDateTime| json!({"schedule": schedule.schedule, "last": rfc3339(last)});
    let Some(last) = last else {
        return Some(Scheduled {
            progress: progress(now),
            snapshot: None,
        });
    };
    let mut due = None;
    let mut at = last;
    while let Some(next) = cron.next_after(at) {
        if next > now {
            break;
        }
        due = Some(next);
        at = next;
    }
    let due = due?;
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
    Some(Scheduled {
        progress: progress(due),
        snapshot: Some(Object::new(Kind::EtcdSnapshot.name(), &name, spec)),
    })
}

/// What one pass over the cluster's snapshots calls for.
#[derive(Debug, Default)]
pub(super) struct Pass {
    /// Scheduled snapshots past retention, to delete (their files go next, one at a time).
    pub expired: Vec<String>,
    /// The one snapshot operation under way; `None`: none (the snapshots leave the hosts' task
    /// slots free).
    pub step: Option<Step>,
}

/// The next step of one snapshot's operation.
#[derive(Debug)]
pub(super) enum Step {
    /// Start taking `0`: keep it (finalizer) and mark it saving, before any task runs.
    Claim(Object),
    /// Taking `snapshot`: the init host's task to write (if not written yet), and the
    /// snapshot's status.
    Save {
        snapshot: String,
        task: Option<(String, Plan)>,
        saved: Option<bool>,
        message: String,
        record: Option<SnapshotStatus>,
    },
    /// Deleting a snapshot's file: its host's task (to write, if not written yet).
    DeleteFile { task: Option<(String, Plan)> },
    /// The snapshot's file is gone (or never was, or its host failed to delete it: `warning`):
    /// remove the hub's copy and let the object go.
    Release {
        snapshot: Object,
        hub_copy: String,
        warning: Option<String>,
    },
}

/// Whether a snapshot is being taken (claimed, not yet saved or failed) or its file deleted:
/// its task holds the init host's task slot until the planner has read the result, so no
/// other operation may start meanwhile (it would overwrite the task, which would then be
/// written and run again: the save twice).
pub(super) fn under_way(c: &Cluster<'_>) -> bool {
    c.snapshots.iter().any(|s| {
        let claimed = s.metadata.finalizers.iter().any(|f| f == FINALIZER);
        let settled = Status::of(s)
            .conditions
            .iter()
            .any(|c| c.kind == "Saved" && c.status != "Unknown");
        claimed && (s.metadata.deletion_timestamp.is_some() || !settled)
    })
}

/// One pass: a snapshot being deleted first, then retention, then a snapshot to take (one
/// being taken goes on; a new one starts only if `may_start`). `hub_files`: the hub keeps
/// copies of snapshots (the snapshot may ask for one).
pub(super) fn pass(c: &Cluster<'_>, may_start: bool, hub_files: bool) -> Pass {
    let mut ordered = c.snapshots.clone();
    ordered.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    let kept = |s: &Object| s.metadata.finalizers.iter().any(|f| f == FINALIZER);
    if let Some(deleting) = ordered
        .iter()
        .find(|s| s.metadata.deletion_timestamp.is_some() && kept(s))
    {
        return Pass {
            expired: Vec::new(),
            step: Some(delete(c, deleting)),
        };
    }
    let expired = expired(c, &ordered);
    let pending = ordered.iter().find(|s| {
        s.metadata.deletion_timestamp.is_none()
            && !expired.contains(&s.metadata.name)
            && (kept(s) || may_start)
            && !Status::of(s)
                .conditions
                .iter()
                .any(|c| c.kind == "Saved" && c.status != "Unknown")
    });
    let step = pending.and_then(|s| take(c, s, hub_files));
    Pass { expired, step }
}

/// The next step of taking `snapshot` on the init host.
fn take(c: &Cluster<'_>, snapshot: &Object, hub_files: bool) -> Option<Step> {
    let name = &snapshot.metadata.name;
    let (host, host_spec) = c.host(c.init)?;
    if !snapshot.metadata.finalizers.iter().any(|f| f == FINALIZER) {
        // Kept until its file is deleted too.
        let mut kept = snapshot.clone();
        kept.metadata.finalizers.push(FINALIZER.into());
        let mut status = Status::of(&kept);
        status.set_condition_to("Saved", None, "Saving", &format!("saving on {}", c.init));
        kept.status = serde_json::to_value(status).unwrap_or(Value::Null);
        return Some(Step::Claim(kept));
    }
    let dist = c.dist.name();
    // The file is named as the host knows it (without its root, if it has one).
    let script = format!(
        "set -e\n{dist} etcd-snapshot save --name \"$1\"\n\
         f=$(ls -1t {snapshots}/\"$1\"-* | head -n 1)\n\
         echo \"file=${{f#\"$DROVER_ROOT\"}}\"\necho \"size=$(stat -c %s \"$f\")\"\n\
         echo \"sha256=$(sha256sum \"$f\" | cut -d ' ' -f 1)\"\n",
        snapshots = super::host_plan::rooted(&format!("{}/server/db/snapshots", c.data_dir()))
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
    let copy = snapshot.spec.get("copyToHub").and_then(Value::as_bool) == Some(true) && hub_files;
    if copy {
        plan.uploads.push(Upload {
            path: format!("{}/server/db/snapshots/{name}-*", c.data_dir()),
            name: hub_copy.clone(),
        });
    }
    let host_name = host.metadata.name.clone();
    let (task, write) = task_state(c, &host_name, &plan);
    let (saved, message, record) = match task {
        Task::Running(what) => (None, format!("saving on {}: {what}", c.init), None),
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
                host: host_name.clone(),
                node: host_spec.node_name.clone(),
                file: field("file"),
                size: field("size").parse().unwrap_or(0),
                sha256: field("sha256"),
                created_at: report.finished("etcd-snapshot"),
                version: format!("{dist} {version}"),
                hub_copy: if copy { hub_copy } else { String::new() },
            };
            (Some(true), String::new(), Some(record))
        }
    };
    Some(Step::Save {
        snapshot: name.clone(),
        task: write.then_some((host_name, plan)),
        saved,
        message,
        record,
    })
}

/// The next step of deleting `snapshot`: its file on its host, then the object.
fn delete(c: &Cluster<'_>, snapshot: &Object) -> Step {
    let record: SnapshotStatus =
        serde_json::from_value(snapshot.status.clone()).unwrap_or_default();
    let release = |warning| Step::Release {
        snapshot: snapshot.clone(),
        hub_copy: record.hub_copy.clone(),
        warning,
    };
    let file_name = record.file.rsplit('/').next().unwrap_or_default();
    let Some((host, _)) = c.host(&record.host).filter(|_| !file_name.is_empty()) else {
        // Never saved, or its host is gone (and the file with it).
        return release(None);
    };
    let plan = task_plan(
        &format!("{}/delete", snapshot.metadata.uid),
        vec![step(
            "etcd-snapshot-delete",
            c.dist.name(),
            &["etcd-snapshot", "delete", file_name],
        )],
        Vec::new(),
    );
    let host = host.metadata.name.clone();
    match task_state(c, &host, &plan) {
        (Task::Running(_), write) => Step::DeleteFile {
            task: write.then_some((host, plan)),
        },
        (Task::Done(_), _) => release(None),
        // The record goes anyway (the user asked for it); what was left is said.
        (Task::Failed(why), _) => release(Some(format!(
            "deleting the snapshot's file {} on {host} failed; remove it by hand: {why}",
            record.file
        ))),
    }
}

/// Scheduled snapshots past retention: the newest `retention` saved ones (and anything newer)
/// stay; snapshots taken on demand are the user's to delete.
fn expired(c: &Cluster<'_>, ordered: &[&Object]) -> Vec<String> {
    let Some(schedule) = &c.spec.etcd_snapshots else {
        return Vec::new();
    };
    let saved = |s: &Object| {
        Status::of(s)
            .conditions
            .iter()
            .any(|c| c.kind == "Saved" && c.status == "True")
    };
    let mut kept = 0u32;
    let mut old = Vec::new();
    for snapshot in ordered.iter().rev().filter(|s| {
        s.metadata.deletion_timestamp.is_none()
            && s.spec.get("scheduled").and_then(Value::as_bool) == Some(true)
    }) {
        if kept >= schedule.retention {
            old.push(snapshot.metadata.name.clone());
        } else if saved(snapshot) {
            kept += 1;
        }
    }
    old
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

#[cfg(test)]
mod tests;
