//! The embedded store: one SQLite file in the data directory, in WAL mode with full sync, so a
//! write is on disk before it is acknowledged. Writes are serialised on one connection (a hub's
//! write rate is modest; durability and order matter more), and the change log that watches
//! replay lives in the same transaction as the change itself.

use std::{
    path::Path,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::StreamExt;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::broadcast;

use super::{
    BoxFuture, EventType, LabelSelector, Object, Op, Store, StoreError, WatchEvent, WatchStream,
    apply::{Applied, apply},
    now_rfc3339,
};

/// Live changes buffered per watcher before a slow one is told to relist (`Gone`).
const WATCH_BUFFER: usize = 8192;

/// How many revisions of change log are kept for watches to resume from.
pub const DEFAULT_RETAIN: u64 = 100_000;

#[derive(Debug, Clone)]
struct Change {
    revision: u64,
    event: WatchEvent,
}

/// The SQLite store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Mutex<Connection>,
    /// Writers waiting for the next commit, and whether a committer is on its way for them.
    queue: Mutex<Queue>,
    live: broadcast::Sender<Arc<Change>>,
    retain: u64,
}

fn backend(e: rusqlite::Error) -> StoreError {
    // SQLite reports ENOSPC as SQLITE_FULL and rolls the transaction back: nothing was
    // written, and the caller can say exactly that and what to do.
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        return StoreError::DiskFull(e.to_string());
    }
    StoreError::Backend(e.to_string())
}

impl SqliteStore {
    /// Writers queued for the next commit.
    #[cfg(test)]
    pub(crate) fn queued_writers(&self) -> usize {
        self.inner.lock_queue().pending.len()
    }

    /// Changes kept for a watcher that has not read them yet (the oldest unread by any).
    #[cfg(test)]
    pub(crate) fn unread_changes(&self) -> usize {
        self.inner.live.len()
    }

    /// Opens (creating if needed) the store in `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with_retention(path, DEFAULT_RETAIN)
    }

    /// As [`SqliteStore::open`], keeping `retain` revisions of change log.
    pub fn open_with_retention(path: &Path, retain: u64) -> Result<Self, StoreError> {
        let conn = Connection::open(path).map_err(|e| {
            StoreError::Backend(format!("cannot open the store at {}: {e}", path.display()))
        })?;
        // WAL lets readers run during a write; FULL makes each commit durable before it returns.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend)?;
        // The store holds password and token hashes and every object: owner-only, as the
        // files SQLite keeps beside it (created with the process's umask).
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            crate::fsutil::owner_only_file(Path::new(&file)).map_err(|e| {
                StoreError::Backend(format!("cannot make {} owner-only: {e}", path.display()))
            })?;
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(backend)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(backend)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS objects (
                 kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,
                 PRIMARY KEY (kind, name)) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS changes (
                 revision INTEGER NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
                 type TEXT NOT NULL, body TEXT NOT NULL,
                 PRIMARY KEY (revision, seq)) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             INSERT OR IGNORE INTO meta VALUES ('revision', 0), ('compacted', 0);",
        )
        .map_err(backend)?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                queue: Mutex::default(),
                live: broadcast::channel(WATCH_BUFFER).0,
                retain: retain.max(1),
            }),
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    async fn blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner, &mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut conn = inner.lock();
            let result = f(&inner, &mut conn);
            crate::metrics::STORE_SECONDS.observe(started.elapsed());
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
    }
}

impl Inner {
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic mid-transaction rolls the transaction back when it is dropped, so the
        // connection is still consistent.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn meta(conn: &Connection, key: &str) -> Result<u64, StoreError> {
    conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")
        .and_then(|mut stmt| stmt.query_row([key], |r| r.get::<_, i64>(0)))
        .map(|v| v as u64)
        .map_err(backend)
}

fn decode(body: &str) -> Result<Object, StoreError> {
    serde_json::from_str(body)
        .map_err(|e| StoreError::Backend(format!("unreadable object in the store: {e}")))
}

fn encode(object: &Object) -> Result<String, StoreError> {
    serde_json::to_string(object).map_err(|e| StoreError::Backend(e.to_string()))
}

fn load(conn: &Connection, kind: &str, name: &str) -> Result<Option<Object>, StoreError> {
    load_body(conn, kind, name)?
        .as_deref()
        .map(decode)
        .transpose()
}

