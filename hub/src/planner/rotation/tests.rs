//! A rotation's passes as a table: hosts and their tasks in, tasks and status out. No store.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use serde_json::json;

use super::*;
use crate::{planner::tasks::decide_in_memory, plans::task_plan_name, store::Object};

fn host(name: &str, server: bool) -> Object {
    Object::new(
        "Host",
        name,
        json!({"cluster": "edge", "nodeName": name,
               "roles": {"etcd": server, "controlPlane": server, "worker": !server}}),
    )
}

/// One pass over a cluster of `hosts` asking for rotation generation 1, with `plans` (tasks)
/// stored and `status` as the rotation's status so far.
fn pass(
    hosts: &[Object],
    plans: &HashMap<String, Object>,
    status: &serde_json::Value,
    may_start: bool,
) -> Option<Pass> {
    let mut cluster = Object::new(
        "Cluster",
        "edge",
        json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
               "rotateCertificates": {"generation": 1}}),
    );
    cluster.metadata.uid = "uid-1".into();
    cluster.status = json!({"certificateRotation": status});
    decide_in_memory(&cluster, hosts, "a", plans, &[], |c| rotation(c, may_start))
}

#[test]
fn servers_rotate_one_at_a_time_then_workers_restart_then_it_is_done() {
    let hosts = [host("a", true), host("bb", true), host("ccc", false)];
    let mut plans = HashMap::new();
    // Not settled yet: a new rotation waits.
    assert!(pass(&hosts, &plans, &serde_json::Value::Null, false).is_none());
    let mut status = serde_json::Value::Null;
    let mut order = Vec::new();
    for _ in 0..10 {
        let step = pass(&hosts, &plans, &status, true).unwrap();
        status = serde_json::to_value(&step.rotation).unwrap();
        if step.rotation.phase == "Rotated" {
            assert_eq!((step.done, step.reason), (Some(true), "Rotated"));
            break;
        }
        assert!(
            step.tasks.len() <= 1,
            "one host at a time: {:?}",
            step.tasks
        );
        for (name, plan) in &step.tasks {
            let steps: Vec<&str> = plan.instructions.iter().map(|i| i.name.as_str()).collect();
            order.push(format!("{name}: {}", steps.join(" ")));
            let sum = proto::plan::v1::checksum(plan);
            let mut task = Object::new(
                "Plan",
                &task_plan_name(name),
                json!({"host": name, "slot": "task", "plan": serde_json::to_value(plan).unwrap()}),
            );
            task.status = json!({"checksum": sum, "appliedChecksum": sum, "state": "applied"});
            plans.insert(task_plan_name(name), task);
        }
    }
    assert_eq!(
        order,
        [
            "a: stop certificate-rotate start",
            "bb: stop certificate-rotate start",
            "ccc: restart",
        ]
    );
    assert_eq!(status["phase"], "Rotated");
    assert_eq!(status["done"], json!(["a", "bb", "ccc"]));
    // Over for this generation: nothing more is asked.
    assert!(pass(&hosts, &plans, &status, true).is_none());
}

#[test]
fn a_failed_host_stops_the_rotation_and_says_which() {
    let hosts = [host("a", true)];
    let first = pass(&hosts, &HashMap::new(), &serde_json::Value::Null, true).unwrap();
    let (name, plan) = &first.tasks[0];
    let mut task = Object::new(
        "Plan",
        &task_plan_name(name),
        json!({"host": name, "slot": "task", "plan": serde_json::to_value(plan).unwrap()}),
    );
    task.status = json!({"checksum": proto::plan::v1::checksum(plan), "state": "failed",
                         "message": "exit code 1", "failureCount": 3, "maxFailures": 3});
    let plans = HashMap::from([(task_plan_name(name), task)]);
    let status = serde_json::to_value(&first.rotation).unwrap();
    let failed = pass(&hosts, &plans, &status, true).unwrap();
    assert_eq!(
        (failed.done, failed.reason),
        (Some(false), "RotationFailed")
    );
    assert!(
        failed
            .message
            .starts_with("certificate rotation stopped at host a: exit code 1"),
        "{}",
        failed.message
    );
}
