//! The log's files: appended to and rotated by size, and read back for `/v1/audit`.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use super::Record;

/// Appends JSON lines to a file, rotating it past a size.
pub(super) struct Appender {
    path: PathBuf,
    file: std::fs::File,
    size: u64,
    max_bytes: u64,
    keep: usize,
}

impl Appender {
    pub(super) fn open(path: &Path, max_bytes: u64, keep: usize) -> std::io::Result<Self> {
        let file = open_owner_only(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            file,
            size,
            max_bytes,
            keep,
        })
    }

    /// Appends `text` (whole JSON lines), rotating first if it would go past the size.
    pub(super) fn append(&mut self, text: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + text.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(text)?;
        self.file.flush()?;
        self.size += text.len() as u64;
        Ok(())
    }

    /// `audit.log` becomes `audit.log.1`, `.1` becomes `.2`, …; the oldest beyond `keep` goes.
    fn rotate(&mut self) -> std::io::Result<()> {
        let numbered = |n: usize| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            let _ = std::fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                let _ = std::fs::rename(numbered(n), numbered(n + 1));
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.file = open_owner_only(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The files of the log, oldest first.
pub fn files(path: &Path, keep: usize) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=keep.max(1))
        .rev()
        .map(|n| PathBuf::from(format!("{}.{n}", path.display())))
        .filter(|p| p.exists())
        .collect();
    if path.exists() {
        files.push(path.to_owned());
    }
    files
}

/// What `/v1/audit` is asked for.
#[derive(Debug, Default, Deserialize)]
pub struct AuditQuery {
    pub user: Option<String>,
    pub cluster: Option<String>,
    /// RFC 3339: records at or after it.
    pub since: Option<String>,
    /// At most this many (the newest), 1,000 by default.
    pub limit: Option<usize>,
}

/// The records `query` asks for, oldest first, from the log's files.
pub fn read(path: &Path, keep: usize, query: &AuditQuery) -> std::io::Result<Vec<Record<'static>>> {
    let since = query
        .since
        .as_deref()
        .map(|s| crate::model::parse_time(s).ok_or(()))
        .transpose()
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "since: an RFC 3339 time, as 2026-11-26T12:00:00Z",
            )
        })?;
    let limit = query.limit.unwrap_or(1000).clamp(1, 100_000);
    let mut out = std::collections::VecDeque::new();
    for file in files(path, keep) {
        let text = std::fs::read_to_string(&file)?;
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Record<'static>>(line) else {
                continue;
            };
            let wanted = query.user.as_ref().is_none_or(|u| **u == *record.user)
                && query
                    .cluster
                    .as_ref()
                    .is_none_or(|c| **c == *record.cluster)
                && since
                    .is_none_or(|s| crate::model::parse_time(&record.time).is_some_and(|t| t >= s));
            if wanted {
                out.push_back(record);
                if out.len() > limit {
                    out.pop_front();
                }
            }
        }
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record, as the writer is sent it: one JSON line.
    fn record(user: &str, cluster: &str, time: &str) -> Vec<u8> {
        let record = Record {
            time: time.into(),
            request_id: "r".into(),
            user: user.into(),
            groups: Vec::new().into(),
            provider: "local".into(),
            source: "127.0.0.1:1".into(),
            verb: "get".into(),
            method: "GET".into(),
            path: "/k8s/clusters/x".into(),
            cluster: cluster.into(),
            resource: "".into(),
            name: "".into(),
            code: 200,
            request_object: None,
        };
        let mut line = serde_json::to_vec(&record).unwrap();
        line.push(b'\n');
        line
    }

    #[test]
    fn the_log_rotates_by_size_and_is_read_back_in_order_across_its_files() {
        let dir = std::env::temp_dir().join(format!("drover-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        let one = record("ann", "prod", "2026-11-26T10:00:00.000Z").len() as u64;
        // Room for two records a file, two rotated files kept.
        let mut log = Appender::open(&path, one * 2, 2).unwrap();
        for i in 0..7 {
            let user = if i % 2 == 0 { "ann" } else { "bob" };
            log.append(&record(
                user,
                "prod",
                &format!("2026-11-26T10:00:0{i}.000Z"),
            ))
            .unwrap();
        }
        assert_eq!(files(&path, 2).len(), 3);
        assert!(!PathBuf::from(format!("{}.3", path.display())).exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Seven written: 0-1, 2-3 and 4-5 filled a file each, 6 started the fourth; with two
        // rotated files kept, 0-1 are gone. Read oldest first.
        let all = read(&path, 2, &AuditQuery::default()).unwrap();
        let times: Vec<&str> = all.iter().map(|r| &r.time[17..19]).collect();
        assert_eq!(times, ["02", "03", "04", "05", "06"]);
        let bobs = read(
            &path,
            2,
            &AuditQuery {
                user: Some("bob".into()),
                since: Some("2026-11-26T10:00:04Z".into()),
                ..AuditQuery::default()
            },
        )
        .unwrap();
        assert_eq!(bobs.len(), 1);
        assert_eq!(bobs[0].time, "2026-11-26T10:00:05.000Z");
        let bad = read(
            &path,
            2,
            &AuditQuery {
                since: Some("yesterday".into()),
                ..AuditQuery::default()
            },
        );
        assert!(bad.is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
