//! A restore's phases as tables: the cluster, its hosts, their tasks and the restore's status
//! in; the tasks to write and the status out. No store.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use serde_json::{Value, json};

use super::*;
use crate::{planner::tasks::decide_in_memory, plans::task_plan_name, store::Object};

/// Hosts `a` (every role; the snapshot's host), `bb` (etcd and control plane), `ccc` (worker).
fn hosts() -> Vec<Object> {
    [("a", true, true), ("bb", true, false), ("ccc", false, true)]
        .into_iter()
        .map(|(name, server, worker)| {
            Object::new(
                "Host",
                name,
                json!({"cluster": "edge", "nodeName": name, "address": "10.0.0.1",
                       "roles": {"etcd": server, "controlPlane": server, "worker": worker}}),
            )
        })
        .collect()
}

fn snapshot(name: &str, host: &str, hub_copy: &str, saved: bool) -> Object {
    let mut object = Object::new("EtcdSnapshot", name, json!({"cluster": "edge"}));
    object.status = json!({
        "conditions": [{"type": "Saved", "status": if saved { "True" } else { "False" }}],
        "host": host, "node": host, "file": format!("/var/lib/rancher/k3s/server/db/snapshots/{name}-{host}"),
        "hubCopy": hub_copy,
    });
    object
}

/// The cluster asking for a restore from `snapshot` (generation 1), with `restore` as its
/// status so far.
fn cluster(snapshot: &str, restore: Value) -> Object {
    let mut object = Object::new(
        "Cluster",
        "edge",
        json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
               "restore": {"snapshot": snapshot, "generation": 1}}),
    );
    object.metadata.uid = "uid-1".into();
    object.status = json!({"restore": restore});
    object
}

struct World {
    cluster: Object,
    hosts: Vec<Object>,
    snapshots: Vec<Object>,
    plans: HashMap<String, Object>,
}

impl World {
    fn new(restore: Value) -> Self {
        World {
            cluster: cluster("s1", restore),
            hosts: hosts(),
            snapshots: vec![snapshot("s1", "a", "", true)],
            plans: HashMap::new(),
        }
    }

    fn pass(&self) -> Pass {
        decide_in_memory(
            &self.cluster,
            &self.hosts,
            "a",
            &self.plans,
            &self.snapshots,
            restore,
        )
    }

    /// What the planner and the agents do with a pass: its status kept, its tasks written and
    /// reported `state` ("applied" with every probe passing, or "failed" for good).
    fn carry_out(&mut self, pass: &Pass, state: &str) {
        if let Some(update) = &pass.update {
            self.cluster.status = json!({"restore": update.restore});
        }
        for (host, plan) in &pass.tasks {
            let sum = proto::plan::v1::checksum(plan);
            let mut task = Object::new(
                "Plan",
                &task_plan_name(host),
                json!({"host": host, "slot": "task", "plan": serde_json::to_value(plan).unwrap()}),
            );
            task.status = match state {
                "applied" => json!({"checksum": sum, "appliedChecksum": sum, "state": "applied"}),
                _ => json!({"checksum": sum, "state": "failed", "message": "exit code 1",
                            "failureCount": 3, "maxFailures": 3}),
            };
            self.plans.insert(task_plan_name(host), task);
        }
    }
}

/// A host's task: the host and its instructions, as `command args`.
type Task = (&'static str, Vec<&'static str>);

fn phase(pass: &Pass) -> &str {
    &pass.update.as_ref().unwrap().restore.phase
}

/// The hosts a pass writes tasks for, with each task's instructions.
fn tasks(pass: &Pass) -> Vec<(String, Vec<String>)> {
    pass.tasks
        .iter()
        .map(|(host, plan)| {
            let steps = plan
                .instructions
                .iter()
                .map(|i| match i.script.is_empty() {
                    true => format!("{} {}", i.command, i.args.join(" ")),
                    false => i.script.clone(),
                })
                .collect();
            (host.clone(), steps)
        })
        .collect()
}

