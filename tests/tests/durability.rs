//! The hub's state under an operator's care and under a full disk: `drover-hub backup` while
//! the hub serves and writes, `restore` into a new machine's directory, one hub per directory,
//! and a disk that fills up under the store.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use serde_json::json;
use tests::{CliRun, HubProcess, api, login, temp_dir};

/// `drover-hub ARGS` (no stdin).
fn hub_command(args: &[&str]) -> CliRun {
    tests::hub_command(args, "")
}

/// What a command printed, stdout then stderr.
fn text(out: &CliRun) -> String {
    format!("{}{}", out.stdout, out.stderr)
}

async fn create_cluster(addr: SocketAddr, admin: &str, name: &str) -> (u16, serde_json::Value) {
    api(
        addr,
        "POST",
        "/v1/clusters",
        Some(admin),
        Some(json!({"metadata": {"name": name}, "spec": {"type": "imported"}})),
    )
    .await
}

async fn cluster_names(addr: SocketAddr, admin: &str) -> BTreeSet<String> {
    let (status, list) = api(addr, "GET", "/v1/clusters", Some(admin), None).await;
    assert_eq!(status, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_the_hub_elsewhere_with_its_ca_and_logins() {
    let dir = temp_dir("backup");
    let (first_dir, second_dir) = (dir.join("first"), dir.join("second"));
    let hub = HubProcess::start(&first_dir).await;
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    for name in ["alpha", "beta"] {
        assert_eq!(create_cluster(hub.addr, &admin, name).await.0, 201);
    }

    // A second hub on the same directory is refused, and the first goes on.
    let second = hub_command(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        first_dir.to_str().unwrap(),
    ]);
    assert_ne!(second.code, 0);
    assert!(
        text(&second).contains("another drover-hub is using"),
        "{}",
        text(&second)
    );

    // The backup runs while a writer keeps the store busy: writes land before it starts and
    // while it runs (counted as each one is answered).
    let busy = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(tokio::sync::Notify::new());
    let writer = {
        let (busy, done, answered, admin, addr) = (
            busy.clone(),
            done.clone(),
            answered.clone(),
            admin.clone(),
            hub.addr,
        );
        tokio::spawn(async move {
            let mut written = Vec::new();
            for i in 0.. {
                if !busy.load(Ordering::SeqCst) {
                    break;
                }
                let name = format!("busy-{i}");
                assert_eq!(create_cluster(addr, &admin, &name).await.0, 201);
                written.push(name);
                done.fetch_add(1, Ordering::SeqCst);
                answered.notify_one();
            }
            written
        })
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), answered.notified())
        .await
        .expect("no write was answered");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (file, out, during) = loop {
        let file = dir.join(format!("hub-{}.backup", done.load(Ordering::SeqCst)));
        let started = done.load(Ordering::SeqCst);
        let out = tokio::task::spawn_blocking({
            let (first_dir, file) = (first_dir.clone(), file.clone());
            move || {
                hub_command(&[
                    "backup",
                    "--data-dir",
                    first_dir.to_str().unwrap(),
                    "--out",
                    file.to_str().unwrap(),
                ])
            }
        })
        .await
        .unwrap();
        let during = done.load(Ordering::SeqCst) - started;
        // A backup so quick that no write was answered while it ran proves nothing: again.
        if during > 0 || std::time::Instant::now() > deadline {
            break (file, out, (started, during));
        }
    };
    busy.store(false, Ordering::SeqCst);
    let written = writer.await.unwrap();
    let (before_backup, during) = during;
    assert!(during > 0, "no write was answered while the backup ran");
    assert_eq!(out.code, 0, "{}", text(&out));
    assert!(text(&out).contains("tls/ca-key.pem"), "{}", text(&out));
    assert_eq!(create_cluster(hub.addr, &admin, "after").await.0, 201);

    // Restoring over a running hub is refused and touches nothing.
    let refused = hub_command(&[
        "restore",
        "--data-dir",
        first_dir.to_str().unwrap(),
        "--from",
        file.to_str().unwrap(),
    ]);
    assert_ne!(refused.code, 0);
    assert!(
        text(&refused).contains("a hub is running"),
        "{}",
        text(&refused)
    );
    assert!(cluster_names(hub.addr, &admin).await.contains("after"));
    let checksum = hub.ca_checksum.clone();
    assert!(hub.terminate().await);

    // A new machine: restore, start, and everything from the backup's instant is there.
    let out = hub_command(&[
        "restore",
        "--data-dir",
        second_dir.to_str().unwrap(),
        "--from",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", text(&out));
    let restored = HubProcess::start(&second_dir).await;
    assert_eq!(restored.ca_checksum, checksum, "agents still trust it");
    assert_eq!(restored.admin_password, None, "the admin user came back");
    let admin = login(restored.addr, "admin", &password).await;
    let names = cluster_names(restored.addr, &admin).await;
    assert!(
        names.contains("alpha") && names.contains("beta"),
        "{names:?}"
    );
    assert!(!names.contains("after"), "written after the backup");
    // The busy writer's clusters: a prefix of what it wrote, none torn, holding every write
    // answered before the backup started and none begun after it ended.
    let busy_kept = names.iter().filter(|n| n.starts_with("busy-")).count();
    assert!(
        written[..busy_kept].iter().all(|n| names.contains(n)),
        "{busy_kept} of {} busy writes, not a prefix: {names:?}",
        written.len()
    );
    // (One write may be committed before the snapshot and answered only after the backup
    // ended: the writer has one in flight at a time.)
    assert!(
        (before_backup..=before_backup + during + 1).contains(&busy_kept),
        "{busy_kept} busy writes in the snapshot; {before_backup} were answered before the backup, {during} while it ran"
    );
    eprintln!(
        "backup while serving: {busy_kept} of {} concurrent writes in the snapshot ({before_backup} before it, {during} while it ran)",
        written.len()
    );
    assert!(restored.terminate().await);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A small tmpfs the hub's data directory lives on, unmounted when dropped.
struct SmallDisk<'a>(&'a Path);

impl Drop for SmallDisk<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0).status();
    }
}

