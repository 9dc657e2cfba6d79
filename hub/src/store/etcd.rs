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
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use proto::etcd::{
    CompactionRequest, Compare, DeleteRangeRequest, KeyValue, LeaseGrantRequest,
    LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, WatchRequest, WatchResponse, compare, event, kv_client::KvClient,
    lease_client::LeaseClient, request_op, response_op, watch_client::WatchClient, watch_request,
};
use tonic::transport::{Channel, Endpoint};

use super::{
    BoxFuture, EventType, LabelSelector, Object, Op, Store, StoreError, WatchEvent, WatchStream,
    apply::{self, Key},
    now_rfc3339,
};

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
    kv: KvClient<Channel>,
    watch: WatchClient<Channel>,
    lease: LeaseClient<Channel>,
    /// `PREFIX`, e.g. `/drover`.
    prefix: String,
    retain: u64,
    /// The compaction step last acted on, so one writer compacts once per step.
    compaction_step: AtomicU64,
    /// The endpoints, for messages.
    endpoints: String,
}

/// A parsed `etcd://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    /// Where Drover's keys live, e.g. `/drover`.
    pub prefix: String,
}

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT…][/PREFIX]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("etcd://").ok_or_else(|| {
            format!("{url:?} is not an etcd URL: write etcd://HOST:PORT[,HOST:PORT…][/PREFIX]")
        })?;
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let prefix = if prefix.is_empty() { "/drover" } else { prefix };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let valid = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !valid {
                return Err(format!(
                    "{host:?} in {url:?} is not HOST:PORT (etcd's client port is usually 2379)"
                ));
            }
            endpoints.push(host.to_owned());
        }
        Ok(Self {
            endpoints,
            prefix: prefix.to_owned(),
        })
    }
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
        let mut endpoints = Vec::new();
        for host in &url.endpoints {
            let endpoint = Endpoint::from_shared(format!("http://{host}"))
                .map_err(|e| StoreError::Invalid(format!("etcd endpoint {host:?}: {e}")))?
                .connect_timeout(Duration::from_secs(3))
                .tcp_nodelay(true)
                // A member that stops answering is noticed within seconds, watches included.
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            endpoints.push(endpoint);
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        let store = Self {
            inner: Arc::new(Inner {
                kv: KvClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
                watch: WatchClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
                lease: LeaseClient::new(channel),
                prefix: url.prefix.clone(),
                retain: retain.max(1),
                compaction_step: AtomicU64::new(0),
                endpoints: url.endpoints.join(","),
            }),
        };
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

    fn kv(&self) -> KvClient<Channel> {
        self.inner.kv.clone()
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

    /// One attempt at committing `ops`: `None` if another writer changed what they read.
    async fn try_commit(
        &self,
        ops: Vec<Op>,
        keys: &[Key],
        fence: Option<&Fence>,
    ) -> Result<Option<Vec<Object>>, StoreError> {
        let mut current = self.read(keys).await?;
        let applied = apply::apply(ops, None, &now_rfc3339(), |kind, name| {
            Ok(current.remove(&(kind.to_owned(), name.to_owned())))
        })?;
        let mut compare: Vec<Compare> = applied
            .before
            .iter()
            .map(|((kind, name), before)| Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Mod as i32,
                key: self.key(kind, name),
                // An absent key compares as mod_revision 0.
                target_union: Some(compare::TargetUnion::ModRevision(
                    before.as_ref().map_or(0, |o| o.revision() as i64),
                )),
            })
            .collect();
        if let Some(fence) = fence {
            // The write lands only while the writer still holds the key it was granted.
            compare.push(Compare {
                result: compare::CompareResult::Equal as i32,
                target: compare::CompareTarget::Create as i32,
                key: fence.key.clone().into_bytes(),
                target_union: Some(compare::TargetUnion::CreateRevision(fence.revision)),
            });
        }
        let mut success = Vec::new();
        for ((kind, name), after) in &applied.after {
            let request = match after {
                Some(object) => request_op::Request::RequestPut(PutRequest {
                    key: self.key(kind, name),
                    value: encode(object)?,
                    ..PutRequest::default()
                }),
                None if applied
                    .before
                    .get(&(kind.clone(), name.clone()))
                    .is_some_and(Option::is_some) =>
                {
                    request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                        key: self.key(kind, name),
                        ..DeleteRangeRequest::default()
                    })
                }
                None => continue,
            };
            success.push(RequestOp {
                request: Some(request),
            });
        }
        let response = self
            .kv()
            .txn(TxnRequest {
                compare,
                success,
                failure: Vec::new(),
            })
            .await
            .map_err(backend)?
            .into_inner();
        if !response.succeeded {
            return Ok(None);
        }
        let revision = revision_of(response.header.as_ref());
        let mut written = applied.written;
        for object in &mut written {
            object.metadata.resource_version = revision.to_string();
        }
        self.compact_if_due(revision).await;
        Ok(Some(written))
    }

    /// Drops history older than the retained revisions, once per step of revisions.
    async fn compact_if_due(&self, revision: u64) {
        let retain = self.inner.retain;
        let step = retain.clamp(1, 1024);
        let this_step = revision / step;
        if revision <= retain
            || self.inner.compaction_step.swap(this_step, Ordering::SeqCst) == this_step
        {
            return;
        }
        let oldest = revision - retain;
        let compacted = self
            .kv()
            .compact(CompactionRequest {
                revision: oldest as i64,
                physical: false,
            })
            .await;
        match compacted {
            // Another replica may have compacted further already; then so much the better.
            Err(e) if !e.message().contains("compacted") => {
                tracing::warn!(error = %e.message(), "compacting etcd's history failed; retrying at the next step");
                return;
            }
            _ => {}
        }
        let marked = self
            .kv()
            .put(PutRequest {
                key: self.meta_key(COMPACTED).into_bytes(),
                value: oldest.to_string().into_bytes(),
                ..PutRequest::default()
            })
            .await;
        if let Err(e) = marked {
            tracing::warn!(error = %e.message(), "recording etcd's compaction failed");
        }
    }

    /// The revision history was last compacted to (0 if never).
    async fn compacted(&self) -> Result<u64, StoreError> {
        let response = self
            .kv()
            .range(RangeRequest {
                key: self.meta_key(COMPACTED).into_bytes(),
                ..RangeRequest::default()
            })
            .await
            .map_err(backend)?
            .into_inner();
        Ok(response
            .kvs
            .first()
            .and_then(|kv| std::str::from_utf8(&kv.value).ok()?.parse().ok())
            .unwrap_or(0))
    }

    /// Commits `ops`, retrying while other writers get there first; with a `fence`, only while
    /// it still holds.
    async fn transact_fenced(
        &self,
        ops: Vec<Op>,
        fence: Option<&Fence>,
    ) -> Result<Vec<Object>, StoreError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let keys = apply::keys(&ops);
        if keys.len() > MAX_TXN_OPS {
            return Err(StoreError::Invalid(format!(
                "one transaction may change at most {MAX_TXN_OPS} objects in the etcd store; this one changes {}",
                keys.len()
            )));
        }
        let started = Instant::now();
        for _ in 0..MAX_ATTEMPTS {
            if let Some(written) = self.try_commit(ops.clone(), &keys, fence).await? {
                crate::metrics::STORE_SECONDS.observe(started.elapsed());
                return Ok(written);
            }
            if let Some(fence) = fence
                && self.get_raw(&fence.key).await?.map(|(_, created)| created)
                    != Some(fence.revision)
            {
                return Err(StoreError::Fenced(fence.key.clone()));
            }
            // Another writer changed an object this one read: read again and retry.
            tokio::task::yield_now().await;
        }
        Err(StoreError::Backend(format!(
            "gave up after {MAX_ATTEMPTS} attempts: other writers kept changing the same objects; retry"
        )))
    }

    /// `PREFIX/<suffix>`: where hub replicas keep what is not an object.
    pub(crate) fn meta_key(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.inner.prefix)
    }

    /// A new lease of `ttl` seconds.
    pub(crate) async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        let granted = self
            .inner
            .lease
            .clone()
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await
            .map_err(backend)?
            .into_inner();
        if !granted.error.is_empty() {
            return Err(StoreError::Backend(format!("etcd: {}", granted.error)));
        }
        Ok(granted.id)
    }

    /// Keeps `lease` alive, renewing every `every`, until it is lost (expired, revoked, or etcd
    /// unreachable for longer than its TTL): then returns why.
    pub(crate) async fn keep_alive(&self, lease: i64, every: Duration) -> StoreError {
        let requests =
            futures::stream::unfold(tokio::time::interval(every), move |mut ticks| async move {
                ticks.tick().await;
                Some((LeaseKeepAliveRequest { id: lease }, ticks))
            });
        let mut responses = match self.inner.lease.clone().lease_keep_alive(requests).await {
            Ok(responses) => responses.into_inner(),
            Err(e) => return backend(e),
        };
        loop {
            match responses.message().await {
                Ok(Some(answer)) if answer.ttl > 0 => {}
                Ok(Some(_)) => return StoreError::Backend(format!("etcd lease {lease:x} expired")),
                Ok(None) => return StoreError::Backend("etcd ended the lease keep-alive".into()),
                Err(e) => return backend(e),
            }
        }
    }

    /// Gives `lease` up: every key under it goes at once.
    pub(crate) async fn revoke(&self, lease: i64) {
        let _ = self
            .inner
            .lease
            .clone()
            .lease_revoke(LeaseRevokeRequest { id: lease })
            .await;
    }

    /// Sets `key` to `value`, under `lease` (0: none).
    pub(crate) async fn put_raw(
        &self,
        key: &str,
        value: &str,
        lease: i64,
    ) -> Result<(), StoreError> {
        self.kv()
            .put(PutRequest {
                key: key.as_bytes().to_vec(),
                value: value.as_bytes().to_vec(),
                lease,
                ..PutRequest::default()
            })
            .await
            .map(drop)
            .map_err(backend)
    }

    /// Sets `key` to `value` under `lease` if no one holds it: the revision it was created at,
    /// or `None` if it exists.
    pub(crate) async fn create_raw(
        &self,
        key: &str,
        value: &str,
        lease: i64,
    ) -> Result<Option<i64>, StoreError> {
        let response = self
            .kv()
            .txn(TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Create as i32,
                    key: key.as_bytes().to_vec(),
                    target_union: Some(compare::TargetUnion::CreateRevision(0)),
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: key.as_bytes().to_vec(),
                        value: value.as_bytes().to_vec(),
                        lease,
                        ..PutRequest::default()
                    })),
                }],
                failure: Vec::new(),
            })
            .await
            .map_err(backend)?
            .into_inner();
        Ok(response
            .succeeded
            .then(|| revision_of(response.header.as_ref()) as i64))
    }

    /// Deletes `key` if its value is `value` (a replica removes only what it wrote).
    pub(crate) async fn delete_raw_if(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.kv()
            .txn(TxnRequest {
                compare: vec![Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Value as i32,
                    key: key.as_bytes().to_vec(),
                    target_union: Some(compare::TargetUnion::Value(value.as_bytes().to_vec())),
                }],
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestDeleteRange(
                        DeleteRangeRequest {
                            key: key.as_bytes().to_vec(),
                            ..DeleteRangeRequest::default()
                        },
                    )),
                }],
                failure: Vec::new(),
            })
            .await
            .map(drop)
            .map_err(backend)
    }

    /// `key`'s value and the revision it was created at.
    pub(crate) async fn get_raw(&self, key: &str) -> Result<Option<(String, i64)>, StoreError> {
        let response = self
            .kv()
            .range(RangeRequest {
                key: key.as_bytes().to_vec(),
                ..RangeRequest::default()
            })
            .await
            .map_err(backend)?
            .into_inner();
        Ok(response.kvs.first().map(|kv| {
            (
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.create_revision,
            )
        }))
    }

    /// Every key under `prefix` (ending in '/'): its value and creation revision, by key.
    pub(crate) async fn list_raw(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        let response = self.range_prefix(prefix).await?;
        Ok(response
            .kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                    kv.create_revision,
                )
            })
            .collect())
    }

    /// This store, writing only while `fence` holds.
    pub fn fenced(&self, fence: Fence) -> FencedStore {
        FencedStore {
            store: self.clone(),
            fence,
        }
    }

    async fn open_watch(
        &self,
        prefix: &str,
        start: u64,
    ) -> Result<tonic::Streaming<WatchResponse>, StoreError> {
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: range_end(prefix),
                    start_revision: start as i64,
                    prev_kv: true,
                    ..WatchCreateRequest::default()
                },
            )),
        };
        // The request stream stays open for the watch's life: nothing more is sent on it.
        let requests =
            futures::stream::once(async move { create }).chain(futures::stream::pending());
        let mut responses = self
            .inner
            .watch
            .clone()
            .watch(requests)
            .await
            .map_err(backend)?
            .into_inner();
        // etcd first acknowledges the watch with an empty "created" response.
        match responses.message().await.map_err(backend)? {
            Some(ack) if ack.created && !ack.canceled => Ok(responses),
            Some(ack) if ack.compact_revision > 0 => Err(StoreError::Gone {
                requested: start.saturating_sub(1),
                oldest: ack.compact_revision as u64,
            }),
            Some(ack) => Err(StoreError::Backend(format!(
                "etcd refused the watch: {}",
                ack.cancel_reason
            ))),
            None => Err(StoreError::Backend("etcd closed the watch at once".into())),
        }
    }
}

