//! What checking a request needs from the store — the caller's token, user and role bindings,
//! and the cluster a proxied request addresses — kept in memory between requests: reading it
//! again for every proxied Kubernetes request would cost more than the request itself.
//!
//! The roles are still checked on every request; only the reads are saved. Everything kept is
//! forgotten the moment the store reports a change to any Token, User, RoleBinding or Cluster
//! (a store watch), so a revoked token, a disabled user or a removed binding stops working as
//! soon as the store has it. A kept token is also dropped at its expiry. While the watch is
//! not running, nothing is answered from memory.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{AuthError, Principal, principal_until, secret};
use crate::{
    model::Kind,
    store::{BoxFuture, LabelSelector, Object, Op, Store, StoreError, WatchStream},
};

/// Past this many entries a map is emptied rather than grown (a flood of distinct tokens).
const MAX_ENTRIES: usize = 10_000;

/// The kinds whose changes can change who a caller is or what they may reach.
const WATCHED: [Kind; 5] = [
    Kind::Token,
    Kind::User,
    Kind::RoleBinding,
    Kind::Cluster,
    Kind::Project,
];

struct Entry<T> {
    /// The generation current when the store was read for it.
    generation: u64,
    value: T,
    expires: Option<OffsetDateTime>,
}

/// The in-memory copy; see the module's comment. Shared (`Arc`) by the API and the proxy.
#[derive(Default)]
pub struct Known {
    /// Bumped by every relevant change; entries of older generations are not used.
    generation: AtomicU64,
    watching: AtomicBool,
    /// By sha256 of the credential presented (the credential itself is never kept).
    principals: Mutex<HashMap<String, Entry<Arc<Principal>>>>,
    clusters: Mutex<HashMap<String, Entry<Arc<Object>>>>,
}

impl std::fmt::Debug for Known {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Known")
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .field("watching", &self.watching.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A map is valid whatever a panicking holder was doing.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Known {
    /// Who presents `credential` (an API or session token), shared rather than copied: the
    /// proxy's hot path only reads it, and a copy of every rule a caller holds would cost more
    /// than the rest of the check.
    pub async fn shared(
        &self,
        store: &dyn Store,
        credential: &str,
    ) -> Result<Arc<Principal>, AuthError> {
        let key = secret::token_hash(credential);
        let generation = self.generation.load(Ordering::SeqCst);
        if let Some(hit) = self.lookup(&self.principals, &key, generation) {
            return Ok(hit);
        }
        let (principal, expires) = principal_until(store, credential).await?;
        let principal = Arc::new(principal);
        self.keep(
            &self.principals,
            key,
            generation,
            principal.clone(),
            expires,
        );
        Ok(principal)
    }

    /// Cluster `name` as the store has it (shared: proxied requests only read it).
    pub async fn cluster(&self, store: &dyn Store, name: &str) -> Result<Arc<Object>, StoreError> {
        let generation = self.generation.load(Ordering::SeqCst);
        if let Some(hit) = self.lookup(&self.clusters, name, generation) {
            return Ok(hit);
        }
        let object = Arc::new(store.get(Kind::Cluster.name(), name).await?);
        self.keep(
            &self.clusters,
            name.to_owned(),
            generation,
            object.clone(),
            None,
        );
        Ok(object)
    }

    fn lookup<T: Clone>(
        &self,
        map: &Mutex<HashMap<String, Entry<T>>>,
        key: &str,
        generation: u64,
    ) -> Option<T> {
        if !self.watching.load(Ordering::SeqCst) {
            return None;
        }
        let map = lock(map);
        let entry = map.get(key)?;
        let fresh = entry.generation == generation
            && entry.expires.is_none_or(|t| t > OffsetDateTime::now_utc());
        fresh.then(|| entry.value.clone())
    }

    fn keep<T>(
        &self,
        map: &Mutex<HashMap<String, Entry<T>>>,
        key: String,
        generation: u64,
        value: T,
        expires: Option<OffsetDateTime>,
    ) {
        // Read under an older generation, or while nothing is watching: not worth keeping.
        if !self.watching.load(Ordering::SeqCst)
            || self.generation.load(Ordering::SeqCst) != generation
        {
            return;
        }
        let mut map = lock(map);
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert(
            key,
            Entry {
                generation,
                value,
                expires,
            },
        );
    }

    /// Whether the store's changes are being followed (and so answers may come from memory).
    pub fn following(&self) -> bool {
        self.watching.load(Ordering::SeqCst)
    }

    /// Drops everything kept.
    fn forget(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        lock(&self.principals).clear();
        lock(&self.clusters).clear();
    }

    /// Follows the store's changes until `shutdown`, forgetting on each relevant one.
    pub async fn follow(self: Arc<Self>, store: Arc<dyn Store>, shutdown: CancellationToken) {
        let mut following = crate::store::Following::new("the sign-in cache");
        loop {
            self.watching.store(false, Ordering::SeqCst);
            self.forget();
            let (watch, revision) = match store.revision().await {
                Ok(revision) => (store.watch(None, Some(revision)).await, revision),
                Err(e) => (Err(e), 0),
            };
            let mut watch = match watch {
                Ok(watch) => watch,
                Err(e) => {
                    following.broke(Some(&e));
                    tracing::warn!(error = %e, "cannot watch the store; authenticating from it directly");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            // Anything read before the watch began belongs to an older generation.
            self.forget();
            self.watching.store(true, Ordering::SeqCst);
            following.resumed(revision);
            loop {
                let event = tokio::select! {
                    () = shutdown.cancelled() => {
                        self.watching.store(false, Ordering::SeqCst);
                        return;
                    }
                    event = watch.next() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        if WATCHED.iter().any(|k| k.name() == event.object.kind) {
                            self.forget();
                        }
                    }
                    // Fell behind or the store hiccuped: start over.
                    end => {
                        following.broke(end.and_then(Result::err).as_ref());
                        break;
                    }
                }
            }
        }
    }
}

/// The store, telling [`Known`] of this hub's own writes the moment they commit, so that a
/// token revoked through this hub fails on the very next request (the watch, which also sees
/// other hubs' writes, may be a moment behind).
#[derive(Debug)]
pub struct Tracked {
    inner: Arc<dyn Store>,
    known: Arc<Known>,
}

impl Tracked {
    pub fn new(inner: Arc<dyn Store>, known: Arc<Known>) -> Self {
        Self { inner, known }
    }
}

impl Store for Tracked {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        self.inner.get(kind, name)
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        self.inner.list(kind, selector)
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        let relevant = ops.iter().any(|op| {
            let (kind, _) = op.key();
            WATCHED.iter().any(|k| k.name() == kind)
        });
        Box::pin(async move {
            let result = self.inner.transact(ops).await;
            if relevant {
                self.known.forget();
            }
            result
        })
    }

    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>> {
        self.inner.watch(kind, from)
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.revision()
    }

    fn get_many(
        &self,
        kind: &str,
        names: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<Option<Object>>, StoreError>> {
        self.inner.get_many(kind, names)
    }

    fn uid(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Option<String>, StoreError>> {
        self.inner.uid(kind, name)
    }

    fn uids(
        &self,
        keys: Vec<(String, String)>,
    ) -> BoxFuture<'_, Result<Vec<Option<String>>, StoreError>> {
        self.inner.uids(keys)
    }
}
