use std::path::{Path, PathBuf};

use proto::plan::v1::{File, Instruction, PeriodicInstruction, Probe, checksum};

use super::*;

fn script(name: &str, script: &str) -> Instruction {
    Instruction {
        name: name.into(),
        script: script.into(),
        ..Instruction::default()
    }
}

/// An instruction that appends a line to `counter` (so its runs can be counted) and then runs
/// `then`.
fn counted(name: &str, counter: &Path, then: &str) -> Instruction {
    script(name, &format!("echo run >> {}; {then}", counter.display()))
}

fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn fast() -> Retry {
    Retry {
        max_failures: 3,
        base: Duration::from_millis(20),
        cap: Duration::from_millis(100),
    }
}

/// Drives `plan` on the record at `path` until `done` holds for the status (or 20 s pass).
async fn drive_until(
    path: &Path,
    plan: &Plan,
    retry: Retry,
    done: impl Fn(&PlanStatus) -> bool,
) -> PlanStatus {
    drive_within(path, plan, retry, done, Duration::from_secs(20)).await
}

async fn drive_within(
    path: &Path,
    plan: &Plan,
    retry: Retry,
    done: impl Fn(&PlanStatus) -> bool,
    within: Duration,
) -> PlanStatus {
    let record = Record::open(path).unwrap();
    record
        .set_desired(checksum(plan), Some(plan.clone()))
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(drive(
        record.clone(),
        retry,
        None,
        crate::root::Root::default(),
        shutdown.clone(),
    ));
    let deadline = tokio::time::Instant::now() + within;
    let status = loop {
        let status = record.status();
        if done(&status) || tokio::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    shutdown.cancel();
    task.await.unwrap();
    status
}

fn applied(s: &PlanStatus) -> bool {
    s.state == PlanState::Applied as i32
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_plan_writes_files_runs_instructions_in_order_and_never_runs_again() {
    let dir = Dir(crate::testing::tempdir());
    let counter = dir.0.join("runs");
    let config = dir.0.join("etc/app/config");
    let plan = Plan {
        files: vec![File {
            path: config.display().to_string(),
            content: b"hello".to_vec(),
            ..File::default()
        }],
        instructions: vec![
            // Sees the file the plan wrote.
            script("read", &format!("cat {}", config.display())),
            Instruction {
                save_output: true,
                ..counted("install", &counter, "echo token-123")
            },
        ],
        ..Plan::default()
    };
    let path = dir.0.join("plan.json");
    let status = drive_until(&path, &plan, fast(), applied).await;
    assert!(applied(&status), "{status:?}");
    assert_eq!(status.applied_checksum, checksum(&plan));
    let names: Vec<_> = status.results.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["read", "install"]);
    assert_eq!(
        status.results[0].stdout, "",
        "output is kept only when asked"
    );
    assert_eq!(status.results[1].stdout, "token-123\n");
    assert_eq!(runs(&counter), 1);

    // A restart with the same plan runs nothing.
    let again = drive_within(&path, &plan, fast(), |_| false, Duration::from_millis(500)).await;
    assert_eq!(runs(&counter), 1);
    assert_eq!(again.seq, status.seq);
}

#[tokio::test]
async fn a_failing_instruction_stops_the_plan_and_is_retried_up_to_max_failures() {
    let dir = Dir(crate::testing::tempdir());
    let counter = dir.0.join("runs");
    let after = dir.0.join("after");
    let plan = Plan {
        instructions: vec![
            counted("install", &counter, "echo 'disk on fire' >&2; exit 1"),
            counted("after", &after, "true"),
        ],
        ..Plan::default()
    };
    let status = drive_until(&dir.0.join("plan.json"), &plan, fast(), |s| {
        s.failure_count >= 3
    })
    .await;
    assert_eq!(status.state, PlanState::Failed as i32);
    assert_eq!((status.failure_count, status.max_failures), (3, 3));
    assert!(
        status.message.contains("install") && status.message.contains("disk on fire"),
        "{}",
        status.message
    );
    assert_eq!(status.results.len(), 1);
    assert_eq!(status.results[0].exit_code, 1);
    assert_eq!(status.results[0].stderr, "disk on fire\n");
    // Give a fourth attempt time to (wrongly) happen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&counter), 3, "stops at max failures");
    assert_eq!(runs(&after), 0, "nothing after the failing instruction ran");
}

#[tokio::test]
async fn a_retry_keeps_the_failure_it_follows_in_sight_until_it_succeeds() {
    let dir = Dir(crate::testing::tempdir());
    let tried = dir.0.join("tried");
    let go = dir.0.join("go");
    // Fails once; the retry waits for `go` so its in-progress status can be read.
    let plan = Plan {
        instructions: vec![script(
            "install",
            &format!(
                "if [ -e {t} ]; then while [ ! -e {g} ]; do sleep 0.05; done; \
                 else touch {t}; echo 'disk on fire' >&2; exit 1; fi",
                t = tried.display(),
                g = go.display()
            ),
        )],
        ..Plan::default()
    };
    let path = dir.0.join("plan.json");
    let retrying = drive_until(&path, &plan, fast(), |s| {
        s.state == PlanState::InProgress as i32 && s.failure_count == 1
    })
    .await;
    assert!(
        retrying.message.contains("disk on fire"),
        "{}",
        retrying.message
    );
    std::fs::write(&go, "").unwrap();
    let status = drive_until(&path, &plan, fast(), applied).await;
    assert_eq!((status.failure_count, status.message.as_str()), (0, ""));
}

#[tokio::test]
async fn a_plan_interrupted_by_a_crash_runs_again_from_the_start() {
    let dir = Dir(crate::testing::tempdir());
    let counter = dir.0.join("runs");
    let plan = Plan {
        instructions: vec![counted("install", &counter, "true")],
        ..Plan::default()
    };
    let path = dir.0.join("plan.json");
    // What a crash mid-plan leaves behind.
    let record = Record::open(&path).unwrap();
    record
        .set_desired(checksum(&plan), Some(plan.clone()))
        .unwrap();
    record
        .record(|s| {
            s.checksum = checksum(&plan);
            s.state = PlanState::InProgress as i32;
        })
        .unwrap();
    drop(record);
    let status = drive_until(&path, &plan, fast(), applied).await;
    assert!(applied(&status), "{status:?}");
    assert_eq!(runs(&counter), 1);
}

#[tokio::test]
async fn a_new_plan_replaces_a_failing_one_and_bad_entries_fail_before_anything_runs() {
    let dir = Dir(crate::testing::tempdir());
    let counter = dir.0.join("runs");
    let bad = Plan {
        files: vec![File {
            path: "relative".into(),
            ..File::default()
        }],
        instructions: vec![counted("x", &counter, "true")],
        max_failures: 1,
        ..Plan::default()
    };
    let path = dir.0.join("plan.json");
    let status = drive_until(&path, &bad, fast(), |s| s.failure_count >= 1).await;
    assert!(status.message.contains("absolute"), "{}", status.message);
    assert_eq!(runs(&counter), 0);
    let good = Plan {
        instructions: vec![counted("x", &counter, "true")],
        ..Plan::default()
    };
    let status = drive_until(&path, &good, fast(), applied).await;
    assert_eq!((status.failure_count, runs(&counter)), (0, 1));
}

#[tokio::test]
async fn periodic_instructions_and_probes_keep_reporting_once_applied() {
    let dir = Dir(crate::testing::tempdir());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
                let _ = tokio::io::AsyncWriteExt::write_all(
                    &mut s,
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
                )
                .await;
            });
        }
    });
    let plan = Plan {
        periodic: vec![PeriodicInstruction {
            instruction: Some(script("uptime", "echo up")),
            period_seconds: 1,
        }],
        probes: vec![Probe {
            name: "readyz".into(),
            url: format!("http://{addr}/readyz"),
            period_seconds: 1,
            ..Probe::default()
        }],
        ..Plan::default()
    };
    let status = drive_until(&dir.0.join("plan.json"), &plan, fast(), |s| {
        s.probes.iter().any(|p| p.healthy) && !s.periodic.is_empty()
    })
    .await;
    assert!(applied(&status));
    assert_eq!(status.periodic[0].stdout, "up\n");
    assert_eq!(status.probes[0].name, "readyz");
    assert!(status.probes[0].healthy, "{status:?}");
}

