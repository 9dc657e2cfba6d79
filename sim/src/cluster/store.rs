//! The simulated cluster's objects, in memory: one resourceVersion counter for everything (as
//! etcd's revision is for kube-apiserver), a bounded log of recent changes for watches to
//! resume from, and a broadcast of live changes.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// Changes kept for watches that resume from a resourceVersion.
const LOG_LEN: usize = 50_000;

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub(crate) type Key = (String, String);

/// A change to one object, at the resourceVersion it produced.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) revision: u64,
    /// The resource's store key (`pods`, `apps/deployments`).
    pub(crate) resource: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub(crate) kind: &'static str,
    pub(crate) object: Arc<Value>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    #[error("conflict: the object has been modified")]
    Conflict,
    #[error("too old resource version: {0} ({1})")]
    Gone(u64, u64),
}

#[derive(Debug, Default)]
struct Inner {
    objects: HashMap<String, BTreeMap<Key, Arc<Value>>>,
    revision: u64,
    log: VecDeque<Arc<Change>>,
}

#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    live: broadcast::Sender<Arc<Change>>,
    uid: std::sync::atomic::AtomicU64,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            live: broadcast::channel(16_384).0,
            uid: std::sync::atomic::AtomicU64::new(1),
        }
    }
}

pub(crate) fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

