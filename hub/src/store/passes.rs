//! The loop of the leader's controllers: a pass over the store at start, again whenever an
//! object of the kinds a controller reads changes (a burst settling first), and every 10 s
//! regardless, until shutdown; a watch that breaks is opened again from a new revision.

use std::{pin::pin, time::Duration};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{Following, Store, WatchEvent};

/// A pass this long after the last one even without a change.
const PERIOD: Duration = Duration::from_secs(10);
/// How long a burst of changes (a status report per instruction, a fleet reconnecting) is
/// given to settle before the pass that takes all of it in.
const SETTLE: Duration = Duration::from_millis(100);

/// `what` names the controller in what the loop logs.
pub async fn on_changes<F: Future<Output = ()>>(
    what: &'static str,
    store: &dyn Store,
    kinds: &[&str],
    shutdown: &CancellationToken,
    pass: impl FnMut() -> F,
) {
    let relevant = |e: &WatchEvent| kinds.contains(&e.object.kind.as_str());
    on_changes_where(what, store, relevant, shutdown, pass).await;
}

/// As [`on_changes`], a pass following the changes `relevant` says are.
pub async fn on_changes_where<F: Future<Output = ()>>(
    what: &'static str,
    store: &dyn Store,
    mut relevant: impl FnMut(&WatchEvent) -> bool,
    shutdown: &CancellationToken,
    mut pass: impl FnMut() -> F,
) {
    let mut following = Following::new(what);
    loop {
        let from = match store.revision().await {
            Ok(from) => from,
            Err(e) => {
                following.broke(Some(&e));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        pass().await;
        let mut changes = match store.watch(None, Some(from)).await {
            Ok(changes) => changes,
            Err(e) => {
                following.broke(Some(&e));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        following.resumed(from);
        // Every change is read as it comes, also while a pass runs: a change left unread
        // keeps the store's copy of it (and of every change after it) in memory.
        let mut dirty = false;
        'watching: loop {
            let mut tick = pin!(tokio::time::sleep(PERIOD));
            while !dirty {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = &mut tick => break,
                    change = changes.next() => match change {
                        Some(Ok(e)) => dirty = relevant(&e),
                        end => {
                            following.broke(end.and_then(Result::err).as_ref());
                            break 'watching;
                        }
                    },
                }
            }
            // One pass for the whole burst, however many changes it has.
            let mut settle = pin!(tokio::time::sleep(SETTLE));
            while dirty {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = &mut settle => dirty = false,
                    change = changes.next() => match change {
                        Some(Ok(_)) => {}
                        end => {
                            following.broke(end.and_then(Result::err).as_ref());
                            break 'watching;
                        }
                    },
                }
            }
            // Changes during the pass may not be in what it read: a relevant one asks for
            // another.
            let mut running = pin!(pass());
            let mut broken = false;
            loop {
                tokio::select! {
                    () = &mut running => break,
                    change = changes.next(), if !broken => match change {
                        Some(Ok(e)) => dirty |= relevant(&e),
                        end => {
                            following.broke(end.and_then(Result::err).as_ref());
                            broken = true;
                        }
                    },
                }
            }
            if broken {
                break 'watching;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use serde_json::json;
    use tokio::sync::{Notify, mpsc};

    use super::*;
    use crate::store::{LabelSelector, Object, Op, sqlite::SqliteStore};

    fn store() -> Arc<SqliteStore> {
        Arc::new(SqliteStore::open(std::path::Path::new(":memory:")).unwrap())
    }

    fn create(kind: &str, name: &str) -> Op {
        Op::Create(Object::new(kind, name, json!({})))
    }

    /// Runs `on_changes` over `store` for kind "Host": each pass counts itself, sends the names
    /// of the Hosts it read, then waits for `gate` when one is given.
    fn follow(
        store: Arc<dyn Store>,
        gate: Option<Arc<Notify>>,
    ) -> (
        mpsc::UnboundedReceiver<Vec<String>>,
        Arc<AtomicUsize>,
        CancellationToken,
    ) {
        let (read, passes) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let (counted, stop) = (count.clone(), shutdown.clone());
        tokio::spawn(async move {
            on_changes("a test pass", store.as_ref(), &["Host"], &stop, || {
                let (store, read, counted, gate) =
                    (store.clone(), read.clone(), counted.clone(), gate.clone());
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let (hosts, _) = store
                        .list("Host", &LabelSelector::everything())
                        .await
                        .unwrap();
                    let _ = read.send(hosts.into_iter().map(|h| h.metadata.name).collect());
                    if let Some(gate) = gate {
                        gate.notified().await;
                    }
                }
            })
            .await;
        });
        (passes, count, shutdown)
    }

    #[tokio::test]
    async fn a_burst_of_changes_costs_one_pass_not_one_per_change() {
        let store = store();
        let (mut passes, count, shutdown) = follow(store.clone(), None);
        assert_eq!(passes.recv().await.unwrap(), Vec::<String>::new());
        // 300 hosts in one transaction, then one more once a pass has seen them.
        let burst = (0..300)
            .map(|i| create("Host", &format!("h{i:03}")))
            .collect();
        store.transact(burst).await.unwrap();
        while passes.recv().await.unwrap().len() < 300 {}
        store.transact(vec![create("Host", "last")]).await.unwrap();
        while passes.recv().await.unwrap().len() < 301 {}
        // Every change has been read (each unread one stays in the store's memory).
        assert_eq!(store.unread_changes(), 0);
        // The first pass, the burst's and the last host's (one more, should the burst's
        // events straddle its settling, or the 10-s pass come between).
        let made = count.load(Ordering::SeqCst);
        assert!(made <= 4, "{made} passes for two writes to the store");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_change_made_while_a_pass_runs_brings_another_and_other_kinds_none() {
        let store = store();
        let gate = Arc::new(Notify::new());
        let (mut passes, count, shutdown) = follow(store.clone(), Some(gate.clone()));
        assert_eq!(passes.recv().await.unwrap(), Vec::<String>::new());
        gate.notify_one();
        store.transact(vec![create("Host", "a")]).await.unwrap();
        // The pass for "a" has read the store and waits at the gate when "b" comes.
        assert_eq!(passes.recv().await.unwrap(), ["a"]);
        store.transact(vec![create("Host", "b")]).await.unwrap();
        gate.notify_one();
        assert_eq!(passes.recv().await.unwrap(), ["a", "b"]);
        gate.notify_one();
        // A kind the controller does not read brings no pass; the next Host does, and no
        // pass came between.
        store.transact(vec![create("Setting", "s")]).await.unwrap();
        store.transact(vec![create("Host", "c")]).await.unwrap();
        assert_eq!(passes.recv().await.unwrap(), ["a", "b", "c"]);
        gate.notify_one();
        assert_eq!(count.load(Ordering::SeqCst), 4);
        shutdown.cancel();
    }
}

/// Which events of a kind change more than a status, from what each object looked like
/// last: a controller's own status writes then start no pass of it (a failed step would
/// otherwise be retried at once, each failure's write the next try's trigger).
#[derive(Debug, Default)]
pub struct SpecChanges {
    /// By name: (generation, being deleted, finalizers).
    seen: std::collections::HashMap<String, (u64, bool, Vec<String>)>,
}

impl SpecChanges {
    pub fn relevant(&mut self, e: &WatchEvent) -> bool {
        let meta = &e.object.metadata;
        if e.kind == super::EventType::Deleted {
            self.seen.remove(&meta.name);
            return true;
        }
        let now = (
            meta.generation,
            meta.deletion_timestamp.is_some(),
            meta.finalizers.clone(),
        );
        self.seen.insert(meta.name.clone(), now.clone()) != Some(now)
    }
}