#[test]
fn waits_double_up_to_the_cap() {
    let r = Retry {
        max_failures: 5,
        base: Duration::from_secs(5),
        cap: Duration::from_secs(30),
    };
    let waits: Vec<u64> = (1..6).map(|n| r.wait(n).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 30, 30]);
}

/// A failed instruction's message ends with its stderr's last lines (up to three): the
/// tool's own error and the script's word on what it was doing both reach the hub.
#[test]
fn a_failure_says_the_last_lines_of_stderr() {
    assert_eq!(
        last_lines(
            "% Total\ncurl: (6) Could not resolve host: get.k3s.io\n\n\
             downloading the installer https://get.k3s.io failed (curl exit 6)\n"
        ),
        "% Total / curl: (6) Could not resolve host: get.k3s.io / downloading the installer https://get.k3s.io failed (curl exit 6)"
    );
    assert_eq!(last_lines("one\n"), "one");
    assert_eq!(last_lines(" \n"), "no output on stderr");
}

#[tokio::test]
async fn a_running_instruction_is_in_the_status_with_its_latest_output_until_it_ends() {
    let dir = Dir(crate::testing::tempdir());
    let release = dir.0.join("release");
    let plan = Plan {
        instructions: vec![
            script("quick", "true"),
            script(
                "install",
                &format!(
                    "echo '[INFO] downloading' >&2; while [ ! -e {} ]; do sleep 0.05; done",
                    release.display()
                ),
            ),
        ],
        ..Plan::default()
    };
    let path = dir.0.join("plan.json");
    let running = drive_until(&path, &plan, fast(), |s| {
        s.current
            .as_ref()
            .is_some_and(|c| c.output.contains("[INFO] downloading"))
    })
    .await;
    let current = running.current.unwrap();
    assert_eq!(current.name, "install");
    assert!(!current.started_at.is_empty());
    assert_eq!(running.results.len(), 1, "the step before it is done");
    std::fs::write(&release, "").unwrap();
    let done = drive_until(&path, &plan, fast(), applied).await;
    assert!(applied(&done), "{done:?}");
    assert_eq!(done.current, None, "nothing runs once it is applied");
}

/// A record that cannot be written (a full disk, no file handles left) is tried again after a
/// wait, as a failed plan is, not at once over and over: the agent's other work goes on.
#[test]
fn a_record_that_cannot_be_written_is_tried_again_after_a_wait_not_in_a_loop() {
    let dir = Dir(crate::testing::tempdir());
    let records = dir.0.join("records");
    std::fs::create_dir_all(&records).unwrap();
    let record = Record::open(&records.join("plan.json")).unwrap();
    let plan = Plan {
        instructions: vec![script("noop", "true")],
        ..Plan::default()
    };
    record.set_desired(checksum(&plan), Some(plan)).unwrap();
    std::fs::remove_dir_all(&records).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // The agent on one thread: an applier that never waits would never let the other task run.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            tokio::spawn(drive(
                record,
                fast(),
                None,
                crate::root::Root::default(),
                CancellationToken::new(),
            ));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = tx.send(());
        });
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the applier tried again and again without a wait"
    );
}
