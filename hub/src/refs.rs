//! References between objects, by uid. A spec names other objects by name (a binding's
//! cluster, a token's user, a host's cluster); names are reused once an object is deleted, so
//! the hub also records, when it creates an object, the uid of each object its spec names
//! (`metadata.ownerReferences`, never changed afterwards). An object is *live* only while every
//! object it names still exists as that very object: a role binding, credential, token or
//! project left behind by a deleted cluster, user or project grants nothing to a new one that
//! merely has the same name. The leader's collector then deletes what is no longer live, as
//! Kubernetes' garbage collector deletes dependents.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{
    model::Kind,
    store::{EventType, LabelSelector, Object, Op, OwnerReference, Store, StoreError},
};

/// The kinds whose specs name other objects.
pub const DEPENDENT: [Kind; 10] = [
    Kind::Host,
    Kind::RegistrationToken,
    Kind::Token,
    Kind::RoleBinding,
    Kind::Project,
    Kind::ProjectSecret,
    Kind::Plan,
    Kind::EtcdSnapshot,
    Kind::Machine,
    Kind::BundleDeployment,
];

/// One object a spec names: the field that names it, its kind and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Referent {
    pub field: &'static str,
    pub kind: Kind,
    pub name: String,
}

/// The objects an object of `kind` with `spec` names.
pub fn referents(kind: Kind, spec: &Value) -> Vec<Referent> {
    let text = |pointer: &str| spec.pointer(pointer).and_then(Value::as_str);
    let mut named = Vec::new();
    let mut add = |field: &'static str, kind: Kind, name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            named.push(Referent {
                field,
                kind,
                name: name.to_owned(),
            });
        }
    };
    match kind {
        Kind::Host
        | Kind::RegistrationToken
        | Kind::Project
        | Kind::EtcdSnapshot
        | Kind::Machine => {
            add("spec.cluster", Kind::Cluster, text("/cluster"));
        }
        Kind::Token => {
            add("spec.user", Kind::User, text("/user"));
            add("spec.cluster", Kind::Cluster, text("/cluster"));
            add("spec.agent.cluster", Kind::Cluster, text("/agent/cluster"));
            // A system-agent's credential is its host's.
            let host = text("/agent/id").and_then(|id| id.strip_prefix("host/"));
            add("spec.agent.id", Kind::Host, host);
        }
        Kind::RoleBinding => {
            add("spec.cluster", Kind::Cluster, text("/cluster"));
            add("spec.project", Kind::Project, text("/project"));
            add("spec.user", Kind::User, text("/user"));
        }
        Kind::ProjectSecret => {
            add("spec.cluster", Kind::Cluster, text("/cluster"));
            add("spec.project", Kind::Project, text("/project"));
        }
        Kind::Plan => {
            add("spec.cluster", Kind::Cluster, text("/cluster"));
            add("spec.host", Kind::Host, text("/host"));
        }
        // What a cluster was given of a bundle goes with either.
        Kind::BundleDeployment => {
            add("spec.bundle", Kind::Bundle, text("/bundle"));
            add("spec.cluster", Kind::Cluster, text("/cluster"));
        }
        // A template names its credential, which cannot go while a template names it (see
        // the API's delete), rather than taking the template with it.
        Kind::Cluster
        | Kind::User
        | Kind::Setting
        | Kind::AuthProvider
        | Kind::CloudCredential
        | Kind::MachineTemplate
        | Kind::RoleTemplate
        | Kind::GlobalRole
        | Kind::ClusterGroup
        | Kind::Bundle
        | Kind::GitRepo => {}
    }
    named
}

