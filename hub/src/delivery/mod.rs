//! Continuous delivery: which cluster gets which bundle, made into one BundleDeployment per
//! bundle and cluster (`BUNDLE.CLUSTER`), which the cluster's agent follows
//! (`ClusterAgent.WatchBundles`), applies with server-side apply and reports on.
//!
//! The decisions ([`desired`], [`summarize`]) are apart from the store: the leader's pass reads
//! bundles, cluster groups, clusters and deployments, asks them what should be, and writes the
//! difference. A cluster created or relabelled later is picked up by the next pass.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    model::{BundleDeploymentSpec, BundleSpec, ClusterGroupSpec, ClusterMatch, Kind},
    store::{LabelSelector, Modifier, Object, Op, Store, StoreError},
};

pub mod content;
pub mod follow;
pub mod git;
pub mod index;
pub mod rollout;

/// On each deployment: its cluster and bundle, so an agent's snapshot reads only its own.
pub const CLUSTER_LABEL: &str = "drover.io/cluster";
pub const BUNDLE_LABEL: &str = "drover.io/bundle";

/// A cluster as targeting sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterFacts {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// What one deployment reported, as the decisions need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported {
    /// The revision the agent applied.
    pub revision: String,
    /// The worst of its objects' states (`Ready` when all are).
    pub state: String,
}

/// Whether `m` selects `cluster`; a group that does not exist selects nothing.
pub(crate) fn matches(
    m: &ClusterMatch,
    cluster: &ClusterFacts,
    groups: &BTreeMap<String, LabelSelector>,
) -> bool {
    let by_name = m.cluster_name.as_ref().is_none_or(|n| *n == cluster.name);
    let by_labels = m.cluster_selector.as_ref().is_none_or(|s| {
        s.parse("")
            .is_ok_and(|selector| selector.matches(&cluster.labels))
    });
    let by_group = m
        .cluster_group
        .as_ref()
        .is_none_or(|g| groups.get(g).is_some_and(|s| s.matches(&cluster.labels)));
    by_name && by_labels && by_group
}

/// `bundle`'s deployment for `cluster`, if one of its targets selects the cluster: the first
/// target that does names it; every customisation that matches applies, in order.
pub fn deployment_for(
    bundle: &str,
    spec: &BundleSpec,
    cluster: &ClusterFacts,
    groups: &BTreeMap<String, LabelSelector>,
) -> Option<BundleDeploymentSpec> {
    let content = spec.content.clone()?;
    let (index, target) = spec
        .targets
        .iter()
        .enumerate()
        .find(|(_, t)| matches(&t.clusters, cluster, groups))?;
    let mut out = BundleDeploymentSpec {
        bundle: bundle.to_owned(),
        cluster: cluster.name.clone(),
        target: if target.name.is_empty() {
            format!("target-{index}")
        } else {
            target.name.clone()
        },
        content,
        default_namespace: spec.default_namespace.clone(),
        correct_drift: spec.correct_drift,
        ..BundleDeploymentSpec::default()
    };
    for c in spec
        .customizations
        .iter()
        .filter(|c| matches(&c.clusters, cluster, groups))
    {
        if let Some(ns) = &c.namespace {
            out.namespace.clone_from(ns);
        }
        out.labels.extend(c.labels.clone());
        out.images.extend(c.images.clone());
    }
    out.vars.insert("cluster.name".into(), cluster.name.clone());
    for (key, value) in &cluster.labels {
        out.vars
            .insert(format!("cluster.labels.{key}"), value.clone());
    }
    out.revision = revision(&out);
    Some(out)
}

/// What identifies a deployment's spec: the digest of all of it but the revision.
pub fn revision(spec: &BundleDeploymentSpec) -> String {
    let mut bare = spec.clone();
    bare.revision = String::new();
    let bytes = serde_json::to_vec(&bare).unwrap_or_default();
    content::digest(&bytes)
}

