//! The planner's decisions for one custom cluster, apart from their effects: from what the
//! planner read (the hosts, their plans and what the agents reported), which plans to write,
//! which nodes to drain first or make schedulable again, and what the cluster's status says.
//! Nothing here reads or writes the store or calls a cluster; the planner carries out what
//! these functions return (see `Planner::reconcile`), and the tests read them as tables.

use std::collections::HashMap;

use proto::plan::v1::{Plan, checksum};
use serde_json::{Value, json};

use super::{
    Ctx, DRAINED, FINALIZER, Join, PlanReport, Step, host_plan, join_token, stored_checksum,
    with_env_removal,
};
use crate::{
    model::{HostSpec, Status, UpgradeStrategy, concurrency},
    store::Object,
};

/// What the planner read about one custom cluster that is not paused and has an init host.
pub(super) struct View<'a> {
    /// The hosts staying in the cluster, with their specs, oldest first.
    pub hosts: &'a [(&'a Object, HostSpec)],
    /// Every stored plan by name (a host's plan is named after the host).
    pub plans: &'a HashMap<String, Object>,
    pub ctx: &'a Ctx<'a>,
    pub strategy: &'a UpgradeStrategy,
    /// The host that initialises the cluster (the first etcd host, kept once chosen).
    pub init: &'a str,
    /// The agents' manifest the init host's plan deploys.
    pub manifest: &'a str,
}

/// A write or a call the rollout asks for, in the order it is to be carried out.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// The init host's plan printed the cluster's join token: keep it on that plan's status.
    RecordJoinToken { host: String, token: String },
    /// The host's upgrade is done: make its node schedulable again.
    Uncordon { host: String, node: String },
    /// Write `plan` as the host's plan. With `drain`, drain that node first and write only once
    /// it is drained (an upgrade with `upgradeStrategy.drain`).
    Write {
        host: String,
        plan: Plan,
        drain: Option<String>,
    },
}

/// What one pass over a cluster decided.
#[derive(Debug, Default)]
pub(super) struct Rollout {
    pub actions: Vec<Action>,
    /// Hosts whose plan is applied with every probe passing.
    pub ready: usize,
    pub total: usize,
    /// Why hosts are not ready yet, one line each, in the hosts' order.
    pub waiting: Vec<String>,
    /// The first failing host and why.
    pub failed: Option<String>,
    /// Hosts that never applied a plan: the cluster is still being provisioned, not upgraded.
    pub never_provisioned: usize,
}

