//! The loop of the leader's controllers: a pass over the store at start, again whenever an
//! object of the kinds a controller reads changes (a burst settling first), and every 10 s
//! regardless, until shutdown; a watch that breaks is opened again from a new revision.

use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::Store;

pub async fn on_changes<F: Future<Output = ()>>(
    store: &dyn Store,
    kinds: &[&str],
    shutdown: &CancellationToken,
    mut pass: impl FnMut() -> F,
) {
    loop {
        let Ok(from) = store.revision().await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        pass().await;
        let Ok(mut changes) = store.watch(None, Some(from)).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            let relevant = tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(10)) => true,
                change = changes.next() => match change {
                    Some(Ok(e)) => kinds.contains(&e.object.kind.as_str()),
                    Some(Err(_)) | None => break,
                },
            };
            if relevant {
                // Let a burst of changes (a status report per instruction) settle first.
                tokio::time::sleep(Duration::from_millis(100)).await;
                pass().await;
            }
        }
    }
}
