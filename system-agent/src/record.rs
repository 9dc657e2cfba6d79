//! One plan's durable record on the host: the plan the agent was given, its latest status, and
//! how far the hub has acknowledged that status. Every change reaches the disk atomically (temp
//! file, fsync, rename, fsync of the directory) before anyone hears of it, so a crash never
//! forgets that a plan was in progress, and a status is kept until the hub has it.

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use proto::plan::v1::{Plan, PlanStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// What is kept on disk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Persisted {
    /// The plan to apply and its checksum (empty: none).
    checksum: String,
    plan: Option<Plan>,
    status: PlanStatus,
    /// The last status sequence number the hub acknowledged.
    acked_seq: u64,
    /// The instruction running now, so that after a crash it is stopped before the plan runs
    /// again (it was started in a process group of its own and would outlive the agent).
    running: Option<Running>,
}

/// A process group an instruction runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Running {
    pub pid: u32,
    /// From `/proc/<pid>/stat`, so a reused pid is never mistaken for it.
    pub start_time: u64,
}

/// A plan slot's record, shared by the task applying it and the task reporting it.
#[derive(Debug)]
pub struct Record {
    path: PathBuf,
    inner: Mutex<Persisted>,
    /// Bumped when the plan to apply changes.
    desired: watch::Sender<u64>,
    /// The latest status's sequence number.
    status: watch::Sender<u64>,
}

impl Record {
    /// Opens the record at `path`, or starts an empty one.
    pub fn open(path: &Path) -> std::io::Result<Arc<Record>> {
        let persisted = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Persisted::default(),
            Err(e) => return Err(e),
        };
        let seq = persisted.status.seq;
        Ok(Arc::new(Record {
            path: path.to_owned(),
            inner: Mutex::new(persisted),
            desired: watch::Sender::new(0),
            status: watch::Sender::new(seq),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Persisted> {
        // A panic while holding the lock leaves the last fully written state; go on with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The plan to apply: its checksum and the plan (none yet: empty and `None`).
    pub fn desired(&self) -> (String, Option<Plan>) {
        let inner = self.lock();
        (inner.checksum.clone(), inner.plan.clone())
    }

    /// Sets the plan to apply; returns whether it changed.
    pub fn set_desired(&self, checksum: String, plan: Option<Plan>) -> std::io::Result<bool> {
        let mut inner = self.lock();
        if inner.checksum == checksum {
            return Ok(false);
        }
        let mut next = inner.clone();
        next.checksum = checksum;
        next.plan = plan;
        write_atomically(&self.path, &next)?;
        *inner = next;
        drop(inner);
        self.desired.send_modify(|n| *n += 1);
        Ok(true)
    }

    /// Notified when the plan to apply changes.
    pub fn watch_desired(&self) -> watch::Receiver<u64> {
        self.desired.subscribe()
    }

    /// Notified when a new status is recorded.
    pub fn watch_status(&self) -> watch::Receiver<u64> {
        self.status.subscribe()
    }

    pub fn status(&self) -> PlanStatus {
        self.lock().status.clone()
    }

    /// Changes the status, on disk first; returns it as recorded.
    pub fn record(&self, change: impl FnOnce(&mut PlanStatus)) -> std::io::Result<PlanStatus> {
        let mut inner = self.lock();
        let mut next = inner.clone();
        change(&mut next.status);
        next.status.seq = inner.status.seq + 1;
        write_atomically(&self.path, &next)?;
        *inner = next;
        let status = inner.status.clone();
        drop(inner);
        self.status.send_replace(status.seq);
        Ok(status)
    }

    /// Records the instruction running now (`None` once it has ended).
    pub fn set_running(&self, running: Option<Running>) -> std::io::Result<()> {
        let mut inner = self.lock();
        if inner.running == running {
            return Ok(());
        }
        let mut next = inner.clone();
        next.running = running;
        write_atomically(&self.path, &next)?;
        *inner = next;
        Ok(())
    }

    pub fn running(&self) -> Option<Running> {
        self.lock().running
    }

    /// The latest status if the hub has not acknowledged it yet.
    pub fn unacked(&self) -> Option<PlanStatus> {
        let inner = self.lock();
        (inner.status.seq > inner.acked_seq).then(|| inner.status.clone())
    }

    /// The hub has the status numbered `seq`.
    pub fn ack(&self, seq: u64) -> std::io::Result<()> {
        let mut inner = self.lock();
        if seq <= inner.acked_seq {
            return Ok(());
        }
        let mut next = inner.clone();
        next.acked_seq = seq.min(next.status.seq);
        write_atomically(&self.path, &next)?;
        *inner = next;
        Ok(())
    }
}

/// Writes `value` as JSON to `path` so that a reader (or a restart after a crash) sees either
/// the old content or the new, never a mix.
fn write_atomically(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value)?;
    write_file_atomically(path, &bytes, 0o600)
}

/// Temp file in the same directory, fsync, rename over `path`, fsync the directory.
pub(crate) fn write_file_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.drover-tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::plan::v1::PlanState;

    #[test]
    fn status_and_plan_survive_reopening_and_acks_are_kept() {
        let dir = tempdir();
        let path = dir.join("plan.json");
        let record = Record::open(&path).unwrap();
        assert_eq!(record.desired(), (String::new(), None));
        assert!(
            record
                .set_desired("abc".into(), Some(Plan::default()))
                .unwrap()
        );
        assert!(
            !record
                .set_desired("abc".into(), Some(Plan::default()))
                .unwrap()
        );
        let s = record
            .record(|s| s.state = PlanState::InProgress as i32)
            .unwrap();
        assert_eq!(s.seq, 1);
        assert_eq!(record.unacked().map(|s| s.seq), Some(1));
        record.record(|s| s.failure_count = 2).unwrap();
        record.ack(1).unwrap();
        assert_eq!(record.unacked().map(|s| s.seq), Some(2));
        drop(record);

        let again = Record::open(&path).unwrap();
        assert_eq!(again.desired().0, "abc");
        let status = again.status();
        assert_eq!(
            (status.state, status.failure_count, status.seq),
            (PlanState::InProgress as i32, 2, 2)
        );
        assert_eq!(again.unacked().map(|s| s.seq), Some(2));
        again.ack(2).unwrap();
        assert!(Record::open(&path).unwrap().unacked().is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file() {
        let dir = tempdir();
        let path = dir.join("plan.json");
        std::fs::write(&path, b"{not json").unwrap();
        let err = Record::open(&path).unwrap_err();
        assert!(err.to_string().contains("plan.json"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    pub(crate) fn tempdir() -> PathBuf {
        crate::testing::tempdir()
    }
}
