//! Which clusters' access may have changed, from one watch of the store shared by every
//! agent's access stream. Each stream used to watch the whole store itself: every change of
//! any object (a bundle deployment's report, a cluster's facts every half minute) was copied
//! to every connected agent and dropped there, so 1,000 agents cost 1,000 copies of each
//! change (`bench delivery` at 1,000 clusters spent most of the hub's CPU on them).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    model::Kind,
    store::{Object, Store},
};

/// The kinds whose every change can change any cluster's access: role bindings, projects and
/// their secrets, users (their groups, or disabled, for the authorized endpoint), templates.
fn everyones(kind: &str) -> bool {
    [
        Kind::RoleBinding,
        Kind::Project,
        Kind::ProjectSecret,
        Kind::User,
        Kind::RoleTemplate,
        Kind::GlobalRole,
    ]
    .iter()
    .any(|k| k.name() == kind)
}

#[derive(Debug)]
struct Cluster {
    /// Its `spec.authorizedEndpoint` as last seen: its status changes every half minute
    /// (facts), which must not cost a snapshot each time.
    endpoint: Option<Value>,
    changed: watch::Sender<u64>,
}

/// Counters bumped when access may have changed: one for every cluster, one per cluster.
#[derive(Debug)]
pub struct Changes {
    everyone: watch::Sender<u64>,
    clusters: Mutex<HashMap<String, Cluster>>,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            everyone: watch::Sender::new(0),
            clusters: Mutex::default(),
        }
    }
}

/// What a stream waits on: any change for every cluster, or one for its own.
#[derive(Debug)]
pub struct Subscription {
    everyone: watch::Receiver<u64>,
    mine: watch::Receiver<u64>,
}

impl Subscription {
    /// Marks everything so far as seen: a snapshot read after this includes it.
    pub fn seen(&mut self) {
        self.everyone.borrow_and_update();
        self.mine.borrow_and_update();
    }

    /// Waits for the next change (at once if one came since [`Self::seen`]); `None` once the
    /// hub is stopping.
    pub async fn changed(&mut self) -> Option<()> {
        tokio::select! {
            r = self.everyone.changed() => r.ok(),
            r = self.mine.changed() => r.ok(),
        }
    }
}

fn bump(sender: &watch::Sender<u64>) {
    sender.send_modify(|n| *n += 1);
}

impl Changes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Cluster>> {
        // A panic elsewhere while holding it leaves a map that is still whole.
        self.clusters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cluster<'a>(clusters: &'a mut HashMap<String, Cluster>, name: &str) -> &'a mut Cluster {
        clusters.entry(name.to_owned()).or_insert_with(|| Cluster {
            endpoint: None,
            changed: watch::Sender::new(0),
        })
    }

    pub fn subscribe(&self, cluster: &str) -> Subscription {
        let mut clusters = self.lock();
        Subscription {
            everyone: self.everyone.subscribe(),
            mine: Self::cluster(&mut clusters, cluster).changed.subscribe(),
        }
    }

    /// Takes in one change of the store, waking the streams it can concern.
    pub fn take(&self, object: &Object) {
        let kind = object.kind.as_str();
        if everyones(kind) {
            bump(&self.everyone);
            return;
        }
        // Locked only for what can concern one cluster: a bundle's report, the commonest
        // change, passes without it.
        if kind == Kind::Cluster.name() {
            let now = object.spec.get("authorizedEndpoint").cloned();
            let mut clusters = self.lock();
            let entry = Self::cluster(&mut clusters, &object.metadata.name);
            if std::mem::replace(&mut entry.endpoint, now.clone()) != now {
                bump(&entry.changed);
            }
        } else if kind == Kind::Token.name()
            // A token made for a cluster opens its authorized endpoint; logins and agents' do
            // not.
            && let Some(cluster) = object.spec.get("cluster").and_then(Value::as_str)
        {
            bump(&Self::cluster(&mut self.lock(), cluster).changed);
        }
    }

    /// Changes may have been missed (the watch broke): every stream looks again.
    fn missed(&self) {
        bump(&self.everyone);
    }

    /// Follows the store until `stop`; a broken watch is started again, and every stream told
    /// to look again.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, stop: CancellationToken) {
        let mut following = crate::store::Following::new("clusters' access (for their agents)");
        loop {
            let started = async {
                let revision = store.revision().await?;
                let changes = store.watch(None, Some(revision)).await?;
                Ok::<_, crate::store::StoreError>((revision, changes))
            };
            let (revision, mut changes) = tokio::select! {
                () = stop.cancelled() => return,
                started = started => match started {
                    Ok(started) => started,
                    Err(e) => {
                        following.broke(Some(&e));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
            };
            following.resumed(revision);
            self.missed();
            if following
                .drain(&mut changes, &stop, |event| self.take(&event.object))
                .await
            {
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

    fn woken(s: &mut Subscription) -> bool {
        let woke = s.everyone.has_changed().unwrap() || s.mine.has_changed().unwrap();
        s.seen();
        woke
    }

    #[test]
    fn a_change_wakes_only_the_clusters_whose_access_it_can_change() {
        let changes = Changes::default();
        let mut east = changes.subscribe("east");
        let mut west = changes.subscribe("west");
        let cluster = |name: &str, endpoint: bool, nodes: u32| {
            let mut c = Object::new(
                Kind::Cluster.name(),
                name,
                json!({"type": "imported", "authorizedEndpoint": {"enabled": endpoint}}),
            );
            c.status = json!({"nodes": nodes});
            c
        };
        // The first sight of a cluster, then its facts alone: only the first wakes it.
        changes.take(&cluster("east", false, 1));
        assert!(woken(&mut east) && !woken(&mut west));
        changes.take(&cluster("east", false, 2));
        assert!(!woken(&mut east));
        changes.take(&cluster("east", true, 2));
        assert!(woken(&mut east) && !woken(&mut west));

        // A token for west's endpoint wakes west; a login's token wakes no one.
        let token = |spec| Object::new(Kind::Token.name(), "t", spec);
        changes.take(&token(json!({"user": "ann", "cluster": "west"})));
        assert!(woken(&mut west) && !woken(&mut east));
        changes.take(&token(json!({"user": "ann"})));
        assert!(!woken(&mut west) && !woken(&mut east));

        // A role binding can change anyone's; a bundle deployment no one's.
        changes.take(&Object::new(Kind::RoleBinding.name(), "b", json!({})));
        assert!(woken(&mut east) && woken(&mut west));
        changes.take(&Object::new(
            Kind::BundleDeployment.name(),
            "a.east",
            json!({}),
        ));
        assert!(!woken(&mut east) && !woken(&mut west));
    }
}