/// The deployments there should be, by name, and for each bundle what its rollout waits for.
/// A bundle whose `dependsOn` are not all applied and ready in a cluster keeps what that cluster
/// has of it now (nothing, or the last revision), as Fleet holds a bundle back until what it
/// depends on is ready; the rest goes as the bundle's rollout allows ([`rollout::gate`]).
pub fn desired(
    bundles: &BTreeMap<String, BundleSpec>,
    clusters: &[ClusterFacts],
    groups: &BTreeMap<String, LabelSelector>,
    existing: &BTreeMap<String, (BundleDeploymentSpec, Reported)>,
) -> (
    BTreeMap<String, BundleDeploymentSpec>,
    BTreeMap<String, String>,
) {
    let mut out = BTreeMap::new();
    let mut waiting = BTreeMap::new();
    for (bundle, spec) in bundles {
        let mut members = Vec::new();
        for cluster in clusters {
            let Some(wanted) = deployment_for(bundle, spec, cluster, groups) else {
                continue;
            };
            let now = existing.get(&deployment_name(bundle, &cluster.name));
            let ready = |dependency: &String| {
                existing
                    .get(&deployment_name(dependency, &cluster.name))
                    .is_some_and(|(spec, reported)| {
                        reported.revision == spec.revision && reported.state == "Ready"
                    })
            };
            if spec.depends_on.iter().all(ready) {
                members.push(rollout::Member {
                    cluster,
                    wanted,
                    now,
                });
            } else if let Some((held, _)) = now {
                out.insert(deployment_name(bundle, &cluster.name), held.clone());
            }
        }
        let (give, message) = rollout::gate(spec.rollout.as_ref(), spec.paused, members, groups);
        for (cluster, spec) in give {
            out.insert(deployment_name(bundle, &cluster), spec);
        }
        waiting.insert(bundle.clone(), message);
    }
    (out, waiting)
}

pub fn deployment_name(bundle: &str, cluster: &str) -> String {
    format!("{bundle}.{cluster}")
}

/// A bundle's status from its deployments: per target, how many clusters have applied the
/// current revision and are ready; the clusters in error or drifted, with why.
pub fn summarize(deployments: &[(&BundleDeploymentSpec, &Value)]) -> Value {
    let mut targets: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    let mut problems = Vec::new();
    for (spec, status) in deployments {
        let entry = targets.entry(spec.target.as_str()).or_default();
        entry.1 += 1;
        let applied = status["revision"].as_str() == Some(spec.revision.as_str());
        let state = status["state"].as_str().unwrap_or("Pending");
        if applied && state == "Ready" {
            entry.0 += 1;
        } else if applied || !status["error"].is_null() {
            problems.push(json!({
                "cluster": spec.cluster,
                "state": state,
                "message": status["message"],
            }));
        }
    }
    let (ready, total) = targets
        .values()
        .fold((0, 0), |(r, t), (rr, tt)| (r + rr, t + tt));
    json!({
        "summary": format!("{ready} of {total} clusters ready"),
        "ready": ready,
        "clusters": total,
        "targets": targets.iter().map(|(name, (r, t))| json!({
            "name": name, "ready": r, "clusters": t,
            "summary": format!("{r} of {t} clusters ready"),
        })).collect::<Vec<_>>(),
        "problems": problems,
    })
}

/// How often chunks no bundle or deployment names are looked for, and how old an unnamed one
/// must be to go (a bundle being written stores its chunks first).
const CHUNK_SWEEP: std::time::Duration = std::time::Duration::from_secs(600);