/// Where an object is kept: its namespace ("" for cluster-scoped) and name.
pub(crate) fn key_of(object: &Value) -> Key {
    (
        meta_str(object, "namespace").to_owned(),
        meta_str(object, "name").to_owned(),
    )
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_uid(&self) -> String {
        let n = self.uid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("5100a000-0000-4000-8000-{n:012x}")
    }

    pub(crate) fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Records a change and publishes it; `object` already carries its new resourceVersion.
    fn commit(&self, inner: &mut Inner, resource: &str, kind: &'static str, object: Arc<Value>) {
        let change = Arc::new(Change {
            revision: inner.revision,
            resource: resource.to_owned(),
            kind,
            object,
        });
        if inner.log.len() == LOG_LEN {
            inner.log.pop_front();
        }
        inner.log.push_back(change.clone());
        let _ = self.live.send(change);
    }

    pub(crate) fn get(&self, resource: &str, key: &Key) -> Option<Arc<Value>> {
        self.lock().objects.get(resource)?.get(key).cloned()
    }

    /// Objects of `resource` (in `namespace` if given), and the revision they are current at.
    pub(crate) fn list(&self, resource: &str, namespace: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        self.list_after(resource, namespace, None)
    }

    /// [`Store::list`] of the objects after `after` in key order (a chunked list's next
    /// chunk), found by the map's order rather than by reading every object's key.
    pub(crate) fn list_after(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<&Key>,
    ) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        if let Some(after) = after {
            // A key before the namespace asked for starts at the namespace.
            let from = match namespace {
                Some(ns) if after.0.as_str() < ns => {
                    std::ops::Bound::Included((ns.to_owned(), String::new()))
                }
                _ => std::ops::Bound::Excluded(after.clone()),
            };
            let items = match inner.objects.get(resource) {
                None => Vec::new(),
                Some(map) => map
                    .range((from, std::ops::Bound::Unbounded))
                    .take_while(|((n, _), _)| namespace.is_none_or(|ns| n == ns))
                    .map(|(_, v)| v.clone())
                    .collect(),
            };
            return (items, inner.revision);
        }
        let items = match inner.objects.get(resource) {
            None => Vec::new(),
            Some(map) => match namespace {
                Some(ns) => map
                    .range((ns.to_owned(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(_, v)| v.clone())
                    .collect(),
                None => map.values().cloned().collect(),
            },
        };
        (items, inner.revision)
    }

    /// Stores a new object, filling in what the server sets.
    pub(crate) fn create(
        &self,
        resource: &str,
        mut object: Value,
    ) -> Result<Arc<Value>, StoreError> {
        let key = key_of(&object);
        let uid = self.new_uid();
        let mut inner = self.lock();
        if inner
            .objects
            .get(resource)
            .is_some_and(|m| m.contains_key(&key))
        {
            return Err(StoreError::AlreadyExists);
        }
        inner.revision += 1;
        let meta = &mut object["metadata"];
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(inner.revision.to_string());
        meta["creationTimestamp"] = json!(now());
        meta["generation"] = json!(1);
        let object = Arc::new(object);
        inner
            .objects
            .entry(resource.to_owned())
            .or_default()
            .insert(key, object.clone());
        self.commit(&mut inner, resource, "ADDED", object.clone());
        Ok(object)
    }

    /// Replaces an object. With `expected` set, only if it is still at that resourceVersion.
    /// `change` gets the current object and returns the new one.
    pub(crate) fn update(
        &self,
        resource: &str,
        key: &Key,
        expected: Option<&str>,
        change: impl FnOnce(&Value) -> Value,
    ) -> Result<Arc<Value>, StoreError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(resource)
            .and_then(|m| m.get(key))
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if let Some(expected) = expected
            && !expected.is_empty()
            && expected != meta_str(&current, "resourceVersion")
        {
            return Err(StoreError::Conflict);
        }
        let mut object = change(&current);
        inner.revision += 1;
        // Identity is the server's.
        for field in ["uid", "creationTimestamp", "namespace", "name"] {
            object["metadata"][field] = current["metadata"][field].clone();
        }
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        let spec_changed = object.get("spec") != current.get("spec");
        object["metadata"]["generation"] = json!(generation + u64::from(spec_changed));
        object["metadata"]["resourceVersion"] = json!(inner.revision.to_string());
        let object = Arc::new(object);
        if let Some(map) = inner.objects.get_mut(resource) {
            map.insert(key.clone(), object.clone());
        }
        self.commit(&mut inner, resource, "MODIFIED", object.clone());
        Ok(object)
    }

    pub(crate) fn delete(&self, resource: &str, key: &Key) -> Result<Arc<Value>, StoreError> {
        let mut inner = self.lock();
        let removed = inner
            .objects
            .get_mut(resource)
            .and_then(|m| m.remove(key))
            .ok_or(StoreError::NotFound)?;
        inner.revision += 1;
        let mut object = (*removed).clone();
        object["metadata"]["resourceVersion"] = json!(inner.revision.to_string());
        let object = Arc::new(object);
        self.commit(&mut inner, resource, "DELETED", object.clone());
        Ok(object)
    }

    /// Deletes every namespaced object in `namespace` (the namespace's own deletion).
    pub(crate) fn delete_namespace_contents(&self, namespace: &str) {
        let keys: Vec<(String, Key)> = {
            let inner = self.lock();
            inner
                .objects
                .iter()
                .flat_map(|(r, m)| {
                    m.keys()
                        .filter(|(ns, _)| ns == namespace)
                        .map(move |k| (r.clone(), k.clone()))
                })
                .collect()
        };
        for (resource, key) in keys {
            let _ = self.delete(&resource, &key);
        }
    }

    /// Live changes, and the changes after `from` that already happened (`None`: none, the
    /// caller sends the current state itself). `Gone` if `from` is older than the log.
    #[allow(clippy::type_complexity)]
    pub(crate) fn watch(
        &self,
        from: Option<u64>,
    ) -> Result<(Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>, u64), StoreError> {
        let inner = self.lock();
        let live = self.live.subscribe();
        let replay = match from {
            None => Vec::new(),
            Some(from) => {
                let oldest = inner.log.front().map_or(inner.revision + 1, |c| c.revision);
                if from + 1 < oldest && from < inner.revision {
                    return Err(StoreError::Gone(from, oldest));
                }
                inner
                    .log
                    .iter()
                    .filter(|c| c.revision > from)
                    .cloned()
                    .collect()
            }
        };
        Ok((replay, live, inner.revision.max(from.unwrap_or(0))))
    }

    /// Every object and the revision, as JSON (what a datastore keeps across restarts).
    pub(crate) fn export(&self) -> Value {
        let inner = self.lock();
        let objects: serde_json::Map<String, Value> = inner
            .objects
            .iter()
            .map(|(resource, map)| {
                (
                    resource.clone(),
                    Value::Array(map.values().map(|v| (**v).clone()).collect()),
                )
            })
            .collect();
        json!({"revision": inner.revision, "objects": objects})
    }

    /// Loads what [`Store::export`] wrote, objects as they were (uids, resourceVersions).
    pub(crate) fn import(&self, state: &Value) {
        let mut inner = self.lock();
        inner.revision = inner.revision.max(state["revision"].as_u64().unwrap_or(0));
        let Some(objects) = state["objects"].as_object() else {
            return;
        };
        for (resource, items) in objects {
            for object in items.as_array().into_iter().flatten() {
                let key = key_of(object);
                inner
                    .objects
                    .entry(resource.clone())
                    .or_default()
                    .insert(key, Arc::new(object.clone()));
            }
        }
    }

    /// Loads objects in bulk at start (no change log, no events).
    pub(crate) fn seed(&self, resource: &str, objects: impl IntoIterator<Item = Value>) {
        let mut inner = self.lock();
        for mut object in objects {
            inner.revision += 1;
            let key = key_of(&object);
            let meta = &mut object["metadata"];
            meta["uid"] = json!(self.new_uid());
            meta["resourceVersion"] = json!(inner.revision.to_string());
            meta["creationTimestamp"] = json!(now());
            meta["generation"] = json!(1);
            inner
                .objects
                .entry(resource.to_owned())
                .or_default()
                .insert(key, Arc::new(object));
        }
    }
}
