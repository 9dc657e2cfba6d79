//! The machines' usage charts on disk: every closed minute of the last 24 hours, in a SQLite
//! file of their own beside the store (`charts.db` in the data directory). In memory a day of
//! one-minute points costs 34 KiB a machine, more than everything else the hub keeps for an
//! agent; on disk it costs nothing per agent while the hub runs, and a restarted hub keeps
//! its charts. Minutes are written in batches ([`Charts::flush`], every few seconds), so a
//! chart is read from the file and the minutes not written yet.
//!
//! Charts are a view, not the hub's record: the file is written without waiting for the disk
//! (a crash may lose its last seconds), and a hub that cannot open it keeps them in memory.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Mutex, MutexGuard},
};

use rusqlite::{Connection, OptionalExtension, params};

use super::history::{Kept, Point, oldest_minute};

/// The file's name in the data directory.
pub const FILE: &str = "charts.db";

/// Closed minutes waiting to be written, at most: a disk that keeps failing costs the hub this
/// much memory, not more (about 20 MB).
const MAX_PENDING: usize = 500_000;

/// Minutes written per transaction: readers wait for one batch at most.
const BATCH: usize = 2_000;

/// A machine's last minute is written to the file at most this often (in minutes), not with
/// every minute: a machine is forgotten a day and at most this long after its last minute.
const LAST_EVERY: u32 = 60;

struct Db {
    conn: Connection,
    /// Each machine as the file has it, by peer id, once looked up.
    ids: HashMap<String, Machine>,
}

#[derive(Debug, Clone, Copy)]
struct Machine {
    id: i64,
    /// The last minute the file records for it (see [`LAST_EVERY`]).
    last: u32,
}

/// See the module's comment.
pub struct Charts {
    db: Mutex<Db>,
    pending: Mutex<Vec<(String, Kept)>>,
    /// Minutes dropped since the last flush because too many were waiting.
    dropped: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Charts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charts")
            .field("pending", &self.lock_pending().len())
            .finish_non_exhaustive()
    }
}

impl Charts {
    /// Opens (creating if needed) the charts' file at `path`.
    pub fn open(path: &Path) -> Result<Self, String> {
        let fail = |e: &dyn std::fmt::Display| format!("charts file {}: {e}", path.display());
        let conn = Connection::open(path).map_err(|e| fail(&e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| fail(&e))?;
        // Usage figures say what runs on the machines: owner-only, as the store's files.
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            crate::fsutil::owner_only_file(Path::new(&file)).map_err(|e| fail(&e))?;
        }
        Self::with(conn).map_err(|e| fail(&e))
    }

    /// Charts kept in memory only (tests, or a hub that cannot open its file).
    // SQLite opens an in-memory database unless the process is out of memory.
    #[allow(clippy::expect_used)]
    pub fn in_memory() -> Self {
        Connection::open_in_memory()
            .and_then(Self::with)
            .expect("an in-memory SQLite database opens")
    }

