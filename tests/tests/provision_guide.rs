//! The guide that opens docs/provisioning.md, run as written: three `drover-sim host`s on this
//! machine become a K3s (stand-in) cluster through the real planner and system-agents, which
//! is then reached with kubectl, upgraded, snapshotted, restored and deleted, and nothing is
//! written outside the hosts' own directories.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use tests::{HubProcess, guide::Shell, guide::guide_blocks, hub_cli, temp_dir};

const STEP: Duration = Duration::from_secs(120);

/// What a host of the machine itself would have written: none of it may appear.
const OUTSIDE: [&str; 6] = [
    "/etc/rancher",
    "/var/lib/rancher",
    "/etc/drover/hub-ca.pem",
    "/usr/local/bin/k3s",
    "/usr/local/bin/k3s-uninstall.sh",
    "/usr/local/bin/systemctl",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provisioning_guide_works_as_written_and_writes_only_in_the_hosts_roots() {
    let steps = guide_blocks("provisioning.md");
    assert_eq!(steps.len(), 9, "{steps:#?}");
    let _alone = tests::hosts::no_network();
    let there_before: Vec<&str> = OUTSIDE
        .iter()
        .copied()
        .filter(|p| Path::new(p).exists())
        .collect();
    // Where the README's quick start leaves the reader: in quickstart/, the hub's data in
    // ./drover-data, the CLI logged in as admin.
    let dir = temp_dir("guide-provision");
    let mut shell = Shell::new(&dir.join("quickstart"));
    // As a real download takes a while: long enough for the watch to see the step's output.
    shell.set("DROVER_SIM_INSTALL_SECONDS", "3");
    let hub = HubProcess::start(&shell.dir.join("drover-data")).await;
    let login = hub_cli(
        &shell.dir.join("home/.config/drover/cli.json"),
        &["login", "--server", &hub.url(), "--password-stdin"],
        &format!("{}\n", hub.admin_password.clone().unwrap()),
    );
    assert_eq!(login.code, 0, "{}", login.stderr);

    let artifacts = shell.run(&steps[0], STEP).await;
    for version in ["v1.33.4+k3s1", "v1.34.1+k3s1"] {
        assert!(
            artifacts.stdout.contains(&format!(
                "{version}: 5 files of the stand-in distribution in ./drover-data/artifacts"
            )),
            "{}",
            artifacts.stdout
        );
    }
    let created = shell.run(&steps[1], STEP).await;
    assert!(
        created.stdout.starts_with("--server https://")
            && created.stdout.contains(" --token drr_")
            && created.stdout.contains(" --ca-checksum "),
        "{}",
        created.stdout
    );
    shell.run(&steps[2], STEP).await;
    let hosts = shell.run(&steps[3], Duration::from_secs(200)).await;
    // The watch said which step each host ran, what it wrote, and when the cluster was up.
    for said in [
        "applying the plan: step 1 \"install\" running since ",
        " | [INFO] stand-in k3s v1.33.4+k3s1: downloading",
        "cluster edge: provisioning — ",
        "cluster edge: active",
    ] {
        assert!(hosts.stdout.contains(said), "{said}: {}", hosts.stdout);
    }
    let rows: Vec<&str> = hosts
        .stdout
        .lines()
        .filter(|l| l.contains("etcd,controlplane,worker") && l.contains(" active"))
        .collect();
    assert_eq!(rows.len(), 3, "{}", hosts.stdout);
    for i in 1..=3 {
        assert!(
            hosts.stdout.contains(&format!("127.0.0.1{i} ")),
            "{}",
            hosts.stdout
        );
        // What the plan wrote is in the host's root.
        let root = shell.dir.join(format!("drover-hosts/node-{i}/root"));
        for written in [
            "etc/rancher/k3s/config.yaml",
            "var/lib/rancher/k3s/installed",
        ] {
            assert!(root.join(written).exists(), "host {i}: {written}");
        }
    }
    let nodes = shell.run(&steps[4], STEP).await;
    for i in 1..=3 {
        assert!(
            nodes
                .stdout
                .lines()
                .any(|l| l.starts_with(&format!("node-{i} "))
                    && l.contains(" Ready ")
                    && l.contains("v1.33.4+k3s1")),
            "{}",
            nodes.stdout
        );
    }
    let upgraded = shell.run(&steps[5], Duration::from_secs(320)).await;
    assert!(
        upgraded.stdout.contains("cluster/edge configured"),
        "{}",
        upgraded.stdout
    );
    assert_eq!(
        upgraded.stdout.matches("v1.34.1+k3s1").count(),
        3,
        "{}",
        upgraded.stdout
    );
    let snapshot = shell.run(&steps[6], STEP).await;
    assert!(
        snapshot.stdout.contains("Snapshot first saved on h-")
            && snapshot
                .stdout
                .contains(": /var/lib/rancher/k3s/server/db/snapshots/first-node-"),
        "{}",
        snapshot.stdout
    );
    assert!(
        snapshot
            .stdout
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["first", "active"])),
        "{}",
        snapshot.stdout
    );
    // The file is where the host that took it keeps it: under its root.
    let file = snapshot
        .stdout
        .split(": /")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    let node = file
        .split("first-")
        .nth(1)
        .and_then(|rest| rest.rsplit_once('-'))
        .unwrap()
        .0;
    let on_disk = shell
        .dir
        .join(format!("drover-hosts/{node}/root"))
        .join(file);
    assert!(on_disk.is_file(), "{}", on_disk.display());
    let restored = shell.run(&steps[7], Duration::from_secs(400)).await;
    assert!(
        restored
            .stdout
            .contains("namespace/after-the-snapshot created")
            && restored
                .stdout
                .contains("Restoring cluster edge from first"),
        "{}",
        restored.stdout
    );
    let namespaces = restored
        .stdout
        .split("Restoring cluster edge from first")
        .nth(1)
        .unwrap();
    assert!(
        namespaces.contains("default") && !namespaces.contains("after-the-snapshot"),
        "{}",
        restored.stdout
    );
    let deleted = shell.run(&steps[8], STEP).await;
    assert!(
        deleted.stdout.contains("Cluster edge deleted."),
        "{}",
        deleted.stdout
    );
    for i in 1..=3 {
        let root = shell.dir.join(format!("drover-hosts/node-{i}/root"));
        assert!(
            !root.join("var/lib/rancher/k3s/installed").exists(),
            "host {i}'s distribution was uninstalled"
        );
    }
    let there_after: Vec<&str> = OUTSIDE
        .iter()
        .copied()
        .filter(|p| Path::new(p).exists())
        .collect();
    assert_eq!(
        there_after, there_before,
        "written outside the hosts' roots"
    );
    drop(shell);
    drop(hub);
}
