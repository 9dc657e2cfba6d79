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
    browser::{Browser, Driver, screenshot_dir},
    imported::Imported,
    login, temp_dir,
};

/// Controls without an accessible name, and text whose contrast with its background is below
/// WCAG AA (4.5:1), on the page as it stands.
const CHECK_PAGE: &str = r#"
const problems = [];
const named = (el) => {
  if (el.getAttribute("aria-label") || el.getAttribute("aria-labelledby")) return true;
  if (el.id && document.querySelector(`label[for="${el.id}"]`)) return true;
  if (el.closest("label")) return true;
  return (el.tagName === "BUTTON" || el.tagName === "A") && el.textContent.trim() !== "";
};
for (const el of document.querySelectorAll("input, select, textarea, button, a[href]")) {
  if (el.offsetParent !== null && !named(el)) problems.push(`unlabelled ${el.outerHTML.slice(0, 80)}`);
}
const rgb = (text) => (text.match(/[\d.]+/g) || []).map(Number);
const luminance = ([r, g, b]) => {
  const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
};
const background = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
for (const el of document.querySelectorAll("body *")) {
  const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim() !== "");
  if (!own || el.offsetParent === null) continue;
  const fg = luminance(rgb(getComputedStyle(el).color).slice(0, 3));
  const bg = luminance(background(el));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) problems.push(`contrast ${ratio.toFixed(2)} for "${el.textContent.trim().slice(0, 40)}"`);
}
return problems;
"#;

async fn check_and_save(browser: &Browser<'_>, name: &str) {
    let problems = browser.run(CHECK_PAGE, json!([])).await;
    assert_eq!(
        problems,
        json!([]),
        "accessibility problems on {}",
        browser.url().await
    );
    browser
        .screenshot(&screenshot_dir().join(format!("dashboard-{name}.png")))
        .await;
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
    assert!(browser.exists("#no-clusters").await);
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
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    browser
        .until(
            "web's row turning active without a reload",
            Duration::from_secs(30),
            "const row = document.querySelector('tr[data-name=\"web\"]'); return window.notReloaded === true && row !== null && row.dataset.state === 'active' && row.textContent.includes('3/3');",
        )
        .await;
    check_and_save(&browser, "clusters-active").await;

    // Filtering hides what does not match.
    browser.type_into("#filter", "nothing-like-this").await;
    browser
        .until(
            "the filter",
            Duration::from_secs(5),
            "return document.querySelector('tr[data-name=\"web\"]').hidden;",
        )
        .await;

    browser.goto(&format!("{base}/clusters/web")).await;
    browser.find("table#cluster tr[data-name='web']").await;
    assert!(browser.text("main").await.contains("Connected"));
    check_and_save(&browser, "cluster-detail").await;
    browser.click("#logout").await;
    browser.find("form#login").await;
    browser.close().await;

    // A read-only user: the clusters they may see, no create button, no create page.
    let (status, _) = api(
        imported.hub.addr,
        "POST",
        "/v1/users",
        Some(&admin),
        Some(
            json!({"metadata": {"name": "viewer"}, "spec": {"password": "a long enough password"}}),
        ),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = api(
        imported.hub.addr,
        "POST",
        "/v1/rolebindings",
        Some(&admin),
        Some(json!({"metadata": {"name": "viewer-web"}, "spec": {"user": "viewer", "role": "read-only", "cluster": "web"}})),
    )
    .await;
    assert_eq!(status, 201);
    let phone = driver.browser("viewer", 390, 844).await;
    log_in(&phone, &base, "viewer", "a long enough password").await;
    phone.find("tr[data-name='web']").await;
    assert!(!phone.exists("a[href='/clusters/new']").await);
    check_and_save(&phone, "clusters-read-only-phone").await;
    phone.goto(&format!("{base}/clusters/new")).await;
    assert!(phone.text("main").await.contains("Only admins"));
    assert!(!phone.exists("form#create-cluster").await);
    phone.close().await;

    imported.shutdown.cancel();
    let _ = agent.await;
}
