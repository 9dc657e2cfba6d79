//! Snapshots and their schedule as tables: the cluster, its snapshots and the hosts' tasks in;
//! what to write out. No store.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use serde_json::{Value, json};
use time::macros::datetime;

use super::*;
use crate::{planner::tasks::decide_in_memory, plans::task_plan_name};

/// Host `a` (every role; the init host).
fn hosts() -> Vec<Object> {
    vec![Object::new(
        "Host",
        "a",
        json!({"cluster": "edge", "nodeName": "node-a", "address": "10.0.0.1",
               "roles": {"etcd": true, "controlPlane": true, "worker": true}}),
    )]
}

/// A snapshot of `edge`, created at `at` (the store's timestamp).
fn snapshot(name: &str, at: &str, scheduled: bool) -> Object {
    let mut object = Object::new(
        "EtcdSnapshot",
        name,
        json!({"cluster": "edge", "scheduled": scheduled}),
    );
    object.metadata.uid = format!("uid-{name}");
    object.metadata.creation_timestamp = at.into();
    object
}

/// `s` claimed (the planner's finalizer on it), with `Saved` at `saved` ("Unknown" while it
/// is taken) and, once saved, its file on host `a`.
fn claimed(mut s: Object, saved: &str) -> Object {
    s.metadata.finalizers.push(FINALIZER.into());
    s.status = json!({"conditions": [{"type": "Saved", "status": saved}]});
    if saved == "True" {
        s.status["host"] = json!("a");
        s.status["file"] = json!(format!(
            "/var/lib/rancher/k3s/server/db/snapshots/{}-node-a-1",
            s.metadata.name
        ));
    }
    s
}

fn deleted(mut s: Object) -> Object {
    s.metadata.deletion_timestamp = Some("2026-01-02T00:00:00Z".into());
    s
}

struct World {
    cluster: Object,
    hosts: Vec<Object>,
    snapshots: Vec<Object>,
    plans: HashMap<String, Object>,
}

impl World {
    /// `edge` with `schedule` as its `spec.etcdSnapshots` (`Value::Null`: none) and `status`.
    fn new(schedule: Value, status: Value) -> Self {
        let mut cluster = Object::new(
            "Cluster",
            "edge",
            json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}),
        );
        if !schedule.is_null() {
            cluster.spec["etcdSnapshots"] = schedule;
        }
        cluster.metadata.uid = "uid-1".into();
        cluster.status = status;
        World {
            cluster,
            hosts: hosts(),
            snapshots: Vec::new(),
            plans: HashMap::new(),
        }
    }

    fn with<T>(&self, decide: impl FnOnce(&Cluster<'_>) -> T) -> T {
        decide_in_memory(
            &self.cluster,
            &self.hosts,
            "a",
            &self.plans,
            &self.snapshots,
            decide,
        )
    }

    fn pass(&self, may_start: bool) -> Pass {
        self.with(|c| pass(c, may_start, true))
    }

    /// `plan` stored as `host`'s task, reported as `report` (its status, with the checksum).
    fn report(&mut self, host: &str, plan: &Plan, mut report: Value) {
        let sum = proto::plan::v1::checksum(plan);
        report["checksum"] = json!(sum);
        if report["state"] == "applied" {
            report["appliedChecksum"] = json!(sum);
        }
        let mut task = Object::new(
            "Plan",
            &task_plan_name(host),
            json!({"host": host, "slot": "task", "plan": serde_json::to_value(plan).unwrap()}),
        );
        task.status = report;
        self.plans.insert(task_plan_name(host), task);
    }
}

/// The instructions of a task, as `command args` (or the script's first line).
fn steps(plan: &Plan) -> Vec<String> {
    plan.instructions
        .iter()
        .map(|i| match i.script.lines().nth(1) {
            Some(line) if i.command.is_empty() => line.to_owned(),
            _ => format!("{} {}", i.command, i.args.join(" ")),
        })
        .collect()
}

#[test]
fn a_new_schedule_counts_from_now_and_takes_nothing_yet() {
    let world = World::new(
        json!({"schedule": "0 * * * *", "retention": 3}),
        Value::Null,
    );
    let now = datetime!(2026-03-04 10:20 UTC);
    let scheduled = world.with(|c| schedule(c, now)).unwrap();
    assert_eq!(
        scheduled,
        Scheduled {
            progress: json!({"schedule": "0 * * * *", "last": "2026-03-04T10:20:00Z"}),
            snapshot: None,
        }
    );
}

