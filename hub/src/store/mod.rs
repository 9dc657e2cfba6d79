//! The hub's state: kube-shaped objects (metadata, spec, status) with optimistic concurrency,
//! multi-object transactions and watches that resume from a resourceVersion without gaps.
//!
//! One interface, [`Store`]; SQLite ([`sqlite::SqliteStore`]) is the embedded backend. Every
//! write gets the store-wide revision that follows the last one, so the revision orders all
//! changes and a watcher can resume exactly where it stopped.

use std::{collections::BTreeMap, fmt, pin::Pin, sync::Arc};

use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod apply;
mod follow;
pub use follow::Following;
mod passes;
pub use passes::{SpecChanges, on_changes, on_changes_where};

/// Said of a write whose answer was lost on its way back from the store: it may have been
/// applied, or not.
pub const MAY_HAVE_BEEN_APPLIED: &str =
    "the change may have been applied: read it back before retrying";
mod read_once;
pub use read_once::ReadOnce;
pub mod etcd;
// Starts a real etcd on loopback: for the tests of this store and the HA tests, not the hub.
#[cfg(any(test, feature = "testing"))]
pub mod local_etcd;
pub mod sqlite;

pub use apply::new_uid;
pub use kubeshape::LabelSelector;

/// Identity and bookkeeping of an object, as Kubernetes shapes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    /// Set by the store at creation; never reused.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Set by the store at every write. Send it back on update to detect concurrent writers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// Incremented by the store whenever `spec` changes.
    #[serde(default)]
    pub generation: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339, UTC; set by the store.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub creation_timestamp: String,
    /// Set when deletion was asked for while finalizers remained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
    /// Controllers that must act before the object may go; deletion waits for none to remain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    /// The objects this one was created for, by uid (see `crate::refs`): set when it is
    /// created and never changed, so it cannot pass to a later object that reuses a name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
    /// Which client set which fields (Kubernetes' FieldsV1 entries), as server-side apply
    /// keeps them: what an applier owned and leaves out of its next apply is removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_fields: Vec<Value>,
}

/// One object another was created for, as Kubernetes' `ownerReferences` name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// An object of any kind, as stored. The API layer gives `spec` and `status` their types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Object {
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default)]
    pub status: Value,
}

impl Object {
    pub fn new(kind: &str, name: &str, spec: Value) -> Self {
        Self {
            kind: kind.to_owned(),
            metadata: ObjectMeta {
                name: name.to_owned(),
                ..ObjectMeta::default()
            },
            spec,
            status: Value::Null,
        }
    }

    /// The revision this object was last written at (0 if never stored).
    pub fn revision(&self) -> u64 {
        self.metadata.resource_version.parse().unwrap_or(0)
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, at the revision it was made at. A `Deleted` event carries the object as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: EventType,
    pub object: Object,
}

/// A stream of changes in revision order. It ends with `Err(Gone)` if the watcher fell so far
/// behind that changes were compacted away; the caller lists again and watches from there.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// One step of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Create(Object),
    /// Fails with `Conflict` if the object's resourceVersion is set and is not the current one.
    Update(Object),
    /// Deletes (or, with finalizers left, marks for deletion); with `Some(rv)`, only at that rv.
    Delete {
        kind: String,
        name: String,
        resource_version: Option<u64>,
    },
    /// Changes the object as the transaction reads it, so no other write can come between
    /// the read and the write and there is no conflict to retry (a status written by the hub
    /// itself). An object the change leaves as it was is not written: no new revision, no
    /// event. Fails with `NotFound` if there is no such object.
    Modify {
        kind: String,
        name: String,
        change: Modifier,
    },
}

impl Op {
    /// The kind and name of the object this op writes.
    pub fn key(&self) -> (&str, &str) {
        match self {
            Op::Create(o) | Op::Update(o) => (&o.kind, &o.metadata.name),
            Op::Delete { kind, name, .. } | Op::Modify { kind, name, .. } => (kind, name),
        }
    }
}

/// What an [`Op::Modify`] does to its object. A backend may run it more than once (etcd, when
/// another writer got there first), each time on the object as then stored.
#[derive(Clone)]
pub struct Modifier(pub Arc<dyn Fn(&mut Object) + Send + Sync>);

impl Modifier {
    pub fn new(change: impl Fn(&mut Object) + Send + Sync + 'static) -> Self {
        Self(Arc::new(change))
    }
}