/// Why an object's references could not be recorded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RefError {
    #[error("{field}: {kind} {name:?} does not exist; create it first")]
    Missing {
        field: &'static str,
        kind: &'static str,
        name: String,
    },
    #[error("{field}: {kind} {name:?} is being deleted; nothing new can be made for it")]
    Deleting {
        field: &'static str,
        kind: &'static str,
        name: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The reference to `referent`, for an object created for it.
pub fn to(referent: &Object) -> OwnerReference {
    OwnerReference {
        kind: referent.kind.clone(),
        name: referent.metadata.name.clone(),
        uid: referent.metadata.uid.clone(),
    }
}

/// Records on `object` (about to be created) the uid of each object its spec names, as they
/// are now. Referents created in the same transaction are given with `beside` (made with
/// [`stamp_all`]).
pub async fn stamp(
    store: &dyn Store,
    object: &mut Object,
    beside: &[&Object],
) -> Result<(), RefError> {
    let Some(kind) = Kind::from_name(&object.kind) else {
        return Ok(());
    };
    let mut refs = Vec::new();
    for r in referents(kind, &object.spec) {
        let found = beside
            .iter()
            .find(|o| o.kind == r.kind.name() && o.metadata.name == r.name)
            .map(|o| (*o).clone());
        let referent = match found {
            Some(o) => o,
            None => match store.get(r.kind.name(), &r.name).await {
                Ok(o) => o,
                Err(StoreError::NotFound { .. }) => {
                    return Err(RefError::Missing {
                        field: r.field,
                        kind: r.kind.name(),
                        name: r.name,
                    });
                }
                Err(e) => return Err(e.into()),
            },
        };
        if referent.metadata.deletion_timestamp.is_some() {
            return Err(RefError::Deleting {
                field: r.field,
                kind: r.kind.name(),
                name: r.name,
            });
        }
        refs.push(to(&referent));
    }
    object.metadata.owner_references = refs;
    Ok(())
}

/// Prepares the creations among `ops` for one transaction: each gets its uid now, and each
/// records the uids of what it names, from the objects created beside it or the store.
/// Every place that creates objects passes its ops through here.
pub async fn stamp_all(store: &dyn Store, ops: &mut [Op]) -> Result<(), StoreError> {
    for op in ops.iter_mut() {
        if let Op::Create(o) = op
            && o.metadata.uid.is_empty()
        {
            o.metadata.uid = crate::store::new_uid();
        }
    }
    let created: Vec<Object> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Create(o) => Some(o.clone()),
            _ => None,
        })
        .collect();
    let beside: Vec<&Object> = created.iter().collect();
    for op in ops.iter_mut() {
        if let Op::Create(o) = op
            && o.metadata.owner_references.is_empty()
        {
            stamp(store, o, &beside).await.map_err(StoreError::from)?;
        }
    }
    Ok(())
}

impl From<RefError> for StoreError {
    fn from(e: RefError) -> Self {
        match e {
            RefError::Store(e) => e,
            other => StoreError::Invalid(other.to_string()),
        }
    }
}

/// Creates `object`, recording what it names (see [`stamp_all`]).
pub async fn create(store: &dyn Store, object: Object) -> Result<Object, StoreError> {
    let mut ops = vec![Op::Create(object)];
    stamp_all(store, &mut ops).await?;
    store
        .transact(ops)
        .await?
        .pop()
        .ok_or_else(|| StoreError::Backend("a creation returned no object".into()))
}

/// Answers "is this object live?" (see the module's comment), reading each referent once.
#[derive(Debug)]
pub struct Liveness<'a> {
    store: &'a dyn Store,
    /// (kind, name) → the uid stored now (`None`: no such object).
    uids: HashMap<(Kind, String), Option<String>>,
}

impl<'a> Liveness<'a> {
    pub fn new(store: &'a dyn Store) -> Self {
        Self {
            store,
            uids: HashMap::new(),
        }
    }

    /// Takes what a list already read as the current objects of their kind.
    pub fn knowing(mut self, kind: Kind, objects: &[Object]) -> Self {
        self.know(kind, objects);
        self
    }

    /// As [`Liveness::knowing`], in place.
    pub fn know(&mut self, kind: Kind, objects: &[Object]) {
        for o in objects {
            self.uids.insert(
                (kind, o.metadata.name.clone()),
                Some(o.metadata.uid.clone()),
            );
        }
    }

    /// Whether every object `object`'s spec names exists as the object it was created for.
    pub async fn live(&mut self, object: &Object) -> Result<bool, StoreError> {
        let Some(kind) = Kind::from_name(&object.kind) else {
            return Ok(true);
        };
        let mut checks = Vec::new();
        for r in referents(kind, &object.spec) {
            let recorded = object
                .metadata
                .owner_references
                .iter()
                .find(|o| o.kind == r.kind.name() && o.name == r.name);
            let Some(recorded) = recorded else {
                return Ok(false);
            };
            checks.push(((r.kind, r.name), recorded.uid.as_str()));
        }
        // What is not known yet is read in one trip (an agent's credential names two).
        let unread: Vec<(Kind, String)> = checks
            .iter()
            .map(|(key, _)| key)
            .filter(|key| !self.uids.contains_key(*key))
            .cloned()
            .collect();
        if !unread.is_empty() {
            let keys = unread
                .iter()
                .map(|(kind, name)| (kind.name().to_owned(), name.clone()))
                .collect();
            let found = self.store.uids(keys).await?;
            self.uids.extend(unread.into_iter().zip(found));
        }
        Ok(checks.iter().all(|(key, recorded)| {
            self.uids.get(key).and_then(Option::as_deref) == Some(*recorded)
        }))
    }

    /// The objects of `objects` that are live.
    pub async fn keep_live(&mut self, objects: Vec<Object>) -> Result<Vec<Object>, StoreError> {
        let mut kept = Vec::with_capacity(objects.len());
        for o in objects {
            if self.live(&o).await? {
                kept.push(o);
            }
        }
        Ok(kept)
    }
}

