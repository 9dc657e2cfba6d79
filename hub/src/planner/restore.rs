//! Restoring a custom cluster's etcd from a snapshot (`spec.restore`), decided apart from its
//! effects: from the cluster, its hosts, their tasks and the restore's status so far, the tasks
//! to write and the status to keep. The phases: stop the distribution on every host; reset etcd
//! from the snapshot on the host that holds it and start it there; start the other servers one
//! at a time (their old etcd member data removed, so they join the restored one), then the
//! workers; each step gated by the hosts' probes. The phase is kept in the cluster's status, so
//! a hub that restarts carries on where it was, and each step's task has its own checksum, so
//! no step runs twice. The planner carries a pass out (`Planner::restore`).

use proto::plan::v1::{Download, Instruction, Plan};
use serde::{Deserialize, Serialize};

use super::tasks::{Cluster, Progress, SnapshotStatus, Task, step, task_plan, task_state};
use crate::model::Status;

/// A restore's progress, kept in the cluster's `status.restore`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct RestoreStatus {
    pub generation: u64,
    pub snapshot: String,
    /// Stopping, Restoring, Rejoining, Restored or Failed.
    pub phase: String,
    /// The host the snapshot is restored on, and the snapshot's file there.
    pub host: String,
    pub file: String,
    /// The hub's copy of the snapshot, put on the host before the restore (empty: none).
    pub hub_copy: String,
    /// Servers started again after the restore, in order.
    pub rejoined: Vec<String>,
    pub message: String,
}

/// The status a pass leaves: the restore's record and its `Restored` condition (`done`:
/// `None` while under way).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Update {
    pub restore: RestoreStatus,
    pub done: Option<bool>,
    pub message: String,
}

/// What one pass of a restore calls for.
#[derive(Debug, Default)]
pub(super) struct Pass {
    /// Tasks to write, by host, before the status.
    pub tasks: Vec<(String, Plan)>,
    pub update: Option<Update>,
    /// The restore owns the hosts: the planner writes no plans to them meanwhile.
    pub owns_hosts: bool,
    /// This pass took a new request.
    pub started: bool,
}

/// One pass of the cluster's restore.
pub(super) fn restore(c: &Cluster<'_>) -> Pass {
    let mut pass = Pass::default();
    let Some(request) = &c.spec.restore else {
        return pass;
    };
    let mut st: RestoreStatus = c
        .status()
        .extra
        .get("restore")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    if st.generation > request.generation
        || (st.generation == request.generation
            && matches!(st.phase.as_str(), "Restored" | "Failed"))
    {
        return pass;
    }
    let update = |st: RestoreStatus, done: Option<bool>, message: String| Update {
        restore: st,
        done,
        message,
    };
    if st.generation < request.generation {
        st = RestoreStatus {
            generation: request.generation,
            snapshot: request.snapshot.clone(),
            phase: "Stopping".into(),
            ..RestoreStatus::default()
        };
        match restorable(c, &request.snapshot) {
            Ok((host, file, hub_copy)) => {
                (st.host, st.file, st.hub_copy) = (host, file, hub_copy);
                pass.update = Some(update(st, None, "stopping the cluster's hosts".into()));
                pass.owns_hosts = true;
                pass.started = true;
            }
            Err(why) => {
                st.phase = "Failed".into();
                st.message = why.clone();
                pass.update = Some(update(st, Some(false), why));
            }
        }
        return pass;
    }
    let id = format!("{}/restore/{}", c.object.metadata.uid, st.generation);
    let outcome = match st.phase.as_str() {
        "Stopping" => stop(c, &id, &mut pass.tasks),
        "Restoring" => reset(c, &st, &id, &mut pass.tasks),
        _ => rejoin(c, &mut st, &id, &mut pass.tasks),
    };
    match outcome {
        Progress::Waiting(message) => {
            let message = format!("{}: {message}", st.phase.to_lowercase());
            pass.update = Some(update(st, None, message));
            pass.owns_hosts = true;
        }
        Progress::Next => {
            st.phase = match st.phase.as_str() {
                "Stopping" => "Restoring",
                "Restoring" => "Rejoining",
                _ => "Restored",
            }
            .into();
            if st.phase == "Restored" {
                pass.update = Some(update(st, Some(true), String::new()));
                return pass;
            }
            let message = match st.phase.as_str() {
                "Restoring" => format!("restoring etcd on {}", st.host),
                _ => "starting the other hosts".to_owned(),
            };
            pass.update = Some(update(st, None, message));
            pass.owns_hosts = true;
        }
        Progress::Failed(why) => {
            let message = format!(
                "the restore from {} stopped while {}: {why}; the hosts are as that step left them: fix the cause and raise spec.restore.generation to restore again",
                st.snapshot,
                st.phase.to_lowercase()
            );
            st.phase = "Failed".into();
            st.message = message.clone();
            pass.update = Some(update(st, Some(false), message));
        }
    }
    pass
}