fn fill(disk: &Path) {
    // Writes zeros until the disk refuses more; dd's failure is the point.
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k", "status=none"])
        .arg(format!("of={}", disk.join("filler").display()))
        .status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_clear_error_and_loses_nothing_once_space_returns() {
    if tests::hosts::skip_without_root("a small disk for the hub needs root to mount a tmpfs") {
        return;
    }
    let dir = temp_dir("disk-full");
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&disk)
        .output()
        .unwrap();
    assert!(
        mounted.status.success(),
        "mounting a 24 MiB tmpfs for the hub's disk: {}",
        String::from_utf8_lossy(&mounted.stderr)
    );
    let _unmount = SmallDisk(&disk);
    let data = disk.join("data");
    let hub = HubProcess::start(&data).await;
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    assert_eq!(create_cluster(hub.addr, &admin, "before").await.0, 201);

    fill(&disk);
    // SQLite may still have room in its write-ahead log; once that is used up, every write is
    // refused with 507 and a message saying what to do. Nothing else is acceptable.
    let mut acknowledged = vec!["before".to_owned()];
    let mut refusal = None;
    for i in 0..2000 {
        let name = format!("full-{i}");
        let (status, body) = create_cluster(hub.addr, &admin, &name).await;
        match status {
            201 => acknowledged.push(name),
            507 => {
                refusal = Some(body);
                break;
            }
            other => panic!("a write on a full disk answered {other}: {body}"),
        }
    }
    let refusal = refusal.expect("writes refused once the disk is full");
    let message = refusal["message"].as_str().unwrap();
    assert!(
        message.contains("disk is full") && message.contains("--data-dir"),
        "{refusal}"
    );
    assert_eq!(refusal["reason"], "InsufficientStorage");
    // Reads go on.
    let names = cluster_names(hub.addr, &admin).await;
    assert!(acknowledged.iter().all(|n| names.contains(n)));

    // Space returns: writes work again without a restart, and after one nothing is missing.
    std::fs::remove_file(disk.join("filler")).unwrap();
    assert_eq!(create_cluster(hub.addr, &admin, "after").await.0, 201);
    acknowledged.push("after".to_owned());
    assert!(hub.terminate().await);
    let again = HubProcess::start(&data).await;
    let admin = login(again.addr, "admin", &password).await;
    let names = cluster_names(again.addr, &admin).await;
    let lost: Vec<_> = acknowledged
        .iter()
        .filter(|n| !names.contains(*n))
        .collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    // The store is whole: a backup of it passes the restore's integrity check.
    let file = dir.join("after-full.backup");
    let out = hub_command(&[
        "backup",
        "--data-dir",
        data.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", text(&out));
    let out = hub_command(&[
        "restore",
        "--data-dir",
        dir.join("check").to_str().unwrap(),
        "--from",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", text(&out));
    eprintln!(
        "disk full: {} writes acknowledged before 507, none lost",
        acknowledged.len() - 2
    );
    assert!(again.terminate().await);
    drop(_unmount);
    std::fs::remove_dir_all(&dir).unwrap();
}
