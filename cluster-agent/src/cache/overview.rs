//! The cluster at a glance ([`proto::overview::Overview`]), summed from the caches' objects:
//! what the nodes offer and the pods on them ask for (as `kubectl describe node` adds it up),
//! how many nodes, pods and deployments are well, and the latest warnings. Pure over the
//! objects' JSON, so every rule is tested without a cluster.

use std::collections::BTreeMap;

use proto::overview::{Overview, WARNINGS, Warning};
use serde::Deserialize;

use crate::facts::quantity;

/// What the overview reads of a node.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Node {
    spec: NodeSpec,
    status: NodeStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NodeSpec {
    unschedulable: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NodeStatus {
    allocatable: BTreeMap<String, String>,
    conditions: Vec<Condition>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pod {
    spec: PodSpec,
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PodSpec {
    node_name: String,
    containers: Vec<Container>,
    init_containers: Vec<Container>,
    overhead: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Container {
    resources: Resources,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Resources {
    requests: BTreeMap<String, String>,
    limits: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodStatus {
    phase: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Deployment {
    spec: DeploymentSpec,
    status: DeploymentStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DeploymentSpec {
    replicas: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct DeploymentStatus {
    available_replicas: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Event {
    metadata: EventMeta,
    #[serde(rename = "type")]
    kind: String,
    reason: String,
    message: String,
    count: Option<u64>,
    last_timestamp: Option<String>,
    first_timestamp: Option<String>,
    event_time: Option<String>,
    series: Option<Series>,
    involved_object: Involved,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EventMeta {
    name: String,
    namespace: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Series {
    count: Option<u64>,
    last_observed_time: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Involved {
    kind: String,
    name: String,
}

/// Each object's JSON read as `T`; one that does not read is left out (the cache holds what
/// the API server sent, so that would be a server's fault, not a reason to fail the summary).
fn read<'a, T: serde::de::DeserializeOwned>(
    objects: &'a [&'a str],
) -> impl Iterator<Item = T> + 'a {
    objects
        .iter()
        .filter_map(|json| serde_json::from_str(json).ok())
}

/// `kind`'s amount (cores, bytes) in `map`; 0 when absent or not a quantity.
fn amount(map: &BTreeMap<String, String>, kind: &str) -> f64 {
    map.get(kind).and_then(|q| quantity(q, 1.0)).unwrap_or(0.0)
}

/// Which of a container's resources a sum reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    Requests,
    Limits,
}

/// What one pod asks for (requests) or may use (limits) of `kind`, as the scheduler counts it:
/// its containers together, or its largest init container if that is more, plus the
/// runtime's overhead (added to limits only where some are set, as Kubernetes does).
fn pod_amount(spec: &PodSpec, kind: &str, asked: Asked) -> f64 {
    let of = |c: &Container| {
        let map = match asked {
            Asked::Requests => &c.resources.requests,
            Asked::Limits => &c.resources.limits,
        };
        amount(map, kind)
    };
    let containers: f64 = spec.containers.iter().map(of).sum();
    let init = spec.init_containers.iter().map(of).fold(0.0, f64::max);
    let own = containers.max(init);
    if asked == Asked::Limits && own == 0.0 {
        return 0.0;
    }
    own + amount(&spec.overhead, kind)
}

/// When an event last happened, as kubectl's LAST SEEN reads it.
fn last_seen(event: &Event) -> String {
    event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.clone())
        .or_else(|| event.last_timestamp.clone())
        .or_else(|| event.event_time.clone())
        .or_else(|| event.first_timestamp.clone())
        .unwrap_or_default()
}

/// The overview of a cluster whose objects (JSON) are these.
pub(crate) fn summarize(
    nodes: &[&str],
    pods: &[&str],
    deployments: &[&str],
    events: &[&str],
) -> Overview {
    let mut overview = Overview::default();
    for node in read::<Node>(nodes) {
        overview.nodes.total += 1;
        if node
            .status
            .conditions
            .iter()
            .any(|c| c.kind == "Ready" && c.status == "True")
        {
            overview.nodes.ready += 1;
        }
        if node.spec.unschedulable {
            overview.nodes.cordoned += 1;
        }
        let offers = &node.status.allocatable;
        overview.cpu.allocatable += amount(offers, "cpu");
        overview.memory.allocatable += amount(offers, "memory");
        overview.pods.allocatable += amount(offers, "pods");
    }
    for pod in read::<Pod>(pods) {
        let phases = &mut overview.pod_phases;
        match pod.status.phase.as_str() {
            "Running" => phases.running += 1,
            "Pending" => phases.pending += 1,
            "Succeeded" => phases.succeeded += 1,
            "Failed" => phases.failed += 1,
            _ => phases.unknown += 1,
        }
        // A finished pod holds nothing; one not yet placed holds nothing of any node.
        let finished = matches!(pod.status.phase.as_str(), "Succeeded" | "Failed");
        if finished || pod.spec.node_name.is_empty() {
            continue;
        }
        overview.pods.requested += 1.0;
        for (kind, capacity) in [("cpu", &mut overview.cpu), ("memory", &mut overview.memory)] {
            capacity.requested += pod_amount(&pod.spec, kind, Asked::Requests);
            capacity.limits += pod_amount(&pod.spec, kind, Asked::Limits);
        }
    }
    for deployment in read::<Deployment>(deployments) {
        overview.deployments.total += 1;
        if deployment.status.available_replicas >= deployment.spec.replicas.unwrap_or(1) {
            overview.deployments.available += 1;
        }
    }
    let mut warnings: Vec<(String, Event)> = read::<Event>(events)
        .filter(|e| e.kind == "Warning")
        .map(|e| (last_seen(&e), e))
        .collect();
    overview.warning_count = warnings.len();
    // Newest first (RFC 3339 in UTC sorts as time does); the same moment in name order.
    warnings.sort_by(|(a, x), (b, y)| b.cmp(a).then_with(|| x.metadata.name.cmp(&y.metadata.name)));
    overview.warnings = warnings
        .into_iter()
        .take(WARNINGS)
        .map(|(last_seen, e)| Warning {
            namespace: e.metadata.namespace,
            object: format!("{}/{}", e.involved_object.kind, e.involved_object.name),
            reason: e.reason,
            message: e.message,
            count: e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1),
            last_seen,
        })
        .collect();
    overview
}

#[cfg(test)]
mod tests {
    use proto::overview::{Deployments, Nodes, PodPhases};

    use super::*;

    fn node(cpu: &str, memory: &str, ready: &str, cordoned: bool) -> String {
        serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"unschedulable": cordoned},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
            },
        })
        .to_string()
    }

    #[test]
    fn nodes_offer_what_they_can_allocate_and_count_as_ready_or_cordoned() {
        let nodes = [
            node("4", "16Gi", "True", false),
            node("3500m", "8Gi", "False", true),
            node("2", "1Gi", "Unknown", false),
        ];
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let overview = summarize(&nodes, &[], &[], &[]);
        assert_eq!(overview.cpu.allocatable, 9.5);
        assert_eq!(overview.memory.allocatable, 25.0 * 1024f64.powi(3));
        assert_eq!(overview.pods.allocatable, 330.0);
        assert_eq!(
            overview.nodes,
            Nodes {
                total: 3,
                ready: 1,
                cordoned: 1
            }
        );
    }

    #[test]
    fn pods_on_nodes_ask_as_the_scheduler_counts() {
        let pods = [
            // Two containers: their requests add up; one has no limit.
            r#"{"spec": {"nodeName": "a", "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": "1"}}},
                {"resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}}]},
               "status": {"phase": "Running"}}"#,
            // An init container asking more than the containers together counts instead,
            // and the runtime's overhead is added.
            r#"{"spec": {"nodeName": "a",
                "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
                "containers": [{"resources": {"requests": {"cpu": "100m"}}}],
                "overhead": {"cpu": "50m", "memory": "1Mi"}},
               "status": {"phase": "Running"}}"#,
            // Not placed yet: nothing of a node's, but still a pending pod.
            r#"{"spec": {"containers": [{"resources": {"requests": {"cpu": "8"}}}]}, "status": {"phase": "Pending"}}"#,
            // Finished: holds nothing.
            r#"{"spec": {"nodeName": "a", "containers": [{"resources": {"requests": {"cpu": "8"}}}]}, "status": {"phase": "Succeeded"}}"#,
            r#"{"spec": {"nodeName": "a", "containers": [{"resources": {"requests": {"cpu": "8"}}}]}, "status": {"phase": "Failed"}}"#,
            // No status yet, and not JSON at all (left out).
            r#"{"spec": {"nodeName": "b", "containers": [{}]}}"#,
            "not json",
        ];
        let overview = summarize(&[], &pods, &[], &[]);
        assert_eq!(
            (overview.cpu.requested, overview.cpu.limits),
            (0.5 + 2.05, 1.0)
        );
        assert_eq!(
            overview.memory.requested,
            256.0 * 1024.0 * 1024.0 + 1024.0 * 1024.0
        );
        // The overhead counts towards limits only where the pod sets some.
        assert_eq!(overview.memory.limits, 0.0);
        assert_eq!(overview.pods.requested, 3.0);
        assert_eq!(
            overview.pod_phases,
            PodPhases {
                running: 2,
                pending: 1,
                succeeded: 1,
                failed: 1,
                unknown: 1
            }
        );
    }

    #[test]
    fn a_deployment_is_available_when_every_wanted_replica_is() {
        let deployments = [
            r#"{"spec": {"replicas": 3}, "status": {"availableReplicas": 3}}"#,
            r#"{"spec": {"replicas": 3}, "status": {"availableReplicas": 2}}"#,
            // Replicas default to one; none wanted is none missing.
            r#"{"spec": {}, "status": {}}"#,
            r#"{"spec": {"replicas": 0}, "status": {}}"#,
        ];
        let overview = summarize(&[], &[], &deployments, &[]);
        assert_eq!(
            overview.deployments,
            Deployments {
                total: 4,
                available: 2
            }
        );
    }

    #[test]
    fn the_latest_warnings_come_first_and_normal_events_are_left_out() {
        let event = |name: &str, kind: &str, when: &str| {
            serde_json::json!({
                "metadata": {"name": name, "namespace": "shop"},
                "type": kind, "reason": "BackOff", "message": format!("{name} failed"),
                "count": 2, "lastTimestamp": when,
                "involvedObject": {"kind": "Pod", "name": "web-0"},
            })
            .to_string()
        };
        let mut events: Vec<String> = (0..12)
            .map(|i| {
                event(
                    &format!("w{i:02}"),
                    "Warning",
                    &format!("2026-12-01T10:{i:02}:00Z"),
                )
            })
            .collect();
        events.push(event("normal", "Normal", "2026-12-01T11:00:00Z"));
        // A series counts and dates itself; an event with no time at all sorts last.
        events.push(
            r#"{"metadata": {"name": "s", "namespace": "kube-system"}, "type": "Warning",
                "reason": "Unhealthy", "message": "probe failed", "count": 1,
                "eventTime": "2026-12-01T09:00:00Z",
                "series": {"count": 40, "lastObservedTime": "2026-12-01T12:00:00Z"},
                "involvedObject": {"kind": "Pod", "name": "dns"}}"#
                .to_owned(),
        );
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        let overview = summarize(&[], &[], &[], &events);
        assert_eq!(overview.warning_count, 13);
        assert_eq!(overview.warnings.len(), WARNINGS);
        assert_eq!(
            overview.warnings[0],
            Warning {
                namespace: "kube-system".into(),
                object: "Pod/dns".into(),
                reason: "Unhealthy".into(),
                message: "probe failed".into(),
                count: 40,
                last_seen: "2026-12-01T12:00:00Z".into(),
            }
        );
        let rest: Vec<&str> = overview.warnings[1..]
            .iter()
            .map(|w| w.message.as_str())
            .collect();
        assert_eq!(
            rest,
            [
                "w11 failed",
                "w10 failed",
                "w09 failed",
                "w08 failed",
                "w07 failed",
                "w06 failed",
                "w05 failed",
                "w04 failed",
                "w03 failed"
            ]
        );
        assert_eq!(overview.warnings[1].count, 2);
    }
}
