//! Rotating a custom cluster's certificates (`spec.rotateCertificates`), decided apart from its
//! effects: host by host within the upgrade strategy's concurrency, servers (stop, the
//! distribution's `certificate rotate`, start) before workers (a restart: their server renews
//! their client certificates), each gated by its probes. Runs once per generation; the progress
//! is kept in the cluster's status. The planner carries a pass out (`Planner::rotate`).

use proto::plan::v1::Plan;
use serde::{Deserialize, Serialize};

use super::tasks::{Cluster, Task, step, task_plan, task_state};
use crate::model::{HostSpec, concurrency};

/// A rotation's progress, kept in the cluster's `status.certificateRotation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct RotationStatus {
    pub generation: u64,
    /// Rotating, Rotated or Failed.
    pub phase: String,
    pub done: Vec<String>,
    pub message: String,
}

/// What one pass of a rotation calls for: tasks to write, then the status and its
/// `CertificatesRotated` condition (`done`: `None` while under way).
#[derive(Debug)]
pub(super) struct Pass {
    pub tasks: Vec<(String, Plan)>,
    pub rotation: RotationStatus,
    pub done: Option<bool>,
    pub reason: &'static str,
    pub message: String,
}

/// One pass of the cluster's rotation; `None` when there is none to run (none asked, this
/// generation over, or a new one that may not start yet: `may_start` is false while the cluster
/// is not settled).
pub(super) fn rotation(c: &Cluster<'_>, may_start: bool) -> Option<Pass> {
    let request = c.spec.rotate_certificates?;
    let mut st: RotationStatus = c
        .status()
        .extra
        .get("certificateRotation")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    if st.generation > request.generation
        || (st.generation == request.generation && st.phase != "Rotating")
    {
        return None;
    }
    if st.generation < request.generation {
        if !may_start {
            return None;
        }
        st = RotationStatus {
            generation: request.generation,
            phase: "Rotating".into(),
            ..RotationStatus::default()
        };
    }
    let id = format!("{}/rotate/{}", c.object.metadata.uid, st.generation);
    let strategy = c.spec.upgrade_strategy.clone().unwrap_or_default();
    let ordered = c.ordered();
    let is_server = |s: &HostSpec| s.roles.etcd || s.roles.control_plane;
    let servers = ordered.iter().filter(|(_, s)| is_server(s)).count();
    let (group, limit): (Vec<_>, usize) = if ordered
        .iter()
        .filter(|(_, s)| is_server(s))
        .all(|(h, _)| st.done.contains(&h.metadata.name))
    {
        let workers: Vec<_> = ordered.iter().filter(|(_, s)| !is_server(s)).collect();
        let limit = concurrency(&strategy.worker_concurrency, workers.len()).unwrap_or(1);
        (workers, limit)
    } else {
        let limit = concurrency(&strategy.control_plane_concurrency, servers).unwrap_or(1);
        (
            ordered.iter().filter(|(_, s)| is_server(s)).collect(),
            limit,
        )
    };
    let mut tasks = Vec::new();
    let mut waiting = Vec::new();
    let mut failed = None;
    let turn: Vec<_> = group
        .iter()
        .filter(|(h, _)| !st.done.contains(&h.metadata.name))
        .take(limit)
        .collect();
    for (host, spec) in turn {
        let name = &host.metadata.name;
        let unit = c.unit(spec);
        let steps = if is_server(spec) {
            vec![
                step("stop", "systemctl", &["stop", unit]),
                step(
                    "certificate-rotate",
                    c.dist.name(),
                    &["certificate", "rotate"],
                ),
                step("start", "systemctl", &["start", unit]),
            ]
        } else {
            // An agent's client certificates are renewed by its server when it restarts.
            vec![step("restart", "systemctl", &["restart", unit])]
        };
        let plan = task_plan(&id, steps, c.probes(name));
        let (task, write) = task_state(c, name, &plan);
        if write {
            tasks.push((name.clone(), plan));
        }
        match task {
            Task::Done(_) => st.done.push(name.clone()),
            Task::Running(what) => waiting.push(format!("{name}: {what}")),
            Task::Failed(why) => failed = Some(format!("{name}: {why}")),
        }
    }
    let total = ordered.len();
    let (done, reason, message) = if let Some(why) = failed {
        st.phase = "Failed".into();
        st.message = format!(
            "certificate rotation stopped at host {why}; fix the cause and raise spec.rotateCertificates.generation to rotate again"
        );
        (Some(false), "RotationFailed", st.message.clone())
    } else if st.done.len() >= total {
        st.phase = "Rotated".into();
        st.message.clear();
        (Some(true), "Rotated", String::new())
    } else {
        let message = format!(
            "{} of {total} hosts rotated; {}",
            st.done.len(),
            waiting.join("; ")
        );
        (None, "Rotating", message)
    };
    Some(Pass {
        tasks,
        rotation: st,
        done,
        reason,
        message,
    })
}

#[cfg(test)]
mod tests;
