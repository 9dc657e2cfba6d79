//! Signing in at a provider's page, the parts that need no provider: a callback no login
//! holds, a login finished in another browser, the cap on logins under way, where a browser
//! may go afterwards, and the command line's sign-in confirmed with its code.

use super::*;
use crate::{
    api::device,
    auth::providers::PENDING_KIND,
    store::{Object, Op},
};

impl TestApi {
    async fn with_openid_provider(&self) {
        let (status, body) = self
            .call(
                Method::POST,
                "/v1/authproviders",
                Some(&self.admin),
                Some(json!({"metadata": {"name": "sso"}, "spec": {"type": "oidc",
                    "oidc": {"issuer": "https://idp.example.com", "clientId": "drover",
                             "clientSecret": "the client's secret"}}})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// The path a redirect answer sends the browser to.
    async fn redirected(&self, path: &str, cookie: Option<&str>) -> String {
        let mut request = Request::builder().method(Method::GET).uri(path);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        let response = self
            .router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        response.headers()["location"].to_str().unwrap().to_owned()
    }
}

fn pending(state: &str, browser: bool) -> Object {
    Object::new(
        PENDING_KIND,
        state,
        json!({"provider": "sso", "nonce": "n", "verifier": "v", "browser": browser,
               "next": "/clusters", "expiresAt": crate::auth::lifetimes::expiry(time::Duration::minutes(10))}),
    )
}

#[tokio::test]
async fn a_callback_that_no_login_of_this_browser_started_signs_no_one_in() {
    let t = setup().await;
    t.with_openid_provider().await;
    // A made-up state: no login holds it.
    let back = t
        .redirected("/v1/login/sso/callback?code=c&state=made-up", None)
        .await;
    assert!(
        back.starts_with("/login?error=") && back.contains("expired"),
        "{back}"
    );
    // A real login under way, but finished in a browser without its cookie (a link someone
    // else started): refused, and the login is used up.
    t.store.create(pending("s-1", true)).await.unwrap();
    let back = t
        .redirected(
            "/v1/login/sso/callback?code=c&state=s-1",
            Some("drover_login=another-state"),
        )
        .await;
    assert!(back.contains("another+browser"), "{back}");
    assert!(t.store.get(PENDING_KIND, "s-1").await.is_err());
    // The provider said no: its error is shown, nothing is exchanged.
    t.store.create(pending("s-2", true)).await.unwrap();
    let back = t
        .redirected(
            "/v1/login/sso/callback?error=access_denied&state=s-2",
            Some("drover_login=s-2"),
        )
        .await;
    assert!(back.contains("access_denied"), "{back}");
}

#[tokio::test]
async fn sign_ins_under_way_are_capped() {
    let t = setup().await;
    t.with_openid_provider().await;
    // A provider's share filled from many sources (each within its own share).
    for batch in 0..50 {
        let ops = (0..100)
            .map(|n| {
                let mut p = pending(&format!("p-{batch}-{n}"), false);
                p.spec["source"] = format!("10.0.{batch}.{}", n % 10).into();
                Op::Create(p)
            })
            .collect();
        t.store.transact(ops).await.unwrap();
    }
    let location = t.redirected("/v1/login/sso/start", None).await;
    assert!(
        location.starts_with("/login?error=too+many+sign-ins"),
        "{location}"
    );
    // A command line's token must be one the hub could have made.
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/login/sso/device",
            None,
            Some(json!({"tokenName": "admin", "tokenHash": "xyz"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[test]
fn after_signing_in_the_browser_goes_only_to_a_path_of_this_hub() {
    for stays in [
        "/clusters",
        "/clusters/prod?tab=nodes",
        "/clusters/prod/explorer/pods?namespace=project:shop",
        "/clusters/prod/explorer/pods?namespace=project%3Ashop",
        "/x/%41b",
        "/a-b_c.d~e",
    ] {
        assert_eq!(next_path(Some(stays)), stays, "{stays}");
    }
    // What a browser would take to another site (a backslash is read as a slash; tabs and
    // newlines are dropped), also once percent-decoded, and what is not a path at all.
    for leaves in [
        "//evil.example/x",
        "/\\evil.example/phish",
        "/%5Cevil.example/phish",
        "/%5cevil.example",
        "/\t/evil.example/x",
        "/%09/evil.example/x",
        "/%0a/evil.example",
        "/%2F/evil.example",
        "/%2f%2fevil.example",
        "https://evil.example/",
        "evil.example",
        "javascript:alert(1)",
        "/ /evil.example",
        "",
    ] {
        assert_eq!(next_path(Some(leaves)), "/clusters", "{leaves:?}");
    }
    assert_eq!(next_path(None), "/clusters");
    assert_eq!(
        next_path(Some(&format!("/{}", "a".repeat(600)))),
        "/clusters"
    );
}

/// The person confirming a command line's sign-in: `admin`, signed in with `provider`.
async fn confirming(t: &TestApi, provider: &str) -> crate::auth::Principal {
    let mut principal = t
        .api
        .principal(
            &[("authorization", format!("Bearer {}", t.admin))]
                .into_iter()
                .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
                .collect(),
        )
        .await
        .unwrap();
    principal.provider = provider.to_owned();
    principal
}

#[tokio::test]
async fn a_command_lines_token_works_only_once_a_person_confirms_its_code() {
    let t = setup().await;
    t.with_openid_provider().await;
    let secret = "cliOwnSecret_0123456789abcdefghij";
    let token_hash = crate::auth::secret::token_hash(secret);
    let (status, started) = t
        .call(
            Method::POST,
            "/v1/login/sso/device",
            None,
            Some(
                json!({"tokenName": "t0123456789ab", "tokenHash": token_hash, "client": "laptop"}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{started}");
    assert_eq!(
        started["verificationUri"],
        "https://hub.example:8443/login/device"
    );
    let code = started["userCode"].as_str().unwrap().to_owned();
    let poll = json!({"deviceCode": started["deviceCode"]});
    let cli_token = format!("drt_t0123456789ab.{secret}");
    let pending = t
        .call(
            Method::POST,
            "/v1/login/device/token",
            None,
            Some(poll.clone()),
        )
        .await;
    assert_eq!(pending.0, StatusCode::BAD_REQUEST);
    assert_eq!(pending.1["error"], "authorization_pending");
    let (status, _) = t.call(Method::GET, "/v1/me", Some(&cli_token), None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a token before the confirmation"
    );

    // A device code made up, or with another's user code, is nothing.
    let forged = json!({"deviceCode": format!("{}.guessed", code.replace('-', "").to_lowercase())});
    let (status, answer) = t
        .call(Method::POST, "/v1/login/device/token", None, Some(forged))
        .await;
    assert_eq!(
        (status, answer["error"].clone()),
        (StatusCode::BAD_REQUEST, json!("expired_token"))
    );

    // Signed in with another provider, the person is sent to sign in with the CLI's.
    let local = confirming(&t, "local").await;
    let other = device::waiting(&t.api, &local, &code).await.unwrap();
    assert_eq!(
        other.unwrap_err(),
        device::NotWaiting::OtherProvider("sso".into())
    );
    // Signed in with it, they see what asks and confirm; typed in any case, with spaces.
    let person = confirming(&t, "sso").await;
    let (waiting, _) = device::waiting(&t.api, &person, &code.to_lowercase().replace('-', " "))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (waiting.code.as_str(), waiting.client.as_str()),
        (code.as_str(), "laptop")
    );
    let decided = device::decide(&t.api, &person, &code, true).await.unwrap();
    assert_eq!(decided, Ok(device::Decided::Approved("admin".into())));
    // Decided once: a second decision finds nothing waiting.
    let again = device::decide(&t.api, &person, &code, false).await.unwrap();
    assert_eq!(again, Err(device::NotWaiting::Unknown));
    let (status, done) = t
        .call(
            Method::POST,
            "/v1/login/device/token",
            None,
            Some(poll.clone()),
        )
        .await;
    assert_eq!(
        (status, done["user"].clone()),
        (StatusCode::OK, json!("admin"))
    );
    let (status, me) = t.call(Method::GET, "/v1/me", Some(&cli_token), None).await;
    assert_eq!(
        (status, me["user"].clone()),
        (StatusCode::OK, json!("admin"))
    );
    // Over once the CLI knows.
    let (status, answer) = t
        .call(Method::POST, "/v1/login/device/token", None, Some(poll))
        .await;
    assert_eq!(
        (status, answer["error"].clone()),
        (StatusCode::BAD_REQUEST, json!("expired_token"))
    );

    // Wrong codes are limited per person: five a minute (the repeated decision above was
    // one).
    for _ in 0..4 {
        let wrong = device::waiting(&t.api, &person, "BCDF-BCDF").await.unwrap();
        assert_eq!(wrong.unwrap_err(), device::NotWaiting::Unknown);
    }
    let blocked = device::waiting(&t.api, &person, "BCDF-BCDF").await.unwrap();
    assert!(
        matches!(blocked, Err(device::NotWaiting::TooMany(_))),
        "{blocked:?}"
    );
}