#[test]
fn after_downtime_one_snapshot_is_due_for_the_latest_slot_only() {
    let world = World::new(
        json!({"schedule": "0 * * * *", "retention": 3, "copyToHub": true}),
        json!({"snapshotSchedule": {"schedule": "0 * * * *", "last": "2026-03-04T07:00:00Z"}}),
    );
    // Three slots passed (08:00, 09:00, 10:00): one snapshot, for 10:00.
    let scheduled = world
        .with(|c| schedule(c, datetime!(2026-03-04 10:20 UTC)))
        .unwrap();
    assert_eq!(
        scheduled.progress,
        json!({"schedule": "0 * * * *", "last": "2026-03-04T10:00:00Z"})
    );
    let snapshot = scheduled.snapshot.unwrap();
    assert_eq!(snapshot.kind, "EtcdSnapshot");
    assert_eq!(snapshot.metadata.name, "edge-202603041000");
    assert_eq!(
        snapshot.spec,
        json!({"cluster": "edge", "scheduled": true, "copyToHub": true})
    );
    // Before the next slot, nothing is written.
    assert_eq!(
        world.with(|c| schedule(c, datetime!(2026-03-04 07:59 UTC))),
        None
    );
}

#[test]
fn a_changed_schedule_counts_from_now_and_no_schedule_writes_nothing() {
    let world = World::new(
        json!({"schedule": "*/5 * * * *"}),
        json!({"snapshotSchedule": {"schedule": "0 * * * *", "last": "2026-03-04T07:00:00Z"}}),
    );
    let now = datetime!(2026-03-04 10:22 UTC);
    let scheduled = world.with(|c| schedule(c, now)).unwrap();
    assert_eq!(scheduled.snapshot, None);
    assert_eq!(scheduled.progress["last"], "2026-03-04T10:22:00Z");
    assert_eq!(scheduled.progress["schedule"], "*/5 * * * *");
    let world = World::new(Value::Null, Value::Null);
    assert_eq!(world.with(|c| schedule(c, now)), None);
}

#[test]
fn a_snapshot_is_claimed_then_saved_on_the_init_host_from_its_task_output() {
    let mut world = World::new(Value::Null, json!({"version": "v1.33.4+k3s1"}));
    world.snapshots = vec![snapshot("s1", "2026-01-01T00:00:00Z", false)];
    // 1. Claimed first: the finalizer keeps it until its file is deleted too.
    let Some(Step::Claim(kept)) = world.pass(true).step else {
        panic!("expected a claim");
    };
    assert_eq!(kept.metadata.finalizers, [FINALIZER]);
    assert_eq!(Status::of(&kept).conditions[0].reason, "Saving");
    // 2. The task on the init host, written once.
    world.snapshots = vec![claimed(
        snapshot("s1", "2026-01-01T00:00:00Z", false),
        "Unknown",
    )];
    let Some(Step::Save {
        snapshot: saving,
        task: Some((host, plan)),
        saved: None,
        ..
    }) = world.pass(true).step
    else {
        panic!("expected the save task");
    };
    assert_eq!((saving.as_str(), host.as_str()), ("s1", "a"));
    assert_eq!(steps(&plan), ["k3s etcd-snapshot save --name \"$1\""]);
    assert_eq!(plan.instructions[0].args, ["s1"]);
    assert!(plan.uploads.is_empty(), "no copy was asked for");
    world.report("a", &plan, json!({"state": "applying"}));
    let Some(Step::Save {
        task: None,
        saved: None,
        ..
    }) = world.pass(true).step
    else {
        panic!("the task is written once");
    };
    // 3. Done: the record comes from the task's output.
    world.report(
        "a",
        &plan,
        json!({"state": "applied", "results": [{"name": "etcd-snapshot", "exitCode": 0,
            "stdout": "file=/var/lib/rancher/k3s/server/db/snapshots/s1-node-a-1\nsize=42\nsha256=abc\n",
            "finishedAt": "2026-01-01T00:00:05Z"}]}),
    );
    let Some(Step::Save {
        saved: Some(true),
        record: Some(record),
        task: None,
        ..
    }) = world.pass(true).step
    else {
        panic!("expected a saved snapshot");
    };
    assert_eq!(
        record,
        SnapshotStatus {
            host: "a".into(),
            node: "node-a".into(),
            file: "/var/lib/rancher/k3s/server/db/snapshots/s1-node-a-1".into(),
            size: 42,
            sha256: "abc".into(),
            created_at: "2026-01-01T00:00:05Z".into(),
            version: "k3s v1.33.4+k3s1".into(),
            hub_copy: String::new(),
        }
    );
    // 4. Saved: nothing more to do.
    world.snapshots = vec![claimed(
        snapshot("s1", "2026-01-01T00:00:00Z", false),
        "True",
    )];
    assert!(world.pass(true).step.is_none());
}

#[test]
fn a_failed_save_is_reported_and_a_copy_to_the_hub_is_uploaded() {
    let mut world = World::new(Value::Null, Value::Null);
    let mut s = claimed(snapshot("s1", "2026-01-01T00:00:00Z", false), "Unknown");
    s.spec["copyToHub"] = json!(true);
    world.snapshots = vec![s];
    let Some(Step::Save {
        task: Some((_, plan)),
        ..
    }) = world.pass(true).step
    else {
        panic!("expected the save task");
    };
    assert_eq!(plan.uploads.len(), 1);
    assert_eq!(
        plan.uploads[0].path,
        "/var/lib/rancher/k3s/server/db/snapshots/s1-*"
    );
    assert_eq!(plan.uploads[0].name, "etcd-snapshots/edge/s1");
    // Without a place for files on the hub, no upload.
    let Some(Step::Save {
        task: Some((_, bare)),
        ..
    }) = world.with(|c| pass(c, true, false)).step
    else {
        panic!("expected the save task");
    };
    assert!(bare.uploads.is_empty());
    world.report(
        "a",
        &plan,
        json!({"state": "failed", "message": "exit code 1", "failureCount": 3, "maxFailures": 3}),
    );
    let Some(Step::Save {
        saved: Some(false),
        message,
        record: None,
        ..
    }) = world.pass(true).step
    else {
        panic!("expected a failed save");
    };
    assert!(
        message.starts_with("saving on a failed: exit code 1"),
        "{message}"
    );
}

