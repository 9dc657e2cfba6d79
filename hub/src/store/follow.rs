//! What a reader that follows the store (a read, then a watch from the read's revision) says
//! when its watch ends and when it has read the store again: after an etcd outage, each
//! replica's log tells what it rebuilt and how long that was behind.

use std::time::Instant;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{StoreError, WatchEvent, WatchStream};

/// One follower's breaks and recoveries.
#[derive(Debug)]
pub struct Following {
    what: &'static str,
    /// When the watch ended, while the follower has not read the store again.
    broke: Option<Instant>,
}

impl Following {
    /// `what` names what the follower derives from the store ("the planner", "plan dispatch").
    pub fn new(what: &'static str) -> Self {
        Self { what, broke: None }
    }

    /// The watch ended, with `error` or closed by the store: said once per break.
    pub fn broke(&mut self, error: Option<&StoreError>) {
        if self.broke.is_some() {
            return;
        }
        self.broke = Some(Instant::now());
        let why = error.map_or_else(|| "the store closed it".to_owned(), ToString::to_string);
        tracing::warn!(follower = self.what, error = %why, "a store watch ended; reading the store again");
    }

    /// The store was read again and is watched from `revision` (`None`: from a full replay):
    /// said once, after a break.
    pub fn resumed(&mut self, revision: impl Into<Option<u64>>) {
        if let Some(at) = self.broke.take() {
            tracing::info!(
                follower = self.what,
                revision = ?revision.into(),
                behind = ?at.elapsed(),
                "rebuilt from a fresh read of the store; watching it again"
            );
        }
    }
}

impl Following {
    /// Hands each event of `changes` to `take` until the watch ends (said, and `false`: read
    /// the store again) or `stop` (`true`).
    pub async fn drain(
        &mut self,
        changes: &mut WatchStream,
        stop: &CancellationToken,
        mut take: impl FnMut(&WatchEvent),
    ) -> bool {
        loop {
            tokio::select! {
                () = stop.cancelled() => return true,
                change = changes.next() => match change {
                    Some(Ok(event)) => take(&event),
                    end => {
                        self.broke(end.and_then(Result::err).as_ref());
                        return false;
                    }
                },
            }
        }
    }
}
