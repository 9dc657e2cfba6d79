//! The guides in `docs/guides/`, each run as written (`tests::guide`): a reader's set-up made
//! first (a hub, the CLI logged in, a cluster), then the guide's blocks in order, checking
//! what each step says you should see.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sim::cluster::{ADMIN_TOKEN, SimCluster, SimConfig};
use tests::{
    HubProcess,
    guide::{Shell, blocks},
    hub_cli,
    imported::{Imported, agent_token, kubectl},
    temp_dir,
};

const STEP: Duration = Duration::from_secs(120);

/// A hub, and a shell whose CLI is logged in to it as `admin`.
async fn hub_and_shell(label: &str) -> (HubProcess, Shell, String) {
    let dir = temp_dir(label);
    let hub = HubProcess::start(&dir.join("hub")).await;
    let password = hub.admin_password.clone().unwrap();
    let shell = Shell::new(&dir.join("work"));
    let config = shell.dir.join("home/.config/drover/cli.json");
    let r = hub_cli(
        &config,
        &["login", "--server", &hub.url(), "--password-stdin"],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    (hub, shell, password)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_import_guide_works_as_written() {
    let steps = blocks("import-a-cluster");
    assert_eq!(steps.len(), 6, "{steps:#?}");
    let (hub, mut shell, password) = hub_and_shell("guide-import").await;
    // The reader's cluster, kubectl on it as its admin.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let sim = SimCluster::start(SimConfig::default(), shutdown.clone())
        .await
        .unwrap();
    let sim_admin = shell.dir.join("cluster.yaml");
    std::fs::write(&sim_admin, sim.kubeconfig(ADMIN_TOKEN)).unwrap();
    shell.set("KUBECONFIG", sim_admin.to_str().unwrap());

    let created = shell.run(&steps[0], STEP).await;
    assert!(
        created.stdout.starts_with("curl -fsSk https://")
            && created.stdout.contains("sha256sum -c --quiet"),
        "{}",
        created.stdout
    );
    let applied = shell.run(&steps[1], STEP).await;
    assert!(
        applied
            .stdout
            .contains("deployment.apps/drover-cluster-agent created"),
        "{}",
        applied.stdout
    );

    // The simulated cluster runs no pods: the test starts the agent its Deployment would, with
    // what the manifest put in the cluster.
    let agent_token = agent_token(&sim_admin).await;
    let imported = Imported {
        dir: shell.dir.clone(),
        admin: tests::login(hub.addr, "admin", &password).await,
        hub,
        registration: String::new(),
        sim,
        sim_admin: sim_admin.clone(),
        agent_token,
        applied: applied.stdout,
        shutdown: shutdown.clone(),
    };
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, shutdown.clone()));

    let active = shell.run(&steps[2], STEP).await;
    assert!(
        active
            .stdout
            .lines()
            .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>()
                == ["prod", "imported", "active"]),
        "{}",
        active.stdout
    );
    let nodes = shell.run(&steps[3], STEP).await;
    let ready = nodes
        .stdout
        .lines()
        .filter(|l| l.contains(" Ready "))
        .count();
    assert_eq!(ready, 3, "{}", nodes.stdout);
    let granted = shell.run(&steps[4], STEP).await;
    assert!(
        granted
            .stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == [
                    "ann-cluster-member-prod",
                    "user",
                    "ann",
                    "cluster-member",
                    "prod"
                ]),
        "{}",
        granted.stdout
    );
    assert!(tests::logs_in(imported.hub.addr, "ann", "a long enough password").await);
    shell.run(&steps[5], STEP).await;
    let (exists, _, _) = kubectl(&sim_admin, &["get", "namespace", "drover-system"]).await;
    assert!(!exists, "the agent removed what the manifest created");
    shutdown.cancel();
    let _ = agent.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backup_guide_works_as_written() {
    let steps = blocks("back-up-and-restore");
    assert_eq!(steps.len(), 3, "{steps:#?}");
    let dir = temp_dir("guide-backup");
    let mut shell = Shell::new(&dir.join("work"));
    // The reader's hub: its data in ./drover-data of the shell's directory.
    let data = shell.dir.join("drover-data");
    let hub = HubProcess::start(&data).await;
    let config = shell.dir.join("home/.config/drover/cli.json");
    let cli = |args: &[&str]| {
        let r = hub_cli(&config, args, "");
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        r.stdout
    };
    let password = hub.admin_password.clone().unwrap();
    let r = hub_cli(
        &config,
        &["login", "--server", &hub.url(), "--password-stdin"],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    cli(&["cluster", "create", "kept"]);

    let backup = shell.run(&steps[0], STEP).await;
    assert!(
        backup.stdout.starts_with("Backup written to hub.backup: ")
            && backup.stdout.contains("-rw-------"),
        "{}",
        backup.stdout
    );
    // After the backup: gone once it is restored.
    cli(&["cluster", "create", "later"]);
    let port = hub.addr.port().to_string();
    let checksum = hub.ca_checksum.clone();
    assert!(hub.terminate().await, "the hub stops cleanly");

    let restored = shell.run(&steps[1], STEP).await;
    assert!(
        restored
            .stdout
            .starts_with("Restored ./drover-data from hub.backup: "),
        "{}",
        restored.stdout
    );
    let listen = format!("127.0.0.1:{port}");
    let hub = HubProcess::start_with(&data, &["--listen", &listen]).await;
    assert_eq!(hub.ca_checksum, checksum, "the same CA: agents trust it");
    let listed = shell.run(&steps[2], STEP).await;
    let names: Vec<&str> = listed
        .stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["kept"], "{}", listed.stdout);
}