/// Where to restore a snapshot of this cluster (host, file there, the hub's copy to put there
/// first), or why it cannot be. A snapshot whose host is gone is restored from the hub's copy
/// on the init host.
fn restorable(c: &Cluster<'_>, name: &str) -> Result<(String, String, String), String> {
    let snapshot = c
        .snapshots
        .iter()
        .find(|s| s.metadata.name == name)
        .ok_or_else(|| format!("spec.restore.snapshot: this cluster has no snapshot {name:?}"))?;
    let status = Status::of(snapshot);
    let saved = status
        .conditions
        .iter()
        .any(|c| c.kind == "Saved" && c.status == "True");
    let record: SnapshotStatus =
        serde_json::from_value(snapshot.status.clone()).unwrap_or_default();
    if !saved || record.file.is_empty() {
        return Err(format!(
            "spec.restore.snapshot: snapshot {name:?} was not saved; choose a saved one"
        ));
    }
    if c.host(&record.host).is_some() {
        return Ok((record.host, record.file, record.hub_copy));
    }
    if record.hub_copy.is_empty() {
        return Err(format!(
            "snapshot {name:?} is on host {}, which is no longer in the cluster, and the hub has no copy of it",
            record.host
        ));
    }
    let base = record.file.rsplit('/').next().unwrap_or(name);
    let file = format!("{}/server/db/snapshots/{base}", c.data_dir());
    Ok((c.init.to_owned(), file, record.hub_copy))
}

/// Where `plan`, as `host`'s task, stands; the task is written first when it is not yet.
fn drive(c: &Cluster<'_>, host: &str, plan: Plan, tasks: &mut Vec<(String, Plan)>) -> Task {
    let (task, write) = task_state(c, host, &plan);
    if write {
        tasks.push((host.to_owned(), plan));
    }
    task
}

/// Every host's distribution stopped.
fn stop(c: &Cluster<'_>, id: &str, tasks: &mut Vec<(String, Plan)>) -> Progress {
    let mut states = Vec::new();
    for (host, spec) in c.hosts {
        let name = &host.metadata.name;
        let plan = task_plan(
            id,
            vec![step("stop", "systemctl", &["stop", c.unit(spec)])],
            vec![],
        );
        states.push((name.clone(), drive(c, name, plan, tasks)));
    }
    Progress::all(states)
}

/// etcd reset from the snapshot on its host, which then starts and passes its probes.
fn reset(
    c: &Cluster<'_>,
    st: &RestoreStatus,
    id: &str,
    tasks: &mut Vec<(String, Plan)>,
) -> Progress {
    let Some((_, spec)) = c.host(&st.host) else {
        return Progress::Failed(format!("host {} left the cluster", st.host));
    };
    let restore_path = format!("--cluster-reset-restore-path={}", st.file);
    let mut plan = task_plan(
        id,
        vec![
            step(
                "cluster-reset",
                c.dist.name(),
                &["server", "--cluster-reset", &restore_path],
            ),
            step("start", "systemctl", &["start", c.unit(spec)]),
        ],
        c.probes(&st.host),
    );
    if !st.hub_copy.is_empty() {
        // The hub's copy, whatever became of the host's.
        plan.downloads.push(Download {
            name: st.hub_copy.clone(),
            path: st.file.clone(),
            permissions: "0600".into(),
        });
    }
    Progress::all(vec![(st.host.clone(), drive(c, &st.host, plan, tasks))])
}

/// The other servers started one at a time (their old etcd member data gone, so they join the
/// restored one), then the workers.
fn rejoin(
    c: &Cluster<'_>,
    st: &mut RestoreStatus,
    id: &str,
    tasks: &mut Vec<(String, Plan)>,
) -> Progress {
    let ordered = c.ordered();
    let servers = ordered
        .iter()
        .filter(|(h, s)| (s.roles.etcd || s.roles.control_plane) && h.metadata.name != st.host);
    for (host, spec) in servers {
        let name = &host.metadata.name;
        if st.rejoined.contains(name) {
            continue;
        }
        let mut steps = Vec::new();
        if spec.roles.etcd {
            steps.push(Instruction {
                name: "remove-etcd-member-data".into(),
                script: format!(
                    "rm -rf {}",
                    super::host_plan::rooted(&format!("{}/server/db/etcd", c.data_dir()))
                ),
                ..Instruction::default()
            });
        }
        steps.push(step("start", "systemctl", &["start", c.unit(spec)]));
        let plan = task_plan(id, steps, c.probes(name));
        return match drive(c, name, plan, tasks) {
            Task::Done(_) => {
                st.rejoined.push(name.clone());
                Progress::Waiting(format!("{name} rejoined"))
            }
            Task::Running(what) => Progress::Waiting(format!("{name}: {what}")),
            Task::Failed(why) => Progress::Failed(format!("{name}: {why}")),
        };
    }
    let mut states = Vec::new();
    for (host, spec) in ordered
        .iter()
        .filter(|(_, s)| !(s.roles.etcd || s.roles.control_plane))
    {
        let name = &host.metadata.name;
        let plan = task_plan(
            id,
            vec![step("start", "systemctl", &["start", c.unit(spec)])],
            c.probes(name),
        );
        states.push((name.clone(), drive(c, name, plan, tasks)));
    }
    Progress::all(states)
}

#[cfg(test)]
mod tests;