/// Objects stored before references existed get them once, from what their names point to
/// now (the hub's start, before it serves). What names nothing that exists is left without,
/// so it is not live and the collector removes it.
pub async fn backfill(store: &dyn Store) -> Result<usize, StoreError> {
    let mut filled = 0;
    for kind in DEPENDENT {
        let (objects, _) = store
            .list(kind.name(), &LabelSelector::everything())
            .await?;
        for mut object in objects {
            if !object.metadata.owner_references.is_empty()
                || referents(kind, &object.spec).is_empty()
            {
                continue;
            }
            match stamp(store, &mut object, &[]).await {
                Ok(()) => {}
                Err(RefError::Store(e)) => return Err(e),
                Err(_) => continue,
            }
            match store.update(object).await {
                Ok(_) => filled += 1,
                // Changed or gone meanwhile: the next start looks again.
                Err(StoreError::Conflict { .. } | StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if filled > 0 {
        tracing::info!(
            objects = filled,
            "recorded the uids of the objects older objects name"
        );
    }
    Ok(filled)
}

/// Finalizers that guard something outside the hub, which the collector must not clear.
const GUARDS_OUTSIDE: &[&str] = &[
    crate::model::MACHINE_FINALIZER,
    crate::model::HOSTED_FINALIZER,
];

/// Deletes every object that is no longer live (its finalizers too: what they waited for went
/// with the object it named), except that an object whose finalizer guards something outside
/// the hub only has its deletion asked for. Returns how many went.
pub async fn collect(store: &dyn Store) -> Result<usize, StoreError> {
    let everything = LabelSelector::everything();
    // What objects name, read once by list rather than once per dependent (a fleet's
    // credentials and plans all name hosts).
    let mut liveness = Liveness::new(store);
    for kind in [Kind::Cluster, Kind::User, Kind::Project] {
        liveness.know(kind, &store.list(kind.name(), &everything).await?.0);
    }
    let mut gone = 0;
    for kind in DEPENDENT {
        let (objects, _) = store.list(kind.name(), &everything).await?;
        if kind == Kind::Host {
            liveness.know(kind, &objects);
        }
        for object in objects {
            // The lists above may be a moment old: what looks dead is read afresh before it
            // goes, and deleted only as read.
            if liveness.live(&object).await? || Liveness::new(store).live(&object).await? {
                continue;
            }
            let mut ops = Vec::new();
            let finalized = !object.metadata.finalizers.is_empty();
            let guarded = object
                .metadata
                .finalizers
                .iter()
                .any(|f| GUARDS_OUTSIDE.contains(&f.as_str()));
            if guarded {
                // Its controller releases what it guards (a cloud's machine), then lets it go:
                // only its deletion is asked for here.
                if object.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                ops.push(Op::Delete {
                    kind: kind.name().into(),
                    name: object.metadata.name.clone(),
                    resource_version: None,
                });
            } else {
                if finalized {
                    let mut cleared = object.clone();
                    cleared.metadata.finalizers.clear();
                    ops.push(Op::Update(cleared));
                }
                // Clearing the last finalizer of an object being deleted completes its
                // deletion.
                if !(finalized && object.metadata.deletion_timestamp.is_some()) {
                    ops.push(Op::Delete {
                        kind: kind.name().into(),
                        name: object.metadata.name.clone(),
                        resource_version: (!finalized).then(|| object.revision()),
                    });
                }
            }
            match store.transact(ops).await {
                Ok(_) => {
                    gone += 1;
                    tracing::info!(kind = kind.name(), name = %object.metadata.name, "removed: an object it was made for is gone");
                }
                Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(gone)
}

/// The collector: a pass at start, after every deletion of an object others may name, and
/// every ten minutes (a pass lists every dependent: too much to do often on a large fleet),
/// until `shutdown`. Runs on the leading replica.
pub async fn run_collector(store: Arc<dyn Store>, shutdown: CancellationToken) {
    let mut following = crate::store::Following::new("the collector of objects left behind");
    loop {
        let watched = match store.revision().await {
            Ok(from) => {
                if let Err(e) = collect(store.as_ref()).await {
                    tracing::warn!(error = %e, "collecting objects left behind failed; retrying");
                }
                store.watch(None, Some(from)).await.map(|w| (w, from))
            }
            Err(e) => Err(e),
        };
        let mut changes = match watched {
            Ok((changes, from)) => {
                following.resumed(from);
                changes
            }
            Err(e) => {
                following.broke(Some(&e));
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let due = tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(600)) => true,
                change = changes.next() => match change {
                    Some(Ok(e)) => e.kind == EventType::Deleted
                        && matches!(e.object.kind.as_str(), "Cluster" | "User" | "Project" | "Host"),
                    end => {
                        following.broke(end.and_then(Result::err).as_ref());
                        break;
                    }
                },
            };
            if due && let Err(e) = collect(store.as_ref()).await {
                tracing::warn!(error = %e, "collecting objects left behind failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests;
