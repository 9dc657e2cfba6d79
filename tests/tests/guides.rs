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

/// Whether a table in `text` has a row starting with `words`.
fn has_row(text: &str, words: &[&str]) -> bool {
    text.lines().any(|l| {
        let row: Vec<&str> = l.split_whitespace().collect();
        row.starts_with(words)
    })
}

/// A hub, and a shell whose CLI is logged in to it as `admin`.
async fn hub_and_shell(label: &str) -> (HubProcess, Shell, String) {
    let dir = temp_dir(label);
    let hub = HubProcess::start(&dir.join("hub")).await;
    shell_on(hub, &dir).await
}

/// A shell in `dir/work` whose CLI is logged in to `hub` as `admin`.
async fn shell_on(hub: HubProcess, dir: &std::path::Path) -> (HubProcess, Shell, String) {
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
        has_row(&active.stdout, &["prod", "imported", "active"]),
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
        has_row(
            &granted.stdout,
            &[
                "ann-cluster-member-prod",
                "user",
                "ann",
                "cluster-member",
                "prod"
            ]
        ),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_guide_works_as_written() {
    let steps = blocks("run-hubs-on-etcd");
    assert_eq!(steps.len(), 5, "{steps:#?}");
    for port in [9441, 9442, 9443] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "the guide's replicas listen on 127.0.0.1:{port}, which is taken on this machine"
        );
    }
    let dir = temp_dir("guide-etcd");
    let etcd = hub::store::local_etcd::LocalEtcd::start_cluster(&dir.join("etcd"), 3).unwrap();
    let mut shell = Shell::new(&dir.join("work"));
    // Step 1 is the reader's own etcd: here, the test's.
    shell.set(
        "DROVER_STORE",
        &hub::store::local_etcd::LocalEtcd::cluster_url(&etcd),
    );
    shell.run(&steps[0], STEP).await;
    let checksums = shell.run(&steps[1], STEP).await;
    let sums: Vec<&str> = checksums
        .stdout
        .lines()
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    assert_eq!(sums.len(), 3, "{}", checksums.stdout);
    assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
    let listed = shell.run(&steps[2], STEP).await;
    assert!(
        has_row(&listed.stdout, &["prod", "imported", "pending"]),
        "{}",
        listed.stdout
    );
    let leads = |text: &str| {
        text.lines()
            .filter(|l| l.ends_with("drover_replica_leader 1"))
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let before = shell.run(&steps[3], STEP).await;
    let leader = leads(&before.stdout);
    assert_eq!(leader.len(), 1, "{}", before.stdout);
    let after = shell.run(&steps[4], STEP).await;
    assert!(
        after.stdout.contains(&format!("stopped {}", leader[0])),
        "{}",
        after.stdout
    );
    let now = leads(&after.stdout);
    assert_eq!(now.len(), 1, "{}", after.stdout);
    assert_ne!(now, leader, "{}", after.stdout);
    drop(shell);
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ldap_guide_works_as_written() {
    use tests::ldap::{BASE, READER_DN, READER_PASSWORD, Slapd, user_dn};
    let steps = blocks("connect-ldap");
    assert_eq!(steps.len(), 3, "{steps:#?}");
    let (hub, mut shell, _) = hub_and_shell("guide-ldap").await;
    let config = shell.dir.join("home/.config/drover/cli.json");
    assert_eq!(hub_cli(&config, &["cluster", "create", "prod"], "").code, 0);
    // The reader's directory: alice in eng, inside a group of groups.
    let slapd = Slapd::start(&shell.dir).await;
    slapd.add_user("alice", "Alice Liddell", "alice-password-1");
    slapd.add_group("eng", &[user_dn("alice")]);
    // Step 1, with the test's values.
    std::fs::write(shell.dir.join("corp-ca.pem"), &slapd.ca_pem).unwrap();
    for (name, value) in [
        ("HUB", hub.url()),
        ("LDAP_URL", slapd.ldaps_url.clone()),
        ("LDAP_CA", "corp-ca.pem".to_owned()),
        ("LDAP_BIND_DN", READER_DN.to_owned()),
        ("LDAP_BIND_PASSWORD", READER_PASSWORD.to_owned()),
        ("LDAP_USERS", format!("ou=people,{BASE}")),
        ("LDAP_GROUPS", format!("ou=groups,{BASE}")),
    ] {
        shell.set(name, &value);
    }
    let added = shell.run(&steps[0], STEP).await;
    assert_eq!(
        added.stdout, "authprovider/corp created\n",
        "{}",
        added.stderr
    );
    let read = hub_cli(&config, &["get", "authprovider", "corp", "-o", "yaml"], "");
    assert!(
        read.stdout.contains("ldaps://") && !read.stdout.contains(READER_PASSWORD),
        "{}",
        read.stdout
    );
    // Alice types her password at the prompt; here the CLI reads it from DROVER_PASSWORD.
    shell.set("DROVER_PASSWORD", "alice-password-1");
    let signed_in = shell.run(&steps[1], STEP).await;
    assert!(
        signed_in.stdout.contains("Logged in"),
        "{}",
        signed_in.stdout
    );
    assert!(
        signed_in
            .stdout
            .lines()
            .any(|l| l.starts_with("corp-alice ")),
        "{}",
        signed_in.stdout
    );
    let granted = shell.run(&steps[2], STEP).await;
    assert!(
        has_row(
            &granted.stdout,
            &[
                "group-corp-eng-cluster-member-prod",
                "group",
                "corp:eng",
                "cluster-member",
                "prod"
            ]
        ),
        "{}",
        granted.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openid_guide_works_as_written() {
    use serde_json::json;
    use tests::{browser::Driver, oidc::OpenIdProvider, signin::through_provider};
    let steps = blocks("connect-oidc");
    assert_eq!(steps.len(), 3, "{steps:#?}");
    let dir = temp_dir("guide-oidc");
    // The provider redirects back to the hub's own URL.
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let (hub, mut shell, _) = shell_on(hub, &dir).await;
    let config = shell.dir.join("home/.config/drover/cli.json");
    assert_eq!(hub_cli(&config, &["cluster", "create", "prod"], "").code, 0);
    // Step 1, the reader's provider: the test's, with the hub registered as its client.
    let secret = "the hub-s client secret at the provider";
    let callback = format!("{}/v1/login/sso/callback", hub.url());
    let users = json!({"olivia": {"name": "Olivia Ops", "preferred_username": "olivia",
                                  "groups": ["ops"]}});
    let idp = OpenIdProvider::start(&dir, "drover", secret, &callback, users).await;
    std::fs::write(shell.dir.join("idp-ca.pem"), &idp.ca_pem).unwrap();
    for (name, value) in [
        ("HUB", hub.url()),
        ("OIDC_ISSUER", idp.issuer.clone()),
        ("OIDC_CLIENT_ID", "drover".to_owned()),
        ("OIDC_CLIENT_SECRET", secret.to_owned()),
        ("OIDC_CA", "idp-ca.pem".to_owned()),
    ] {
        shell.set(name, &value);
    }
    let added = shell.run(&steps[0], STEP).await;
    assert_eq!(
        added.stdout, "authprovider/sso created\n",
        "{}",
        added.stderr
    );
    shell.run(&steps[1], STEP).await;

    // Step 5: the CLI waits while olivia confirms its code in a browser.
    let printed = shell.dir.join("block.err");
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("olivia", 1280, 900).await;
    let confirm = async {
        let (page, code) = loop {
            let text = std::fs::read_to_string(&printed).unwrap_or_default();
            let page = text
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("https://"));
            let code = text.lines().find_map(|l| l.trim().strip_prefix("Code:"));
            if let (Some(page), Some(code)) = (page, code) {
                break (page.to_owned(), code.trim().to_owned());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        browser.goto(&page).await;
        let sign_in = browser
            .run(
                "return document.querySelector('a[data-provider=sso]').href;",
                json!([]),
            )
            .await;
        through_provider(&browser, sign_in.as_str().unwrap(), "olivia").await;
        let request = tests::signin::device_request(&browser, &page, &code).await;
        assert!(request.contains(&code), "{request}");
        browser.click("#device-approve").await;
        browser.find("#cli-done").await;
    };
    let (signed_in, ()) = tokio::join!(shell.run(&steps[2], STEP), confirm);
    assert!(
        signed_in.stdout.contains("as sso-olivia (with sso)"),
        "{}",
        signed_in.stdout
    );
    let olivia = shell.dir.join("olivia.json");
    let r = hub_cli(&olivia, &["get", "clusters"], "");
    assert!(
        has_row(&r.stdout, &["prod"]),
        "her group's role shows her prod: {}",
        r.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_guide_works_as_written() {
    let steps = blocks("define-a-role");
    assert_eq!(steps.len(), 6, "{steps:#?}");
    let (hub, mut shell, password) = hub_and_shell("guide-role").await;
    // The reader's imported cluster, with its agent connected, and kubectl on it as its admin.
    let admin = tests::login(hub.addr, "admin", &password).await;
    let registration = tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    let url = hub.url();
    let cluster_dir = shell.dir.join("cluster");
    std::fs::create_dir_all(&cluster_dir).unwrap();
    let imported =
        Imported::attach(cluster_dir, hub, admin, registration, SimConfig::default()).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    shell.set("KUBECONFIG", imported.sim_admin.to_str().unwrap());
    shell.set("HUB", &url);

    let made = shell.run(&steps[0], STEP).await;
    for line in [
        "Project shop created in cluster prod.",
        "namespace/shop-a created",
        "namespace/shop-a labeled",
        "deployment.apps/web created",
        "secret/db created",
    ] {
        assert!(made.stdout.contains(line), "{line}: {}", made.stdout);
    }
    let defined = shell.run(&steps[1], STEP).await;
    assert!(
        defined.stdout.contains("Role template deployer created."),
        "{}",
        defined.stdout
    );
    assert!(
        has_row(
            &defined.stdout,
            &["deployer", "project", "no", "2", "Deployer"]
        ),
        "{}",
        defined.stdout
    );
    for builtin in [
        "cluster-owner",
        "cluster-member",
        "read-only",
        "project-owner",
        "project-member",
        "project-read-only",
    ] {
        assert!(
            has_row(&defined.stdout, &[builtin]),
            "{builtin}: {}",
            defined.stdout
        );
    }
    let granted = shell.run(&steps[2], STEP).await;
    assert!(
        granted.stdout.contains("User dan created.")
            && granted
                .stdout
                .contains("Granted deployer (binding shop-group-ci)."),
        "{}",
        granted.stdout
    );
    let seen = shell.run(&steps[3], STEP).await;
    assert_eq!(
        seen.stdout,
        "[\"deployments\",\"deployments/scale\"] [\"pods\",\"pods/log\"]\ndrover-role-deployer ci\n",
        "{}",
        seen.stderr
    );
    let as_dan = shell.run(&steps[4], STEP).await;
    assert!(
        as_dan.stdout.contains("deployment.apps/web scaled"),
        "{}",
        as_dan.stdout
    );
    assert!(
        as_dan.stderr.contains(
            "Error from server (Forbidden): secrets is forbidden: User \"dan\" cannot list resource \"secrets\" in API group \"\" in the namespace \"shop-a\""
        ),
        "{}",
        as_dan.stderr
    );
    let (_, replicas, _) = kubectl(
        &imported.sim_admin,
        &[
            "-n",
            "shop-a",
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .await;
    assert_eq!(replicas, "2");
    let removed = shell.run(&steps[5], STEP).await;
    assert!(
        removed
            .stdout
            .contains("Role binding shop-group-ci revoked.")
            && removed.stdout.contains("Role template deployer deleted."),
        "{}",
        removed.stdout
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (exists, _, _) = kubectl(
            &imported.sim_admin,
            &["get", "clusterrole", "drover-role-deployer"],
        )
        .await;
        if !exists {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ClusterRole stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    imported.shutdown.cancel();
    let _ = agent.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubectl_guide_works_as_written() {
    let steps = blocks("manage-the-hub-with-kubectl");
    assert_eq!(steps.len(), 4, "{steps:#?}");
    let dir = temp_dir("guide-kubectl");
    // The hub's URL is the address kubectl reaches it by, as on a reader's machine.
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let (_hub, mut shell, _) = shell_on(hub, &dir).await;

    let crd = shell.run(&steps[0], STEP).await;
    let header: Vec<&str> = crd
        .stdout
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "CREATED", "AT"], "{}", crd.stdout);
    assert!(
        has_row(&crd.stdout, &["clusters.management.drover.io"]),
        "{}",
        crd.stdout
    );
    // What `export` keeps in the reader's shell.
    let kubeconfig = shell.dir.join("hub.kubeconfig").display().to_string();
    shell.set("KUBECONFIG", &kubeconfig);

    let created = shell.run(&steps[1], STEP).await;
    let mut lines = created.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("cluster.management.drover.io/edge created")
    );
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "STATE", "TYPE", "VERSION", "NODES", "AGE"],
        "{}",
        created.stdout
    );
    assert!(
        has_row(&created.stdout, &["edge", "pending"])
            || has_row(&created.stdout, &["edge", "provisioning"]),
        "{}",
        created.stdout
    );

    let changed = shell.run(&steps[2], STEP).await;
    let lines: Vec<&str> = changed.stdout.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "cluster.management.drover.io/edge labeled",
            "cluster.management.drover.io/edge patched",
            "the shop floor"
        ],
        "{}",
        changed.stdout
    );
    for field in ["controlPlaneConcurrency", "workerConcurrency", "drain"] {
        assert!(
            changed.stdout.contains(field),
            "{field}: {}",
            changed.stdout
        );
    }

    let deleted = shell.run(&steps[3], STEP).await;
    assert_eq!(
        deleted.stdout.lines().collect::<Vec<_>>(),
        ["yes", "cluster.management.drover.io \"edge\" deleted"],
        "{}",
        deleted.stdout
    );
}
