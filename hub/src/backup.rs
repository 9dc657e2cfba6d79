//! `drover-hub backup` and `drover-hub restore`, and the lock that keeps a running hub and a
//! restore off the same data directory.
//!
//! A backup is one SQLite file: a consistent copy of the store made by `VACUUM INTO` (one read
//! transaction, so it may run while the hub serves and writes), plus the hub's CA certificate
//! and key in a table of their own, because a hub restored without its CA is a hub no agent
//! trusts. The file therefore holds a private key: it is written with mode 0600.
//!
//! A restore checks the file first (SQLite's integrity check, the backup's own tables, a CA
//! that loads), refuses while a hub runs on the directory, and moves what was there aside into
//! `before-restore-<time>/` instead of deleting it.

use std::{
    fs,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::{
    fsutil::write_atomic,
    pki::{CA_CERT, CA_KEY, TLS_DIR},
};

/// The store's file in the data directory.
pub const STORE_FILE: &str = "state.db";
const LOCK_FILE: &str = "hub.lock";
/// Written into every backup; a restore refuses files without it.
const FORMAT: &str = "drover-hub-backup/1";

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    // The cause is the source, printed after the path once.
    #[error("{path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Sqlite { path: String, message: String },
    #[error("{0}")]
    Refused(String),
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn sqlite_at(path: &Path) -> impl FnOnce(rusqlite::Error) -> BackupError + '_ {
    move |e| BackupError::Sqlite {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Held while a hub serves from a data directory (or a restore rewrites it); released when
/// dropped, or by the kernel when the process dies, so a crash never leaves it stuck.
#[derive(Debug)]
pub struct DataDirLock {
    _file: fs::File,
}

/// Takes the data directory's lock, or says who has it.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, BackupError> {
    let path = data_dir.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_at(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(DataDirLock { _file: file }),
        Err(fs::TryLockError::WouldBlock) => Err(BackupError::Refused(format!(
            "another drover-hub is using {} (it holds {LOCK_FILE}); stop it first, or give this \
             one its own --data-dir",
            data_dir.display()
        ))),
        Err(fs::TryLockError::Error(source)) => Err(BackupError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// What a backup holds, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub objects: u64,
    pub revision: u64,
    /// Files of the data directory carried along (the CA), by path inside it.
    pub files: Vec<String>,
    pub created_at: String,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} objects at revision {}, taken {}; files: {}",
            self.objects,
            self.revision,
            self.created_at,
            if self.files.is_empty() {
                "none (the hub used --tls certificates)".to_owned()
            } else {
                self.files.join(", ")
            }
        )
    }
}

fn summary(conn: &Connection, path: &Path) -> Result<Summary, BackupError> {
    let at = || sqlite_at(path);
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM objects", [], |r| r.get(0))
        .map_err(at())?;
    let revision: i64 = conn
        .query_row("SELECT value FROM meta WHERE key = 'revision'", [], |r| {
            r.get(0)
        })
        .map_err(at())?;
    let mut files = Vec::new();
    let mut stmt = conn
        .prepare("SELECT path FROM backup_files ORDER BY path")
        .map_err(at())?;
    for row in stmt.query_map([], |r| r.get(0)).map_err(at())? {
        files.push(row.map_err(at())?);
    }
    let created_at = conn
        .query_row(
            "SELECT value FROM backup_meta WHERE key = 'created_at'",
            [],
            |r| r.get(0),
        )
        .map_err(at())?;
    Ok(Summary {
        objects: objects as u64,
        revision: revision as u64,
        files,
        created_at,
    })
}

