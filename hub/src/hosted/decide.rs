//! What the hosted-cluster controller does next for one cluster, from its spec and what the
//! cloud reports: no effects here, so every rule is a row of the tables below.

use drivers::hosted::{Cluster, NodeGroup, Phase, Size};

use crate::model::{HostedSpec, NodeGroupSpec, minor_version};

/// The tag every cloud resource the hub makes carries: the hub cluster's name ...
pub const CLUSTER_TAG: &str = "drover.io/cluster";
/// ... and its uid, which tells this cluster's resources from those of an earlier cluster of
/// the same name, or of another hub.
pub const OWNER_TAG: &str = "drover.io/owner";

/// What the cloud holds for one cluster.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub cluster: Option<Cluster>,
    pub node_groups: Vec<NodeGroup>,
    /// Whether the hub has installed the agents into the cluster (its own record, not the
    /// cloud's).
    pub agents_installed: bool,
}

/// One step towards the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    CreateCluster,
    /// Apply the import manifest at the cluster's API server (once, as soon as it is active).
    InstallAgents,
    /// Move the control plane one minor version up, to this.
    UpgradeCluster(String),
    DeleteCluster,
    CreateNodeGroup(String),
    ScaleNodeGroup(String, Size),
    UpgradeNodeGroup(String, String),
    DeleteNodeGroup(String),
}

/// Where the cluster stands after the actions (for its status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The cloud is working on something: wait for it (what, for the status).
    Waiting(String),
    /// The cloud holds what the spec says.
    Ready,
    /// Nothing more can happen until someone acts (why, and what to do).
    Stuck(String),
    /// Deleted, and nothing of it is left in the cloud: the finalizer can go.
    Released,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub standing: Standing,
}

fn decision(actions: Vec<Action>, standing: Standing) -> Decision {
    Decision { actions, standing }
}

/// The next steps for cluster `name` (uid `uid`), `deleting` or not, with `spec` against what
/// the cloud holds.
pub fn decide(
    name: &str,
    uid: &str,
    spec: &HostedSpec,
    deleting: bool,
    observed: &Observed,
) -> Decision {
    let cloud_name = spec.cloud_name(name);
    if deleting {
        return delete(spec, uid, observed);
    }
    let Some(cluster) = &observed.cluster else {
        if spec.import.is_some() {
            return decision(
                vec![],
                Standing::Stuck(format!(
                    "no EKS cluster {cloud_name:?} in {}: check spec.hosted.import.name and the region",
                    spec.region
                )),
            );
        }
        return decision(
            vec![Action::CreateCluster],
            Standing::Waiting("creating the control plane".into()),
        );
    };
    if spec.import.is_none() && cluster.tags.get(OWNER_TAG).map(String::as_str) != Some(uid) {
        return decision(
            vec![],
            Standing::Stuck(format!(
                "an EKS cluster {cloud_name:?} exists that this cluster did not make; take it over with spec.hosted.import, or give this cluster another name"
            )),
        );
    }
    match cluster.phase {
        Phase::Active => {}
        Phase::Failed => {
            return decision(
                vec![],
                Standing::Stuck(format!(
                    "the cloud reports the control plane {}",
                    cluster.status
                )),
            );
        }
        _ => {
            return decision(
                vec![],
                Standing::Waiting(format!("control plane {}", cluster.status)),
            );
        }
    }
    let mut decision = active(spec, uid, cluster, observed);
    // Last: the cloud's own steps do not wait for it (an endpoint the hub cannot reach, say
    // private only, holds the agents back, not the node groups).
    if !observed.agents_installed {
        decision.actions.push(Action::InstallAgents);
    }
    decision
}

/// With the control plane active: upgrade it, or see to the node groups.
fn active(spec: &HostedSpec, uid: &str, cluster: &Cluster, observed: &Observed) -> Decision {
    // The control plane first: node groups follow a version it already runs.
    let (Some(want), Some(have)) = (
        minor_version(&spec.kubernetes_version),
        minor_version(&cluster.version),
    ) else {
        return decision(
            vec![],
            Standing::Stuck(format!(
                "the cloud reports version {:?}, which is not a minor version",
                cluster.version
            )),
        );
    };
    let groups_busy = observed
        .node_groups
        .iter()
        .any(|g| matches!(g.phase, Phase::Creating | Phase::Updating));
    if want > have {
        if groups_busy {
            return decision(
                vec![],
                Standing::Waiting("node groups to settle before the control plane upgrades".into()),
            );
        }
        // One minor version at a time, as EKS allows.
        let next = format!("{}.{}", have.0, have.1 + 1);
        let step = if want.0 == have.0 {
            next
        } else {
            spec.kubernetes_version.clone()
        };
        return decision(
            vec![Action::UpgradeCluster(step.clone())],
            Standing::Waiting(format!("upgrading the control plane to {step}")),
        );
    }
    node_groups(spec, uid, &cluster.version, observed)
}

