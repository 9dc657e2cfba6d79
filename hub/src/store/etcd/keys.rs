//! What hub replicas coordinate with besides objects: leases, raw keys under the prefix
//! (membership, the leader's key), and the fenced writer a leader writes through.

use std::time::{Duration, Instant};

use proto::etcd::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, compare, request_op,
};

use super::{EtcdStore, backend, members, revision_of};
use crate::store::{BoxFuture, LabelSelector, Object, Op, Store, StoreError, WatchStream};

/// How long a lease's grant or revocation is waited for.
const LEASE_CALL: Duration = Duration::from_secs(3);

impl EtcdStore {
    /// `PREFIX/<suffix>`: where hub replicas keep what is not an object.
    pub(crate) fn meta_key(&self, suffix: &str) -> String {
        format!("{}/{suffix}", self.inner.prefix)
    }

    /// A new lease of `ttl` seconds.
    pub(crate) async fn grant(&self, ttl: i64) -> Result<i64, StoreError> {
        let (member, mut lease) = self.inner.members.lease();
        // A lease granted whose answer came too late expires by itself.
        let granted = tokio::time::timeout(
            LEASE_CALL,
            lease.lease_grant(LeaseGrantRequest { ttl, id: 0 }),
        )
        .await
        .map_err(|_| {
            self.inner
                .members
                .lost(member, "no answer to a lease grant");
            StoreError::Backend(format!(
                "etcd: no answer to a lease grant within {} s",
                LEASE_CALL.as_secs()
            ))
        })?
        .map_err(|e| {
            self.lost(member, &e);
            backend(e)
        })?
        .into_inner();
        if !granted.error.is_empty() {
            return Err(StoreError::Backend(format!("etcd: {}", granted.error)));
        }
        Ok(granted.id)
    }

    /// Keeps `lease` alive, renewing every `every`, until it is lost (expired, revoked, or no
    /// member renewed it for `ttl`): then returns why. A member that goes away is not the
    /// lease's end: the keep-alive reopens on the next member at once, and whoever holds a key
    /// under the lease (the lead) keeps holding it.
    pub(crate) async fn keep_alive(
        &self,
        lease: i64,
        every: Duration,
        ttl: Duration,
    ) -> StoreError {
        let renewed = std::sync::Mutex::new(Instant::now());
        let last = || *renewed.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Bounded by the lease's own end: a call that hangs while etcd is away (a
            // connection being made, a member that takes the stream and says nothing) must
            // not keep the lease, and the lead under it, alive in this replica's mind.
            let attempt = self.keep_alive_on_one(lease, every, &renewed);
            tokio::pin!(attempt);
            let broken = loop {
                let end = tokio::time::Instant::from_std(last() + ttl);
                tokio::select! {
                    result = &mut attempt => match result {
                        Ok(broken) => break broken,
                        Err(lost) => return lost,
                    },
                    () = tokio::time::sleep_until(end) => if last().elapsed() >= ttl {
                        return StoreError::Backend(format!(
                            "no etcd member renewed the lease for {} s",
                            ttl.as_secs()
                        ));
                    },
                }
            };
            if last().elapsed() >= ttl {
                return broken;
            }
            tracing::info!(error = %broken, "renewing this replica's etcd lease through another member");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Renews `lease` on the current member until its stream breaks (`Ok`: why) or the lease
    /// is gone (`Err`); `renewed` is when it last was.
    async fn keep_alive_on_one(
        &self,
        lease: i64,
        every: Duration,
        renewed: &std::sync::Mutex<Instant>,
    ) -> Result<StoreError, StoreError> {
        let requests =
            futures::stream::unfold(tokio::time::interval(every), move |mut ticks| async move {
                ticks.tick().await;
                Some((LeaseKeepAliveRequest { id: lease }, ticks))
            });
        let (member, mut client) = self.inner.members.lease();
        let mut responses = match client.lease_keep_alive(requests).await {
            Ok(responses) => responses.into_inner(),
            Err(e) => {
                self.lost(member, &e);
                return Ok(backend(e));
            }
        };
        loop {
            match responses.message().await {
                Ok(Some(answer)) if answer.ttl > 0 => {
                    *renewed.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                }
                Ok(Some(_)) => {
                    return Err(StoreError::Backend(format!("etcd lease {lease:x} expired")));
                }
                Ok(None) => {
                    self.inner
                        .members
                        .lost(member, "it ended the lease keep-alive");
                    return Ok(StoreError::Backend(
                        "etcd ended the lease keep-alive".into(),
                    ));
                }
                Err(e) => {
                    self.lost(member, &e);
                    return Ok(backend(e));
                }
            }
        }
    }

    /// Gives `lease` up: every key under it goes at once.
    pub(crate) async fn revoke(&self, lease: i64) {
        let (_, mut client) = self.inner.members.lease();
        // Unanswered, the lease still ends with its TTL.
        let _ = tokio::time::timeout(
            LEASE_CALL,
            client.lease_revoke(LeaseRevokeRequest { id: lease }),
        )
        .await;
    }

    /// A stream on member `member` failed with `e`: if the member cannot serve, the next one
    /// becomes current.
    fn lost(&self, member: usize, e: &tonic::Status) {
        if members::ended(e) != members::Ended::Answered {
            self.inner.members.lost(member, e.message());
        }
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

    fn uid(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Option<String>, StoreError>> {
        self.store.uid(kind, name)
    }

    fn uids(
        &self,
        keys: Vec<(String, String)>,
    ) -> BoxFuture<'_, Result<Vec<Option<String>>, StoreError>> {
        self.store.uids(keys)
    }
}
