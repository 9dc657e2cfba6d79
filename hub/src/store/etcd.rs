//! The HA store: objects in etcd, so several hub replicas share one state
//! (`--store etcd://HOST:2379[,HOST:2379…][/PREFIX]`).
//!
//! Each object is one key, `PREFIX/objects/<kind>/<name>`, its JSON body without the
//! resourceVersion: that is the key's etcd mod_revision, so a transaction's writes share the
//! revision etcd gives the transaction, as in the SQLite store. A transaction reads the objects
//! it names, decides the writes with the same rules as every backend ([`super::apply`]), and
//! commits them in one etcd Txn guarded by each read key's mod_revision; if another writer got
//! there first, it reads again and retries. Watches are etcd watches on the kind's prefix.
//! History older than the retained revisions is compacted by the writer that crosses a step,
//! and the compacted revision kept under `PREFIX/meta/compacted` so a watch from before it
//! fails at once with `Gone`.

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use proto::etcd::{KeyValue, RangeRequest, RequestOp, TxnRequest, request_op, response_op};

use super::{BoxFuture, LabelSelector, Object, Op, Store, StoreError, WatchStream, apply::Key};

/// Where the revision history was last compacted to is kept, under the prefix.
const COMPACTED: &str = "meta/compacted";

/// etcd's default `--max-txn-ops`: a transaction may touch at most this many objects.
const MAX_TXN_OPS: usize = 128;

/// How often a transaction reads again and retries when other writers keep getting there first.
const MAX_ATTEMPTS: usize = 64;

/// Responses as large as a big list (the default gRPC limit of 4 MiB is a few thousand objects).
const MAX_MESSAGE: usize = 256 << 20;

/// The etcd store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    members: members::Members,
    /// `PREFIX`, e.g. `/drover`.
    prefix: String,
    retain: u64,
    /// The compaction step last acted on, so one writer compacts once per step.
    compaction_step: AtomicU64,
    /// The endpoints, for messages.
    endpoints: String,
}

fn backend(e: tonic::Status) -> StoreError {
    let message = e.message();
    let hint = if message.contains("too many operations") {
        "; a transaction touched more objects than etcd's --max-txn-ops allows: raise it"
    } else if message.contains("request is too large") {
        "; an object is larger than etcd's --max-request-bytes allows: raise it"
    } else {
        ""
    };
    StoreError::Backend(format!("etcd: {message}{hint}"))
}