/// With the control plane active at `version`: node groups made, resized, upgraded one at a
/// time, and removed to match the spec.
fn node_groups(spec: &HostedSpec, uid: &str, version: &str, observed: &Observed) -> Decision {
    let mut actions = Vec::new();
    let mut waiting = Vec::new();
    let mut stuck = Vec::new();
    let mut upgrading = observed
        .node_groups
        .iter()
        .any(|g| g.phase == Phase::Updating && g.version != version);
    for want in &spec.node_groups {
        let Some(have) = observed.node_groups.iter().find(|g| g.name == want.name) else {
            actions.push(Action::CreateNodeGroup(want.name.clone()));
            waiting.push(format!("creating node group {}", want.name));
            continue;
        };
        match have.phase {
            Phase::Active => {}
            Phase::Failed => {
                stuck.push(format!("node group {} is {}", have.name, have.status));
                continue;
            }
            _ => {
                waiting.push(format!("node group {} {}", have.name, have.status));
                continue;
            }
        }
        let size = size_of(want);
        if (have.desired_size, have.min_size, have.max_size) != (size.desired, size.min, size.max) {
            actions.push(Action::ScaleNodeGroup(want.name.clone(), size));
            waiting.push(format!(
                "scaling node group {} to {}",
                want.name, size.desired
            ));
        } else if have.version != version {
            if upgrading {
                waiting.push(format!(
                    "node group {} waits its turn to upgrade",
                    want.name
                ));
            } else {
                upgrading = true;
                actions.push(Action::UpgradeNodeGroup(
                    want.name.clone(),
                    version.to_owned(),
                ));
                waiting.push(format!("upgrading node group {} to {version}", want.name));
            }
        }
    }
    // Groups the spec no longer names go, if the hub made them (a group someone else added
    // to an imported cluster is theirs).
    for have in &observed.node_groups {
        let named = spec.node_groups.iter().any(|g| g.name == have.name);
        if !named && ours(&have.tags, uid) && have.phase != Phase::Deleting {
            actions.push(Action::DeleteNodeGroup(have.name.clone()));
            waiting.push(format!("deleting node group {}", have.name));
        } else if !named && have.phase == Phase::Deleting && ours(&have.tags, uid) {
            waiting.push(format!("node group {} DELETING", have.name));
        }
    }
    let standing = if !stuck.is_empty() {
        Standing::Stuck(stuck.join("; "))
    } else if !waiting.is_empty() {
        Standing::Waiting(waiting.join("; "))
    } else {
        Standing::Ready
    };
    decision(actions, standing)
}

fn size_of(group: &NodeGroupSpec) -> Size {
    Size {
        desired: group.desired_size,
        min: group.min_size,
        max: group.max_size,
    }
}

fn ours(tags: &std::collections::BTreeMap<String, String>, uid: &str) -> bool {
    tags.get(OWNER_TAG).map(String::as_str) == Some(uid)
}

/// Deleting: the node groups the hub made, then (once none is left) the control plane, unless
/// the cluster was taken over (`import`): the hub leaves what it did not make.
fn delete(spec: &HostedSpec, uid: &str, observed: &Observed) -> Decision {
    let imported = spec.import.is_some();
    let mut actions = Vec::new();
    let mut waiting = Vec::new();
    let mut groups_left = false;
    for group in &observed.node_groups {
        if !ours(&group.tags, uid) {
            continue;
        }
        groups_left = true;
        if group.phase == Phase::Deleting {
            waiting.push(format!("node group {} DELETING", group.name));
        } else {
            actions.push(Action::DeleteNodeGroup(group.name.clone()));
            waiting.push(format!("deleting node group {}", group.name));
        }
    }
    if groups_left {
        return decision(actions, Standing::Waiting(waiting.join("; ")));
    }
    match &observed.cluster {
        Some(cluster) if !imported && ours(&cluster.tags, uid) => {
            if cluster.phase == Phase::Deleting {
                decision(vec![], Standing::Waiting("control plane DELETING".into()))
            } else {
                decision(
                    vec![Action::DeleteCluster],
                    Standing::Waiting("deleting the control plane".into()),
                )
            }
        }
        // Gone, taken over, or not this cluster's to delete.
        _ => decision(vec![], Standing::Released),
    }
}

#[cfg(test)]
mod tests;