/// Writes a backup of the hub in `data_dir` to `out`, which must not exist. Safe while the hub
/// runs: the copy is one read transaction of the store.
pub fn backup(data_dir: &Path, out: &Path) -> Result<Summary, BackupError> {
    let store = data_dir.join(STORE_FILE);
    if !store.is_file() {
        return Err(BackupError::Refused(format!(
            "no hub state in {} (no {STORE_FILE}); pass the --data-dir the hub runs with",
            data_dir.display()
        )));
    }
    if out.exists() {
        return Err(BackupError::Refused(format!(
            "{} exists; choose a new file name (a backup never overwrites)",
            out.display()
        )));
    }
    let partial = sibling(out, ".partial");
    let _ = fs::remove_file(&partial);
    let result = (|| {
        // Empty and private before the copy lands in it: it will hold the CA's key.
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .and_then(|f| f.set_permissions(fs::Permissions::from_mode(0o600)))
            .map_err(io_at(&partial))?;
        let source = Connection::open_with_flags(&store, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(sqlite_at(&store))?;
        source
            .busy_timeout(std::time::Duration::from_secs(30))
            .map_err(sqlite_at(&store))?;
        source
            .execute("VACUUM INTO ?1", [partial.to_string_lossy()])
            .map_err(sqlite_at(&store))?;
        drop(source);

        let copy = Connection::open(&partial).map_err(sqlite_at(&partial))?;
        copy.execute_batch(
            "CREATE TABLE backup_files (path TEXT PRIMARY KEY, mode INTEGER NOT NULL, content BLOB NOT NULL);
             CREATE TABLE backup_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
        )
        .map_err(sqlite_at(&partial))?;
        for (name, mode, content) in tls_files(data_dir)? {
            copy.execute(
                "INSERT INTO backup_files VALUES (?1, ?2, ?3)",
                rusqlite::params![format!("{TLS_DIR}/{name}"), mode, content],
            )
            .map_err(sqlite_at(&partial))?;
        }
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        copy.execute(
            "INSERT INTO backup_meta VALUES ('format', ?1), ('created_at', ?2), ('hub_version', ?3)",
            [FORMAT, &now, env!("CARGO_PKG_VERSION")],
        )
        .map_err(sqlite_at(&partial))?;
        let summary = summary(&copy, &partial)?;
        copy.close().map_err(|(_, e)| sqlite_at(&partial)(e))?;
        fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(io_at(&partial))?;
        fs::rename(&partial, out).map_err(io_at(out))?;
        sync_dir(out)?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result
}

/// The CA's (and serving certificate's) files, with their permission bits.
fn tls_files(data_dir: &Path) -> Result<Vec<(String, u32, Vec<u8>)>, BackupError> {
    let dir = data_dir.join(TLS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        // A hub started with --tls has no CA of its own to carry.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_at(&dir)(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_at(&dir))?;
        let path = entry.path();
        let meta = entry.metadata().map_err(io_at(&path))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Temporary files of an atomic write in progress are not part of the state.
        if !meta.is_file() || name.starts_with('.') {
            continue;
        }
        let content = fs::read(&path).map_err(io_at(&path))?;
        files.push((name, meta.permissions().mode() & 0o777, content));
    }
    files.sort();
    Ok(files)
}

/// Checks that `file` is a whole, readable Drover backup; returns what it holds.
pub fn verify(file: &Path) -> Result<Summary, BackupError> {
    let conn = Connection::open_with_flags(file, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(sqlite_at(file))?;
    let not_backup = |why: String| {
        BackupError::Refused(format!(
            "{} is not a usable Drover backup ({why}); nothing was changed",
            file.display()
        ))
    };
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| not_backup(e.to_string()))?;
    if integrity != "ok" {
        return Err(not_backup(format!("integrity check: {integrity}")));
    }
    let format: Option<String> = conn
        .query_row(
            "SELECT value FROM backup_meta WHERE key = 'format'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| not_backup(e.to_string()))?;
    if format.as_deref() != Some(FORMAT) {
        return Err(not_backup(format!(
            "format {:?}, expected {FORMAT:?}",
            format.unwrap_or_default()
        )));
    }
    let summary = summary(&conn, file).map_err(|e| not_backup(e.to_string()))?;
    let file_content = |path: &str| -> Result<Option<Vec<u8>>, BackupError> {
        conn.query_row(
            "SELECT content FROM backup_files WHERE path = ?1",
            [path],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| not_backup(e.to_string()))
    };
    if let (Some(cert), Some(key)) = (
        file_content(&format!("{TLS_DIR}/{}", CA_CERT))?,
        file_content(&format!("{TLS_DIR}/{}", CA_KEY))?,
    ) {
        tunnel::tls::CertificateAuthority::from_pem(
            &String::from_utf8_lossy(&cert),
            &String::from_utf8_lossy(&key),
        )
        .map_err(|e| not_backup(format!("its CA does not load: {e}")))?;
    }
    Ok(summary)
}

/// What a restore did.
#[derive(Debug)]
pub struct Restored {
    pub summary: Summary,
    /// Where the state that was replaced now is (`None`: the directory held none).
    pub previous: Option<PathBuf>,
}

/// Replaces the hub state in `data_dir` with the backup in `from`. Refuses while a hub runs
/// there; keeps the replaced state in `data_dir/before-restore-<time>/`.
pub fn restore(data_dir: &Path, from: &Path) -> Result<Restored, BackupError> {
    let summary = verify(from)?;
    fs::create_dir_all(data_dir).map_err(io_at(data_dir))?;
    let _lock = lock_data_dir(data_dir).map_err(|e| match e {
        BackupError::Refused(_) => BackupError::Refused(format!(
            "a hub is running on {}; stop it first: a restore replaces its state",
            data_dir.display()
        )),
        other => other,
    })?;

    // The store first, staged beside its final place, without the backup's own tables.
    let staged = data_dir.join(format!("{STORE_FILE}.restoring"));
    let _ = fs::remove_file(&staged);
    fs::copy(from, &staged).map_err(io_at(&staged))?;
    let files = (|| {
        let conn = Connection::open(&staged).map_err(sqlite_at(&staged))?;
        let mut files = Vec::new();
        {
            let mut stmt = conn
                .prepare("SELECT path, mode, content FROM backup_files ORDER BY path")
                .map_err(sqlite_at(&staged))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?, r.get(2)?))
                })
                .map_err(sqlite_at(&staged))?;
            for row in rows {
                files.push(row.map_err(sqlite_at(&staged))?);
            }
        }
        conn.execute_batch("DROP TABLE backup_files; DROP TABLE backup_meta;")
            .map_err(sqlite_at(&staged))?;
        conn.close().map_err(|(_, e)| sqlite_at(&staged)(e))?;
        fs::File::open(&staged)
            .and_then(|f| f.sync_all())
            .map_err(io_at(&staged))?;
        Ok::<Vec<(String, u32, Vec<u8>)>, BackupError>(files)
    })();
    let files = match files {
        Ok(files) => files,
        Err(e) => {
            let _ = fs::remove_file(&staged);
            return Err(e);
        }
    };

    // Then what was there moves aside, whole, and the new state takes its place.
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let aside = data_dir.join(format!("before-restore-{stamp}"));
    let mut moved = false;
    for name in [
        STORE_FILE.to_owned(),
        format!("{STORE_FILE}-wal"),
        format!("{STORE_FILE}-shm"),
        TLS_DIR.to_owned(),
    ] {
        let path = data_dir.join(&name);
        if path.exists() {
            fs::create_dir_all(&aside).map_err(io_at(&aside))?;
            fs::rename(&path, aside.join(&name)).map_err(io_at(&path))?;
            moved = true;
        }
    }
    let store = data_dir.join(STORE_FILE);
    fs::rename(&staged, &store).map_err(io_at(&store))?;
    for (path, mode, content) in &files {
        let target = data_dir.join(path);
        if let Some(dir) = target.parent() {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        write_atomic(&target, content, *mode).map_err(io_at(&target))?;
    }
    sync_dir(&store)?;
    Ok(Restored {
        summary,
        previous: moved.then_some(aside),
    })
}

/// `path` with `suffix` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

fn sync_dir(file: &Path) -> Result<(), BackupError> {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

#[cfg(test)]
mod tests;
