//! Transactions: the objects an op list names read, the writes decided by the rules every
//! backend shares, committed in one etcd Txn guarded by what was read (retried while other
//! writers get there first); and the compaction of history that a commit crossing a step
//! triggers.

use std::{sync::atomic::Ordering, time::Instant};

use proto::etcd::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, compare, request_op,
};

use super::{
    COMPACTED, EtcdStore, MAX_ATTEMPTS, MAX_TXN_OPS, backend, encode, keys::Fence, revision_of,
};
use crate::store::{
    Object, Op, StoreError,
    apply::{self, Key},
    now_rfc3339,
};

impl EtcdStore {
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
        if applied.after.is_empty() {
            // Nothing changed (each op a modification that left its object as it was).
            return Ok(Some(applied.written));
        }
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
        // Objects left as they were keep their own revision.
        for object in written
            .iter_mut()
            .filter(|o| o.metadata.resource_version.is_empty())
        {
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
    pub(super) async fn compacted(&self) -> Result<u64, StoreError> {
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
    pub(super) async fn transact_fenced(
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
}
