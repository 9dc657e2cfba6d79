//! A local plan directory, for hosts with no hub (air-gapped, or while debugging): each
//! `NAME.json` in it is a plan (the JSON form of `drover.plan.v1.Plan`), applied like one from
//! the hub, with its record (and so its status) in `<agent dir>/local/NAME.json`. The directory
//! is read every two seconds; a changed file is a new plan, a removed one is left as it was.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use proto::plan::v1::{Plan, PlanState, checksum};
use tokio_util::sync::CancellationToken;

use crate::{applier, record::Record};

/// How often the directory is read.
const EVERY: Duration = Duration::from_secs(2);

struct Slot {
    record: Arc<Record>,
    stop: CancellationToken,
    /// The file's bytes last read, so an unchanged file is not parsed again.
    seen: Vec<u8>,
}

/// Follows `plans` until `shutdown`, keeping records in `records`; they land where `root` says.
pub async fn follow(
    plans: PathBuf,
    records: PathBuf,
    retry: applier::Retry,
    root: crate::root::Root,
    shutdown: CancellationToken,
) {
    if let Err(e) = std::fs::create_dir_all(&records) {
        tracing::error!(dir = %records.display(), error = %e, "cannot keep local plan records");
        return;
    }
    tracing::info!(dir = %plans.display(), "applying local plans");
    let mut slots: HashMap<String, Slot> = HashMap::new();
    loop {
        let found = plan_files(&plans);
        slots.retain(|name, slot| {
            let keep = found.contains_key(name);
            if !keep {
                slot.stop.cancel();
            }
            keep
        });
        for (name, path) in found {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            if slots.get(&name).is_some_and(|s| s.seen == bytes) {
                continue;
            }
            let slot = match slots.get_mut(&name) {
                Some(slot) => slot,
                None => {
                    let record = match Record::open(&records.join(format!("{name}.json"))) {
                        Ok(r) => r,
                        Err(e) => {
                            tracing::error!(plan = %name, error = %e, "cannot open the plan's record");
                            continue;
                        }
                    };
                    let stop = shutdown.child_token();
                    tokio::spawn(applier::drive(
                        record.clone(),
                        retry,
                        None,
                        root.clone(),
                        stop.clone(),
                    ));
                    slots.entry(name.clone()).or_insert(Slot {
                        record,
                        stop,
                        seen: Vec::new(),
                    })
                }
            };
            // A plan not kept is read again next time, as if the file had changed.
            if take(&name, &path, &bytes, &slot.record) {
                slot.seen = bytes;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// `NAME.json` files in `dir`, by name.
fn plan_files(dir: &Path) -> HashMap<String, PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
        .filter_map(|p| Some((p.file_stem()?.to_str()?.to_owned(), p)))
        .collect()
}

/// Hands a plan file's content to its record; a file that is not a plan is reported in the
/// record's status, naming the file, and nothing runs. False when the record could not be
/// written, so the file is taken again on the next read.
fn take(name: &str, path: &Path, bytes: &[u8], record: &Record) -> bool {
    match serde_json::from_slice::<Plan>(bytes) {
        Ok(plan) => match record.set_desired(checksum(&plan), Some(plan)) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(plan = %name, error = %e, retry_in = ?EVERY, "cannot keep the plan on disk; it is read again");
                false
            }
        },
        Err(e) => {
            let message = format!("{}: not a plan: {e}", path.display());
            tracing::warn!("{message}");
            let kept = record.record(|s| {
                s.checksum.clear();
                s.state = PlanState::Failed as i32;
                s.message = message;
            });
            match kept {
                Ok(_) => true,
                Err(e) => {
                    tracing::error!(plan = %name, error = %e, retry_in = ?EVERY, "cannot record the plan's status; the file is read again");
                    false
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::plan::v1::PlanStatus;

    async fn until(record: &Path, done: impl Fn(&PlanStatus) -> bool) -> PlanStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = Record::open(record) {
                let status = r.status();
                if done(&status) {
                    return status;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}",
                record.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn plan_files_apply_with_no_hub_and_bad_ones_say_why() {
        let dir = crate::testing::tempdir();
        let (plans, records) = (dir.join("plans"), dir.join("records"));
        std::fs::create_dir_all(&plans).unwrap();
        let marker = dir.join("ran");
        std::fs::write(
            plans.join("setup.json"),
            format!(
                r#"{{"instructions": [{{"name": "touch", "command": "/usr/bin/touch", "args": ["{}"]}}]}}"#,
                marker.display()
            ),
        )
        .unwrap();
        std::fs::write(plans.join("broken.json"), r#"{"instructions": 3}"#).unwrap();
        std::fs::write(plans.join("notes.txt"), "not a plan").unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(follow(
            plans.clone(),
            records.clone(),
            applier::Retry::default(),
            crate::root::Root::default(),
            shutdown.clone(),
        ));
        let status = until(&records.join("setup.json"), |s| {
            s.state == PlanState::Applied as i32
        })
        .await;
        assert!(marker.exists());
        assert_eq!(status.results[0].name, "touch");
        let broken = until(&records.join("broken.json"), |s| !s.message.is_empty()).await;
        assert!(
            broken.message.contains("broken.json") && broken.message.contains("not a plan"),
            "{}",
            broken.message
        );
        assert!(!records.join("notes.json").exists());
        shutdown.cancel();
        task.await.unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A plan file whose record the disk refuses is taken again on a later read, though the
    /// file has not changed since.
    #[tokio::test(start_paused = true)]
    async fn a_plan_the_disk_refuses_is_taken_on_a_later_read() {
        let dir = crate::testing::tempdir();
        let (plans, records) = (dir.join("plans"), dir.join("records"));
        std::fs::create_dir_all(&plans).unwrap();
        std::fs::create_dir_all(&records).unwrap();
        // The record's temporary file cannot be created while a directory holds its name.
        let blocker = records.join(".empty.json.drover-tmp");
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(plans.join("empty.json"), r#"{"instructions": []}"#).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(follow(
            plans,
            records.clone(),
            applier::Retry::default(),
            crate::root::Root::default(),
            shutdown.clone(),
        ));
        // The paused clock runs ahead while every task waits: the directory is read a few times.
        tokio::time::sleep(EVERY * 4).await;
        let record = Record::open(&records.join("empty.json")).unwrap();
        assert_eq!(record.desired().0, "");

        std::fs::remove_dir(&blocker).unwrap();
        let status = until(&records.join("empty.json"), |s| {
            s.state == PlanState::Applied as i32
        })
        .await;
        assert!(!status.checksum.is_empty());
        shutdown.cancel();
        task.await.unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