/// The hosts' target plans, in order (init, etcd, control plane, workers), each written when
/// its gate opens: every host of an earlier step ready, and within the upgrade concurrency of
/// its group (servers, workers) when it is upgrading rather than joining for the first time.
pub(super) fn rollout(view: &View<'_>) -> Rollout {
    let mut out = Rollout::default();
    let dist = view.ctx.dist;
    let init_plan = view.plans.get(view.init);
    let init_spec = view
        .hosts
        .iter()
        .find(|(h, _)| h.metadata.name == view.init)
        .map(|(_, s)| s);
    let join_token = join_token(init_plan);
    let init_address = init_spec.map_or_else(String::new, |s| {
        if s.internal_address.is_empty() {
            s.address.clone()
        } else {
            s.internal_address.clone()
        }
    });
    let join = match (&join_token, init_address.is_empty()) {
        (Some(token), false) => Some(Join {
            url: format!("https://{init_address}:{}", dist.join_port()),
            token: token.clone(),
        }),
        _ => None,
    };
    if let (Some(token), Some(plan)) = (&join_token, init_plan)
        && Status::of(plan)
            .extra
            .get("joinToken")
            .and_then(Value::as_str)
            != Some(token)
    {
        out.actions.push(Action::RecordJoinToken {
            host: view.init.to_owned(),
            token: token.clone(),
        });
    }

    let servers = view
        .hosts
        .iter()
        .filter(|(_, s)| s.roles.etcd || s.roles.control_plane)
        .count();
    let workers = view.hosts.len() - servers;
    let limits = [
        concurrency(&view.strategy.control_plane_concurrency, servers).unwrap_or(1),
        concurrency(&view.strategy.worker_concurrency, workers).unwrap_or(1),
    ];
    let mut in_flight = [0usize; 2];
    let mut ordered: Vec<(&Object, &HostSpec, Step)> = view
        .hosts
        .iter()
        .map(|(h, s)| (*h, s, step_of(&h.metadata.name, s, view.init)))
        .collect();
    // Within a step, in the order of the nodes' names (as `kubectl get nodes` lists them), not
    // of the hosts' objects, whose names come from random host ids: the order an operator
    // sees is the order the hosts roll in.
    ordered.sort_by(|(a, a_spec, a_step), (b, b_spec, b_step)| {
        (a_step, &a_spec.node_name, &a.metadata.name).cmp(&(
            b_step,
            &b_spec.node_name,
            &b.metadata.name,
        ))
    });
    out.total = ordered.len();
    let mut ready_through: HashMap<Step, bool> = HashMap::new();
    for (host, spec, step) in &ordered {
        let name = &host.metadata.name;
        // As people know it in what the cluster waits on: its node's name, and the hub's.
        let who = match spec.node_name.as_str() {
            "" => name.clone(),
            node => format!("{name} ({node})"),
        };
        let stored = view.plans.get(name.as_str());
        let group = usize::from(*step == Step::Worker);
        let target = match (step, &join) {
            (Step::Init, _) => host_plan(view.ctx, spec, *step, None, Some(view.manifest)),
            (_, Some(join)) => host_plan(view.ctx, spec, *step, Some(join), None),
            (_, None) => {
                out.never_provisioned += usize::from(stored.is_none());
                *ready_through.entry(*step).or_insert(true) = false;
                out.waiting.push(if init_address.is_empty() {
                    format!(
                        "{who}: the init host {} has no address to join (install it with --address or --internal-address)",
                        view.init
                    )
                } else {
                    format!(
                        "{who}: waiting for the init host {} to report its join token",
                        view.init
                    )
                });
                continue;
            }
        };
        let target = with_env_removal(target, view.ctx, stored);
        let target_sum = checksum(&target);
        let report = stored.map(PlanReport::of).unwrap_or_default();
        if stored.and_then(stored_checksum).as_deref() == Some(target_sum.as_str()) {
            if report.ready(&target_sum, target.probes.len()) {
                out.ready += 1;
                ready_through.entry(*step).or_insert(true);
                if stored.is_some_and(|p| Status::of(p).extra.contains_key(DRAINED)) {
                    out.actions.push(Action::Uncordon {
                        host: name.clone(),
                        node: spec.node_name.clone(),
                    });
                }
            } else {
                in_flight[group] += 1;
                *ready_through.entry(*step).or_insert(true) = false;
                if report.applied.is_empty() {
                    out.never_provisioned += 1;
                }
                match report.failure(&target_sum) {
                    Some(why) => {
                        out.failed = Some(format!("host {name} ({}): {why}", spec.node_name));
                    }
                    None => out
                        .waiting
                        .push(format!("{who}: {}", report.progress(&target_sum))),
                }
            }
            continue;
        }
        *ready_through.entry(*step).or_insert(true) = false;
        // A host that applied some plan before is upgrading; the strategy limits those.
        let upgrade = !report.applied.is_empty();
        if !upgrade {
            out.never_provisioned += 1;
        }
        let earlier_ready = ready_through
            .iter()
            .filter(|(s, _)| **s < *step)
            .all(|(_, ok)| *ok);
        if *step != Step::Init && !earlier_ready {
            out.waiting
                .push(format!("{who}: waiting for the hosts before it"));
            continue;
        }
        if upgrade && in_flight[group] >= limits[group] {
            out.waiting
                .push(format!("{who}: waiting for its turn to upgrade"));
            continue;
        }
        in_flight[group] += 1;
        let drained = stored.is_some_and(|p| {
            Status::of(p).extra.get(DRAINED).and_then(Value::as_str) == Some(&target_sum)
        });
        out.actions.push(Action::Write {
            host: name.clone(),
            plan: target,
            drain: (upgrade && view.strategy.drain && !drained).then(|| spec.node_name.clone()),
        });
    }
    out
}

/// Where a host comes in the order.
fn step_of(name: &str, spec: &HostSpec, init: &str) -> Step {
    if name == init {
        Step::Init
    } else if spec.roles.etcd {
        Step::Etcd
    } else if spec.roles.control_plane {
        Step::ControlPlane
    } else {
        Step::Worker
    }
}

