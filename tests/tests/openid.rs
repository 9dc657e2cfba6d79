//! Signing in with OpenID Connect, end to end: a certified OpenID provider (npm's
//! `oidc-provider`, run by Node.js), the browser flow in a real headless Chromium (PKCE,
//! `state` bound to the browser and used once, `nonce`), groups from the userinfo endpoint
//! (the provider keeps them out of the ID token), ID tokens with a wrong audience, a wrong
//! issuer, an expired one, a bad signature and another key's signature all refused saying
//! which check failed, the command line's sign-in confirmed with a code by the person who
//! started it, users keyed by issuer and subject exactly, sign-in starts limited per address,
//! groups refreshed with the refresh token, and a user the provider no longer has losing their
//! tokens.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{
    HubProcess, api,
    browser::{Driver, check_and_save_as},
    leaked_secrets,
    oidc::OpenIdProvider,
    signin::{
        CliLogin, back_at_hub, bind_group, create_provider, groups_become, refresh_every,
        through_provider,
    },
    temp_dir,
};

const CLIENT_SECRET: &str = "drover's client secret at the provider";

/// A hub at its own URL, an OpenID provider with `users` (login → claims), and the hub's
/// provider `sso` for it asking for `scopes`: the test's directory, the hub, the admin's token,
/// the provider, and what the hub answered to the provider's creation.
async fn hub_and_provider(
    label: &str,
    users: Value,
    scopes: &[&str],
) -> (
    std::path::PathBuf,
    HubProcess,
    String,
    OpenIdProvider,
    Value,
) {
    let dir = temp_dir(label);
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let callback = format!("{}/v1/login/sso/callback", hub.url());
    let idp = OpenIdProvider::start(&dir, "drover", CLIENT_SECRET, &callback, users).await;
    let answer = create_provider(
        hub.addr,
        &admin,
        "sso",
        json!({"type": "oidc", "displayName": "Example SSO",
            "oidc": {"issuer": idp.issuer, "clientId": "drover", "clientSecret": CLIENT_SECRET,
                     "scopes": scopes, "caCerts": idp.ca_pem}}),
    )
    .await;
    (dir, hub, admin, idp, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_sign_in_at_their_openid_provider_with_its_groups() {
    let (dir, hub, admin, idp, answer) = hub_and_provider(
        "openid",
        json!({"olivia": {"name": "Olivia Ops", "preferred_username": "olivia",
                          "email": "olivia@example.com", "groups": ["admins", "ops"]}}),
        &["openid", "profile", "email", "groups", "offline_access"],
    )
    .await;
    let hub_url = hub.url();
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
    // Linked by the provider's issuer and subject together.
    assert_eq!(
        user["spec"]["principal"]["id"],
        format!("{}#olivia", idp.issuer),
        "{user}"
    );
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

    // Tampered ID tokens are refused, each saying which check failed, in words (not "user
    // not found", not Rust's debug text); nobody is signed in by them.
    for (mode, says) in [
        (
            "aud",
            "the ID token is for the audience another-client, not this hub's client",
        ),
        ("iss", "the ID token's issuer"),
        ("exp", "the ID token expired"),
        ("sig", "signature does not verify"),
        ("key", "signature does not verify"),
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
        assert!(
            !error.contains("not found") && !error.contains("Some(") && !error.contains('['),
            "{mode}: {error}"
        );
        let me = fresh
            .run("return fetch('/v1/me').then(r => r.status);", json!([]))
            .await;
        assert_eq!(me, 401, "{mode}");
        fresh.close().await;
    }
    idp.tamper("").await;

    // A state is used once: the provider's page for a finished login, visited again, gives
    // a fresh and valid code for the same state (and PKCE challenge), which the hub refuses
    // because the state was consumed, before it asks the provider anything.
    // (The start is asked for here, to read where it sends the browser; the browser gets
    // the cookie that binds the login to it.)
    let mut client = tests::ClientFrom::connect([127, 0, 0, 1].into(), hub.addr).await;
    let (status, started) = client.get_headers("/v1/login/sso/start").await;
    assert_eq!(status, 303);
    let at_provider = started["location"].to_str().unwrap().to_owned();
    assert!(at_provider.starts_with(&idp.issuer), "{at_provider}");
    let cookie = started["set-cookie"].to_str().unwrap();
    let (name, value) = cookie.split(';').next().unwrap().split_once('=').unwrap();
    let replay = driver.browser("replay", 1280, 900).await;
    replay.goto(&format!("{hub_url}/login")).await;
    replay.add_cookie(name, value, "/v1/login/").await;
    through_provider(&replay, &at_provider, "olivia").await;
    assert_eq!(back_at_hub(&replay).await["user"], "sso-olivia");
    through_provider(&replay, &at_provider, "olivia").await;
    replay
        .until(
            "the replay's refusal",
            Duration::from_secs(20),
            "return location.pathname === '/login' && document.getElementById('login-error').textContent.length > 0;",
        )
        .await;
    let error = replay.text("#login-error").await;
    assert!(error.contains("used already"), "{error}");
    replay.close().await;

    // The command line's sign-in is a device authorisation: one party starts it, and a link
    // alone signs no one in. Someone who follows it (signing in at the provider on the way)
    // has no code to type; given the code, they see what asks for access and deny it. No
    // token of theirs is made meanwhile.
    let cli_tokens = async || {
        let (_, tokens) = api(hub.addr, "GET", "/v1/tokens", Some(&admin), None).await;
        tokens["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| {
                t["spec"]["user"] == "sso-olivia" && t["spec"]["description"] == "drover-hub CLI"
            })
            .count()
    };
    let before = cli_tokens().await;
    let stolen_config = dir.join("stolen.json");
    let mut stolen = CliLogin::start(&hub, &stolen_config, "sso").await;
    assert_eq!(stolen.url, format!("{hub_url}/login/device"));
    let victim = driver.browser("victim", 1280, 900).await;
    victim.goto(&stolen.url).await;
    let sign_in = victim
        .run(
            "return document.querySelector('a[data-provider=sso]').href;",
            json!([]),
        )
        .await;
    through_provider(&victim, sign_in.as_str().unwrap(), "olivia").await;
    victim.find("form#device-code").await;
    victim.type_into("#user-code", "BCDF-GHJK").await;
    victim.click("form#device-code button[type=submit]").await;
    let error = victim.text("#device-error").await;
    assert!(error.contains("No command line waits"), "{error}");
    assert!(
        stolen.waiting(),
        "a link and a sign-in at the provider finished the CLI's login"
    );
    assert_eq!(cli_tokens().await, before);
    let request = tests::signin::device_request(&victim, &stolen.url, &stolen.code).await;
    assert!(request.contains("127.0.0.1"), "{request}");
    check_and_save_as(&victim, "device-confirm").await;
    victim.click("#device-deny").await;
    victim.find("#cli-denied").await;
    stolen.refused(&stolen_config).await;
    assert_eq!(cli_tokens().await, before);
    victim.close().await;
    // The old way, a link that signed the command line in for whoever opened it, is gone.
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/login/sso/cli",
        None,
        Some(json!({"tokenName": "t0123456789ab", "tokenHash": "0".repeat(64)})),
    )
    .await;
    assert!(status == 404 || status == 405, "{status}");

    // The person who started it confirms with the code: then, and only then, it works.
    let config = dir.join("cli.json");
    let mut cli = CliLogin::start(&hub, &config, "sso").await;
    let (page, code) = (cli.url.clone(), cli.code.clone());
    let request = tests::signin::device_request(&browser, &page, &code).await;
    assert!(request.contains(&code), "{request}");
    assert!(cli.waiting());
    browser.click("#device-approve").await;
    browser.find("#cli-done").await;
    let (stdout, cli_token) = cli.finish(&config).await;
    assert_eq!(cli_tokens().await, before + 1);
    // A code is used once.
    browser.goto(&page).await;
    browser.type_into("#user-code", &code).await;
    browser.click("form#device-code button[type=submit]").await;
    let error = browser.text("#device-error").await;
    assert!(error.contains("No command line waits"), "{error}");
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

/// Anyone may start a sign-in, and each is kept until it is used or expires: one address that
/// starts a thousand of them (far more than one person needs) keeps only its newest few and
/// takes nothing from anyone else, who still signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_use_up_everyones_sign_ins() {
    let (_dir, hub, _admin, idp, _) =
        hub_and_provider("openid-flood", json!({}), &["openid"]).await;
    let to_provider =
        |(status, location): &(u16, String)| *status == 303 && location.starts_with(&idp.issuer);
    let mut flood = tests::ClientFrom::connect([127, 0, 0, 2].into(), hub.addr).await;
    for n in 0..1050 {
        let answer = flood.get("/v1/login/sso/start").await;
        // Its own newest sign-in always starts: the oldest of its own make room.
        assert!(
            to_provider(&answer),
            "start {n} from the flooding address: {answer:?}"
        );
    }
    let mut other = tests::ClientFrom::connect([127, 0, 0, 3].into(), hub.addr).await;
    let answer = other.get("/v1/login/sso/start").await;
    assert!(to_provider(&answer), "another address: {answer:?}");
}