#[test]
fn a_restore_stops_every_host_resets_etcd_then_rejoins_servers_one_by_one_then_workers() {
    let mut world = World::new(Value::Null);
    // The request is taken: the restore owns the hosts before anything runs.
    let pass = world.pass();
    assert_eq!(phase(&pass), "Stopping");
    assert!(pass.owns_hosts && pass.tasks.is_empty() && pass.started);
    assert_eq!(pass.update.as_ref().unwrap().restore.host, "a");
    world.carry_out(&pass, "applied");

    let expected: [(&str, Vec<Task>); 4] = [
        (
            "Stopping",
            vec![
                ("a", vec!["systemctl stop k3s"]),
                ("bb", vec!["systemctl stop k3s"]),
                ("ccc", vec!["systemctl stop k3s-agent"]),
            ],
        ),
        (
            "Restoring",
            vec![(
                "a",
                vec![
                    "k3s server --cluster-reset --cluster-reset-restore-path=/var/lib/rancher/k3s/server/db/snapshots/s1-a",
                    "systemctl start k3s",
                ],
            )],
        ),
        (
            "Rejoining",
            vec![(
                "bb",
                vec![
                    "rm -rf \"$DROVER_ROOT/var/lib/rancher/k3s/server/db/etcd\"",
                    "systemctl start k3s",
                ],
            )],
        ),
        (
            "Rejoining",
            vec![("ccc", vec!["systemctl start k3s-agent"])],
        ),
    ];
    for (step, (in_phase, writes)) in expected.into_iter().enumerate() {
        // The step's tasks are written, and it waits for them.
        let pass = world.pass();
        assert_eq!(phase(&pass), in_phase, "step {step}: {:?}", pass.update);
        let written = tasks(&pass);
        let want: Vec<(String, Vec<String>)> = writes
            .iter()
            .map(|(h, steps)| (h.to_string(), steps.iter().map(|s| s.to_string()).collect()))
            .collect();
        assert_eq!(written, want, "step {step}");
        assert!(pass.owns_hosts, "step {step}");
        world.carry_out(&pass, "applied");
        // Applied: the next pass moves on (or, rejoining, records the server that rejoined).
        let next = world.pass();
        assert!(next.tasks.is_empty(), "step {step}: nothing written twice");
        world.carry_out(&next, "applied");
    }
    // A new pass: the restore is over, and nothing more is asked of the hosts.
    let done = world.cluster.status["restore"].clone();
    assert_eq!(done["phase"], "Restored", "{done}");
    assert_eq!(done["rejoined"], json!(["bb"]));
    let after = world.pass();
    assert!(after.update.is_none() && after.tasks.is_empty() && !after.owns_hosts);
}

#[test]
fn a_failed_step_stops_the_restore_and_says_where() {
    let mut world = World::new(Value::Null);
    let pass = world.pass();
    world.carry_out(&pass, "applied");
    let stopping = world.pass();
    world.carry_out(&stopping, "failed");
    let failed = world.pass();
    let update = failed.update.as_ref().unwrap();
    assert_eq!(update.done, Some(false));
    assert_eq!(update.restore.phase, "Failed");
    assert!(
        update
            .message
            .starts_with("the restore from s1 stopped while stopping: host a: exit code 1"),
        "{}",
        update.message
    );
    assert!(!failed.owns_hosts, "a failed restore lets the hosts go");
}

#[test]
fn a_snapshot_is_restored_from_the_hub_copy_when_its_host_is_gone_and_refused_when_unusable() {
    let cases = [
        // (snapshot, hub copy, saved, restore host, error)
        (
            "s1",
            "gone",
            "etcd-snapshots/edge/s1",
            true,
            Some("a"),
            None,
        ),
        (
            "s1",
            "gone",
            "",
            true,
            None,
            Some("no longer in the cluster, and the hub has no copy"),
        ),
        (
            "s1",
            "a",
            "",
            false,
            None,
            Some("was not saved; choose a saved one"),
        ),
        (
            "other",
            "a",
            "",
            true,
            None,
            Some("this cluster has no snapshot \"other\""),
        ),
    ];
    for (asked, on, hub_copy, saved, host, error) in cases {
        let mut world = World::new(Value::Null);
        world.cluster = cluster(asked, Value::Null);
        world.snapshots = vec![snapshot("s1", on, hub_copy, saved)];
        let pass = world.pass();
        let update = pass.update.as_ref().unwrap();
        match (host, error) {
            (Some(host), _) => {
                assert_eq!(update.restore.host, host);
                assert_eq!(update.restore.hub_copy, hub_copy);
                assert!(update.restore.file.ends_with("/snapshots/s1-gone"));
                world.carry_out(&pass, "applied");
                // Stopping, then the reset downloads the hub's copy first.
                let stopping = world.pass();
                world.carry_out(&stopping, "applied");
                let next = world.pass();
                world.carry_out(&next, "applied");
                let reset = world.pass();
                let (_, plan) = &reset.tasks[0];
                assert_eq!(plan.downloads[0].name, hub_copy);
            }
            (None, Some(error)) => {
                assert_eq!(update.done, Some(false));
                assert!(update.message.contains(error), "{}", update.message);
                assert!(!pass.owns_hosts);
            }
            (None, None) => unreachable!(),
        }
    }
}