impl fmt::Debug for Modifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Modifier(..)")
    }
}

/// Why a store operation failed. Messages say what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: String, name: String },
    #[error("{kind} {name:?} already exists; choose another name or update the existing one")]
    AlreadyExists { kind: String, name: String },
    #[error(
        "{kind} {name:?} was changed by someone else (you sent resourceVersion {sent}, it is now {current}); \
         get it again, reapply your change, and retry"
    )]
    Conflict {
        kind: String,
        name: String,
        sent: String,
        current: String,
    },
    #[error(
        "resourceVersion {requested} is too old (changes before {oldest} were compacted); list again and watch \
         from the list's resourceVersion"
    )]
    Gone { requested: u64, oldest: u64 },
    #[error("{0}")]
    Invalid(String),
    /// This hub replica wrote as the leader but no longer leads; nothing was written.
    #[error(
        "this hub replica no longer holds {0} (another replica leads now); nothing was written"
    )]
    Fenced(String),
    /// The disk holding the store is full; the write was rolled back.
    #[error("the disk holding the hub's store is full ({0}); nothing was written")]
    DiskFull(String),
    #[error("store failure: {0}")]
    Backend(String),
}

/// The hub's persistent state.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>>;

    /// Objects of `kind` whose labels match, by name, and the revision the list is current at.
    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>>;

    /// Applies every op or none; returns the objects as written (deleted ones as they were).
    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>>;

    /// Changes to objects of `kind` (every kind if `None`) after revision `from`. With `from`
    /// `None`, first an `Added` event for every current object, then the changes that follow.
    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>>;

    /// The latest revision.
    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Each of `names` of `kind` as stored now (`None`: no such object), in their order. A
    /// backend that can read many in one trip to its thread or server does.
    fn get_many(
        &self,
        kind: &str,
        names: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<Option<Object>>, StoreError>> {
        let kind = kind.to_owned();
        Box::pin(async move {
            let mut found = Vec::with_capacity(names.len());
            for name in &names {
                match self.get(&kind, name).await {
                    Ok(object) => found.push(Some(object)),
                    Err(StoreError::NotFound { .. }) => found.push(None),
                    Err(e) => return Err(e),
                }
            }
            Ok(found)
        })
    }

    /// The uid `kind`/`name` is stored with now (`None`: no such object). What a liveness
    /// check reads: a backend that can answer without the whole object (a host's facts) does.
    fn uid(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Option<String>, StoreError>> {
        let read = self.get(kind, name);
        Box::pin(async move {
            match read.await {
                Ok(object) => Ok(Some(object.metadata.uid)),
                Err(StoreError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// [`Store::uid`] of each (kind, name) of `keys`, in their order. A backend that can read
    /// them in one trip to its thread or server does: an agent's credential check reads two.
    fn uids(
        &self,
        keys: Vec<(String, String)>,
    ) -> BoxFuture<'_, Result<Vec<Option<String>>, StoreError>> {
        Box::pin(async move {
            let mut found = Vec::with_capacity(keys.len());
            for (kind, name) in &keys {
                found.push(self.uid(kind, name).await?);
            }
            Ok(found)
        })
    }
}

/// A boxed future, as the trait's methods return (the trait is used as `dyn Store`).
pub type BoxFuture<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Conveniences over [`Store::transact`].
impl dyn Store {
    pub async fn create(&self, object: Object) -> Result<Object, StoreError> {
        single(self.transact(vec![Op::Create(object)]).await)
    }

    pub async fn update(&self, object: Object) -> Result<Object, StoreError> {
        single(self.transact(vec![Op::Update(object)]).await)
    }

    pub async fn delete(
        &self,
        kind: &str,
        name: &str,
        resource_version: Option<u64>,
    ) -> Result<Object, StoreError> {
        single(
            self.transact(vec![Op::Delete {
                kind: kind.to_owned(),
                name: name.to_owned(),
                resource_version,
            }])
            .await,
        )
    }
}

fn single(result: Result<Vec<Object>, StoreError>) -> Result<Object, StoreError> {
    result?
        .pop()
        .ok_or_else(|| StoreError::Backend("a one-step transaction returned no object".into()))
}

/// Now, as RFC 3339 in UTC with second precision (as Kubernetes writes timestamps).
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

#[cfg(test)]
pub mod before_writes;
#[cfg(test)]
mod tests;