/// The change an etcd event stands for.
fn change(event: &proto::etcd::Event) -> Result<WatchEvent, StoreError> {
    let kv = event
        .kv
        .as_ref()
        .ok_or_else(|| StoreError::Backend("an etcd event without its key".into()))?;
    if event.r#type == event::EventType::Delete as i32 {
        // A deleted object as it was last stored, at the revision of its deletion.
        let mut object = match &event.prev_kv {
            Some(prev) => decode(prev)?,
            None => placeholder(&kv.key)?,
        };
        object.metadata.resource_version = kv.mod_revision.to_string();
        return Ok(WatchEvent {
            kind: EventType::Deleted,
            object,
        });
    }
    let kind = if kv.create_revision == kv.mod_revision {
        EventType::Added
    } else {
        EventType::Modified
    };
    Ok(WatchEvent {
        kind,
        object: decode(kv)?,
    })
}

/// An object known only by its key (its last body was compacted away before a delete event).
fn placeholder(key: &[u8]) -> Result<Object, StoreError> {
    let key = String::from_utf8_lossy(key);
    let mut parts = key.rsplit('/');
    match (parts.next(), parts.next()) {
        (Some(name), Some(kind)) => Ok(Object::new(kind, name, serde_json::Value::Null)),
        _ => Err(StoreError::Backend(format!(
            "an etcd key Drover did not write: {key}"
        ))),
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
        let prefix = self.prefix(kind);
        Box::pin(async move {
            let (replay, start) = match from {
                None => {
                    let (objects, revision) = self.range(&prefix).await?;
                    let replay: VecDeque<_> = objects
                        .into_iter()
                        .map(|object| WatchEvent {
                            kind: EventType::Added,
                            object,
                        })
                        .collect();
                    (replay, revision + 1)
                }
                Some(from) => {
                    let oldest = self.compacted().await?;
                    if from + 1 < oldest {
                        return Err(StoreError::Gone {
                            requested: from,
                            oldest,
                        });
                    }
                    (VecDeque::new(), from + 1)
                }
            };
            let responses = self.open_watch(&prefix, start).await?;
            let replayed = futures::stream::iter(replay.into_iter().map(Ok));
            let live = futures::stream::unfold(
                Some((responses, VecDeque::new(), start.saturating_sub(1))),
                |state| async move {
                    let (mut responses, mut pending, mut seen) = state?;
                    loop {
                        if let Some(event) = pending.pop_front() {
                            return Some((Ok(event), Some((responses, pending, seen))));
                        }
                        let response = match responses.message().await {
                            Ok(Some(response)) => response,
                            Ok(None) => return None,
                            Err(e) => return Some((Err(backend(e)), None)),
                        };
                        if response.canceled {
                            let error = if response.compact_revision > 0 {
                                StoreError::Gone {
                                    requested: seen,
                                    oldest: response.compact_revision as u64,
                                }
                            } else {
                                StoreError::Backend(format!(
                                    "etcd ended the watch: {}",
                                    response.cancel_reason
                                ))
                            };
                            return Some((Err(error), None));
                        }
                        for event in &response.events {
                            match change(event) {
                                Ok(event) => {
                                    seen = event.object.revision();
                                    pending.push_back(event);
                                }
                                Err(e) => return Some((Err(e), None)),
                            }
                        }
                    }
                },
            );
            let stream: WatchStream = Box::pin(replayed.chain(live));
            Ok(stream)
        })
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.current_revision())
    }
}

