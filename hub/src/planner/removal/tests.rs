//! A cluster's removal as tables: what was read in, what to write out. No store.

#![allow(clippy::unwrap_used)]

use serde_json::json;
use time::macros::datetime;

use super::*;

fn object(kind: &str, name: &str, spec: Value) -> Object {
    Object::new(kind, name, spec)
}

fn cluster(kind: &str) -> Object {
    let mut c = object("Cluster", "edge", json!({"type": kind}));
    c.metadata.finalizers = vec![FINALIZER.into(), "someone-else".into()];
    c.metadata.deletion_timestamp = Some("2026-03-04T10:00:00Z".into());
    c
}

/// Each op as `verb kind/name` (an update also says the finalizers it leaves).
fn ops(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(|op| match op {
            Op::Delete { kind, name, .. } => format!("delete {kind}/{name}"),
            Op::Update(o) => format!(
                "update {}/{} [{}]",
                o.kind,
                o.metadata.name,
                o.metadata.finalizers.join(",")
            ),
            Op::Create(o) => format!("create {}/{}", o.kind, o.metadata.name),
            Op::Modify { kind, name, .. } => format!("modify {kind}/{name}"),
        })
        .collect()
}

#[test]
fn access_to_the_cluster_goes_and_no_other_clusters() {
    let listed = vec![
        (
            Kind::RoleBinding,
            vec![
                object("RoleBinding", "rb-edge", json!({"cluster": "edge"})),
                object("RoleBinding", "rb-core", json!({"cluster": "core"})),
                // A global binding names no cluster.
                object("RoleBinding", "rb-all", json!({"role": "admin"})),
            ],
        ),
        (
            Kind::Project,
            vec![object("Project", "p-edge", json!({"cluster": "edge"}))],
        ),
    ];
    assert_eq!(
        ops(&revocations("edge", &listed)),
        ["delete RoleBinding/rb-edge", "delete Project/p-edge"]
    );
}

#[test]
fn only_an_imported_cluster_is_cleaned_and_only_through_a_connected_agent() {
    assert_eq!(cleaning(&cluster("custom"), true), Cleaning::Nothing);
    assert_eq!(cleaning(&cluster("imported"), true), Cleaning::ThroughAgent);
    let Cleaning::LeftBehind(what) = cleaning(&cluster("imported"), false) else {
        panic!("expected what is left behind");
    };
    assert!(what.contains("drover-system namespace"), "{what}");
}

#[test]
fn a_failed_cleaning_is_waited_for_two_minutes_then_the_removal_goes_on() {
    let c = cluster("imported");
    let waiting = after_failed_cleaning(&c, "agent busy", datetime!(2026-03-04 10:01:59 UTC));
    assert_eq!(
        waiting,
        Err("removing: cleaning the cluster: agent busy".to_owned())
    );
    let left = after_failed_cleaning(&c, "agent busy", datetime!(2026-03-04 10:02:01 UTC));
    assert!(left.unwrap().contains("by hand"));
}

#[test]
fn the_last_write_deletes_the_clusters_objects_clearing_their_finalizers_then_lets_it_go() {
    let mut kept_plan = object("Plan", "h1", json!({"cluster": "edge"}));
    kept_plan.metadata.finalizers = vec![FINALIZER.into()];
    let mut deleting_snapshot = object("EtcdSnapshot", "s1", json!({"cluster": "edge"}));
    deleting_snapshot.metadata.finalizers = vec![FINALIZER.into()];
    deleting_snapshot.metadata.deletion_timestamp = Some("2026-03-04T09:00:00Z".into());
    let listed = vec![
        (
            Kind::Token,
            vec![
                // An agent's credential names its cluster under `agent`.
                object("Token", "t-agent", json!({"agent": {"cluster": "edge"}})),
                object("Token", "t-user", json!({"user": "ann"})),
            ],
        ),
        (
            Kind::RegistrationToken,
            vec![object(
                "RegistrationToken",
                "r1",
                json!({"cluster": "edge"}),
            )],
        ),
        (
            Kind::Plan,
            vec![
                kept_plan,
                object("Plan", "other", json!({"cluster": "core"})),
            ],
        ),
        (Kind::EtcdSnapshot, vec![deleting_snapshot]),
    ];
    assert_eq!(
        ops(&last_write(&cluster("custom"), &listed)),
        [
            "delete Token/t-agent",
            "delete RegistrationToken/r1",
            "update Plan/h1 []",
            "delete Plan/h1",
            "update EtcdSnapshot/s1 []",
            "update Cluster/edge [someone-else]",
        ]
    );
}

#[test]
fn an_ordinary_removal_says_whom_it_waits_on_since_when_and_the_way_out() {
    let c = cluster("custom");
    let mut gone = object(
        "Host",
        "h-1",
        json!({"cluster": "edge", "nodeName": "node-1"}),
    );
    gone.metadata.deletion_timestamp = Some("2026-03-04T10:00:00Z".into());
    let unnamed = object("Host", "h-2", json!({"cluster": "edge"}));
    let message = waiting_on(&c, &[&gone, &unnamed]);
    assert!(
        message.starts_with(
            "removing: waiting since 2026-03-04T10:00:00Z for 2 host(s) to run their uninstall plan: node-1 (h-1) ("
        ),
        "{message}"
    );
    assert!(message.contains("; h-2 ("), "{message}");
    assert!(
        message
            .ends_with("`drover-hub cluster delete edge --force` removes the cluster without them"),
        "{message}"
    );
}

#[test]
fn a_removal_anyway_names_the_hosts_that_may_still_run_the_distribution() {
    let a = object(
        "Host",
        "h-1",
        json!({"cluster": "edge", "nodeName": "node-1"}),
    );
    let b = object(
        "Host",
        "h-2",
        json!({"cluster": "edge", "nodeName": "node-2"}),
    );
    let message = left_running(&[&a, &b]);
    assert!(
        message.contains("may still run its distribution: node-1 (h-1), node-2 (h-2);"),
        "{message}"
    );
    assert!(message.contains("k3s-uninstall.sh"), "{message}");
}
