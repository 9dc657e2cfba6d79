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
    // `cargo build` has been done by `cargo test`; every other line runs as written.
    let prelude = "cargo() { echo \"cargo $*: built by cargo test\"; }\n";
    let out = std::fs::File::create(dir.join("quickstart.out")).unwrap();
    let err = std::fs::File::create(dir.join("quickstart.err")).unwrap();
    let mut shell = tokio::process::Command::new("bash")
        .args(["-e", "-c", &format!("{prelude}{script}")])
        .current_dir(&dir)
        .env("HOME", dir.join("home"))
        .env_remove("KUBECONFIG")
        .env_remove("DROVER_CONFIG")
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
    let _ = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .status();
    let stdout = std::fs::read_to_string(dir.join("quickstart.out")).unwrap();
    let stderr = std::fs::read_to_string(dir.join("quickstart.err")).unwrap();
    let tail = |text: &str| text.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    let status = status.unwrap_or_else(|_| {
        panic!(
            "the quick start did not finish in 180 s\n{stdout}\n{}",
            tail(&stderr)
        )
    });
    assert!(
        status.unwrap().success(),
        "the quick start failed\n{stdout}\n{}",
        tail(&stderr)
    );
    // kubectl, through the hub, lists the simulated cluster's three nodes.
    let nodes: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("node-") && l.contains(" Ready "))
        .collect();
    assert_eq!(nodes.len(), 3, "{stdout}");
    assert!(
        stdout.contains("deployment.apps/drover-cluster-agent created"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