    fn with(conn: Connection) -> rusqlite::Result<Self> {
        // Not the hub's record (see the module's comment): no wait for the disk per commit.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS machines (
                 id INTEGER PRIMARY KEY, peer TEXT NOT NULL UNIQUE,
                 last INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE IF NOT EXISTS minutes (
                 machine INTEGER NOT NULL, minute INTEGER NOT NULL,
                 cpu INTEGER NOT NULL, load INTEGER NOT NULL, memory INTEGER NOT NULL,
                 disk INTEGER NOT NULL, rx INTEGER NOT NULL, tx INTEGER NOT NULL,
                 PRIMARY KEY (minute, machine)) WITHOUT ROWID;",
        )?;
        add_last_minutes(&conn)?;
        Ok(Self {
            db: Mutex::new(Db {
                conn,
                ids: HashMap::new(),
            }),
            pending: Mutex::default(),
            dropped: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn lock_db(&self) -> MutexGuard<'_, Db> {
        // A panic mid-transaction rolls it back when the transaction is dropped.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_pending(&self) -> MutexGuard<'_, Vec<(String, Kept)>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a closed minute of `peer`'s machine (written by the next [`Charts::flush`]).
    pub fn keep(&self, peer: &str, minute: Kept) {
        let mut pending = self.lock_pending();
        if pending.len() >= MAX_PENDING {
            // Said once a flush, not once a machine.
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        pending.push((peer.to_owned(), minute));
    }

    /// Writes the minutes kept since the last flush, and forgets every minute older than 24
    /// hours before `now` (seconds since the Unix epoch). Blocks on the disk: call it from a
    /// blocking thread.
    pub fn flush(&self, now: u64) {
        let pending = std::mem::take(&mut *self.lock_pending());
        let dropped = self.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "the charts file was not written for a while; minutes of usage were dropped"
            );
        }
        let oldest = oldest_minute(now);
        for batch in pending.chunks(BATCH) {
            let mut db = self.lock_db();
            if let Err(e) = write(&mut db, batch) {
                tracing::warn!(error = %e, minutes = batch.len(), "cannot write usage charts; these minutes are lost");
            }
        }
        if let Err(e) = forget(&mut self.lock_db(), oldest) {
            tracing::warn!(error = %e, "cannot forget old usage minutes");
        }
    }

    /// `peer`'s closed minutes within the 24 hours before `now`, oldest first.
    pub fn points(&self, peer: &str, now: u64) -> Vec<Point> {
        let oldest = oldest_minute(now);
        let newest = u32::try_from(now / 60).unwrap_or(u32::MAX);
        let mut minutes: Vec<Kept> = {
            let mut db = self.lock_db();
            read(&mut db, peer, oldest, newest).unwrap_or_else(|e| {
                tracing::warn!(%peer, error = %e, "cannot read the charts file");
                Vec::new()
            })
        };
        // Not written yet: newer than anything in the file for this machine.
        minutes.extend(
            self.lock_pending()
                .iter()
                .filter(|(p, k)| p == peer && k.minute >= oldest)
                .map(|(_, k)| *k),
        );
        minutes.sort_by_key(|k| k.minute);
        // A minute written again (a hub restarted within it) shows once, as last kept.
        minutes.dedup_by(|later, earlier| {
            let same = later.minute == earlier.minute;
            if same {
                *earlier = *later;
            }
            same
        });
        minutes.iter().map(Kept::point).collect()
    }
}

/// Files written before machines had a last minute: each machine counts as seen now, so it
/// is forgotten a day after it last sent a minute from now on.
fn add_last_minutes(conn: &Connection) -> rusqlite::Result<()> {
    let has_last: bool = conn.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info('machines') WHERE name = 'last'",
        [],
        |r| r.get(0),
    )?;
    if has_last {
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs() / 60).unwrap_or(u32::MAX));
    conn.execute_batch("BEGIN")?;
    let added = conn
        .execute_batch("ALTER TABLE machines ADD COLUMN last INTEGER NOT NULL DEFAULT 0")
        .and_then(|()| conn.execute("UPDATE machines SET last = ?1", [now]));
    end_transaction(conn, added).map(drop)
}