/// A key its holder was granted at a revision (a leader's key): writes guarded by it land only
/// while the key is still the one created then, so a deposed holder cannot write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub revision: i64,
}

/// The etcd store for a writer that must hold a [`Fence`]: every transaction carries it, and
/// fails with [`StoreError::Fenced`] once it no longer holds. Reads and watches are the store's.
#[derive(Debug, Clone)]
pub struct FencedStore {
    store: EtcdStore,
    fence: Fence,
}

impl Store for FencedStore {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        self.store.get(kind, name)
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        self.store.list(kind, selector)
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        Box::pin(self.store.transact_fenced(ops, Some(&self.fence)))
    }

    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>> {
        self.store.watch(kind, from)
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.store.revision()
    }
}

#[cfg(test)]
mod url_tests {
    use super::EtcdUrl;

    #[test]
    fn an_etcd_url_names_members_and_an_optional_prefix() {
        let url = EtcdUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379").unwrap();
        assert_eq!(url.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(url.prefix, "/drover");
        let url = EtcdUrl::parse("etcd://etcd.internal:2379/teams/a/").unwrap();
        assert_eq!(url.endpoints, ["etcd.internal:2379"]);
        assert_eq!(url.prefix, "/teams/a");
        for bad in [
            "http://x:2379",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://a:1,,b:2",
        ] {
            let err = EtcdUrl::parse(bad).unwrap_err();
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }
}
