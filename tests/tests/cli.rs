//! `drover-hub` as a command-line client of a running hub: what people type and scripts parse.

#![allow(clippy::unwrap_used)]

use serde_json::Value;
use tests::{HubProcess, api, hub_cli as cli, hub_command, logs_in, printed_password, temp_dir};

#[tokio::test]
async fn an_operator_logs_in_creates_a_cluster_and_manages_tokens_from_the_command_line() {
    let data = temp_dir("cli");
    let hub = HubProcess::start(&data).await;
    let password = hub.admin_password.clone().unwrap();
    let config = data.join("cli.json");
    let url = hub.url();

    // Not logged in yet: exit code 4.
    let r = cli(&config, &["cluster", "list"], "");
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("drover-hub login"), "{}", r.stderr);

    // A wrong CA checksum refuses the login (3); a wrong password is refused by the hub (1).
    let wrong_ca = "0".repeat(64);
    let r = cli(
        &config,
        &[
            "login",
            "--server",
            &url,
            "--password-stdin",
            "--ca-checksum",
            &wrong_ca,
        ],
        &password,
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    let r = cli(
        &config,
        &["login", "--server", &url, "--password-stdin"],
        "not-the-password\n",
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    let r = cli(
        &config,
        &[
            "login",
            "--server",
            &url,
            "--password-stdin",
            "--ca-checksum",
            &hub.ca_checksum,
        ],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("Logged in"), "{}", r.stdout);
    // Logging in again from this CLI replaces its token: the first no longer works.
    let first = saved_token(&config);
    let r = cli(
        &config,
        &["login", "--server", &url, "--password-stdin"],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let second = saved_token(&config);
    assert_ne!(first, second);
    let (status, _) = api(hub.addr, "GET", "/v1/me", Some(&first), None).await;
    assert_eq!(status, 401, "the replaced token still works");
    let (status, _) = api(hub.addr, "GET", "/v1/me", Some(&second), None).await;
    assert_eq!(status, 200);
    let r = cli(&config, &["token", "list", "--user", "admin"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout
            .lines()
            .filter(|l| l.contains("drover-hub CLI"))
            .count(),
        1,
        "{}",
        r.stdout
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&config).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    let r = cli(&config, &["cluster", "create", "prod"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    // The command names the hub by its server URL (here the machine's name), not how we reached it.
    // First the command that pins the hub's CA, then the alternatives.
    let first = r
        .stdout
        .lines()
        .find(|l| l.contains("/v3/import/drr_"))
        .unwrap();
    assert!(
        first.trim().starts_with("curl -fsSk https://") && first.contains("sha256sum -c"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("kubectl apply -f https://"),
        "{}",
        r.stdout
    );
    let r = cli(
        &config,
        &[
            "cluster",
            "create",
            "edge",
            "--type",
            "custom",
            "--distribution",
            "k3s",
            "--kubernetes-version",
            "v1.33.4+k3s1",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("system-agent-install.sh"), "{}", r.stdout);
    let r = cli(&config, &["cluster", "create", "prod"], "");
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);

    let r = cli(&config, &["cluster", "list"], "");
    assert!(r.stdout.starts_with("NAME"), "{}", r.stdout);
    assert!(
        r.stdout
            .lines()
            .any(|l| l.starts_with("prod ") && l.contains("pending")),
        "{}",
        r.stdout
    );
    let r = cli(&config, &["cluster", "list", "-o", "json"], "");
    let list: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let r = cli(&config, &["cluster", "get", "prod", "-o", "yaml"], "");
    let prod: Value = serde_saphyr::from_str(&r.stdout).unwrap();
    assert_eq!(prod["spec"]["type"], "imported");

    let r = cli(&config, &["kubeconfig", "prod"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let kubeconfig: Value = serde_saphyr::from_str(&r.stdout).unwrap();
    let server = kubeconfig["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap();
    assert!(
        server.starts_with("https://") && server.ends_with("/k8s/clusters/prod"),
        "{server}"
    );
    assert!(
        kubeconfig["users"][0]["user"]["token"]
            .as_str()
            .unwrap()
            .starts_with("drt_")
    );

    let r = cli(&config, &["token", "create", "--description", "ci"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let value = r
        .stdout
        .split_whitespace()
        .find(|w| w.starts_with("drt_"))
        .unwrap()
        .to_owned();
    let name = value
        .trim_start_matches("drt_")
        .split('.')
        .next()
        .unwrap()
        .to_owned();
    let r = cli(&config, &["token", "list"], "");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[1..3], ["admin", "ci"], "{}", r.stdout);
    assert_eq!(columns.last(), Some(&"api"), "{}", r.stdout);
    assert!(r.stdout.starts_with("NAME"), "{}", r.stdout);
    assert!(r.stdout.lines().next().unwrap().contains("USER"));
    assert!(
        !r.stdout.contains(&value),
        "a token's value is never listed"
    );
    let hub_addr = hub.addr;
    let (status, _) = tests::api(hub_addr, "GET", "/v1/me", Some(&value), None).await;
    assert_eq!(status, 200, "the new token works");
    let r = cli(&config, &["token", "revoke", &name], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Revoked: gone from the list, and refused at once.
    let r = cli(&config, &["token", "list"], "");
    assert!(!r.stdout.contains(&name), "{}", r.stdout);
    let (status, _) = tests::api(hub_addr, "GET", "/v1/me", Some(&value), None).await;
    assert_eq!(status, 401, "a revoked token is refused");

    // Projects and their members.
    let r = cli(
        &config,
        &[
            "project",
            "create",
            "shop",
            "--cluster",
            "prod",
            "--display-name",
            "Shop",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("drover.io/project=shop"), "{}", r.stdout);
    let r = cli(&config, &["project", "list"], "");
    assert!(
        r.stdout.contains("shop") && r.stdout.contains("Shop"),
        "{}",
        r.stdout
    );
    let r = cli(
        &config,
        &[
            "project",
            "add-member",
            "shop",
            "--cluster",
            "prod",
            "--user",
            "admin",
            "--role",
            "project-owner",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("project-owner of project shop"),
        "{}",
        r.stdout
    );
    let r = cli(
        &config,
        &[
            "project",
            "add-member",
            "shop",
            "--cluster",
            "prod",
            "--user",
            "admin",
            "--role",
            "cluster-owner",
        ],
        "",
    );
    assert_eq!(r.code, 1, "a cluster role is not a project role");
    assert!(r.stderr.contains("cluster role"), "{}", r.stderr);
    let binding = |admin_token: String| async move {
        tests::api(
            hub_addr,
            "GET",
            "/v1/rolebindings/shop-admin",
            Some(&admin_token),
            None,
        )
        .await
        .0
    };
    let admin_token = saved_token(&config);
    assert_eq!(binding(admin_token.clone()).await, 200);
    let r = cli(
        &config,
        &["project", "remove-member", "shop", "--user", "admin"],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        binding(admin_token).await,
        404,
        "the member's binding is gone"
    );
    let r = cli(&config, &["project", "delete", "shop"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cli(&config, &["project", "list"], "");
    assert!(!r.stdout.contains("shop"), "{}", r.stdout);

    let r = cli(&config, &["cluster", "delete", "prod"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cli(&config, &["cluster", "get", "prod"], "");
    assert_eq!(r.code, 1);

    let r = cli(&config, &["cluster", "frobnicate"], "");
    assert_eq!(r.code, 2);

    assert!(hub.terminate().await);
    // The hub is gone: exit code 3.
    let r = cli(&config, &["cluster", "list"], "");
    assert_eq!(r.code, 3, "{}", r.stderr);
    std::fs::remove_dir_all(&data).unwrap();
}

#[tokio::test]
async fn reset_admin_password_sets_it_in_the_hubs_own_store_and_refuses_a_dir_without_one() {
    let data = temp_dir("cli-reset");
    let hub = HubProcess::start(&data).await;
    let old = hub.admin_password.clone().unwrap();
    let data_dir = data.to_str().unwrap();

    // While the hub runs: the new password works at once, the old one no more.
    let r = hub_command(&["reset-admin-password", "--data-dir", data_dir], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let new = printed_password(&r.stdout);
    assert_ne!(new, old);
    assert!(logs_in(hub.addr, "admin", &new).await);
    assert!(!logs_in(hub.addr, "admin", &old).await);

    // A directory with no hub state in it: refused, saying what to give; nothing is created
    // there (a password written to a new store is one no hub sees).
    let empty = temp_dir("cli-reset-empty");
    let r = hub_command(
        &[
            "reset-admin-password",
            "--data-dir",
            empty.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("no hub state in"), "{}", r.stderr);
    assert!(r.stderr.contains("--store"), "{}", r.stderr);
    assert!(!empty.join("state.db").exists());
    assert!(logs_in(hub.addr, "admin", &new).await);

    // Backup and restore of a hub on etcd: refused, pointing at etcd's own tools.
    for command in [
        vec!["backup", "--out", "/tmp/never-written"],
        vec!["restore", "--from", "/tmp/never-read"],
    ] {
        let mut args = command.clone();
        args.extend(["--data-dir", data_dir, "--store", "etcd://127.0.0.1:2379"]);
        let r = hub_command(&args, "");
        assert_eq!(r.code, 1, "{command:?}: {}", r.stdout);
        assert!(r.stderr.contains("etcdctl snapshot save"), "{}", r.stderr);
    }
}

#[test]
fn a_hub_that_cannot_start_says_why_once_and_what_to_do() {
    let data = temp_dir("cli-start");
    let data_dir = data.to_str().unwrap();
    // The port is taken: said once, with what to do.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let r = hub_command(&["serve", "--listen", &listen, "--data-dir", data_dir], "");
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.stderr.matches("in use").count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "cannot listen on {listen} (another process holds it"
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("--listen"), "{}", r.stderr);
    // A certificate file that is not there: the flag that named it, and the cause once.
    let r = hub_command(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
            "--tls-cert",
            "/nonexistent/hub.pem",
            "--tls-key",
            "/nonexistent/hub.key",
        ],
        "",
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("cannot read --tls-cert /nonexistent/hub.pem: "),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.matches("No such file").count(), 1, "{}", r.stderr);
}

#[tokio::test]
async fn login_asks_for_the_password_at_a_terminal_and_says_how_to_give_it_in_a_script() {
    let data = temp_dir("cli-prompt");
    let hub = HubProcess::start(&data).await;
    let password = hub.admin_password.clone().unwrap();
    let config = data.join("cli.json");
    let url = hub.url();

    // In a script (stdin not a terminal) and no password given: refused, saying how.
    let r = cli(&config, &["login", "--server", &url], "");
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--password-stdin") && r.stderr.contains("DROVER_PASSWORD"),
        "{}",
        r.stderr
    );

    // At a terminal (util-linux `script` gives the command one): asked for, then logged in.
    let login = format!(
        "{} login --server {url} --ca-checksum {} --config {}",
        tests::binary("drover-hub").display(),
        hub.ca_checksum,
        config.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &login, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(format!("{password}\n").as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("Password for admin: "), "{shown}");
    assert!(shown.contains("Logged in to"), "{shown}");

    // A wrong password for the default user says which user was tried and how to give another.
    let r = cli(
        &config,
        &["login", "--server", &url, "--password-stdin"],
        "not-the-password\n",
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("as user \"admin\"") && r.stderr.contains("--username"),
        "{}",
        r.stderr
    );
}

/// The API token the CLI keeps in `config` after `login`.
fn saved_token(config: &std::path::Path) -> String {
    let saved: Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    saved["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_admin_manages_users_and_their_roles_from_the_command_line() {
    let data = temp_dir("cli-users");
    let hub = HubProcess::start(&data).await;
    let config = data.join("cli.json");
    let r = cli(
        &config,
        &[
            "login",
            "--server",
            &hub.url(),
            "--password-stdin",
            "--ca-checksum",
            &hub.ca_checksum,
        ],
        &format!("{}\n", hub.admin_password.clone().unwrap()),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);

    let r = cli(
        &config,
        &[
            "user",
            "create",
            "ann",
            "--display-name",
            "Ann",
            "--group",
            "ops",
            "--password-stdin",
        ],
        "a long enough password\n",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cli(&config, &["user", "list"], "");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("ann "))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["ann", "Ann", "ops", "no"]
    );
    assert!(logs_in(hub.addr, "ann", "a long enough password").await);
    // A password too short is refused by the hub, saying why.
    let r = cli(
        &config,
        &["user", "set-password", "ann", "--password-stdin"],
        "short\n",
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("12 characters"), "{}", r.stderr);

    // Roles: granted, listed, effective, revoked.
    let me = async |password: &str| {
        let token = tests::login(hub.addr, "ann", password).await;
        tests::api(hub.addr, "GET", "/v1/me", Some(&token), None)
            .await
            .1
    };
    assert_eq!(me("a long enough password").await["admin"], false);
    let r = cli(
        &config,
        &["role", "grant", "--user", "ann", "--role", "admin"],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cli(&config, &["role", "list"], "");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("ann-admin-global"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["ann-admin-global", "user", "ann", "admin"]
    );
    assert_eq!(me("a long enough password").await["admin"], true);
    let r = cli(
        &config,
        &["role", "revoke", "--user", "ann", "--role", "admin"],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        !cli(&config, &["role", "list"], "")
            .stdout
            .contains("ann-admin-global")
    );
    assert_eq!(me("a long enough password").await["admin"], false);

    // A new password; then the user goes.
    let r = cli(
        &config,
        &["user", "set-password", "ann", "--password-stdin"],
        "another long password\n",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!logs_in(hub.addr, "ann", "a long enough password").await);
    assert!(logs_in(hub.addr, "ann", "another long password").await);
    let r = cli(&config, &["user", "delete", "ann"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!cli(&config, &["user", "list"], "").stdout.contains("ann "));
    assert!(!logs_in(hub.addr, "ann", "another long password").await);
}

/// Any of the hub's objects from the command line, as kubectl users work: `get` (a table,
/// YAML or JSON, one or all, by label), `apply -f` (created, configured, unchanged), `host`
/// and `setting`; and a user who may not do something is told so with exit code 1.
#[tokio::test]
async fn objects_of_any_kind_are_read_and_applied_from_the_command_line() {
    let data = temp_dir("cli-objects");
    let hub = HubProcess::start(&data).await;
    let config = data.join("cli.json");
    let password = hub.admin_password.clone().unwrap();
    let r = cli(
        &config,
        &["login", "--server", &hub.url(), "--password-stdin"],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);

    let file = data.join("fleet.yaml");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    write(
        "apiVersion: management.drover.io/v1\nkind: Cluster\nmetadata: {name: edge, labels: {env: prod}}\n\
         spec: {type: custom, distribution: k3s, version: v1.33.4+k3s1}\n---\n\
         kind: Host\nmetadata: {name: h1}\n\
         spec: {cluster: edge, roles: {etcd: true, controlPlane: true}, address: 10.0.0.5}\n---\n\
         kind: Setting\nmetadata: {name: session-ttl}\nspec: {value: 8h}\n",
    );
    let apply = || cli(&config, &["apply", "-f", file.to_str().unwrap()], "");
    let r = apply();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "cluster/edge created\nhost/h1 created\nsetting/session-ttl created\n"
    );
    let r = apply();
    assert_eq!(
        r.stdout, "cluster/edge unchanged\nhost/h1 unchanged\nsetting/session-ttl unchanged\n",
        "{}",
        r.stderr
    );

    // get: a table, one object as YAML, by label, JSON.
    let r = cli(&config, &["get", "clusters"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.starts_with("NAME"), "{}", r.stdout);
    assert!(
        r.stdout.lines().any(|l| l.starts_with("edge ")),
        "{}",
        r.stdout
    );
    let r = cli(&config, &["get", "Cluster", "edge", "-o", "yaml"], "");
    assert!(r.stdout.contains("env: prod"), "{}", r.stdout);
    let r = cli(
        &config,
        &["get", "cluster", "-l", "env=test", "-o", "json"],
        "",
    );
    let listed: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(listed["items"], serde_json::json!([]), "{}", r.stdout);
    let r = cli(&config, &["get", "pods"], "");
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("no kind \"pods\"") && r.stderr.contains("clusters, "),
        "{}",
        r.stderr
    );
    let r = cli(&config, &["get", "cluster", "nowhere"], "");
    assert_eq!(r.code, 1, "{}", r.stdout);

    // A label changed in the file: configured.
    write(
        "kind: Cluster\nmetadata: {name: edge, labels: {env: test}}\n\
         spec: {type: custom, distribution: k3s, version: v1.33.4+k3s1}\n",
    );
    assert_eq!(apply().stdout, "cluster/edge configured\n");
    let r = cli(&config, &["get", "cluster", "-l", "env=test"], "");
    assert!(
        r.stdout.lines().any(|l| l.starts_with("edge ")),
        "{}",
        r.stdout
    );

    // host and setting.
    let r = cli(&config, &["host", "list", "--cluster", "edge"], "");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("h1 "))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert_eq!(
        row.split_whitespace().take(4).collect::<Vec<_>>(),
        ["h1", "edge", "etcd,controlplane", "10.0.0.5"]
    );
    assert!(
        cli(&config, &["host", "get", "h1"], "")
            .stdout
            .contains("h1 ")
    );
    let r = cli(&config, &["setting", "set", "session-ttl", "12h"], "");
    assert_eq!(r.stdout, "setting/session-ttl configured\n", "{}", r.stderr);
    let r = cli(&config, &["setting", "get", "session-ttl"], "");
    let row = r.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["session-ttl", "12h"]
    );
    let r = cli(&config, &["setting", "set", "session-ttl", "forever"], "");
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stderr.contains("session-ttl"), "{}", r.stderr);
    // The hub refuses an object: the error names it and what was applied before it.
    write(
        "kind: Cluster\nmetadata: {name: second}\nspec: {type: imported}\n---\n\
         kind: Setting\nmetadata: {name: session-ttl}\nspec: {value: forever}\n",
    );
    let r = apply();
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stderr
            .contains("setting/session-ttl: the hub answered 422")
            && r.stderr
                .contains("(applied before it: cluster/second created)"),
        "{}",
        r.stderr
    );
    // A file that is not objects says which and why; nothing else is applied.
    write("kind: Setting\nspec: {value: 1h}\n");
    let r = apply();
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.stderr.contains("no kind or no metadata.name"),
        "{}",
        r.stderr
    );

    // A user who is not an admin is told what they may not do, with exit code 1.
    let r = cli(
        &config,
        &["user", "create", "bob", "--password-stdin"],
        "a long enough password\n",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let bob = data.join("bob.json");
    let r = cli(
        &bob,
        &[
            "login",
            "--server",
            &hub.url(),
            "--username",
            "bob",
            "--password-stdin",
        ],
        "a long enough password\n",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    for args in [
        &["user", "list"][..],
        &["get", "cloudcredentials"],
        &["setting", "set", "session-ttl", "1h"],
    ] {
        let r = cli(&bob, args, "");
        assert_eq!(r.code, 1, "{args:?}: {}", r.stdout);
        assert!(
            r.stderr.contains("user \"bob\" may not") && r.stderr.contains("admin role"),
            "{args:?}: {}",
            r.stderr
        );
    }
}
