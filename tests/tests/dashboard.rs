//! The dashboard in a real headless Chromium: log in, create an imported cluster and get its
//! command with a copy button, watch its row turn `active` without a reload when a (simulated)
//! cluster's agent connects, and a read-only user sees no admin controls. Every page is checked
//! for unlabelled controls and unreadable text, and saved as a screenshot under
//! `target/screenshots/` for review.
//!
//! The downstream cluster is `sim`'s simulated API server; the hub, the cluster-agent, kubectl
//! (applying the import manifest) and the browser are the real ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api,
    browser::{Browser, Driver, check_and_save_as},
    imported::Imported,
    login, temp_dir,
};

async fn check_and_save(browser: &Browser<'_>, name: &str) {
    check_and_save_as(browser, &format!("dashboard-{name}")).await;
}

async fn log_in(browser: &Browser<'_>, base: &str, user: &str, password: &str) {
    browser.goto(&format!("{base}/")).await;
    // No session: the dashboard sends the browser to the login page.
    browser.find("form#login").await;
    assert!(browser.url().await.contains("/login"));
    browser.type_into("#username", user).await;
    browser.type_into("#password", password).await;
    browser.click("form#login button[type=submit]").await;
    browser.find("table#clusters").await;
}

/// The state the clusters page shows for `name` now.
async fn row_state(browser: &Browser<'_>, name: &str) -> Value {
    browser
        .run(
            "const row = document.querySelector(`tr[data-name=\"${arguments[0]}\"]`); return row ? row.dataset.state : null;",
            json!([name]),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_and_drive_the_fleet_in_a_browser() {
    let dir = temp_dir("dashboard");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("admin", 1280, 900).await;

    // A wrong password says so and stays on the page.
    browser.goto(&format!("{base}/login")).await;
    browser.type_into("#username", "admin").await;
    browser.type_into("#password", "not the password").await;
    browser.click("form#login button[type=submit]").await;
    browser
        .until(
            "the login error",
            Duration::from_secs(10),
            "return document.getElementById('login-error').textContent.includes('wrong');",
        )
        .await;
    check_and_save(&browser, "login").await;

    log_in(&browser, &base, "admin", &password).await;
    assert!(browser.exists("#no-rows:not([hidden])").await);
    check_and_save(&browser, "clusters-empty").await;

    // Create an imported cluster: the command to run appears, with a copy button.
    browser.click("a[href='/clusters/new']").await;
    browser.type_into("#name", "web").await;
    check_and_save(&browser, "create-cluster").await;
    browser
        .click("form#create-cluster button[type=submit]")
        .await;
    browser
        .until(
            "the import command",
            Duration::from_secs(10),
            "return !document.getElementById('created').hidden;",
        )
        .await;
    let command = browser.text("#command").await;
    assert!(command.contains("/v3/import/"), "{command}");
    assert_eq!(
        browser
            .run(
                "return document.querySelector('button.copy').getAttribute('aria-label');",
                json!([])
            )
            .await,
        "Copy the command"
    );
    check_and_save(&browser, "cluster-created").await;
    // The same name again is refused with the hub's reason.
    browser.goto(&format!("{base}/clusters/new")).await;
    browser.type_into("#name", "web").await;
    browser
        .click("form#create-cluster button[type=submit]")
        .await;
    browser
        .until(
            "the duplicate's error",
            Duration::from_secs(10),
            "return document.getElementById('create-error').textContent.includes('already exists');",
        )
        .await;

    // The clusters page: `web` waits for its agent.
    browser.goto(&format!("{base}/clusters")).await;
    browser.find("tr[data-name='web']").await;
    assert_eq!(row_state(&browser, "web").await, "pending");
    // A mark that a reload would wipe.
    browser.run("window.notReloaded = true;", json!([])).await;

    // The cluster's agent connects: the row turns active, live.
    let token = command
        .rsplit("/v3/import/")
        .next()
        .and_then(|rest| rest.split(".yaml").next())
        .unwrap()
        .to_owned();
    let admin = login(hub.addr, "admin", &password).await;
    let imported = Imported::attach(
        dir.clone(),
        hub,
        admin.clone(),
        token,
        SimConfig {
            nodes: 3,
            ..SimConfig::default()
        },
    )
    .await;
    let config =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-0").await)
            .unwrap();
    let agent_stop = imported.shutdown.child_token();
    let agent = tokio::spawn(cluster_agent::run(config, agent_stop.clone()));
    browser
        .until(
            "web's row turning active without a reload",
            Duration::from_secs(30),
            "const row = document.querySelector('tr[data-name=\"web\"]'); return window.notReloaded === true && row !== null && row.dataset.state === 'active' && row.textContent.includes('3/3');",
        )
        .await;
    check_and_save(&browser, "clusters-active").await;

    // Filtering asks the hub for what matches, keeps the view in the address, and says when
    // nothing does; clearing it brings the row back, all without a reload.
    browser.type_into("#filter", "nothing-like-this").await;
    browser
        .until(
            "the filter",
            Duration::from_secs(5),
            "const none = document.getElementById('no-rows'); return document.querySelector('tr[data-name=\"web\"]') === null && none !== null && none.textContent.includes('Nothing matches');",
        )
        .await;
    assert!(
        browser
            .url()
            .await
            .ends_with("/clusters?q=nothing-like-this")
    );
    browser
        .run(
            "const input = document.getElementById('filter'); input.value = ''; input.dispatchEvent(new Event('input', {bubbles: true}));",
            json!([]),
        )
        .await;
    browser
        .until(
            "the filter cleared",
            Duration::from_secs(5),
            "return window.notReloaded === true && document.querySelector('tr[data-name=\"web\"]') !== null;",
        )
        .await;

    // The agent stops: the row shows it without a reload. How long after the hub's own record
    // of it the page shows it is printed (a figure, not a pass mark).
    let stopped = std::time::Instant::now();
    agent_stop.cancel();
    let hub_saw = tokio::spawn({
        let (addr, admin) = (imported.hub.addr, admin.clone());
        async move {
            loop {
                let (_, web) = api(addr, "GET", "/v1/clusters/web", Some(&admin), None).await;
                if web["state"]["state"] == "disconnected" {
                    return stopped.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    browser
        .until(
            "web's row turning disconnected without a reload",
            Duration::from_secs(30),
            "const row = document.querySelector('tr[data-name=\"web\"]'); return window.notReloaded === true && row.dataset.state === 'disconnected';",
        )
        .await;
    let page_saw = stopped.elapsed();
    let hub_saw = hub_saw.await.unwrap();
    eprintln!(
        "live update: the hub recorded web disconnected {hub_saw:?} after its agent stopped, the page showed it {page_saw:?} after (lag {:?})",
        page_saw.saturating_sub(hub_saw)
    );

    // A node-agent reports its node: the cluster page lists it, live, with its CPU sparkline,
    // and the node's page shows its facts and four charts.
    let node_config =
        node_agent::Config::from_env(&imported.node_agent_env("node-0").await).unwrap();
    let node_agent = tokio::spawn(node_agent::run(node_config, imported.shutdown.clone()));
    browser.goto(&format!("{base}/clusters/web")).await;
    browser.find("table#cluster tr[data-name='web']").await;
    assert!(browser.text("main").await.contains("Connected"));
    // The summary says what each of its cells is.
    let headings = browser.text("table#cluster thead").await;
    for heading in ["State", "Kubernetes", "Nodes ready", "Use", "Agents"] {
        assert!(headings.contains(heading), "{headings}");
    }
    // The cluster's owner makes a project and gives someone a role on it, on this page (a
    // member is given only to a project that exists).
    assert!(!browser.exists("#create-project-member").await);
    browser.type_into("#project-name", "shop").await;
    browser.type_into("#project-display", "Shop <front>").await;
    browser.click("#create-project button[type='submit']").await;
    browser.find("table#projects").await;
    browser.type_into("#member-project", "shop").await;
    browser.type_into("#member-user", "admin").await;
    browser
        .click("#create-project-member button[type='submit']")
        .await;
    browser
        .until(
            "the new member listed",
            Duration::from_secs(10),
            "const t = document.querySelector('table#projects'); return t !== null && t.textContent.includes('admin (project-member)');",
        )
        .await;
    let projects = browser.text("table#projects").await;
    assert!(
        projects.contains("Shop <front>") && projects.contains("drover.io/project=shop"),
        "{projects}"
    );
    let (status, binding) = api(
        imported.hub.addr,
        "GET",
        "/v1/rolebindings/shop-admin",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "the same binding name as the CLI's: {binding}");
    assert_eq!(binding["spec"]["project"], "shop");
    browser.click("#projects button.delete").await;
    browser
        .until(
            "the member removed",
            Duration::from_secs(10),
            "const t = document.querySelector('table#projects'); return t !== null && !t.textContent.includes('admin (project-member)');",
        )
        .await;
    browser
        .until(
            "node-0 on the cluster page without a reload",
            Duration::from_secs(30),
            "const row = document.querySelector('#machines tr[data-name=\"node-0\"]'); return row !== null && row.dataset.state === 'active' && row.querySelector('svg.spark polyline') !== null;",
        )
        .await;
    browser
        .until(
            "the cluster's events",
            Duration::from_secs(10),
            "return document.querySelector('#events li[data-reason=\"AgentConnected\"]') !== null;",
        )
        .await;
    // The kubeconfig downloads; a new registration command comes with a copy button.
    browser.click("#kubeconfig").await;
    browser
        .until(
            "the kubeconfig download",
            Duration::from_secs(10),
            "const a = document.getElementById('kubeconfig-link'); return a !== null && a.href.startsWith('blob:');",
        )
        .await;
    browser.click("#new-registration").await;
    browser
        .until(
            "a new registration command",
            Duration::from_secs(10),
            "return document.getElementById('registration-command').textContent.includes('/v3/import/');",
        )
        .await;
    // The clusters page offers the hub's own kubeconfig, for kubectl to manage the hub.
    browser.goto(&format!("{base}/clusters")).await;
    browser.click("#hub-kubeconfig").await;
    browser
        .until(
            "the hub's kubeconfig download",
            Duration::from_secs(10),
            "const a = document.getElementById('hub-kubeconfig-link'); return a !== null && a.href.startsWith('blob:') && a.download === 'drover-hub.kubeconfig.yaml';",
        )
        .await;
    browser.goto(&format!("{base}/clusters/web")).await;
    check_and_save(&browser, "cluster-detail").await;
    browser
        .click("#machines a[href='/clusters/web/nodes/node-0']")
        .await;
    browser.find("dl.facts").await;
    assert_eq!(
        browser
            .run(
                "return document.querySelectorAll('figure.chart svg').length;",
                json!([])
            )
            .await,
        4
    );
    assert!(browser.text("dl.facts").await.contains("Kernel"));
    // The node's Kubernetes side (labels, taints, pods, cordon, drain) is one link away.
    let explore = browser
        .run(
            "return document.getElementById('node-explorer').getAttribute('href');",
            json!([]),
        )
        .await;
    assert_eq!(explore, "/clusters/web/explorer/nodes/node-0");
    check_and_save(&browser, "node").await;

    // A host (a real system-agent, in this process) registers to a custom cluster, paused so
    // nothing is installed; a plan whose instruction fails shows on the cluster's page with
    // the instruction's output.
    browser.goto(&format!("{base}/clusters/new")).await;
    browser.type_into("#name", "edge").await;
    browser.click("input[name='type'][value='custom']").await;
    browser.find("#custom-fields:not([hidden])").await;
    browser
        .click("form#create-cluster button[type=submit]")
        .await;
    browser
        .until(
            "the host command",
            Duration::from_secs(10),
            "return !document.getElementById('created').hidden;",
        )
        .await;
    let command = browser.text("#command").await;
    assert!(command.contains("/system-agent-install.sh"), "{command}");
    let (_, edge) = api(
        imported.hub.addr,
        "GET",
        "/v1/clusters/edge",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(
        (
            &edge["spec"]["distribution"],
            &edge["spec"]["version"],
            &edge["spec"]["upgradeStrategy"]["workerConcurrency"]
        ),
        (&json!("k3s"), &json!("v1.33.4+k3s1"), &json!("10%")),
        "{edge}"
    );
    // Paused before any host registers: the host here is this machine.
    let (status, body) = api(
        imported.hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(&admin),
        Some(json!({"spec": {"paused": true}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let token = command
        .split("--token ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    let host_dir = dir.join("host");
    let host_agent = system_agent::Agent::start(
        system_agent::Config {
            hub: Some(system_agent::HubSettings {
                server: imported.hub.url(),
                token: tunnel::Secret::new(token),
                ca_checksum: imported.hub.ca_checksum.clone(),
                state_dir: host_dir.clone(),
                local_address: None,
                proxy: Default::default(),
            }),
            dir: host_dir.clone(),
            host: system_agent::HostSpec {
                roles: system_agent::Roles {
                    worker: true,
                    ..system_agent::Roles::default()
                },
                node_name: "w1".into(),
                ..system_agent::HostSpec::default()
            },
            local_plans: None,
            root: system_agent::Root::default(),
            machine: None,
            retry: system_agent::Retry::default(),
        },
        imported.shutdown.clone(),
    )
    .await
    .unwrap();
    let registered: Value =
        serde_json::from_slice(&std::fs::read(host_dir.join("registration.json")).unwrap())
            .unwrap();
    let host = registered["id"]
        .as_str()
        .unwrap()
        .strip_prefix("host/")
        .unwrap()
        .to_owned();
    let (status, body) = api(
        imported.hub.addr,
        "POST",
        "/v1/plans",
        Some(&admin),
        Some(json!({"metadata": {"name": host}, "spec": {"host": host, "cluster": "edge", "plan": {
            "instructions": [{"name": "check-disk", "script": "echo 'no space left on /var/lib/rancher' >&2; exit 3"}],
            "maxFailures": 1,
        }}})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    browser.goto(&format!("{base}/clusters/edge")).await;
    let row = format!("#machines tr[data-name='{host}']");
    browser.find(&row).await;
    browser
        .until(
            "the failed plan's output on the cluster page",
            Duration::from_secs(30),
            &format!(
                "const row = document.querySelector(\"{row}\"); return row !== null && row.querySelector('.plan-failed') !== null && row.textContent.includes('check-disk exited 3') && row.textContent.includes('no space left');"
            ),
        )
        .await;
    check_and_save(&browser, "cluster-custom-failed-plan").await;
    // An etcd snapshot on demand from the cluster's page (the cluster is paused, so it waits
    // to be taken: the taking is the day-2 test's), then deleted again.
    browser
        .type_into("#snapshot-name", "from-the-dashboard")
        .await;
    browser.click("#snapshot-copy").await;
    browser
        .click("form#create-snapshot button[type=submit]")
        .await;
    browser
        .until(
            "the new snapshot in the table",
            Duration::from_secs(10),
            "return document.querySelector('#snapshots tbody').textContent.includes('from-the-dashboard');",
        )
        .await;
    let (status, snapshot) = api(
        imported.hub.addr,
        "GET",
        "/v1/etcdsnapshots/from-the-dashboard",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{snapshot}");
    assert_eq!(
        (
            &snapshot["spec"]["cluster"],
            &snapshot["spec"]["copyToHub"],
            &snapshot["state"]["state"]
        ),
        (&json!("edge"), &json!(true), &json!("pending"))
    );
    check_and_save(&browser, "cluster-custom-snapshot").await;
    browser
        .click(
            "#snapshots button.snapshot-delete[data-path='/v1/etcdsnapshots/from-the-dashboard']",
        )
        .await;
    browser
        .until(
            "the snapshot gone from the table",
            Duration::from_secs(10),
            "return !document.querySelector('#snapshots tbody').textContent.includes('from-the-dashboard');",
        )
        .await;
    // Sorting by name, both ways.
    browser.goto(&format!("{base}/clusters")).await;
    browser.find("tr[data-name='edge']").await;
    let first = "return document.querySelector('#clusters tbody tr').dataset.name;";
    assert_eq!(browser.run(first, json!([])).await, "edge");
    browser.click("#clusters thead a.sort").await;
    browser
        .until(
            "the clusters by name, backwards",
            Duration::from_secs(5),
            "return document.querySelector('#clusters tbody tr').dataset.name === 'web';",
        )
        .await;
    assert!(browser.url().await.ends_with("/clusters?sort=-name&page=1"));
    assert_eq!(
        browser
            .run(
                "return document.querySelector('th[aria-sort]').getAttribute('aria-sort');",
                json!([])
            )
            .await,
        "descending"
    );
    browser.goto(&format!("{base}/hosts")).await;
    browser
        .find(&format!("#hosts tr[data-name='{host}']"))
        .await;
    assert!(browser.text("#hosts").await.contains("worker"));
    // Listed by its node name first; its id (a hash) beside it.
    let link = browser
        .text(&format!("#hosts a[href='/hosts/{host}']"))
        .await;
    assert!(link.starts_with("w1 ") && link.contains(&host), "{link}");
    check_and_save(&browser, "hosts").await;
    browser
        .click(&format!("#hosts a[href='/hosts/{host}']"))
        .await;
    browser.find(&format!("#host tr[data-name='{host}']")).await;
    browser.find("dl.facts").await;
    check_and_save(&browser, "host").await;

    // Users: the admin creates a user and grants them read-only on `web`, from the page.
    browser.goto(&format!("{base}/users")).await;
    browser.type_into("#user-name", "viewer").await;
    browser
        .type_into("#user-password", "a long enough password")
        .await;
    browser.click("form#create-user button[type=submit]").await;
    browser.find("#users tr[data-name='viewer']").await;
    browser.type_into("#binding-user", "viewer").await;
    browser
        .run(
            "document.getElementById('binding-cluster').value = 'web';",
            json!([]),
        )
        .await;
    browser
        .click("form#create-binding button[type=submit]")
        .await;
    browser
        .find("#bindings tr[data-name='viewer-read-only-web']")
        .await;
    check_and_save(&browser, "users").await;

    // An API token, shown once, that works.
    browser.goto(&format!("{base}/tokens")).await;
    browser.type_into("#token-description", "ci").await;
    browser.click("form#create-token button[type=submit]").await;
    browser
        .until(
            "the new token",
            Duration::from_secs(10),
            "return !document.getElementById('token-created').hidden;",
        )
        .await;
    let token = browser.text("#token-value").await;
    let (status, me) = api(imported.hub.addr, "GET", "/v1/me", Some(&token), None).await;
    assert_eq!((status, me["user"].as_str()), (200, Some("admin")), "{me}");
    check_and_save(&browser, "tokens").await;
    browser.goto(&format!("{base}/tokens")).await;
    assert!(
        !browser.text("main").await.contains(&token),
        "a token is shown once"
    );

    // A custom cluster (no hosts: nothing to plan) paused and resumed from its page.
    tests::create_custom_cluster(
        imported.hub.addr,
        &admin,
        "idle",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1"}),
    )
    .await;
    let paused = async || {
        let (_, idle) = api(
            imported.hub.addr,
            "GET",
            "/v1/clusters/idle",
            Some(&admin),
            None,
        )
        .await;
        idle["spec"]["paused"] == true
    };
    for (label, then) in [("Pause provisioning", true), ("Resume provisioning", false)] {
        browser.goto(&format!("{base}/clusters/idle")).await;
        assert_eq!(browser.text("#pause").await, label);
        browser.click("#pause").await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while paused().await != then {
            assert!(std::time::Instant::now() < deadline, "{label} did not take");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Its page, while it waits for hosts, gives the command that registers one.
    browser.click("#new-registration").await;
    browser
        .until(
            "the pending cluster's host command",
            Duration::from_secs(10),
            "return document.getElementById('registration-command').textContent.includes('system-agent-install.sh');",
        )
        .await;

    browser.click("#logout").await;
    browser.find("form#login").await;
    browser.close().await;

    // The read-only user, on a phone: the clusters they may see, no create button, no create
    // page, no admin pages.
    let phone = driver.browser("viewer", 390, 844).await;
    log_in(&phone, &base, "viewer", "a long enough password").await;
    phone.find("tr[data-name='web']").await;
    assert!(!phone.exists("tr[data-name='edge']").await);
    assert!(!phone.exists("a[href='/clusters/new']").await);
    assert!(!phone.exists("nav a[href='/users']").await);
    check_and_save(&phone, "clusters-read-only-phone").await;
    phone.goto(&format!("{base}/clusters/new")).await;
    assert!(phone.text("main").await.contains("Only admins"));
    assert!(!phone.exists("form#create-cluster").await);
    phone.goto(&format!("{base}/users")).await;
    assert!(phone.text("main").await.contains("Only admins"));
    assert!(!phone.exists("form#create-user").await);
    phone.goto(&format!("{base}/clusters/web")).await;
    phone.find("table#cluster").await;
    assert!(!phone.exists("#new-registration").await);
    phone.close().await;
    node_agent.abort();
    drop(host_agent);

    // Nothing secret reached the hub's log: not the admin's password, no token.
    let log = imported.hub.log.lock().unwrap().join("\n");
    assert!(log.len() > 1000, "the hub logged next to nothing: {log}");
    let leaks = tests::leaked_secrets(&log, &[&password, "a long enough password"]);
    assert!(leaks.is_empty(), "secrets in the hub's log: {leaks:?}");

    imported.shutdown.cancel();
    let _ = agent.await;
}

/// A custom cluster's machine pools on its page, against moto's EC2 (no instance boots here:
/// machines stay `Bootstrapping`, which is what the page must show). An admin creates the
/// cluster with a pool on the create page, scales the pool with its buttons and adds a pool; the rows follow without a reload; a read-only user sees
/// the pools but no control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_scale_machine_pools_from_the_cluster_page() {
    let dir = temp_dir("dashboard-pools");
    let moto = tests::cloud::Moto::start(&dir).await;
    let hub = HubProcess::start(&dir.join("hub")).await;
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    let cloud = json!({"region": "us-east-1", "endpoint": moto.endpoint, "endpointCA": moto.ca_pem,
                       "ami": moto.ami, "instanceType": "t3.small", "subnetId": moto.subnet_id});
    for (path, object) in [
        (
            "/v1/cloudcredentials",
            json!({"metadata": {"name": "aws"}, "spec": {"driver": "amazonec2",
                   "amazonec2": {"accessKeyId": moto.credentials.access_key_id,
                                 "secretAccessKey": moto.credentials.secret_access_key}}}),
        ),
        (
            "/v1/machinetemplates",
            json!({"metadata": {"name": "cloud"}, "spec": {"driver": "amazonec2",
                   "credential": "aws", "amazonec2": cloud}}),
        ),
        (
            "/v1/users",
            json!({"metadata": {"name": "viewer"}, "spec": {"password": "a long enough password"}}),
        ),
    ] {
        let (status, body) = api(hub.addr, "POST", path, Some(&admin), Some(object)).await;
        assert_eq!(status, 201, "{path}: {body}");
    }
    tests::note_secret(&moto.credentials.secret_access_key);

    let driver = Driver::start(&dir).await;
    let browser = driver.browser("pools-admin", 1280, 900).await;
    log_in(&browser, &base, "admin", &password).await;
    // The cluster and its pool in one step, on the create page.
    browser.goto(&format!("{base}/clusters/new")).await;
    browser.type_into("#name", "edge").await;
    browser.click("input[name=type][value=custom]").await;
    browser
        .type_into(".pool-row [name=pool-name]", "workers")
        .await;
    browser
        .run(
            "const row = document.querySelector('.pool-row'); \
             row.querySelector('[name=pool-quantity]').value = '2'; \
             row.querySelector('[name=pool-etcd]').checked = false; \
             row.querySelector('[name=pool-controlPlane]').checked = false;",
            json!([]),
        )
        .await;
    check_and_save(&browser, "create-with-pools").await;
    browser
        .click("form#create-cluster button[type=submit]")
        .await;
    browser.find("#created:not([hidden])").await;
    let (_, cluster) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    assert_eq!(
        cluster["spec"]["machinePools"],
        json!([{"name": "workers", "quantity": 2, "template": "cloud",
                "roles": {"etcd": false, "controlPlane": false, "worker": true}}]),
        "{cluster}"
    );
    let binding = json!({"metadata": {"name": "edge-viewer"},
                         "spec": {"user": "viewer", "role": "read-only", "cluster": "edge"}});
    let (status, body) = api(
        hub.addr,
        "POST",
        "/v1/rolebindings",
        Some(&admin),
        Some(binding),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    browser.goto(&format!("{base}/clusters/edge")).await;
    browser.find("table#pools tr[data-name=workers]").await;
    let rows = |n: usize, phase: &str| {
        format!(
            "const rows = [...document.querySelectorAll('table#pool-machines tbody tr')]; \
             return rows.length === {n} && rows.every((r) => r.textContent.includes('{phase}'));"
        )
    };
    browser
        .until(
            "two machines bootstrapping",
            Duration::from_secs(30),
            &rows(2, "Bootstrapping"),
        )
        .await;
    let running = browser
        .text("table#pools tr[data-name=workers] td[data-label=Machines]")
        .await;
    assert_eq!(running, "0/2");
    check_and_save(&browser, "pools").await;

    // + : a third machine appears, made at the cloud.
    browser
        .click("button.scale[data-pool=workers][data-by='1']")
        .await;
    browser
        .until(
            "three machines",
            Duration::from_secs(30),
            &rows(3, "Bootstrapping"),
        )
        .await;
    let live = || async {
        moto.instances()
            .await
            .into_iter()
            .filter(tests::cloud::Instance::live)
            .count()
    };
    assert_eq!(live().await, 3);
    // − : back to two, the newest instance terminated.
    browser
        .click("button.scale[data-pool=workers][data-by='-1']")
        .await;
    browser
        .until(
            "two machines again",
            Duration::from_secs(30),
            &rows(2, "Bootstrapping"),
        )
        .await;
    tests::until("two instances", Duration::from_secs(30), async || {
        live().await == 2
    })
    .await;

    // A new pool from the form.
    browser.type_into("#pool-name", "gpu").await;
    browser
        .run(
            "document.getElementById('pool-quantity').value = '1'; \
             document.querySelector('#add-pool [name=controlPlane]').checked = false;",
            json!([]),
        )
        .await;
    browser.click("form#add-pool button[type=submit]").await;
    browser.find("table#pools tr[data-name=gpu]").await;
    browser
        .until(
            "the gpu pool's machine",
            Duration::from_secs(30),
            &rows(3, "Bootstrapping"),
        )
        .await;
    let (_, cluster) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    assert_eq!(
        cluster["spec"]["machinePools"][1],
        json!({"name": "gpu", "quantity": 1, "template": "cloud",
               "roles": {"etcd": false, "controlPlane": false, "worker": true}})
    );

    // A read-only user sees the pools and machines, and no control.
    let viewer = driver.browser("pools-viewer", 1280, 900).await;
    log_in(&viewer, &base, "viewer", "a long enough password").await;
    viewer.goto(&format!("{base}/clusters/edge")).await;
    viewer.find("table#pools tr[data-name=gpu]").await;
    assert!(!viewer.exists("button.scale").await);
    assert!(!viewer.exists("form#add-pool").await);
    viewer.close().await;
    browser.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// After a password login the page goes to `next` only while it is a path of this hub: a
/// backslash (which browsers read as a slash) or a tab (which they drop), percent-encoded in
/// the link someone was sent, must not carry the browser to another site. (The no-script form
/// and a provider's callback use the same check, `api::next_path`, table-tested in the hub.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_link_cannot_send_the_browser_to_another_site() {
    let dir = temp_dir("dashboard-next");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();
    let driver = Driver::start(&dir).await;
    for next in ["/%5Cevil.example/phish", "/%09/evil.example/x"] {
        let browser = driver.browser("next", 1024, 768).await;
        browser.goto(&format!("{base}/login?next={next}")).await;
        browser.find("form#login").await;
        browser.type_into("#username", "admin").await;
        browser.type_into("#password", &password).await;
        browser.click("form#login button[type=submit]").await;
        // The script signs in, then goes on: to the clusters page, as `next` is refused.
        browser.find("table#clusters").await;
        let url = browser.url().await;
        assert!(
            url.starts_with(&format!("{base}/clusters")),
            "next={next} led to {url}"
        );
        browser.close().await;
    }
}

/// Every page names the hub's icon, which the hub serves (browsers asked for `/favicon.ico` on
/// every page and got a 404, an error in every page's console).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_names_an_icon_the_hub_serves() {
    let dir = temp_dir("dashboard-icon");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let (code, page) = tests::api_text(hub.addr, "GET", "/login", None).await;
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains(r#"<link rel="icon" href="/assets/favicon.svg" type="image/svg+xml">"#),
        "{page}"
    );
    for path in ["/assets/favicon.svg", "/favicon.ico"] {
        let (code, icon) = tests::api_text(hub.addr, "GET", path, None).await;
        assert_eq!(code, 200, "{path}: {icon}");
        assert!(icon.starts_with("<svg "), "{path}: {icon}");
    }
}

/// The clusters page with 10,000 clusters: it shows a page of 50, and a filter, the next page
/// and a label selector are each one request answered by the hub with that page alone; no
/// request lists the clusters. Names count as people count (`fleet-51` follows `fleet-50`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clusters_are_paged_and_filtered_by_the_hub() {
    const CLUSTERS: usize = 10_000;
    let dir = temp_dir("dashboard-fleet");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    let started = std::time::Instant::now();
    for chunk in (1..=CLUSTERS).collect::<Vec<_>>().chunks(1000) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let env = if i % 2 == 0 { "prod" } else { "dev" };
                json!({"metadata": {"name": format!("fleet-{i}"), "labels": {"env": env}},
                       "spec": {"type": "imported"}})
            })
            .collect();
        let (status, body) = api(
            hub.addr,
            "POST",
            "/v1/clusters",
            Some(&admin),
            Some(json!({"kind": "ClusterList", "items": items})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    eprintln!("{CLUSTERS} clusters created in {:?}", started.elapsed());

    let driver = Driver::start(&dir).await;
    let browser = driver.browser("admin", 1280, 900).await;
    log_in(&browser, &base, "admin", &password).await;
    let rows = "return Array.from(document.querySelectorAll('#clusters tbody tr')).map((r) => r.dataset.name);";
    let shown = browser.run(rows, json!([])).await;
    assert_eq!(shown.as_array().unwrap().len(), 50);
    assert_eq!(shown[0], "fleet-1");
    assert_eq!(shown[49], "fleet-50");
    assert_eq!(
        browser.text("#page-summary").await,
        "1–50 of 10,000 clusters"
    );
    check_and_save(&browser, "clusters-10000").await;

    // What the page asked of the hub from here on.
    let requests = r#"return performance.getEntriesByType("resource")
        .map((e) => new URL(e.name)).filter((u) => u.pathname.startsWith("/clusters") || u.pathname.startsWith("/v1/clusters"))
        .map((u) => u.pathname + u.search);"#;
    let asked = |before: usize| {
        let browser = &browser;
        async move {
            let all = browser.run(requests, json!([])).await;
            all.as_array().unwrap()[before..]
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let before = browser
        .run(requests, json!([]))
        .await
        .as_array()
        .unwrap()
        .len();

    browser.click("a[rel=next]").await;
    browser
        .until(
            "the second page",
            Duration::from_secs(10),
            "const row = document.querySelector('#clusters tbody tr'); return row !== null && row.dataset.name === 'fleet-51';",
        )
        .await;
    assert_eq!(
        browser.text("#page-summary").await,
        "51–100 of 10,000 clusters"
    );
    let made = asked(before).await;
    assert_eq!(made, ["/clusters?part=rows&page=2"], "{made:?}");

    let before = before + made.len();
    browser.type_into("#filter", "fleet-9999").await;
    browser
        .until(
            "the one cluster that matches",
            Duration::from_secs(10),
            "const rows = document.querySelectorAll('#clusters tbody tr'); return rows.length === 1 && rows[0].dataset.name === 'fleet-9999';",
        )
        .await;
    let made = asked(before).await;
    // Typing is one request once it pauses (a poll may have come meanwhile).
    assert!(
        made.iter().filter(|r| r.contains("q=fleet-9999")).count() == 1
            && made.iter().all(|r| r.starts_with("/clusters?part=rows")),
        "{made:?}"
    );
    assert!(browser.url().await.ends_with("/clusters?q=fleet-9999"));

    // A label selector beside the name: the hub counts what matches.
    let before = before + made.len();
    browser
        .run(
            "const f = document.getElementById('filter'); f.value = ''; const s = document.getElementById('filter-selector'); s.value = 'env=prod'; document.getElementById('filters').requestSubmit();",
            json!([]),
        )
        .await;
    browser
        .until(
            "the prod clusters",
            Duration::from_secs(10),
            "return document.getElementById('page-summary').textContent === '1–50 of 5,000 matching, 10,000 clusters in all';",
        )
        .await;
    let shown = browser.run(rows, json!([])).await;
    assert_eq!(shown[0], "fleet-2");
    assert_eq!(shown[1], "fleet-4");
    let made = asked(before).await;
    assert!(
        made.iter()
            .any(|r| r == "/clusters?part=rows&selector=env%3Dprod"),
        "{made:?}"
    );
    assert!(
        !made
            .iter()
            .any(|r| r.starts_with("/v1/clusters?") && !r.contains("watch=true"))
    );
    check_and_save(&browser, "clusters-10000-filtered").await;

    // A selector the hub cannot read says what is wrong.
    browser
        .goto(&format!("{base}/clusters?selector=env%3D%3D%3Dprod"))
        .await;
    let error = browser.text("#filter-error").await;
    assert!(error.starts_with("Label selector: "), "{error}");
    browser.close().await;
}
