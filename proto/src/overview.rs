//! A cluster at a glance, as the cluster-agent sums it from its caches and the dashboard's
//! cluster overview draws it: capacity, the health of nodes, pods and deployments, and the
//! latest warnings. JSON on the `cluster-cache` service's [`PATH`].

use serde::{Deserialize, Serialize};

/// Where the `cluster-cache` service answers the overview (no resource is named `-`).
pub const PATH: &str = "/-/overview";

/// How many of the latest warning events an overview carries.
pub const WARNINGS: usize = 10;

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    pub cpu: Capacity,
    pub memory: Capacity,
    /// Pods: `requested` counts the pods placed on a node and not finished; no limits.
    pub pods: Capacity,
    pub nodes: Nodes,
    pub pod_phases: PodPhases,
    pub deployments: Deployments,
    /// Warning events in the cache, all of them.
    pub warning_count: usize,
    /// The latest [`WARNINGS`] of them, the newest first.
    pub warnings: Vec<Warning>,
}

/// What the nodes offer and what the pods on them ask for and may use, as `kubectl describe
/// node` sums them: CPU in cores, memory in bytes, pods in pods.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    pub allocatable: f64,
    pub requested: f64,
    pub limits: f64,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nodes {
    pub total: usize,
    pub ready: usize,
    /// Cordoned (`spec.unschedulable`), ready or not.
    pub cordoned: usize,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPhases {
    pub running: usize,
    pub pending: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub unknown: usize,
}

#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deployments {
    pub total: usize,
    /// As many replicas available as wanted.
    pub available: usize,
}

/// One warning event, as `kubectl get events` prints it.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Warning {
    pub namespace: String,
    /// `Kind/name` of what it is about.
    pub object: String,
    pub reason: String,
    pub message: String,
    pub count: u64,
    /// RFC 3339; empty when the event carries no time.
    pub last_seen: String,
}
