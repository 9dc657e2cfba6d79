//! Signing in at a provider's page, the parts that need no provider: a callback no login
//! holds, a login finished in another browser, and the cap on logins under way.

use super::*;
use crate::{
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
    for batch in 0..10 {
        let ops = (0..100)
            .map(|n| Op::Create(pending(&format!("p-{batch}-{n}"), false)))
            .collect();
        t.store.transact(ops).await.unwrap();
    }
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/login/sso/cli",
            None,
            Some(json!({"tokenName": "t0123456789ab", "tokenHash": "0".repeat(64)})),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    // A CLI's token must be one the hub could have made.
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/login/sso/cli",
            None,
            Some(json!({"tokenName": "admin", "tokenHash": "xyz"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}