/// Commits the transaction begun on `conn` if `done` is a success, else rolls it back.
fn end_transaction<T>(conn: &Connection, done: rusqlite::Result<T>) -> rusqlite::Result<T> {
    match done {
        Ok(value) => conn.execute_batch("COMMIT").map(|()| value),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Forgets every minute before `oldest`, and the machines that sent none since (a machine
/// removed, or replaced under another name, would otherwise keep its row and its id in memory
/// for as long as the hub runs). A machine's recorded last minute may be [`LAST_EVERY`]
/// behind its true one.
fn forget(db: &mut Db, oldest: u32) -> rusqlite::Result<()> {
    // Minutes are keyed by time first, so the day's oldest are the file's first pages.
    db.conn
        .prepare_cached("DELETE FROM minutes WHERE minute < ?1")?
        .execute([oldest])?;
    let gone = db
        .conn
        .prepare_cached("DELETE FROM machines WHERE last < ?1 RETURNING peer")?
        .query_map([oldest.saturating_sub(LAST_EVERY)], |r| {
            r.get::<_, String>(0)
        })?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    for peer in gone {
        db.ids.remove(&peer);
    }
    Ok(())
}

/// The machine in the file, made if `create` and it has none.
fn machine(db: &mut Db, peer: &str, create: bool) -> rusqlite::Result<Option<Machine>> {
    if let Some(machine) = db.ids.get(peer) {
        return Ok(Some(*machine));
    }
    if create {
        db.conn
            .prepare_cached("INSERT OR IGNORE INTO machines (peer) VALUES (?1)")?
            .execute([peer])?;
    }
    let machine = db
        .conn
        .prepare_cached("SELECT id, last FROM machines WHERE peer = ?1")?
        .query_row([peer], |r| {
            Ok(Machine {
                id: r.get(0)?,
                last: r.get(1)?,
            })
        })
        .optional()?;
    if let Some(machine) = machine {
        db.ids.insert(peer.to_owned(), machine);
    }
    Ok(machine)
}

fn write(db: &mut Db, batch: &[(String, Kept)]) -> rusqlite::Result<()> {
    db.conn.execute_batch("BEGIN")?;
    let written = (|| {
        for (peer, k) in batch {
            let Some(Machine { id, last }) = machine(db, peer, true)? else {
                continue;
            };
            db.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO minutes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute(params![
                    id,
                    k.minute,
                    k.cpu_centi,
                    k.load_centi,
                    k.memory_kib,
                    k.disk_mib,
                    i64::try_from(k.net_rx_rate).unwrap_or(i64::MAX),
                    i64::try_from(k.net_tx_rate).unwrap_or(i64::MAX),
                ])?;
            if k.minute >= last.saturating_add(LAST_EVERY) {
                db.conn
                    .prepare_cached("UPDATE machines SET last = ?2 WHERE id = ?1")?
                    .execute(params![id, k.minute])?;
                if let Some(machine) = db.ids.get_mut(peer) {
                    machine.last = k.minute;
                }
            }
        }
        Ok(())
    })();
    let ended = end_transaction(&db.conn, written);
    if ended.is_err() {
        // What was learned of machines inside the transaction went with it.
        db.ids.clear();
    }
    ended
}

/// One machine's minutes from `oldest` to `newest`: a lookup a minute. Minutes are keyed by
/// time first so that a flush appends to the file's end instead of touching a page per machine
/// (at 10,000 machines that was 40 MB written a minute for 240 KB of figures).
fn read(db: &mut Db, peer: &str, oldest: u32, newest: u32) -> rusqlite::Result<Vec<Kept>> {
    let Some(Machine { id, .. }) = machine(db, peer, false)? else {
        return Ok(Vec::new());
    };
    let mut stmt = db.conn.prepare_cached(
        "SELECT cpu, load, memory, disk, rx, tx FROM minutes WHERE minute = ?1 AND machine = ?2",
    )?;
    let mut kept = Vec::new();
    for minute in oldest..=newest {
        let row = stmt
            .query_row(params![minute, id], |r| {
                Ok(Kept {
                    minute,
                    cpu_centi: r.get(0)?,
                    load_centi: r.get(1)?,
                    memory_kib: r.get(2)?,
                    disk_mib: r.get(3)?,
                    net_rx_rate: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
                    net_tx_rate: u64::try_from(r.get::<_, i64>(5)?).unwrap_or(0),
                })
            })
            .optional()?;
        kept.extend(row);
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::history::{History, MINUTES, tests::usage};

    /// A directory of the test's own, removed when dropped.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("drover-charts-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Three days of a sample every 10 s, flushed every 15 s as the hub does.
    fn three_days(charts: &Charts, peer: &str, start: u64) -> (History, u64) {
        let mut h = History::default();
        let end = start + 3 * 24 * 3600;
        for t in (start..end).step_by(10) {
            if let Some(closed) = h.record(t, &usage(((t / 10) % 100) as f32, t, t * 100)) {
                charts.keep(peer, closed);
            }
            if t % 15 == 0 {
                charts.flush(t);
            }
        }
        (h, end - 10)
    }

    #[test]
    fn three_days_of_samples_keep_one_day_in_the_file_and_none_in_memory() {
        let dir = Dir::new("days");
        let charts = Charts::open(&dir.0.join(FILE)).unwrap();
        let (h, now) = three_days(&charts, "host/h1", 1_800_000_000);
        assert!(charts.lock_pending().is_empty(), "minutes left unwritten");
        let mut points = charts.points("host/h1", now);
        points.extend(h.open_point(now));
        assert_eq!(points.len(), MINUTES);
        let minutes: Vec<u32> = points.iter().map(|p| p.minute).collect();
        assert!(
            minutes.windows(2).all(|w| w[1] == w[0] + 1),
            "a gap or a repeat"
        );
        assert_eq!(*minutes.last().unwrap(), u32::try_from(now / 60).unwrap());
        // 100 bytes a second throughout; memory within the KiB it is kept in.
        assert!(points.iter().all(|p| p.net_rx_rate == 100.0));
        let last_closed = points[MINUTES - 2];
        let sampled = u64::from(last_closed.minute) * 60 + 50;
        assert!(
            sampled - last_closed.memory_used_bytes < 1024,
            "{last_closed:?}"
        );
        // What is older than the day left the file as it went.
        let rows: i64 = charts
            .lock_db()
            .conn
            .query_row("SELECT count(*) FROM minutes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, MINUTES as i64 - 1);
    }

    #[test]
    fn a_restarted_hub_reads_the_charts_it_wrote() {
        let dir = Dir::new("restart");
        let path = dir.0.join(FILE);
        let t = 1_800_000_000 / 60 * 60;
        {
            let charts = Charts::open(&path).unwrap();
            let mut h = History::default();
            for minute in 0..5 {
                if let Some(closed) = h.record(t + minute * 60, &usage(10.0 * minute as f32, 0, 0))
                {
                    charts.keep("node/c/n1", closed);
                }
            }
            charts.flush(t + 300);
        }
        let charts = Charts::open(&path).unwrap();
        let cpu: Vec<f32> = charts
            .points("node/c/n1", t + 300)
            .iter()
            .map(|p| p.cpu_percent)
            .collect();
        assert_eq!(cpu, [0.0, 10.0, 20.0, 30.0]);
        assert!(charts.points("node/c/n2", t + 300).is_empty());
        // The file is the hub's owner's alone.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{mode:o}");
        }
    }

    #[test]
    fn minutes_not_written_yet_are_in_the_chart_and_a_machine_gone_a_day_leaves_the_file() {
        let charts = Charts::in_memory();
        let t = 1_800_000_000 / 60 * 60;
        let kept = |minute: u64, cpu: f32| {
            Kept::of(&Point {
                minute: u32::try_from(minute / 60).unwrap(),
                cpu_percent: cpu,
                memory_used_bytes: 0,
                disk_used_bytes: 0,
                load1: 0.0,
                net_rx_rate: 0.0,
                net_tx_rate: 0.0,
            })
        };
        charts.keep("host/gone", kept(t, 1.0));
        charts.flush(t + 60);
        charts.keep("host/gone", kept(t + 60, 2.0));
        // One flushed, one still waiting: both shown, in order.
        let cpu: Vec<f32> = charts
            .points("host/gone", t + 120)
            .iter()
            .map(|p| p.cpu_percent)
            .collect();
        assert_eq!(cpu, [1.0, 2.0]);
        charts.flush(t + 120);
        // A day later nothing more came from it: the next flush (of other machines' minutes)
        // forgets it.
        let later = t + 60 + 24 * 3600;
        charts.keep("host/other", kept(later, 3.0));
        charts.flush(later);
        let rows: i64 = charts
            .lock_db()
            .conn
            .query_row("SELECT count(*) FROM minutes", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 1);
        assert!(charts.points("host/gone", later).is_empty());
        // An hour on (its last minute in the file may be that late), nor does the file keep a
        // row for it, nor the hub its id.
        let later = later + 3600;
        charts.keep("host/other", kept(later, 3.0));
        charts.flush(later);
        let machines: Vec<String> = {
            let db = charts.lock_db();
            let mut stmt = db.conn.prepare("SELECT peer FROM machines").unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        assert_eq!(machines, ["host/other"]);
        assert!(!charts.lock_db().ids.contains_key("host/gone"));
        // Should it come back, its chart starts afresh.
        charts.keep("host/gone", kept(later + 60, 4.0));
        charts.flush(later + 120);
        let cpu: Vec<f32> = charts
            .points("host/gone", later + 120)
            .iter()
            .map(|p| p.cpu_percent)
            .collect();
        assert_eq!(cpu, [4.0]);
    }

    /// A file written before machines had a last minute keeps its charts, and its machines
    /// are forgotten a day after they stop sending minutes, as any.
    #[test]
    fn a_file_from_before_last_minutes_keeps_its_charts() {
        let dir = Dir::new("upgrade");
        let path = dir.0.join(FILE);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 60
            * 60;
        let minute = u32::try_from(now / 60).unwrap() - 10;
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE machines (id INTEGER PRIMARY KEY, peer TEXT NOT NULL UNIQUE);
                 CREATE TABLE minutes (
                     machine INTEGER NOT NULL, minute INTEGER NOT NULL,
                     cpu INTEGER NOT NULL, load INTEGER NOT NULL, memory INTEGER NOT NULL,
                     disk INTEGER NOT NULL, rx INTEGER NOT NULL, tx INTEGER NOT NULL,
                     PRIMARY KEY (minute, machine)) WITHOUT ROWID;
                 INSERT INTO machines VALUES (1, 'host/old');",
            )
            .unwrap();
            conn.execute(
                "INSERT INTO minutes VALUES (1, ?1, 2500, 0, 0, 0, 0, 0)",
                [minute],
            )
            .unwrap();
        }
        let charts = Charts::open(&path).unwrap();
        let points = charts.points("host/old", now);
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].cpu_percent, 25.0);
        // A flush now keeps it (it counts as seen when the file was opened) ...
        charts.flush(now);
        assert_eq!(charts.points("host/old", now).len(), 1);
        // ... and a flush a day (and the hour a last minute may lag) after that forgets it.
        charts.flush(now + 25 * 3600 + 60);
        let machines: i64 = charts
            .lock_db()
            .conn
            .query_row("SELECT count(*) FROM machines", [], |r| r.get(0))
            .unwrap();
        assert_eq!(machines, 0);
    }
}
