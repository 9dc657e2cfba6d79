//! Every cluster's deployments as its agent is sent them, kept by each hub from one watch of
//! the store. A cluster's stream and its chunk checks read its own share; before, each read
//! listed every deployment of the fleet, so a commit to B bundles on N clusters decoded N × B
//! deployments for each of its N × B changes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use proto::cluster::v1::{BundleDeployment, BundleSnapshot};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    model::{BundleDeploymentSpec, Kind},
    store::{EventType, LabelSelector, Object, Store, WatchEvent},
};

/// One cluster's deployments, and a counter bumped when what its agent is sent changes.
#[derive(Debug)]
struct Entry {
    deployments: BTreeMap<String, BundleDeployment>,
    changed: watch::Sender<u64>,
}

impl Entry {
    fn new() -> Self {
        Self {
            deployments: BTreeMap::new(),
            changed: watch::Sender::new(0),
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

#[derive(Debug)]
pub struct Index {
    clusters: Mutex<HashMap<String, Entry>>,
    /// Set once the first list is in: until then no cluster is sent anything (an empty
    /// snapshot would tell its agent to prune every bundle).
    loaded: watch::Sender<bool>,
}

impl Default for Index {
    fn default() -> Self {
        Self {
            clusters: Mutex::default(),
            loaded: watch::Sender::new(false),
        }
    }
}

/// What an agent is sent of deployment `name`.
pub fn message(name: &str, spec: BundleDeploymentSpec) -> BundleDeployment {
    BundleDeployment {
        name: name.to_owned(),
        bundle: spec.bundle,
        content: spec.content.digest,
        chunks: spec.content.chunks,
        default_namespace: spec.default_namespace,
        namespace: spec.namespace,
        labels: spec.labels,
        images: spec.images,
        vars: spec.vars,
        correct_drift: spec.correct_drift,
        revision: spec.revision,
    }
}

/// The cluster and message of a stored deployment.
fn parse(object: &Object) -> Option<(String, BundleDeployment)> {
    let spec: BundleDeploymentSpec = serde_json::from_value(object.spec.clone()).ok()?;
    Some((spec.cluster.clone(), message(&object.metadata.name, spec)))
}

impl Index {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic elsewhere while holding it leaves maps that are still whole.
        self.clusters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes when `cluster`'s deployments change (as its agent would see them).
    pub fn subscribe(&self, cluster: &str) -> watch::Receiver<u64> {
        let mut clusters = self.lock();
        let entry = clusters
            .entry(cluster.to_owned())
            .or_insert_with(Entry::new);
        entry.changed.subscribe()
    }

    /// Waits until the first list is in.
    pub async fn loaded(&self) {
        let mut loaded = self.loaded.subscribe();
        let _ = loaded.wait_for(|l| *l).await;
    }

    /// `cluster`'s deployments now, by name.
    pub fn snapshot(&self, cluster: &str) -> BundleSnapshot {
        let clusters = self.lock();
        let deployments = clusters
            .get(cluster)
            .map(|e| e.deployments.values().cloned().collect())
            .unwrap_or_default();
        BundleSnapshot { deployments }
    }

    /// Whether one of `cluster`'s deployments names chunk `digest`.
    pub fn names_chunk(&self, cluster: &str, digest: &str) -> bool {
        let clusters = self.lock();
        clusters.get(cluster).is_some_and(|e| {
            e.deployments
                .values()
                .any(|d| d.chunks.iter().any(|c| c == digest))
        })
    }

    /// Takes in one change; only a change of what an agent is sent wakes its cluster (a
    /// report changes the status alone).
    pub fn apply(&self, object: &Object, deleted: bool) {
        let Some((cluster, message)) = parse(object) else {
            return;
        };
        let mut clusters = self.lock();
        let entry = clusters.entry(cluster).or_insert_with(Entry::new);
        let name = &object.metadata.name;
        let changed = if deleted {
            entry.deployments.remove(name).is_some()
        } else if entry.deployments.get(name) == Some(&message) {
            false
        } else {
            entry.deployments.insert(name.clone(), message);
            true
        };
        if changed {
            entry.bump();
        }
    }

    /// Replaces everything with a full list, waking only the clusters whose share changed.
    pub fn replace_all(&self, objects: &[Object]) {
        let mut fresh: HashMap<String, BTreeMap<String, BundleDeployment>> = HashMap::new();
        for object in objects {
            if let Some((cluster, message)) = parse(object) {
                fresh
                    .entry(cluster)
                    .or_default()
                    .insert(object.metadata.name.clone(), message);
            }
        }
        let mut clusters = self.lock();
        for (name, entry) in clusters.iter_mut() {
            let now = fresh.remove(name).unwrap_or_default();
            if entry.deployments != now {
                entry.deployments = now;
                entry.bump();
            }
        }
        for (name, deployments) in fresh {
            let mut entry = Entry::new();
            entry.deployments = deployments;
            clusters.insert(name, entry);
        }
        drop(clusters);
        self.loaded.send_replace(true);
    }

    /// Keeps the index from the store until `stop`: a list, then its changes; a broken watch
    /// lists again.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, stop: CancellationToken) {
        let mut following = crate::store::Following::new("the clusters' bundle deployments");
        loop {
            let kind = Kind::BundleDeployment.name();
            let listed = async {
                let (objects, revision) = store.list(kind, &LabelSelector::everything()).await?;
                let changes = store.watch(Some(kind), Some(revision)).await?;
                Ok::<_, crate::store::StoreError>((objects, revision, changes))
            };
            let (objects, revision, mut changes) = tokio::select! {
                () = stop.cancelled() => return,
                listed = listed => match listed {
                    Ok(listed) => listed,
                    Err(e) => {
                        following.broke(Some(&e));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
            };
            self.replace_all(&objects);
            following.resumed(revision);
            let take = |event: &WatchEvent| {
                self.apply(&event.object, event.kind == EventType::Deleted);
            };
            if following.drain(&mut changes, &stop, take).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn deployment(name: &str, cluster: &str, revision: &str) -> Object {
        Object::new(
            Kind::BundleDeployment.name(),
            name,
            json!({"bundle": name.split('.').next().unwrap(), "cluster": cluster,
                   "target": "t", "content": {"digest": "sha256-c", "chunks": ["sha256-k"], "objects": 1, "bytes": 10},
                   "revision": revision}),
        )
    }

    #[test]
    fn a_cluster_is_woken_only_by_a_change_of_what_its_agent_is_sent() {
        let index = Index::default();
        index.replace_all(&[deployment("a.east", "east", "r1")]);
        let mut east = index.subscribe("east");
        let mut west = index.subscribe("west");
        east.borrow_and_update();
        west.borrow_and_update();

        // A report: the status changes, the spec does not. No news.
        let mut reported = deployment("a.east", "east", "r1");
        reported.status = json!({"state": "Ready"});
        index.apply(&reported, false);
        assert!(!east.has_changed().unwrap());

        // A new revision, and a deployment of west's: each wakes its own cluster.
        index.apply(&deployment("a.east", "east", "r2"), false);
        assert!(east.has_changed().unwrap() && !west.has_changed().unwrap());
        assert_eq!(index.snapshot("east").deployments[0].revision, "r2");
        index.apply(&deployment("a.west", "west", "r1"), false);
        assert!(west.has_changed().unwrap());
        assert!(index.names_chunk("west", "sha256-k"));
        assert!(!index.names_chunk("lab", "sha256-k"));
        east.borrow_and_update();
        west.borrow_and_update();

        // A full list again (a broken watch): only the cluster whose share differs wakes.
        index.replace_all(&[
            deployment("a.east", "east", "r2"),
            deployment("b.east", "east", "r1"),
            deployment("a.west", "west", "r1"),
        ]);
        assert!(east.has_changed().unwrap() && !west.has_changed().unwrap());
        let names: Vec<String> = (index.snapshot("east").deployments.into_iter())
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["a.east", "b.east"]);

        index.apply(&deployment("a.west", "west", "r1"), true);
        assert!(west.has_changed().unwrap());
        assert!(index.snapshot("west").deployments.is_empty());
    }

    #[tokio::test]
    async fn nothing_is_sent_before_the_first_list() {
        let index = Arc::new(Index::default());
        let mut stream = crate::delivery::follow::follow(index.clone(), "east".into());
        let first = tokio::time::timeout(
            Duration::from_millis(100),
            futures::StreamExt::next(&mut stream),
        )
        .await;
        assert!(first.is_err(), "an empty snapshot would prune every bundle");
        index.replace_all(&[deployment("a.east", "east", "r1")]);
        let first = futures::StreamExt::next(&mut stream)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.deployments.len(), 1);
    }
}
