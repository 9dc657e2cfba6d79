//! Custom clusters on `drover-sim host`s (real system-agents, each in a root directory and on a
//! loopback address of its own, no root privileges): a failed download explained within
//! seconds wherever a person looks, and a cluster whose hosts are gone removed anyway.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    HubProcess, api, binary,
    browser::{Browser, Driver},
    create_custom_cluster, hub_cli,
    local_host::{LocalHost, installs_the_standin, set},
    login, temp_dir,
};

/// Polls `path` as the admin until `done` accepts it; panics after `within`.
async fn until(
    hub: &HubProcess,
    admin: &str,
    path: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (_, value) = api(hub.addr, "GET", path, Some(admin), None).await;
        if done(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{path}: {value:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `browser` signed in to the dashboard as admin.
async fn signed_in(browser: &Browser<'_>, hub: &HubProcess) {
    browser.goto(&format!("{}/login", hub.url())).await;
    browser.type_into("#username", "admin").await;
    browser
        .type_into("#password", hub.admin_password.as_deref().unwrap())
        .await;
    browser.click("form#login button[type=submit]").await;
    browser.find("table#clusters").await;
}

/// The hub, its admin token, and the CLI's config logged in as admin.
async fn hub(dir: &Path) -> (HubProcess, String, PathBuf) {
    let hub = HubProcess::start(&dir.join("hub")).await;
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    let config = dir.join("cli.json");
    let r = hub_cli(
        &config,
        &["login", "--server", &hub.url(), "--password-stdin"],
        &format!("{password}\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    (hub, admin, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_fails_its_step_at_once_and_says_curls_error_everywhere() {
    let dir = temp_dir("local-download");
    let (hub, admin, config) = hub(&dir).await;
    // Nothing listens on the discard port: curl fails to connect at once.
    let url = "https://127.0.0.1:9/k3s-install.sh";
    set(&hub, &admin, "k3s-install-url", url).await;
    let registration = create_custom_cluster(
        hub.addr,
        &admin,
        "edge",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1"}),
    )
    .await;
    let started = Instant::now();
    let _host = LocalHost::start(
        &hub,
        registration["token"].as_str().unwrap(),
        "node-d1",
        "127.0.0.31",
        &dir,
    );
    let hosts = until(&hub, &admin, "/v1/hosts", Duration::from_secs(30), |v| {
        v["items"].as_array().is_some_and(|i| i.len() == 1)
    })
    .await;
    let host = hosts["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    // The plan's status: the step, curl's own error and the URL.
    let plan = until(
        &hub,
        &admin,
        &format!("/v1/plans/{host}"),
        Duration::from_secs(10),
        |p| {
            p["status"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        },
    )
    .await;
    let failed_after = started.elapsed();
    let message = plan["status"]["message"].as_str().unwrap();
    let curl = "Failed to connect to 127.0.0.1 port 9";
    assert!(
        message.starts_with("instruction \"install\" exited with 7: curl: (7) ")
            && message.contains(curl)
            && message.contains(&format!(
                "downloading the installer {url} failed (curl exit 7)"
            )),
        "{message}"
    );
    assert!(failed_after < Duration::from_secs(10), "{failed_after:?}");
    // The host's state, the cluster's condition and the CLI say the same.
    for path in [format!("/v1/hosts/{host}"), "/v1/clusters/edge".to_owned()] {
        let object = until(&hub, &admin, &path, Duration::from_secs(10), |o| {
            o["state"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(curl))
        })
        .await;
        assert_eq!(object["state"]["error"], true, "{object:#}");
    }
    for args in [["host", "get", host.as_str()], ["cluster", "get", "edge"]] {
        let shown = hub_cli(&config, &args, "");
        assert_eq!(shown.code, 0, "{}", shown.stderr);
        assert!(shown.stdout.contains(curl), "{args:?}: {}", shown.stdout);
    }
    let listed = hub_cli(&config, &["host", "list"], "");
    assert!(listed.stdout.contains(curl), "{}", listed.stdout);
    // And the cluster's page: its row, its host's row and its conditions.
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("download-failed", 1280, 900).await;
    signed_in(&browser, &hub).await;
    browser.goto(&format!("{}/clusters/edge", hub.url())).await;
    for table in ["cluster", "machines", "conditions"] {
        let shown = browser.text(&format!("table#{table}")).await;
        assert!(shown.contains(curl), "{table}: {shown}");
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_step_and_its_output_are_on_the_cluster_page_as_they_come() {
    let dir = temp_dir("local-progress");
    let (hub, admin, _) = hub(&dir).await;
    installs_the_standin(&hub, &admin, &dir).await;
    let registration = create_custom_cluster(
        hub.addr,
        &admin,
        "edge",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1"}),
    )
    .await;
    // A download that takes a while, as a real one does.
    let _host = LocalHost::start_with(
        &hub,
        registration["token"].as_str().unwrap(),
        "node-p1",
        "127.0.0.34",
        &dir,
        &[("DROVER_SIM_INSTALL_SECONDS", "60")],
    );
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("progress", 1280, 900).await;
    signed_in(&browser, &hub).await;
    browser.goto(&format!("{}/clusters/edge", hub.url())).await;
    // The rows are redrawn as the host reports: no reload.
    browser
        .until(
            "the host's running step and its output",
            Duration::from_secs(30),
            "const row = document.querySelector('#machines tbody tr'); \
             return !!row && row.textContent.includes('step install running since') \
               && !!row.querySelector('details.live[open] pre') \
               && row.querySelector('details.live pre').textContent.includes('[INFO] stand-in k3s v1.33.4+k3s1: downloading');",
        )
        .await;
    // The cluster says which host and step it waits on.
    let (_, cluster) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    let message = cluster["state"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("(node-p1): applying its plan: step 1 \"install\" running since "),
        "{message}"
    );
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_hosts_are_gone_is_removed_anyway_with_a_warning() {
    let dir = temp_dir("local-force");
    let (hub, admin, config) = hub(&dir).await;
    installs_the_standin(&hub, &admin, &dir).await;
    // Two clusters of a host each: one removed anyway with the CLI, one in the dashboard.
    let mut hosts = Vec::new();
    for (cluster, node, address) in [
        ("edge", "node-r1", "127.0.0.32"),
        ("core", "node-r2", "127.0.0.33"),
    ] {
        let registration = create_custom_cluster(
            hub.addr,
            &admin,
            cluster,
            json!({"distribution": "k3s", "version": "v1.33.4+k3s1"}),
        )
        .await;
        let token = registration["token"].as_str().unwrap();
        hosts.push(LocalHost::start(&hub, token, node, address, &dir));
    }
    for cluster in ["edge", "core"] {
        until(
            &hub,
            &admin,
            &format!("/v1/clusters/{cluster}"),
            Duration::from_secs(120),
            |c| c["state"]["state"] == "active",
        )
        .await;
    }
    // The machines are gone for good.
    for host in &mut hosts {
        host.stop();
    }

    // An ordinary delete waits for the host, saying on whom, since when, and the way out.
    let waiting = std::process::Command::new("timeout")
        .arg("6")
        .arg(binary("drover-hub"))
        .args(["cluster", "delete", "edge", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&waiting.stderr);
    assert_eq!(waiting.status.code(), Some(124), "still waiting: {said}");
    assert!(
        said.contains("removing: waiting since ")
            && said.contains("host(s) to run their uninstall plan: node-r1 (h-")
            && said.contains(
                "`drover-hub cluster delete edge --force` removes the cluster without them"
            ),
        "{said}"
    );
    let (_, cluster) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    assert_eq!(cluster["state"]["state"], "removing", "{cluster:#}");

    let forced = hub_cli(&config, &["cluster", "delete", "edge", "--force"], "");
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert!(
        forced.stdout.contains("Cluster edge deleted."),
        "{}",
        forced.stdout
    );

    // The dashboard: Delete waits the same way; Remove anyway asks, naming the host.
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("remove-anyway", 1280, 900).await;
    signed_in(&browser, &hub).await;
    browser.goto(&format!("{}/clusters/core", hub.url())).await;
    // Answering the question and clicking in one script: the page reloads itself as the
    // cluster changes, which would drop a confirm() replaced beforehand.
    let click_yes = |id: &str| {
        format!(
            "window.asked = []; window.confirm = (q) => {{ window.asked.push(q); return true; }}; \
             document.getElementById('{id}').click(); return window.asked;"
        )
    };
    browser.find("#delete-cluster").await;
    browser.run(&click_yes("delete-cluster"), json!([])).await;
    browser.find("#remove-anyway").await;
    let asked = browser.run(&click_yes("remove-anyway"), json!([])).await;
    let asked = asked[0].as_str().unwrap_or_default();
    assert!(
        asked.starts_with("Remove cluster core without its hosts?")
            && asked.contains("may keep running its distribution: node-r2 (h-"),
        "{asked}"
    );
    until(&hub, &admin, "/v1/clusters", Duration::from_secs(30), |c| {
        c["items"] == json!([])
    })
    .await;
    browser.close().await;

    let (_, listed) = api(hub.addr, "GET", "/v1/hosts", Some(&admin), None).await;
    assert_eq!(listed["items"], json!([]), "the hosts are forgotten");
    for (cluster, node) in [("edge", "node-r1"), ("core", "node-r2")] {
        let (_, events) = api(
            hub.addr,
            "GET",
            &format!("/v1/events?cluster={cluster}"),
            Some(&admin),
            None,
        )
        .await;
        let warning = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["reason"] == "RemovedAnyway")
            .unwrap_or_else(|| panic!("{events:#}"));
        assert_eq!(warning["type"], "Warning");
        let message = warning["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("may still run its distribution: {node} (h-"))
                && message.contains("k3s-uninstall.sh"),
            "{message}"
        );
    }
    // Its agent's credential went with it: the host, started again, is refused.
    let again = LocalHost::start(&hub, "unused", "node-r1", "127.0.0.32", &dir);
    let log = dir.join("node-r1.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("refused this agent's credential")
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(again);
}
