//! How a change of a bundle reaches the clusters that already have it: partition by partition,
//! at most `maxUnavailable` clusters at a time being given it and not yet ready with it; a
//! partition whose clusters are not ready with the change (beyond its own `maxUnavailable`)
//! holds every later one back, so a bad change stops after the first partition. A cluster new
//! to the bundle gets the current revision at once: it has nothing to lose.

use std::collections::BTreeMap;

use super::{ClusterFacts, Reported, matches};
use crate::{
    model::{BundleDeploymentSpec, Rollout, count_of},
    store::LabelSelector,
};

/// One cluster of a bundle: what it should have now, and what it has (with its last report).
#[derive(Debug, Clone)]
pub struct Member<'a> {
    pub cluster: &'a ClusterFacts,
    pub wanted: BundleDeploymentSpec,
    pub now: Option<&'a (BundleDeploymentSpec, Reported)>,
}

fn updated(m: &Member<'_>) -> bool {
    m.now.is_some_and(|(spec, _)| *spec == m.wanted)
}

fn ready(m: &Member<'_>) -> bool {
    m.now.is_some_and(|(spec, reported)| {
        reported.revision == spec.revision && reported.state == "Ready"
    })
}

/// What each cluster is to be given now (by cluster name; a cluster left out gets nothing), and
/// what the rollout is waiting for (empty when nothing).
pub fn gate(
    rollout: Option<&Rollout>,
    paused: bool,
    members: Vec<Member<'_>>,
    groups: &BTreeMap<String, LabelSelector>,
) -> (BTreeMap<String, BundleDeploymentSpec>, String) {
    let mut give = BTreeMap::new();
    let hold = |m: &Member<'_>, give: &mut BTreeMap<String, BundleDeploymentSpec>| {
        if let Some((spec, _)) = m.now {
            give.insert(m.cluster.name.clone(), spec.clone());
        }
    };
    if paused {
        let behind = members.iter().filter(|m| !updated(m)).count();
        for m in &members {
            hold(m, &mut give);
        }
        let message = if behind > 0 {
            format!("paused: {behind} cluster(s) wait for the current revision")
        } else {
            "paused".to_owned()
        };
        return (give, message);
    }
    let (new, mut existing): (Vec<_>, Vec<_>) = members.into_iter().partition(|m| m.now.is_none());
    for m in new {
        give.insert(m.cluster.name.clone(), m.wanted);
    }
    let default = Rollout::default();
    let rollout = rollout.unwrap_or(&default);
    let limit = count_of(
        rollout.max_unavailable.as_deref().unwrap_or("100%"),
        existing.len(),
        1,
    )
    .unwrap_or(1);
    // The partitions in order, each taking the clusters it selects that no earlier one took.
    let mut partitions: Vec<(String, Option<&str>, Vec<Member<'_>>)> = Vec::new();
    for p in &rollout.partitions {
        let (mine, rest): (Vec<_>, Vec<_>) = existing
            .into_iter()
            .partition(|m| matches(&p.clusters, m.cluster, groups));
        existing = rest;
        partitions.push((p.name.clone(), p.max_unavailable.as_deref(), mine));
    }
    if !existing.is_empty() {
        let name = if rollout.partitions.is_empty() {
            "all"
        } else {
            "the rest"
        };
        partitions.push((name.to_owned(), None, existing));
    }
    let count = partitions.len();
    let mut waiting = String::new();
    for (index, (name, allowed, members)) in partitions.into_iter().enumerate() {
        if !waiting.is_empty() {
            for m in &members {
                hold(m, &mut give);
            }
            continue;
        }
        let mut in_flight = members.iter().filter(|m| updated(m) && !ready(m)).count();
        for m in &members {
            if updated(m) {
                give.insert(m.cluster.name.clone(), m.wanted.clone());
            } else if in_flight < limit {
                give.insert(m.cluster.name.clone(), m.wanted.clone());
                in_flight += 1;
            } else {
                hold(m, &mut give);
            }
        }
        let behind: Vec<&str> = members
            .iter()
            .filter(|m| !(updated(m) && ready(m)))
            .map(|m| m.cluster.name.as_str())
            .collect();
        let all_given = members.iter().all(updated);
        let tolerated = count_of(allowed.unwrap_or("0"), members.len(), 0).unwrap_or(0);
        if !all_given || behind.len() > tolerated {
            let shown: Vec<&str> = behind.iter().take(5).copied().collect();
            let more = behind.len().saturating_sub(shown.len());
            waiting = format!(
                "rolling out partition {} of {count} ({name}): waiting for {}{} to be ready with the current revision",
                index + 1,
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                },
            );
        }
    }
    (give, waiting)
}