/// A user is their provider's issuer and subject, exactly: a subject that differs only in case
/// is someone else, who inherits nothing. `allowed.users` names people by subject, or by an
/// email the provider verified; an unverified one lets nobody in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openid_user_is_their_subject_exactly() {
    let (dir, hub, admin, idp, _) = hub_and_provider(
        "openid-subjects",
        json!({"00u7Kx9QbA": {"preferred_username": "ann", "groups": []}}),
        &["openid", "profile", "email", "groups"],
    )
    .await;
    let hub_url = hub.url();
    let start = format!("{hub_url}/v1/login/sso/start");
    let driver = Driver::start(&dir).await;
    let sign_in = async |login: &str| {
        let browser = driver.browser(login, 1024, 768).await;
        through_provider(&browser, &start, login).await;
        let me = back_at_hub(&browser).await;
        let error = browser
            .run(
                "const e = document.getElementById('login-error'); return e ? e.textContent : '';",
                json!([]),
            )
            .await;
        browser.close().await;
        (me, error.as_str().unwrap_or_default().to_owned())
    };

    // Ann signs in and is made an admin.
    let (me, _) = sign_in("00u7Kx9QbA").await;
    assert_eq!(me["user"], "sso-ann", "{me}");
    let (status, answer) = api(
        hub.addr,
        "POST",
        "/v1/rolebindings",
        Some(&admin),
        Some(json!({"metadata": {"name": "ann-admin"},
                    "spec": {"user": "sso-ann", "role": "admin"}})),
    )
    .await;
    assert_eq!(status, 201, "{answer}");

    // Another account whose subject differs only in case (and who calls itself ann) is
    // another hub user, with none of Ann's roles; Ann stays linked to her own subject.
    idp.set_users(json!({"00u7Kx9QbA": {"preferred_username": "ann"},
                         "00U7kX9qBa": {"preferred_username": "ann"}}))
        .await;
    let (me, _) = sign_in("00U7kX9qBa").await;
    assert_eq!(me["user"], "sso-ann-2", "{me}");
    assert_eq!(me["admin"], false, "{me}");
    let (_, ann) = api(hub.addr, "GET", "/v1/users/sso-ann", Some(&admin), None).await;
    assert_eq!(
        ann["spec"]["principal"]["id"],
        format!("{}#00u7Kx9QbA", idp.issuer),
        "{ann}"
    );

    // Allowed by email: only an email the provider verified counts.
    let (status, mut provider) =
        api(hub.addr, "GET", "/v1/authproviders/sso", Some(&admin), None).await;
    assert_eq!(status, 200, "{provider}");
    provider["spec"]["allowed"] = json!({"users": ["mallory@example.com"]});
    let (status, answer) = api(
        hub.addr,
        "PUT",
        "/v1/authproviders/sso",
        Some(&admin),
        Some(provider),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    idp.set_users(json!({"m-1": {"preferred_username": "mallory",
                                  "email": "mallory@example.com", "email_verified": false}}))
        .await;
    let (me, error) = sign_in("m-1").await;
    assert!(me.get("user").is_none(), "{me}");
    assert!(error.contains("may not sign in"), "{error}");
    idp.set_users(json!({"m-1": {"preferred_username": "mallory",
                                  "email": "mallory@example.com", "email_verified": true}}))
        .await;
    let (me, _) = sign_in("m-1").await;
    assert_eq!(me["user"], "sso-mallory", "{me}");
}