#[test]
fn a_new_snapshot_waits_for_a_settled_cluster_but_one_under_way_goes_on() {
    let mut world = World::new(Value::Null, Value::Null);
    world.snapshots = vec![snapshot("s1", "2026-01-01T00:00:00Z", false)];
    assert!(world.pass(false).step.is_none());
    world.snapshots = vec![claimed(
        snapshot("s1", "2026-01-01T00:00:00Z", false),
        "Unknown",
    )];
    assert!(matches!(world.pass(false).step, Some(Step::Save { .. })));
}

#[test]
fn a_deleted_snapshot_loses_its_file_first_then_goes() {
    let mut world = World::new(Value::Null, Value::Null);
    world.snapshots = vec![
        deleted(claimed(
            snapshot("old", "2026-01-01T00:00:00Z", false),
            "True",
        )),
        // Waiting to be taken: deletion comes first.
        snapshot("new", "2026-01-02T00:00:00Z", false),
    ];
    let pass = world.pass(true);
    let Some(Step::DeleteFile {
        task: Some((host, plan)),
    }) = pass.step
    else {
        panic!("expected the file's deletion");
    };
    assert_eq!(host, "a");
    assert_eq!(steps(&plan), ["k3s etcd-snapshot delete old-node-a-1"]);
    world.report("a", &plan, json!({"state": "applied"}));
    let Some(Step::Release {
        snapshot: released,
        warning: None,
        ..
    }) = world.pass(true).step
    else {
        panic!("expected the release");
    };
    assert_eq!(released.metadata.name, "old");
    // A file that cannot be deleted is said, and the record goes anyway.
    world.report(
        "a",
        &plan,
        json!({"state": "failed", "message": "no such file", "failureCount": 3, "maxFailures": 3}),
    );
    let Some(Step::Release {
        warning: Some(why), ..
    }) = world.pass(true).step
    else {
        panic!("expected the release");
    };
    assert!(
        why.contains("old-node-a-1") && why.contains("no such file"),
        "{why}"
    );
}

#[test]
fn a_snapshot_never_saved_or_whose_host_is_gone_goes_at_once_with_its_hub_copy() {
    let mut world = World::new(Value::Null, Value::Null);
    world.snapshots = vec![deleted(claimed(
        snapshot("s1", "2026-01-01T00:00:00Z", false),
        "False",
    ))];
    assert!(matches!(
        world.pass(true).step,
        Some(Step::Release { warning: None, .. })
    ));
    let mut gone = claimed(snapshot("s2", "2026-01-01T00:00:00Z", false), "True");
    gone.status["host"] = json!("removed-host");
    gone.status["hubCopy"] = json!("etcd-snapshots/edge/s2");
    world.snapshots = vec![deleted(gone)];
    let Some(Step::Release { hub_copy, .. }) = world.pass(true).step else {
        panic!("expected the release");
    };
    assert_eq!(hub_copy, "etcd-snapshots/edge/s2");
}

#[test]
fn retention_keeps_the_newest_saved_scheduled_snapshots_and_never_those_taken_by_hand() {
    let mut world = World::new(
        json!({"schedule": "0 * * * *", "retention": 2}),
        Value::Null,
    );
    world.snapshots = vec![
        claimed(snapshot("by-hand", "2026-01-01T00:00:00Z", false), "True"),
        claimed(snapshot("h1", "2026-01-01T01:00:00Z", true), "True"),
        claimed(snapshot("h2", "2026-01-01T02:00:00Z", true), "True"),
        claimed(snapshot("h3", "2026-01-01T03:00:00Z", true), "True"),
        // Not saved yet: kept, and not counted.
        claimed(snapshot("h4", "2026-01-01T04:00:00Z", true), "Unknown"),
    ];
    let pass = world.pass(true);
    assert_eq!(pass.expired, ["h1"]);
    assert!(matches!(pass.step, Some(Step::Save { ref snapshot, .. }) if snapshot == "h4"));
    // One failed, unsaved and older than the kept ones, goes and is not taken again.
    world.snapshots = vec![
        snapshot("h0", "2026-01-01T00:00:00Z", true),
        claimed(snapshot("h2", "2026-01-01T02:00:00Z", true), "True"),
        claimed(snapshot("h3", "2026-01-01T03:00:00Z", true), "True"),
    ];
    let pass = world.pass(true);
    assert_eq!(pass.expired, ["h0"]);
    assert!(pass.step.is_none());
}