fn load_body(conn: &Connection, kind: &str, name: &str) -> Result<Option<String>, StoreError> {
    conn.prepare_cached("SELECT body FROM objects WHERE kind = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.query_row(params![kind, name], |r| r.get(0)).optional())
        .map_err(backend)
}

/// An object's uid alone, read from its stored body without building the rest.
fn decode_uid(body: &str) -> Result<String, StoreError> {
    #[derive(serde::Deserialize)]
    struct Stored {
        metadata: Uid,
    }
    #[derive(serde::Deserialize)]
    struct Uid {
        #[serde(default)]
        uid: String,
    }
    serde_json::from_str::<Stored>(body)
        .map(|s| s.metadata.uid)
        .map_err(|e| StoreError::Backend(format!("unreadable object in the store: {e}")))
}

/// Writes what the transaction's ops made of each object they touched: an object's last
/// change says what it became (gone, if deleted), and `bodies` holds each change's object as
/// stored text, so a row is the very text its change-log entry has (encoded once, not twice).
fn write(tx: &Connection, events: &[WatchEvent], bodies: &[String]) -> Result<(), StoreError> {
    // Newest first, each object once (a list's transaction holds a thousand changes).
    let mut written = std::collections::HashSet::new();
    for (event, body) in events.iter().zip(bodies).rev() {
        let (kind, name) = (&event.object.kind, &event.object.metadata.name);
        if !written.insert((kind, name)) {
            continue;
        }
        match event.kind {
            EventType::Deleted => tx
                .prepare_cached("DELETE FROM objects WHERE kind = ?1 AND name = ?2")
                .and_then(|mut stmt| stmt.execute(params![kind, name])),
            EventType::Added | EventType::Modified => tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO objects (kind, name, body) VALUES (?1, ?2, ?3)",
                )
                .and_then(|mut stmt| stmt.execute(params![kind, name, body])),
        }
        .map_err(backend)?;
    }
    Ok(())
}

fn event_name(kind: EventType) -> &'static str {
    match kind {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
    }
}

fn event_kind(name: &str) -> Result<EventType, StoreError> {
    match name {
        "ADDED" => Ok(EventType::Added),
        "MODIFIED" => Ok(EventType::Modified),
        "DELETED" => Ok(EventType::Deleted),
        other => Err(StoreError::Backend(format!(
            "unknown change type {other:?} in the log"
        ))),
    }
}

/// The writers waiting for the next commit. `committing` is set while a committer runs (or is
/// about to): it commits what is queued until the queue is empty, so writers that arrive
/// meanwhile join its next batch instead of each taking a thread that would only wait for the
/// connection (with a fleet's writes in flight, a fifth of the commits' CPU went to futex
/// waits and context switches, and a commit, with its fsync, for every few writers).
#[derive(Debug, Default)]
struct Queue {
    pending: Vec<Pending>,
    committing: bool,
}

/// Runs on a blocking thread while writers are queued: each pass takes the connection, then
/// everything queued by then, and commits it in one transaction.
fn committer(inner: &Inner) {
    loop {
        let mut conn = inner.lock();
        let batch = {
            let mut queue = inner.lock_queue();
            if queue.pending.is_empty() {
                // Under the queue's lock: a writer queued after this starts a new committer.
                queue.committing = false;
                return;
            }
            std::mem::take(&mut queue.pending)
        };
        let started = std::time::Instant::now();
        // A commit that panics (a bug in some writer's change) fails its own batch — the
        // writers' channels go as it unwinds and its transaction rolls back — and the
        // committer goes on with the writers queued meanwhile: were it to stop, they (and
        // every later writer) would wait for a committer the queue believes is running.
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit(inner, &mut conn, batch);
        }));
        if committed.is_err() {
            tracing::error!("a store commit panicked: its writers were told it failed");
        }
        crate::metrics::STORE_SECONDS.observe(started.elapsed());
    }
}

/// A writer's ops waiting for the next commit, and where its outcome goes.
#[derive(Debug)]
struct Pending {
    ops: Vec<Op>,
    done: tokio::sync::oneshot::Sender<Result<Vec<Object>, StoreError>>,
}