/// Deletes the chunks that no bundle or deployment names and that are older than
/// [`CHUNK_SWEEP`]; returns how many went.
pub async fn sweep_chunks(store: &dyn Store) -> Result<usize, StoreError> {
    let all = LabelSelector::everything();
    let mut named = BTreeSet::new();
    for kind in [Kind::Bundle, Kind::BundleDeployment] {
        let (objects, _) = store.list(kind.name(), &all).await?;
        for o in objects {
            let chunks = o.spec.pointer("/content/chunks").and_then(Value::as_array);
            named.extend(
                chunks
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_owned),
            );
        }
    }
    let (chunks, _) = store.list(crate::model::CHUNK_KIND, &all).await?;
    let cutoff = time::OffsetDateTime::now_utc() - CHUNK_SWEEP;
    let mut gone = 0;
    for chunk in chunks {
        let made = time::OffsetDateTime::parse(
            &chunk.metadata.creation_timestamp,
            &time::format_description::well_known::Rfc3339,
        );
        if named.contains(&chunk.metadata.name) || made.is_ok_and(|t| t > cutoff) {
            continue;
        }
        match store
            .delete(
                crate::model::CHUNK_KIND,
                &chunk.metadata.name,
                Some(chunk.revision()),
            )
            .await
        {
            Ok(_) => gone += 1,
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(gone)
}

/// A GitRepo's status from the deployments of its bundles: per target, how many clusters have
/// every bundle of the repository applied at its current revision and ready.
pub fn summarize_clusters(deployments: &[(&BundleDeploymentSpec, &Value)]) -> Value {
    let mut clusters: BTreeMap<(&str, &str), bool> = BTreeMap::new();
    for (spec, status) in deployments {
        let ready = status["revision"].as_str() == Some(spec.revision.as_str())
            && status["state"] == "Ready";
        let entry = clusters
            .entry((spec.target.as_str(), spec.cluster.as_str()))
            .or_insert(true);
        *entry &= ready;
    }
    let mut targets: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for ((target, _), ready) in &clusters {
        let entry = targets.entry(target).or_default();
        entry.1 += 1;
        entry.0 += u32::from(*ready);
    }
    let ready = clusters.values().filter(|r| **r).count();
    json!({
        "summary": format!("{ready} of {} clusters ready", clusters.len()),
        "targets": targets.iter().map(|(name, (r, t))| json!({
            "name": name, "ready": r, "clusters": t,
            "summary": format!("{r} of {t} clusters ready"),
        })).collect::<Vec<_>>(),
    })
}

/// Sets each of `fields` in `status`, leaving the fields others write (the GitRepo's reader
/// and the delivery controller share a GitRepo's status).
pub(crate) fn merge_status(status: &mut Value, fields: &Value) {
    if !status.is_object() {
        *status = json!({});
    }
    if let (Value::Object(now), Value::Object(new)) = (status, fields) {
        for (k, v) in new {
            now.insert(k.clone(), v.clone());
        }
    }
}

/// Which changes call for a pass: any of a bundle, a cluster group or a deployment (its
/// report moves the rollout and the statuses), but of a cluster only its labels, coming or
/// going; its status changes with every facts report (each cluster's every half minute), and a
/// pass reads every deployment of the fleet.
#[derive(Debug, Default)]
pub struct Changes {
    /// Each cluster's labels as last seen.
    clusters: std::collections::HashMap<String, BTreeMap<String, String>>,
}

impl Changes {
    pub fn relevant(&mut self, event: &crate::store::WatchEvent) -> bool {
        let object = &event.object;
        let kind = object.kind.as_str();
        if kind != Kind::Cluster.name() {
            return [
                Kind::Bundle.name(),
                Kind::ClusterGroup.name(),
                Kind::BundleDeployment.name(),
            ]
            .contains(&kind);
        }
        let name = &object.metadata.name;
        let gone = event.kind == crate::store::EventType::Deleted
            || object.metadata.deletion_timestamp.is_some();
        if gone {
            self.clusters.remove(name);
            return true;
        }
        if self.clusters.get(name) == Some(&object.metadata.labels) {
            return false;
        }
        self.clusters
            .insert(name.clone(), object.metadata.labels.clone());
        true
    }
}

/// The leader's controller: a pass at start and after each change [`Changes`] calls for;
/// unnamed chunks swept every [`CHUNK_SWEEP`].
pub async fn run(store: std::sync::Arc<dyn Store>, stop: CancellationToken) {
    let sweeper = {
        let (store, stop) = (store.clone(), stop.clone());
        async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(CHUNK_SWEEP) => {}
                }
                match sweep_chunks(store.as_ref()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        chunks = n,
                        "continuous delivery: removed content no bundle names any more"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "continuous delivery: cannot sweep unnamed content; trying again in 10 minutes")
                    }
                }
            }
        }
    };
    let mut changes = Changes::default();
    let passes = crate::store::on_changes_where(
        "continuous delivery",
        store.as_ref(),
        |e| changes.relevant(e),
        &stop,
        || {
            let store = store.clone();
            async move {
                if let Err(e) = pass(store.as_ref()).await {
                    tracing::warn!(error = %e, "continuous delivery: the pass failed; trying again at the next change or in 10 s");
                }
            }
        },
    );
    tokio::join!(passes, sweeper);
}

