//! The README's quick start, run as written: the lines of its first `sh` block under
//! "## Quick start", read from README.md, in bash, in a fresh directory and home. Only the build
//! is not repeated (`cargo test` has built the binaries; `target/release` there points at
//! them), so the README cannot promise what does not work.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::{Ipv4Addr, TcpListener},
    os::unix::fs::symlink,
    path::Path,
    process::Stdio,
    time::Duration,
};

use tests::{binary, temp_dir};
use tokio::io::AsyncBufReadExt;

/// The commands of the quick start, as the README shows them.
fn quick_start() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README.md");
    let section = readme
        .split("\n## Quick start\n")
        .nth(1)
        .expect("README.md has a \"## Quick start\" section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the quick start has a sh block");
    block.to_owned()
}

/// Runs the quick start in `dir` (a clone, as far as it can tell) and returns its stdout,
/// failing the test if it fails or takes longer than 180 s.
async fn run_in(dir: &Path, script: &str, run: &str) -> String {
    // `cargo build` has been done by `cargo test`; every other line runs as written.
    let prelude = "cargo() { echo \"cargo $*: built by cargo test\"; }\n";
    let out = std::fs::File::create(dir.join(format!("{run}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{run}.err"))).unwrap();
    let mut shell = tokio::process::Command::new("bash")
        .args(["-e", "-c", &format!("{prelude}{script}")])
        .current_dir(dir)
        .env("HOME", dir.join("home"))
        .env_remove("KUBECONFIG")
        .env_remove("DROVER_CONFIG")
        .env_remove("DROVER_LOG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: the hub, the cluster and the agent it starts in the
        // background go with it at the end.
        .process_group(0)
        .spawn()
        .unwrap();
    let group = shell.id().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(180), shell.wait()).await;
    stop_group(group).await;
    let stdout = std::fs::read_to_string(dir.join(format!("{run}.out"))).unwrap();
    let stderr = std::fs::read_to_string(dir.join(format!("{run}.err"))).unwrap();
    let logs = ["hub.log", "sim.log", "agent.log"]
        .map(|log| {
            let text =
                std::fs::read_to_string(dir.join("quickstart").join(log)).unwrap_or_default();
            format!("--- {log}\n{}", tail(&text))
        })
        .join("\n");
    let status = status.unwrap_or_else(|_| {
        panic!(
            "the quick start ({run}) did not finish in 180 s\n{stdout}\n{}\n{logs}",
            tail(&stderr)
        )
    });
    assert!(
        status.unwrap().success(),
        "the quick start ({run}) failed\n{stdout}\n{}\n{logs}",
        tail(&stderr)
    );
    stdout
}

fn tail(text: &str) -> String {
    let mut lines: Vec<&str> = text.lines().rev().take(40).collect();
    lines.reverse();
    lines.join("\n")
}

/// Ends process group `group` and waits until the ports it held are free again.
async fn stop_group(group: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while [8443, 6443]
        .iter()
        .any(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).is_err())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the quick start's processes still hold their ports 30 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The README's lines in any order: the demo first (its own `drover-demo`), then the quick
/// start, then the quick start again in the same clone; each quick start ends with kubectl
/// listing the cluster's nodes through the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_works_as_written() {
    let script = quick_start();
    assert!(
        script.starts_with("cargo build --release --bins\n"),
        "the quick start builds first: {script}"
    );
    for port in [8443, 6443] {
        assert!(
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok(),
            "the quick start listens on 127.0.0.1:{port}, which is taken on this machine"
        );
    }
    let dir = temp_dir("quickstart");
    let built = binary("drover-hub").parent().unwrap().to_owned();
    std::fs::create_dir_all(dir.join("target")).unwrap();
    symlink(&built, dir.join("target/release")).unwrap();

    // The demo, as the README starts it (on another port: 8443 is the quick start's).
    let mut demo = tokio::process::Command::new(binary("drover-sim"))
        .args(["demo", "1", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env_remove("DROVER_LOG")
        .env_remove("DROVER_DATA_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut printed = tokio::io::BufReader::new(demo.stdout.take().unwrap()).lines();
    let mut banner = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = printed.next_line().await.unwrap() {
            let done = line.contains("CA checksum");
            banner.push(line);
            if done {
                break;
            }
        }
    })
    .await
    .expect("the demo is up within 60 s");
    // The password is what it prints last but the URL lines.
    assert!(
        banner.iter().any(|l| l.contains("with password")),
        "{banner:?}"
    );
    // Stopped as Ctrl-C would: its simulated hosts stop their services with it.
    let pid = demo.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    tokio::time::timeout(Duration::from_secs(30), demo.wait())
        .await
        .expect("the demo stops within 30 s of Ctrl-C")
        .unwrap();
    assert!(
        dir.join("drover-demo").is_dir(),
        "the demo keeps its state in ./drover-demo"
    );
    assert!(
        !dir.join("drover-data").exists(),
        "the demo leaves ./drover-data alone"
    );

    for run in ["first", "again"] {
        let stdout = run_in(&dir, &script, run).await;
        // kubectl, through the hub, lists the simulated cluster's three nodes.
        let nodes: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("node-") && l.contains(" Ready "))
            .collect();
        assert_eq!(nodes.len(), 3, "{run}: {stdout}");
        assert!(
            stdout.contains("deployment.apps/drover-cluster-agent created"),
            "{run}: {stdout}"
        );
        // The hub's log went to its file, not the terminal.
        let log = std::fs::read_to_string(dir.join("quickstart/hub.log")).unwrap();
        assert!(log.contains("Drover hub is up"), "{log}");
        assert!(!stdout.contains(" INFO "), "{run}: {stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