/// Applies one writer's ops at `revision` inside the open transaction and logs its changes.
fn apply_one(
    tx: &Connection,
    ops: Vec<Op>,
    revision: u64,
    now: &str,
) -> Result<(Vec<Object>, Vec<WatchEvent>), StoreError> {
    let applied = apply(ops, Some(revision), now, |kind, name| load(tx, kind, name))?;
    let bodies = applied
        .events
        .iter()
        .map(|event| encode(&event.object))
        .collect::<Result<Vec<_>, _>>()?;
    write(tx, &applied.events, &bodies)?;
    let Applied {
        written, events, ..
    } = applied;
    let mut log = tx
        .prepare_cached(
            "INSERT INTO changes (revision, seq, kind, type, body) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(backend)?;
    for (seq, (event, body)) in events.iter().zip(&bodies).enumerate() {
        log.execute(params![
            revision as i64,
            seq as i64,
            event.object.kind,
            event_name(event.kind),
            body
        ])
        .map_err(backend)?;
    }
    Ok((written, events))
}

/// Commits `batch` in one transaction: each writer's ops all or none (a savepoint each), and
/// all of them durable together. A failed commit fails every writer of the batch.
fn commit(inner: &Inner, conn: &mut Connection, batch: Vec<Pending>) {
    let mut outcomes: Vec<(Pending, Result<Vec<Object>, StoreError>)> = Vec::new();
    let mut changes: Vec<(u64, Vec<WatchEvent>)> = Vec::new();
    let result = (|| -> Result<(), StoreError> {
        let mut tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(backend)?;
        let first = meta(&tx, "revision")?;
        let mut revision = first;
        let now = now_rfc3339();
        for mut pending in batch {
            let ops = std::mem::take(&mut pending.ops);
            let savepoint = tx.savepoint().map_err(backend)?;
            match apply_one(&savepoint, ops, revision + 1, &now) {
                Ok((written, events)) => {
                    savepoint.commit().map_err(backend)?;
                    // Writers that changed nothing take no revision.
                    if !events.is_empty() {
                        revision += 1;
                        changes.push((revision, events));
                    }
                    outcomes.push((pending, Ok(written)));
                }
                // Dropping the savepoint rolls this writer's ops back; the others stand.
                Err(e) => outcomes.push((pending, Err(e))),
            }
        }
        if revision == first {
            return Ok(());
        }
        tx.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'revision'",
            [revision as i64],
        )
        .map_err(backend)?;
        // Compact in steps, not at every write.
        let step = inner.retain.clamp(1, 1024);
        if revision / step != first / step && revision > inner.retain {
            let keep_from = revision - inner.retain;
            tx.execute(
                "DELETE FROM changes WHERE revision < ?1",
                [keep_from as i64],
            )
            .map_err(backend)?;
            tx.execute(
                "UPDATE meta SET value = ?1 WHERE key = 'compacted'",
                [keep_from as i64],
            )
            .map_err(backend)?;
        }
        tx.commit().map_err(backend)
    })();
    match result {
        // Published while the connection is still locked, so watchers see commit order.
        Ok(()) => {
            for (revision, events) in changes {
                for event in events {
                    let _ = inner.live.send(Arc::new(Change { revision, event }));
                }
            }
            for (pending, outcome) in outcomes {
                let _ = pending.done.send(outcome);
            }
        }
        Err(e) => {
            // Nothing of the batch was written; say so to every writer (those whose own ops
            // failed keep their own reason).
            for (pending, outcome) in outcomes {
                let _ = pending.done.send(outcome.and(Err(e.clone())));
            }
        }
    }
}