/// The host that initialises the cluster: the one chosen before while it is still an etcd
/// host of the cluster, else the oldest etcd host.
pub(super) fn init_host<'a>(
    hosts: &'a [(&'a Object, HostSpec)],
    previous: Option<&str>,
) -> Option<&'a (&'a Object, HostSpec)> {
    hosts
        .iter()
        .find(|(h, s)| s.roles.etcd && Some(h.metadata.name.as_str()) == previous)
        .or_else(|| hosts.iter().find(|(_, s)| s.roles.etcd))
}

impl Rollout {
    /// Sets the cluster's status for this pass: the init host, the hosts ready, and the
    /// `Provisioned` and `Updated` conditions. `more_waiting` is what carrying out the actions
    /// found not done yet (a node still draining).
    pub(super) fn status(
        &self,
        s: &mut Status,
        init: &str,
        version: &str,
        more_waiting: &[String],
    ) {
        let waiting: Vec<&str> = self
            .waiting
            .iter()
            .chain(more_waiting)
            .map(String::as_str)
            .collect();
        let (ready, total) = (self.ready, self.total);
        s.extra.insert("initHost".into(), json!(init));
        s.extra
            .insert("hosts".into(), json!({"ready": ready, "total": total}));
        match &self.failed {
            Some(why) => s.set_condition("Provisioned", false, "ProvisioningFailed", why),
            None if self.never_provisioned > 0 => {
                let message = format!("{ready} of {total} hosts ready; {}", waiting.join("; "));
                s.set_condition_to("Provisioned", None, "Provisioning", &message);
            }
            None => s.set_condition("Provisioned", true, "Provisioned", ""),
        }
        if self.failed.is_none() && self.never_provisioned == 0 {
            if ready == total && waiting.is_empty() {
                s.set_condition("Updated", true, "Updated", "");
                s.extra.insert("version".into(), json!(version));
            } else {
                let message = format!(
                    "rolling to {version}: {ready} of {total} hosts done; {}",
                    waiting.join("; ")
                );
                s.set_condition_to("Updated", None, "Updating", &message);
            }
        }
    }
}

/// What removing a host calls for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Removal {
    /// The planner never put its finalizer on the host: nothing of it to undo.
    Nothing,
    /// Write the uninstall plan; with `drain`, drain that node first and write only once it is
    /// drained.
    Uninstall { plan: Plan, drain: Option<String> },
    /// The uninstall plan is written and not applied yet.
    Wait,
    /// Uninstalled: delete its node from the cluster, its plan and its credential, and let
    /// the host go.
    Release { node: String },
}

/// A host being removed: its uninstall plan first, then it goes.
pub(super) fn removal(
    ctx: &Ctx<'_>,
    host: &Object,
    stored: Option<&Object>,
    drain: bool,
) -> Removal {
    if !host.metadata.finalizers.iter().any(|f| f == FINALIZER) {
        return Removal::Nothing;
    }
    let spec = serde_json::from_value::<HostSpec>(host.spec.clone()).ok();
    let server = spec
        .as_ref()
        .is_some_and(|s| s.roles.etcd || s.roles.control_plane);
    let node = spec.map(|s| s.node_name).unwrap_or_default();
    // Its machine is destroyed (replaced as unhealthy): no uninstall can run, none is needed.
    if host
        .metadata
        .annotations
        .contains_key(crate::model::MACHINE_DESTROYED)
    {
        return Removal::Release { node };
    }
    // A machine pool's `drainBeforeDelete` drains whatever the upgrade strategy says.
    let drain = drain
        || host
            .metadata
            .annotations
            .contains_key(crate::model::DRAIN_BEFORE_DELETE);
    let plan = Plan {
        instructions: vec![ctx.uninstall(server)],
        ..Plan::default()
    };
    let sum = checksum(&plan);
    if stored.and_then(stored_checksum).as_deref() != Some(sum.as_str()) {
        return Removal::Uninstall {
            plan,
            drain: drain.then_some(node),
        };
    }
    if stored.map(PlanReport::of).is_some_and(|r| r.applied == sum) {
        Removal::Release { node }
    } else {
        Removal::Wait
    }
}

#[cfg(test)]
mod tests;
