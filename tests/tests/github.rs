//! Signing in with GitHub, end to end against a STAND-IN for GitHub (github.com cannot be
//! reached from these machines; `tests/github/standin.mjs` answers the OAuth app flow and the
//! REST endpoints with GitHub's documented shapes, as GitHub Enterprise Server): the browser
//! flow in headless Chromium, organisations and teams as groups, the command line's login,
//! the scheduled refresh taking a team's role away, a user GitHub no longer has losing their
//! tokens, and a wrong client secret refused.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tests::{
    HubProcess, api,
    browser::{Browser, Driver},
    github::GithubStandIn,
    signin::{CliLogin, back_at_hub, bind_group, create_provider, groups_become, refresh_every},
    temp_dir,
};

const SECRET: &str = "the OAuth app's client secret";

fn octocat(teams: Value) -> Value {
    json!({"octocat": {"id": 583231, "name": "The Octocat", "orgs": ["acme"], "teams": teams}})
}

/// Follows `start` (the hub's link, or the URL the CLI printed): the stand-in, like GitHub for
/// an app the user authorized before, sends the browser straight back to the hub.
async fn sign_in(browser: &Browser<'_>, start: &str) -> Value {
    browser.goto(start).await;
    back_at_hub(browser).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_users_sign_in_with_their_organisations_and_teams() {
    let dir = temp_dir("github");
    let hub = HubProcess::start_at_own_url(&dir.join("hub")).await;
    let hub_url = hub.url();
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let github = GithubStandIn::start(
        &dir,
        ("drover-app", SECRET),
        octocat(json!([{"org": "acme", "slug": "ops"}])),
        "octocat",
    )
    .await;
    let spec = |secret: &str| {
        json!({"type": "github", "displayName": "GitHub",
            "github": {"clientId": "drover-app", "clientSecret": secret,
                       "baseUrl": github.url, "caCerts": github.ca_pem}})
    };
    let answer = create_provider(hub.addr, &admin, "github", spec(SECRET)).await;
    assert!(
        answer["spec"]["github"].get("clientSecret").is_none(),
        "{answer}"
    );
    bind_group(
        hub.addr,
        &admin,
        "acme-ops",
        ("github:acme/ops", "admin", None),
    )
    .await;

    // The dashboard's "Sign in with GitHub": organisations and teams are groups.
    let driver = Driver::start(&dir).await;
    let browser = driver.browser("octocat", 1280, 900).await;
    browser.goto(&format!("{hub_url}/login")).await;
    let href = browser
        .run(
            "return document.querySelector('a[data-provider=github]').href;",
            json!([]),
        )
        .await;
    let href = href.as_str().unwrap().to_owned();
    let me = sign_in(&browser, &href).await;
    assert_eq!(
        (me["user"].clone(), me["admin"].clone()),
        (json!("github-octocat"), json!(true)),
        "{me}"
    );
    let (_, user) = api(
        hub.addr,
        "GET",
        "/v1/users/github-octocat",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(user["spec"]["principal"]["id"], "583231", "{user}");
    assert_eq!(
        user["spec"]["providerGroups"],
        json!(["github:acme", "github:acme/ops"]),
        "{user}"
    );

    // The command line shows a page and a code; signed in there, the person types the code
    // and confirms.
    let config = dir.join("cli.json");
    let cli = CliLogin::start(&hub, &config, "github").await;
    tests::signin::device_request(&browser, &cli.url, &cli.code).await;
    browser.click("#device-approve").await;
    browser.find("#cli-done").await;
    let (_, token) = cli.finish(&config).await;

    // Out of the team on GitHub: the next refresh takes its role away.
    refresh_every(hub.addr, &admin, "10s").await;
    groups_become(
        hub.addr,
        &admin,
        "github-octocat",
        json!(["github:acme"]),
        github.set_users(octocat(json!([]))),
    )
    .await;
    let (status, me) = api(hub.addr, "GET", "/v1/me", Some(&token), None).await;
    assert_eq!((status, me["admin"].clone()), (200, json!(false)), "{me}");

    // Gone from GitHub: their tokens are revoked.
    tests::revoked_by(hub.addr, &admin, &token, github.set_users(json!({}))).await;

    // A wrong client secret: GitHub refuses the code and the login page says so.
    let (_, mut read) = api(
        hub.addr,
        "GET",
        "/v1/authproviders/github",
        Some(&admin),
        None,
    )
    .await;
    read["spec"]["github"]["clientSecret"] = "not the app's secret".into();
    let (status, answer) = api(
        hub.addr,
        "PUT",
        "/v1/authproviders/github",
        Some(&admin),
        Some(read),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    github.set_users(octocat(json!([]))).await;
    let fresh = driver.browser("refused", 1280, 900).await;
    let me = sign_in(&fresh, &href).await;
    assert_eq!(me["code"], 401, "{me}");
    let error = fresh.text("#login-error").await;
    assert!(error.contains("incorrect_client_credentials"), "{error}");
    fresh.close().await;
    browser.close().await;
}