impl Store for SqliteStore {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        Box::pin(self.blocking(move |_, conn| {
            load(conn, &kind, &name)?.ok_or(StoreError::NotFound { kind, name })
        }))
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        let (kind, selector) = (kind.to_owned(), selector.clone());
        Box::pin(self.blocking(move |_, conn| {
            let tx = conn.transaction().map_err(backend)?;
            let revision = meta(&tx, "revision")?;
            let mut objects = Vec::new();
            {
                let mut stmt = tx
                    .prepare_cached("SELECT body FROM objects WHERE kind = ?1 ORDER BY name")
                    .map_err(backend)?;
                let rows = stmt
                    .query_map([&kind], |r| r.get::<_, String>(0))
                    .map_err(backend)?;
                for body in rows {
                    let object = decode(&body.map_err(backend)?)?;
                    if selector.matches(&object.metadata.labels) {
                        objects.push(object);
                    }
                }
            }
            tx.commit().map_err(backend)?;
            Ok((objects, revision))
        }))
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        Box::pin(async move {
            if ops.is_empty() {
                return Ok(Vec::new());
            }
            // Group commit: queue the ops; one committer at a time commits everything queued
            // when it takes the connection in one SQLite transaction (one fsync), each
            // writer's ops in a savepoint of their own with a revision of their own.
            let (done, result) = tokio::sync::oneshot::channel();
            let start = {
                let mut queue = self.inner.lock_queue();
                queue.pending.push(Pending { ops, done });
                !std::mem::replace(&mut queue.committing, true)
            };
            if start {
                let inner = self.inner.clone();
                tokio::task::spawn_blocking(move || committer(&inner));
            }
            result
                .await
                .map_err(|_| StoreError::Backend("the store's writer went away".into()))?
        })
    }

    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>> {
        let kind = kind.map(str::to_owned);
        Box::pin(async move {
            let filter = kind.clone();
            let (replay, live, current) = self
                .blocking(move |inner, conn| {
                    // Subscribing under the lock: nothing can commit between the replay's end and
                    // the first live change.
                    let live = inner.live.subscribe();
                    let tx = conn.transaction().map_err(backend)?;
                    let current = meta(&tx, "revision")?;
                    let compacted = meta(&tx, "compacted")?;
                    // The replay is kept as the stored text and decoded as it is read: a
                    // watch from the start replays every object, and decoded all at once they
                    // take several times their text's memory (a hub restarted with 10,000
                    // hosts: 218 MB resident 2 s after its start, 181 MB decoding as read).
                    let mut replay: Vec<(EventType, String)> = Vec::new();
                    match from {
                        None => {
                            let mut stmt = tx.prepare_cached("SELECT body FROM objects WHERE ?1 IS NULL OR kind = ?1 ORDER BY kind, name").map_err(backend)?;
                            let rows = stmt.query_map([&filter], |r| r.get::<_, String>(0)).map_err(backend)?;
                            for body in rows {
                                replay.push((EventType::Added, body.map_err(backend)?));
                            }
                        }
                        Some(from) if from + 1 < compacted => {
                            return Err(StoreError::Gone {
                                requested: from,
                                oldest: compacted,
                            });
                        }
                        Some(from) => {
                            let mut stmt = tx
                                .prepare_cached(
                                    "SELECT type, body FROM changes WHERE revision > ?1 AND (?2 IS NULL OR kind = ?2) \
                                     ORDER BY revision, seq",
                                )
                                .map_err(backend)?;
                            let rows = stmt
                                .query_map(params![from as i64, filter], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                                .map_err(backend)?;
                            for row in rows {
                                let (kind, body) = row.map_err(backend)?;
                                replay.push((event_kind(&kind)?, body));
                            }
                        }
                    }
                    tx.commit().map_err(backend)?;
                    Ok((replay, live, current.max(from.unwrap_or(0))))
                })
                .await?;
            let replayed = futures::stream::iter(replay).then(|(kind, body)| async move {
                // The reader decodes now: it gives the runtime its turn now and then.
                tokio::task::consume_budget().await;
                Ok(WatchEvent {
                    kind,
                    object: decode(&body)?,
                })
            });
            // Live changes after the replayed ones; after a lag, one `Gone` and the end.
            let live = futures::stream::unfold(Some((live, current)), move |state| {
                let kind = kind.clone();
                async move {
                    let (mut live, mut seen) = state?;
                    loop {
                        match live.recv().await {
                            Ok(change) if change.revision <= current => continue,
                            Ok(change) => {
                                seen = change.revision;
                                if kind
                                    .as_deref()
                                    .is_none_or(|k| k == change.event.object.kind)
                                {
                                    return Some((Ok(change.event.clone()), Some((live, seen))));
                                }
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                let gone = StoreError::Gone {
                                    requested: seen,
                                    oldest: seen + 1,
                                };
                                return Some((Err(gone), None));
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    }
                }
            });
            let stream: WatchStream = Box::pin(replayed.chain(live));
            Ok(stream)
        })
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.blocking(|_, conn| meta(conn, "revision")))
    }

    fn get_many(
        &self,
        kind: &str,
        names: Vec<String>,
    ) -> BoxFuture<'_, Result<Vec<Option<Object>>, StoreError>> {
        let kind = kind.to_owned();
        // One trip to the connection for them all (a list's items name hundreds of hosts).
        Box::pin(
            self.blocking(move |_, conn| {
                names.iter().map(|name| load(conn, &kind, name)).collect()
            }),
        )
    }

    fn uid(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Option<String>, StoreError>> {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        Box::pin(self.blocking(move |_, conn| stored_uid(conn, &kind, &name)))
    }

    fn uids(
        &self,
        keys: Vec<(String, String)>,
    ) -> BoxFuture<'_, Result<Vec<Option<String>>, StoreError>> {
        // One trip for them all: a trip to the blocking pool costs about what the read does.
        Box::pin(self.blocking(move |_, conn| {
            keys.iter()
                .map(|(kind, name)| stored_uid(conn, kind, name))
                .collect()
        }))
    }
}

/// The uid `kind`/`name` is stored with, read without building the object.
fn stored_uid(conn: &Connection, kind: &str, name: &str) -> Result<Option<String>, StoreError> {
    load_body(conn, kind, name)?
        .as_deref()
        .map(decode_uid)
        .transpose()
}
