//! Signing in with OpenID Connect, end to end: a certified OpenID provider (npm's
//! `oidc-provider`, run by Node.js), the browser flow in a real headless Chromium (PKCE,
//! `state` bound to the browser, `nonce`), groups from the userinfo endpoint (the provider
//! keeps them out of the ID token), ID tokens with a wrong audience, a wrong issuer, an expired
//! one, a bad signature and another key's signature all refused, the command line's login
//! through the browser, groups refreshed with the refresh token, and a user the provider no
//! longer has losing their tokens.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{
    HubProcess, api,
    browser::{Browser, Driver, check_and_save_as},
    leaked_secrets,
    oidc::OpenIdProvider,
    signin::{CliLogin, back_at_hub, bind_group, create_provider, groups_become, refresh_every},
    temp_dir,
};

const CLIENT_SECRET: &str = "drover's client secret at the provider";

/// Goes to `start` (the hub's link to the provider, or the URL the CLI printed) and signs in
/// at the provider as `login`.
async fn through_provider(browser: &Browser<'_>, start: &str, login: &str) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_sign_in_at_their_openid_provider_with_its_groups() {
    let dir = temp_dir("openid");
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let hub_url = hub.url();
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let idp = OpenIdProvider::start(
        &dir,
        "drover",
        CLIENT_SECRET,
        &format!("{hub_url}/v1/login/sso/callback"),
        json!({"olivia": {"name": "Olivia Ops", "preferred_username": "olivia",
                          "email": "olivia@example.com", "groups": ["admins", "ops"]}}),
    )
    .await;
    let answer = create_provider(
        hub.addr,
        &admin,
        "sso",
        json!({"type": "oidc", "displayName": "Example SSO",
            "oidc": {"issuer": idp.issuer, "clientId": "drover", "clientSecret": CLIENT_SECRET,
                     "scopes": ["openid", "profile", "email", "groups", "offline_access"],
                     "caCerts": idp.ca_pem}}),
    )
    .await;
    assert!(
        answer["spec"]["oidc"].get("clientSecret").is_none(),
        "{answer}"
    );
    // The provider's admins are the hub's admins.
    bind_group(
        hub.addr,
        &admin,
        "sso-admins",
        ("sso:admins", "admin", None),
    )
    .await;

    // The dashboard's login page offers the provider; signing in there lands on the hub.
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("olivia", 1280, 900).await;
    browser.goto(&format!("{hub_url}/login")).await;
    let start = browser.text("a[data-provider=sso]").await;
    assert!(start.contains("Sign in with Example SSO"), "{start}");
    check_and_save_as(&browser, "openid-login").await;
    let href = browser
        .run(
            "return document.querySelector('a[data-provider=sso]').href;",
            json!([]),
        )
        .await;
    through_provider(&browser, href.as_str().unwrap(), "olivia").await;
    let me = back_at_hub(&browser).await;
    assert_eq!(me["user"], "sso-olivia", "{me}");
    assert_eq!(me["admin"], true, "{me}");
    let (_, user) = api(hub.addr, "GET", "/v1/users/sso-olivia", Some(&admin), None).await;
    assert_eq!(user["spec"]["principal"]["id"], "olivia", "{user}");
    assert_eq!(
        user["spec"]["providerGroups"],
        json!(["sso:admins", "sso:ops"]),
        "{user}"
    );

    // Logging out ends the provider's session too: the browser is sent to its end-session
    // page, and the hub's session no longer works.
    browser.goto(&format!("{hub_url}/clusters")).await;
    browser.click("#logout").await;
    let issuer = idp.issuer.clone();
    browser
        .until(
            "the provider's end-session page",
            Duration::from_secs(20),
            &format!("return location.origin === '{issuer}';"),
        )
        .await;
    browser.goto(&format!("{hub_url}/login")).await;
    let me = browser
        .run("return fetch('/v1/me').then(r => r.status);", json!([]))
        .await;
    assert_eq!(me, 401);
    through_provider(&browser, href.as_str().unwrap(), "olivia").await;
    assert_eq!(back_at_hub(&browser).await["user"], "sso-olivia");

    // Tampered ID tokens are refused, each saying why; nobody is signed in by them.
    for (mode, says) in [
        ("aud", "not this hub's client"),
        ("iss", "issuer"),
        ("exp", "expired"),
        ("sig", "signature"),
        ("key", "signature"),
    ] {
        idp.tamper(mode).await;
        let fresh = driver.browser(&format!("tamper-{mode}"), 1280, 900).await;
        through_provider(&fresh, href.as_str().unwrap(), "olivia").await;
        fresh
            .until(
                "the refusal on the login page",
                Duration::from_secs(20),
                "return location.pathname === '/login' && document.getElementById('login-error').textContent.length > 0;",
            )
            .await;
        let error = fresh.text("#login-error").await;
        assert!(error.contains(says), "{mode}: {error}");
        let me = fresh
            .run("return fetch('/v1/me').then(r => r.status);", json!([]))
            .await;
        assert_eq!(me, 401, "{mode}");
        fresh.close().await;
    }
    idp.tamper("").await;

    // A callback whose state no login holds (replayed, forged) is refused.
    let (status, _) =
        tests::https_get(hub.addr, "/v1/login/sso/callback?code=stolen&state=made-up").await;
    assert_eq!(status, 303);

    // The command line prints the provider's URL and waits; the browser signs in there.
    let config = dir.join("cli.json");
    let cli = CliLogin::start(&hub, &config, "sso").await;
    assert!(cli.url.starts_with(&idp.issuer), "{}", cli.url);
    through_provider(&browser, &cli.url, "olivia").await;
    browser.find("#cli-done").await;
    let (stdout, cli_token) = cli.finish(&config).await;
    assert!(stdout.contains("as sso-olivia"), "{stdout}");
    let (status, me) = api(hub.addr, "GET", "/v1/me", Some(&cli_token), None).await;
    assert_eq!((status, me["user"].clone()), (200, json!("sso-olivia")));

    // Out of admins at the provider: the next refresh (by the refresh token) takes the role.
    refresh_every(hub.addr, &admin, "10s").await;
    groups_become(
        hub.addr,
        &admin,
        "sso-olivia",
        json!(["sso:ops"]),
        idp.set_users(
            json!({"olivia": {"name": "Olivia Ops", "preferred_username": "olivia",
                                        "groups": ["ops"]}}),
        ),
    )
    .await;
    let (_, me) = api(hub.addr, "GET", "/v1/me", Some(&cli_token), None).await;
    assert_eq!(me["admin"], false, "{me}");

    // Gone from the provider: the refresh grant is refused and her tokens are revoked.
    tests::revoked_by(hub.addr, &admin, &cli_token, idp.set_users(json!({}))).await;

    // The client secret is never shown nor logged; the logins are in the audit log.
    let (_, shown) = api(hub.addr, "GET", "/v1/authproviders/sso", Some(&admin), None).await;
    assert!(
        shown["spec"]["oidc"].get("clientSecret").is_none(),
        "{shown}"
    );
    let (_, audit) = api(
        hub.addr,
        "GET",
        "/v1/audit?user=sso-olivia",
        Some(&admin),
        None,
    )
    .await;
    let logins: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verb"] == "login" && r["provider"] == "sso")
        .collect();
    assert!(logins.len() >= 2, "{audit}");
    let log = hub.log.lock().unwrap().join("\n");
    let (_, everything) = api(
        hub.addr,
        "GET",
        "/v1/audit?limit=100000",
        Some(&admin),
        None,
    )
    .await;
    for text in [log, everything.to_string()] {
        assert_eq!(
            leaked_secrets(&text, &[CLIENT_SECRET, &cli_token]),
            Vec::<String>::new()
        );
    }
    browser.close().await;
}
