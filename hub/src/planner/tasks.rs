//! What the day-2 operations share: the view of a cluster they decide from, the tasks they run
//! on hosts (a host's second plan slot), where a task stands, and a snapshot's record.

use std::collections::HashMap;

use proto::plan::v1::{Instruction, Plan, Probe, checksum};
use serde::{Deserialize, Serialize};

use super::{host_plan::stored_checksum, report::PlanReport};
use crate::{
    model::{ClusterSpec, Distribution, HostSpec, Status},
    plans::task_plan_name,
    store::Object,
};

/// What one pass of the planner knows about a cluster, for its operations.
pub(super) struct Cluster<'a> {
    pub object: &'a Object,
    pub spec: &'a ClusterSpec,
    pub dist: Distribution,
    /// The cluster's hosts (not those being removed), in creation order.
    pub hosts: &'a [(&'a Object, HostSpec)],
    pub init: &'a str,
    pub plans: &'a HashMap<String, Object>,
    /// The cluster's EtcdSnapshots.
    pub snapshots: Vec<&'a Object>,
}

/// Where a task stands.
pub(super) enum Task {
    Running(String),
    Done(PlanReport),
    Failed(String),
}

/// A snapshot's record, in its `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct SnapshotStatus {
    pub host: String,
    /// The node name of the host, as the distribution names the file.
    pub node: String,
    pub file: String,
    pub size: u64,
    pub sha256: String,
    pub created_at: String,
    /// The distribution and version the cluster ran.
    pub version: String,
    /// The name of the hub's copy, under its data directory's `files/` (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hub_copy: String,
}

impl Cluster<'_> {
    pub(super) fn name(&self) -> &str {
        &self.object.metadata.name
    }

    pub(super) fn status(&self) -> Status {
        Status::of(self.object)
    }

    pub(super) fn host(&self, name: &str) -> Option<&(&Object, HostSpec)> {
        self.hosts.iter().find(|(h, _)| h.metadata.name == name)
    }

    /// Servers (etcd hosts first, then control-plane hosts), then workers; each group in
    /// creation order.
    pub(super) fn ordered(&self) -> Vec<&(&Object, HostSpec)> {
        let mut hosts: Vec<&(&Object, HostSpec)> = self.hosts.iter().collect();
        // Then by node name, as rollouts order hosts (host objects are named after random ids).
        hosts.sort_by_key(|(h, s)| {
            let rank = if s.roles.etcd {
                0
            } else if s.roles.control_plane {
                1
            } else {
                2
            };
            (rank, s.node_name.clone(), h.metadata.name.clone())
        });
        hosts
    }

    /// The probes of the host's plan: what "this host is healthy" means for it.
    pub(super) fn probes(&self, host: &str) -> Vec<Probe> {
        self.plans
            .get(host)
            .and_then(|p| crate::model::parse_plan(p.spec.get("plan")?).ok())
            .map(|p| p.probes)
            .unwrap_or_default()
    }

    /// The distribution's service on `spec`'s host.
    pub(super) fn unit(&self, spec: &HostSpec) -> &'static str {
        let server = spec.roles.etcd || spec.roles.control_plane;
        match (self.dist, server) {
            (Distribution::K3s, true) => "k3s",
            (Distribution::K3s, false) => "k3s-agent",
            (Distribution::Rke2, true) => "rke2-server",
            (Distribution::Rke2, false) => "rke2-agent",
        }
    }

    pub(super) fn data_dir(&self) -> String {
        format!("/var/lib/rancher/{}", self.dist.name())
    }

    pub(super) fn settled(&self) -> bool {
        let status = self.status();
        ["Provisioned", "Updated"].iter().all(|kind| {
            status
                .conditions
                .iter()
                .any(|c| c.kind == *kind && c.status == "True")
        })
    }
}

/// Decides with the view of `cluster` (K3s, its init host `init`) from objects held in memory:
/// how the operations' table tests call their decisions.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(super) fn decide_in_memory<T>(
    cluster: &Object,
    hosts: &[Object],
    init: &str,
    plans: &HashMap<String, Object>,
    snapshots: &[Object],
    decide: impl FnOnce(&Cluster<'_>) -> T,
) -> T {
    let spec: ClusterSpec = serde_json::from_value(cluster.spec.clone()).unwrap();
    let specs: Vec<(&Object, HostSpec)> = hosts
        .iter()
        .map(|h| (h, serde_json::from_value(h.spec.clone()).unwrap()))
        .collect();
    decide(&Cluster {
        object: cluster,
        spec: &spec,
        dist: Distribution::K3s,
        hosts: &specs,
        init,
        plans,
        snapshots: snapshots.iter().collect(),
    })
}

pub(super) fn step(name: &str, command: &str, args: &[&str]) -> Instruction {
    Instruction {
        name: name.into(),
        command: command.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..Instruction::default()
    }
}

/// A task plan: `instructions`, gated by `probes`; `id` makes each operation's task its own
/// (an agent that applied an identical task before would not run it again).
pub(super) fn task_plan(id: &str, mut instructions: Vec<Instruction>, probes: Vec<Probe>) -> Plan {
    if let Some(first) = instructions.first_mut() {
        first.env.push(format!("DROVER_TASK={id}"));
    }
    Plan {
        instructions,
        probes,
        // An operation that failed three times needs a person; retrying it for long hides that.
        max_failures: 3,
        ..Plan::default()
    }
}

/// Where `plan` stands as `host`'s task, and whether it must be written first (it is not the
/// host's task yet).
pub(super) fn task_state(c: &Cluster<'_>, host: &str, plan: &Plan) -> (Task, bool) {
    let sum = checksum(plan);
    let stored = c.plans.get(&task_plan_name(host));
    if stored.and_then(stored_checksum).as_deref() != Some(sum.as_str()) {
        return (
            Task::Running("waiting for the system-agent to take the task".into()),
            true,
        );
    }
    let report = stored.map(PlanReport::of).unwrap_or_default();
    let task = if report.ready(&sum, plan.probes.len()) {
        Task::Done(report)
    } else if report.gave_up(&sum) {
        Task::Failed(report.failure(&sum).unwrap_or_default().to_owned())
    } else {
        Task::Running(match report.failure(&sum) {
            Some(why) => why.to_owned(),
            None => report.progress(&sum),
        })
    };
    (task, false)
}

/// How far a step of an operation is.
pub(super) enum Progress {
    Waiting(String),
    Next,
    Failed(String),
}

impl Progress {
    /// Every host's task done: next; one failed: failed; else waiting, saying on whom.
    pub(super) fn all(tasks: Vec<(String, Task)>) -> Progress {
        let mut waiting = Vec::new();
        for (host, task) in tasks {
            match task {
                Task::Done(_) => {}
                Task::Running(what) => waiting.push(format!("{host}: {what}")),
                Task::Failed(why) => return Progress::Failed(format!("host {host}: {why}")),
            }
        }
        if waiting.is_empty() {
            Progress::Next
        } else {
            Progress::Waiting(waiting.join("; "))
        }
    }
}