/// One pass: the deployments made to match, then each bundle's status.
pub async fn pass(store: &dyn Store) -> Result<(), StoreError> {
    let all = LabelSelector::everything();
    let (bundles, _) = store.list(Kind::Bundle.name(), &all).await?;
    let (groups, _) = store.list(Kind::ClusterGroup.name(), &all).await?;
    let (clusters, _) = store.list(Kind::Cluster.name(), &all).await?;
    let (deployments, _) = store.list(Kind::BundleDeployment.name(), &all).await?;
    let specs: BTreeMap<String, BundleSpec> = bundles
        .iter()
        .filter(|b| b.metadata.deletion_timestamp.is_none())
        .filter_map(|b| {
            let spec = serde_json::from_value(b.spec.clone()).ok()?;
            Some((b.metadata.name.clone(), spec))
        })
        .collect();
    let groups: BTreeMap<String, LabelSelector> = groups
        .iter()
        .filter_map(|g| {
            let spec: ClusterGroupSpec = serde_json::from_value(g.spec.clone()).ok()?;
            Some((g.metadata.name.clone(), spec.selector.parse("").ok()?))
        })
        .collect();
    let clusters: Vec<ClusterFacts> = clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| ClusterFacts {
            name: c.metadata.name.clone(),
            labels: c.metadata.labels.clone(),
        })
        .collect();
    let existing: BTreeMap<String, (BundleDeploymentSpec, Reported)> = deployments
        .iter()
        .filter_map(|d| {
            let spec = serde_json::from_value(d.spec.clone()).ok()?;
            let reported = Reported {
                revision: d.status["revision"].as_str().unwrap_or_default().to_owned(),
                state: d.status["state"].as_str().unwrap_or_default().to_owned(),
            };
            Some((d.metadata.name.clone(), (spec, reported)))
        })
        .collect();
    let (wanted, waiting) = desired(&specs, &clusters, &groups, &existing);
    let mut ops = Vec::new();
    for (name, spec) in &wanted {
        let value = serde_json::to_value(spec).map_err(|e| StoreError::Invalid(e.to_string()))?;
        match existing.get(name) {
            None => {
                let mut object = Object::new(Kind::BundleDeployment.name(), name, value);
                let labels = &mut object.metadata.labels;
                labels.insert(CLUSTER_LABEL.into(), spec.cluster.clone());
                labels.insert(BUNDLE_LABEL.into(), spec.bundle.clone());
                ops.push(Op::Create(object));
            }
            Some((now, _)) if now != spec => {
                let value = value.clone();
                ops.push(Op::Modify {
                    kind: Kind::BundleDeployment.name().into(),
                    name: name.clone(),
                    change: Modifier::new(move |o| o.spec = value.clone()),
                });
            }
            Some(_) => {}
        }
    }
    for name in existing.keys().filter(|n| !wanted.contains_key(*n)) {
        ops.push(Op::Delete {
            kind: Kind::BundleDeployment.name().into(),
            name: name.clone(),
            resource_version: None,
        });
    }
    // One object a transaction, so a deployment whose bundle or cluster went meanwhile fails
    // alone; many in flight, so the store commits them together (a commit of a GitRepo to
    // 1,000 clusters is 1,000 creates or changes per bundle: one fsync each took minutes).
    let writes: Vec<_> = ops.into_iter().map(|op| write_one(store, op)).collect();
    futures::stream::iter(writes)
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<()>>()
        .await?;
    // The statuses as listed above: this pass wrote specs only.
    write_statuses(store, &bundles, &deployments, &wanted, &waiting).await
}

