//! What the sign-in tests (directory, OpenID, GitHub) share: creating a provider and a role
//! binding, the refresh interval, waiting for a user's groups to change, and the command
//! line's browser login.

use std::{net::SocketAddr, path::Path, time::Duration};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{HubProcess, api};

/// Creates the AuthProvider `name` with `spec`; panics unless the hub accepts it. Returns what
/// the hub answered.
pub async fn create_provider(addr: SocketAddr, admin: &str, name: &str, spec: Value) -> Value {
    let (status, answer) = api(
        addr,
        "POST",
        "/v1/authproviders",
        Some(admin),
        Some(json!({"metadata": {"name": name}, "spec": spec})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    answer
}

/// Binds `role` (global, or on `cluster`) to `group`, as the role binding `name`.
pub async fn bind_group(
    addr: SocketAddr,
    admin: &str,
    name: &str,
    (group, role, cluster): (&str, &str, Option<&str>),
) {
    let mut spec = json!({"group": group, "role": role});
    if let Some(cluster) = cluster {
        spec["cluster"] = cluster.into();
    }
    let (status, answer) = api(
        addr,
        "POST",
        "/v1/rolebindings",
        Some(admin),
        Some(json!({"metadata": {"name": name}, "spec": spec})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
}

/// Sets how often providers' users' groups are read again.
pub async fn refresh_every(addr: SocketAddr, admin: &str, interval: &str) {
    let (status, answer) = api(
        addr,
        "POST",
        "/v1/settings",
        Some(admin),
        Some(json!({"metadata": {"name": "auth-refresh-interval"}, "spec": {"value": interval}})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
}

/// Does `change`, then waits (watching users from before it) until `user`'s provider groups
/// are `groups`.
pub async fn groups_become(
    addr: SocketAddr,
    admin: &str,
    user: &str,
    groups: Value,
    change: impl std::future::Future<Output = ()>,
) {
    crate::after_change(addr, admin, "users", change, |e| {
        e["object"]["metadata"]["name"] == user
            && e["object"]["spec"]
                .get("providerGroups")
                .cloned()
                .unwrap_or(json!([]))
                == groups
    })
    .await;
}

/// Waits until the browser is back at the hub (its clusters page, or the login page saying
/// why not) and returns what `/v1/me` says there.
pub async fn back_at_hub(browser: &crate::browser::Browser<'_>) -> Value {
    browser
        .until(
            "back at the hub",
            Duration::from_secs(20),
            "return location.pathname === '/clusters' || location.pathname === '/login';",
        )
        .await;
    browser
        .run("return fetch('/v1/me').then(r => r.json());", json!([]))
        .await
}

/// `drover-hub login --provider NAME` started, and the page and code it printed for a person
/// to confirm the sign-in with.
#[derive(Debug)]
pub struct CliLogin {
    child: tokio::process::Child,
    pub url: String,
    pub code: String,
}

impl CliLogin {
    pub async fn start(hub: &HubProcess, config: &Path, provider: &str) -> Self {
        let mut child = tokio::process::Command::new(crate::binary("drover-hub"))
            .args([
                "login",
                "--server",
                &hub.url(),
                "--ca-checksum",
                &hub.ca_checksum,
            ])
            .args(["--provider", provider, "--config", config.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut printed = BufReader::new(child.stderr.take().unwrap()).lines();
        let (url, code) = tokio::time::timeout(Duration::from_secs(30), async {
            let mut url = None;
            loop {
                let line = printed
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the CLI's page and code");
                let line = line.trim();
                if line.starts_with("https://") {
                    url = Some(line.to_owned());
                } else if let Some(code) = line.strip_prefix("Code:") {
                    return (
                        url.expect("the page before the code"),
                        code.trim().to_owned(),
                    );
                }
            }
        })
        .await
        .expect("the CLI prints a page and a code within 30 s");
        // The rest of what it says (a refusal) is read when it ends.
        tokio::spawn(async move { while let Ok(Some(_)) = printed.next_line().await {} });
        CliLogin { child, url, code }
    }

    /// Whether the CLI is still waiting for its confirmation.
    pub fn waiting(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the CLI to finish; returns what it printed and the token it saved.
    pub async fn finish(self, config: &Path) -> (String, String) {
        let out = tokio::time::timeout(Duration::from_secs(30), self.child.wait_with_output())
            .await
            .expect("the CLI done within 30 s of the sign-in")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        let saved: Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
        let token = saved["token"].as_str().unwrap().to_owned();
        crate::note_secret(&token);
        (stdout, token)
    }

    /// Waits for the CLI to give up (denied); it saved nothing.
    pub async fn refused(self, config: &Path) {
        let out = tokio::time::timeout(Duration::from_secs(30), self.child.wait_with_output())
            .await
            .expect("the CLI done within 30 s of the denial")
            .unwrap();
        assert!(!out.status.success());
        assert!(!config.exists(), "the CLI saved a token it was refused");
    }
}

/// On the hub's page for signing a command line in (the browser signed in already), types
/// `code` and continues to what asks for access: returns the page's request details.
pub async fn device_request(
    browser: &crate::browser::Browser<'_>,
    url: &str,
    code: &str,
) -> String {
    browser.goto(url).await;
    browser.find("form#device-code").await;
    browser.type_into("#user-code", code).await;
    browser.click("form#device-code button[type=submit]").await;
    browser.find("dl#device-request").await;
    browser.text("dl#device-request").await
}

/// Goes to `start` (the hub's link to the provider, or the URL the CLI printed) and signs in
/// at the provider as `login`.
pub async fn through_provider(browser: &crate::browser::Browser<'_>, start: &str, login: &str) {
    browser.goto(start).await;
    // The provider's own pages: its sign-in form (unless its session is still on), then its
    // consent (asked for every time: the hub asks for offline access).
    if browser.exists("input[name=login]").await {
        browser.type_into("input[name=login]", login).await;
        browser
            .type_into("input[name=password]", "any password")
            .await;
        browser.click("button[type=submit]").await;
    }
    browser
        .until(
            "the provider's consent page",
            Duration::from_secs(20),
            "return document.querySelector('input[name=prompt][value=consent]') !== null;",
        )
        .await;
    browser.click("button[type=submit]").await;
}
