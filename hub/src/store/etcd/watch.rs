//! Watches: an etcd watch on a kind's prefix, its events turned into the store's changes.

use std::collections::VecDeque;

use futures::StreamExt;
use proto::etcd::{WatchCreateRequest, WatchRequest, WatchResponse, event, watch_request};

use super::{EtcdStore, backend, decode, range_end};
use crate::store::{EventType, Object, StoreError, WatchEvent, WatchStream};

impl EtcdStore {
    /// Every change under `prefix` after revision `from`; with no `from`, every object there
    /// first (as added), then the changes after that read.
    pub(super) async fn watch_prefix(
        &self,
        prefix: String,
        from: Option<u64>,
    ) -> Result<WatchStream, StoreError> {
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
        let (member, mut client) = self.inner.members.watch();
        let mut responses = client
            .watch(requests)
            .await
            .map_err(|e| {
                self.inner.members.lost(member, e.message());
                backend(e)
            })?
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