/// Writes of one pass in flight at once.
const WRITERS: usize = 64;

/// One deployment's create, change or delete; one whose bundle or cluster went meanwhile is
/// skipped.
async fn write_one(store: &dyn Store, op: Op) -> Result<(), StoreError> {
    let mut one = vec![op];
    if matches!(one[0], Op::Create(_))
        && let Err(e) = crate::refs::stamp_all(store, &mut one).await
    {
        tracing::debug!(error = %e, "continuous delivery: not creating a deployment");
        return Ok(());
    }
    match store.transact(one).await {
        Ok(_) | Err(StoreError::NotFound { .. } | StoreError::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn write_statuses(
    store: &dyn Store,
    bundles: &[Object],
    deployments: &[Object],
    wanted: &BTreeMap<String, BundleDeploymentSpec>,
    waiting: &BTreeMap<String, String>,
) -> Result<(), StoreError> {
    let all = LabelSelector::everything();
    let statuses: BTreeMap<&str, &Value> = deployments
        .iter()
        .map(|d| (d.metadata.name.as_str(), &d.status))
        .collect();
    let null = Value::Null;
    // Each GitRepo: its bundles' clusters, counted once each.
    let (repos, _) = store.list(Kind::GitRepo.name(), &all).await?;
    for repo in &repos {
        let name = &repo.metadata.name;
        let of_repo: BTreeSet<&str> = bundles
            .iter()
            .filter(|b| b.metadata.labels.get(git::GITREPO_LABEL) == Some(name))
            .map(|b| b.metadata.name.as_str())
            .collect();
        let mine: Vec<(&BundleDeploymentSpec, &Value)> = wanted
            .iter()
            .filter(|(_, spec)| of_repo.contains(spec.bundle.as_str()))
            .map(|(n, spec)| (spec, statuses.get(n.as_str()).copied().unwrap_or(&null)))
            .collect();
        let counted = summarize_clusters(&mine);
        if repo.status.get("summary") == counted.get("summary")
            && repo.status.get("targets") == counted.get("targets")
        {
            continue;
        }
        let op = Op::Modify {
            kind: Kind::GitRepo.name().into(),
            name: name.clone(),
            change: Modifier::new(move |o| {
                let fields = json!({"summary": counted["summary"], "targets": counted["targets"]});
                merge_status(&mut o.status, &fields);
            }),
        };
        match store.transact(vec![op]).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    for bundle in bundles {
        let name = &bundle.metadata.name;
        let mine: Vec<(&BundleDeploymentSpec, &Value)> = wanted
            .iter()
            .filter(|(_, spec)| spec.bundle == *name)
            .map(|(n, spec)| (spec, statuses.get(n.as_str()).copied().unwrap_or(&null)))
            .collect();
        let mut status = summarize(&mine);
        if let Some(content) = bundle.spec.get("content") {
            status["content"] = content["digest"].clone();
        }
        status["rollout"] = json!(waiting.get(name).cloned().unwrap_or_default());
        let names: BTreeSet<&str> = [
            "summary", "ready", "clusters", "targets", "problems", "content", "rollout",
        ]
        .into_iter()
        .collect();
        let differs = names
            .iter()
            .any(|k| bundle.status.get(*k) != status.get(*k));
        if !differs {
            continue;
        }
        let op = Op::Modify {
            kind: Kind::Bundle.name().into(),
            name: name.clone(),
            change: Modifier::new(move |o| merge_status(&mut o.status, &status)),
        };
        match store.transact(vec![op]).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