fn range_end(prefix: &str) -> Vec<u8> {
    // Every prefix here ends in '/', so adding one to its last byte never overflows.
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

fn decode(kv: &KeyValue) -> Result<Object, StoreError> {
    let mut object: Object = serde_json::from_slice(&kv.value).map_err(|e| {
        StoreError::Backend(format!(
            "unreadable object at {} in etcd: {e}",
            String::from_utf8_lossy(&kv.key)
        ))
    })?;
    object.metadata.resource_version = kv.mod_revision.to_string();
    Ok(object)
}

fn encode(object: &Object) -> Result<Vec<u8>, StoreError> {
    // The resourceVersion is the key's mod_revision; storing it would only let the two disagree.
    let mut object = object.clone();
    object.metadata.resource_version.clear();
    serde_json::to_vec(&object).map_err(|e| StoreError::Backend(e.to_string()))
}

fn revision_of(header: Option<&proto::etcd::ResponseHeader>) -> u64 {
    header.map_or(0, |h| h.revision.max(0) as u64)
}

impl EtcdStore {
    /// Connects to the etcd cluster `url` names and checks that it answers.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with_retention(url, super::sqlite::DEFAULT_RETAIN).await
    }

    /// As [`EtcdStore::connect`], keeping `retain` revisions of history for watches.
    pub async fn connect_with_retention(url: &str, retain: u64) -> Result<Self, StoreError> {
        let url = EtcdUrl::parse(url).map_err(StoreError::Invalid)?;
        let store = Self {
            inner: Arc::new(Inner {
                members: members::Members::new(&url.endpoints)?,
                prefix: url.prefix.clone(),
                retain: retain.max(1),
                compaction_step: AtomicU64::new(0),
                endpoints: url.endpoints.join(","),
            }),
        };
        // Members are checked in the background for as long as the store is in use, and the
        // cluster's member list read at once and every 15 checks (about 30 s).
        let inner = Arc::downgrade(&store.inner);
        let probe = store.meta_key("health").into_bytes();
        tokio::spawn(async move {
            for round in 0_u64.. {
                let Some(live) = inner.upgrade() else {
                    return;
                };
                if round % 15 == 0 {
                    live.members.learn().await;
                }
                drop(live);
                tokio::time::sleep(members::HEALTH_EVERY).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                inner.members.check(&probe).await;
            }
        });
        // The channel connects lazily; a hub that cannot reach its store says so at start.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout(Duration::from_secs(3), store.current_revision()).await {
                Ok(Ok(_)) => return Ok(store),
                Ok(Err(e)) if Instant::now() > deadline => {
                    return Err(StoreError::Backend(format!(
                        "cannot reach etcd at {}: {e}; is etcd running there?",
                        store.inner.endpoints
                    )));
                }
                Err(_) if Instant::now() > deadline => {
                    return Err(StoreError::Backend(format!(
                        "etcd at {} did not answer within 10 s; is etcd running there?",
                        store.inner.endpoints
                    )));
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn key(&self, kind: &str, name: &str) -> Vec<u8> {
        format!("{}/objects/{kind}/{name}", self.inner.prefix).into_bytes()
    }

    fn prefix(&self, kind: Option<&str>) -> String {
        match kind {
            Some(kind) => format!("{}/objects/{kind}/", self.inner.prefix),
            None => format!("{}/objects/", self.inner.prefix),
        }
    }

    fn kv(&self) -> members::Kv<'_> {
        self.inner.members.kv()
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        let prefix = self.prefix(None);
        let response = self
            .kv()
            .range(RangeRequest {
                range_end: range_end(&prefix),
                key: prefix.into_bytes(),
                count_only: true,
                ..RangeRequest::default()
            })
            .await
            .map_err(backend)?
            .into_inner();
        Ok(revision_of(response.header.as_ref()))
    }

    /// Every key under `prefix` (ending in '/').
    async fn range_prefix(&self, prefix: &str) -> Result<proto::etcd::RangeResponse, StoreError> {
        Ok(self
            .kv()
            .range(RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: range_end(prefix),
                ..RangeRequest::default()
            })
            .await
            .map_err(backend)?
            .into_inner())
    }

    /// Every object under `prefix`, by key, and the revision the read is current at.
    async fn range(&self, prefix: &str) -> Result<(Vec<Object>, u64), StoreError> {
        let response = self.range_prefix(prefix).await?;
        let objects = response.kvs.iter().map(decode).collect::<Result<_, _>>()?;
        Ok((objects, revision_of(response.header.as_ref())))
    }

    /// The objects `keys` name as they are now (each read is at one revision; the commit's
    /// guards make the whole transaction see one state).
    async fn read(&self, keys: &[Key]) -> Result<BTreeMap<Key, Object>, StoreError> {
        let mut found = BTreeMap::new();
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let success = chunk
                .iter()
                .map(|(kind, name)| RequestOp {
                    request: Some(request_op::Request::RequestRange(RangeRequest {
                        key: self.key(kind, name),
                        ..RangeRequest::default()
                    })),
                })
                .collect();
            let response = self
                .kv()
                .txn(TxnRequest {
                    success,
                    ..TxnRequest::default()
                })
                .await
                .map_err(backend)?
                .into_inner();
            for (key, op) in chunk.iter().zip(response.responses) {
                if let Some(response_op::Response::ResponseRange(range)) = op.response
                    && let Some(kv) = range.kvs.first()
                {
                    found.insert(key.clone(), decode(kv)?);
                }
            }
        }
        Ok(found)
    }
}

impl Store for EtcdStore {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        let key = self.key(kind, name);
        let (kind, name) = (kind.to_owned(), name.to_owned());
        Box::pin(async move {
            let started = Instant::now();
            let response = self
                .kv()
                .range(RangeRequest {
                    key,
                    ..RangeRequest::default()
                })
                .await
                .map_err(backend)?
                .into_inner();
            crate::metrics::STORE_SECONDS.observe(started.elapsed());
            match response.kvs.first() {
                Some(kv) => decode(kv),
                None => Err(StoreError::NotFound { kind, name }),
            }
        })
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        let prefix = self.prefix(Some(kind));
        let selector = selector.clone();
        Box::pin(async move {
            let started = Instant::now();
            let (mut objects, revision) = self.range(&prefix).await?;
            objects.retain(|o| selector.matches(&o.metadata.labels));
            crate::metrics::STORE_SECONDS.observe(started.elapsed());
            Ok((objects, revision))
        })
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        Box::pin(self.transact_fenced(ops, None))
    }

    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>> {
        Box::pin(self.watch_prefix(self.prefix(kind), from))
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.current_revision())
    }
}

mod keys;
mod members;
mod txn;
mod url;
mod watch;

pub use keys::{Fence, FencedStore};
pub use url::EtcdUrl;
