//! Token lifetimes: the settings, a CLI login replacing its earlier token, admins listing and
//! revoking one user's tokens, and the sweep of expired tokens.

use time::{Duration, OffsetDateTime, format_description::well_known::Rfc3339};

use super::*;
use crate::{auth::lifetimes, model::Kind, store::Object};

/// How far off `expiresAt` lies from now.
fn lives(token_object: &Value) -> Duration {
    let at = token_object["spec"]["expiresAt"]
        .as_str()
        .or_else(|| token_object["expiresAt"].as_str())
        .unwrap_or_else(|| panic!("no expiresAt: {token_object}"));
    OffsetDateTime::parse(at, &Rfc3339).unwrap() - OffsetDateTime::now_utc()
}

fn about(lifetime: Duration, expected: Duration) -> bool {
    lifetime <= expected && lifetime > expected - Duration::minutes(1)
}

impl TestApi {
    async fn set(&self, name: &str, value: &str) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            "/v1/settings",
            Some(&self.admin),
            Some(json!({"metadata": {"name": name}, "spec": {"value": value}})),
        )
        .await
    }

    async fn login_as(&self, user: &str, session: bool, client: &str) -> Value {
        let (status, body) = self
            .call(
                Method::POST,
                "/v1/login",
                None,
                Some(json!({"username": user, "password": "a long enough password", "session": session, "client": client})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn works(&self, token: &Value) -> bool {
        let token = token["token"].as_str().unwrap();
        let (status, _) = self
            .call(Method::GET, "/v1/clusters", Some(token), None)
            .await;
        status == StatusCode::OK
    }

    /// The tokens of `user`, as an admin lists them.
    async fn tokens_of(&self, user: &str) -> Vec<Value> {
        let (status, list) = self
            .call(
                Method::GET,
                &format!("/v1/tokens?labelSelector=drover.io/user%3D{user}"),
                Some(&self.admin),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{list}");
        list["items"].as_array().unwrap().clone()
    }
}

#[tokio::test]
async fn token_lifetimes_follow_the_settings_and_bad_values_are_refused() {
    let t = setup().await;
    let (status, refused) = t.set("session-ttl", "forever").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("session-ttl") && message.contains("16h"),
        "{message}"
    );
    let (status, refused) = t.set("api-token-max-ttl", "400d").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");

    // The defaults: a session 16 h, a CLI login's token 30 days, a kubeconfig's 90 days.
    t.create(&t.admin, "clusters", imported("prod")).await;
    t.user("pat", Some(("cluster-member", "prod"))).await;
    assert!(about(
        lives(&t.login_as("pat", true, "").await),
        Duration::hours(16)
    ));
    assert!(about(
        lives(&t.login_as("pat", false, "a").await),
        Duration::days(30)
    ));

    for (name, value) in [
        ("session-ttl", "1h"),
        ("api-token-max-ttl", "7d"),
        ("kubeconfig-token-ttl", "2d"),
    ] {
        let (status, body) = t.set(name, value).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    assert!(about(
        lives(&t.login_as("pat", true, "").await),
        Duration::hours(1)
    ));
    let cli = t.login_as("pat", false, "b").await;
    assert!(about(lives(&cli), Duration::days(7)));
    let cli_token = cli["token"].as_str().unwrap();
    let (status, _) = t
        .call(
            Method::POST,
            "/v1/clusters/prod/kubeconfig",
            Some(cli_token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let kubeconfig_token = t
        .tokens_of("pat")
        .await
        .into_iter()
        .find(|tok| tok["spec"]["description"] == "kubeconfig for cluster prod")
        .unwrap();
    assert!(about(lives(&kubeconfig_token), Duration::days(2)));

    // An API token: none longer than the longest lifetime; without a time, that long.
    let too_late = lifetimes::expiry(Duration::days(8));
    let (status, refused) = t
        .call(
            Method::POST,
            "/v1/tokens",
            Some(cli_token),
            Some(json!({"spec": {"description": "ci", "expiresAt": too_late}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("api-token-max-ttl"),
        "{refused}"
    );
    let created = t
        .create(cli_token, "tokens", json!({"spec": {"description": "ci"}}))
        .await;
    assert!(about(lives(&created), Duration::days(7)), "{created}");
}

#[tokio::test]
async fn a_new_login_from_the_same_client_revokes_the_token_it_replaces() {
    let t = setup().await;
    t.user("pat", None).await;
    let first = t.login_as("pat", false, "laptop").await;
    let second = t.login_as("pat", false, "laptop").await;
    assert!(!t.works(&first).await, "the replaced token still works");
    assert!(t.works(&second).await);
    // Another client, or a dashboard session, leaves it be.
    let other = t.login_as("pat", false, "build-server").await;
    let session = t.login_as("pat", true, "laptop").await;
    assert!(t.works(&second).await && t.works(&other).await && t.works(&session).await);
}

#[tokio::test]
async fn admins_list_and_revoke_one_users_tokens() {
    let t = setup().await;
    let pat = t.user("pat", None).await;
    let sam = t.user("sam", None).await;
    let laptop = t.login_as("pat", false, "laptop").await;
    let pats: Vec<String> = t
        .tokens_of("pat")
        .await
        .iter()
        .map(|tok| tok["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    // The login by `user` above and the one from the laptop; none of sam's.
    assert_eq!(pats.len(), 2, "{pats:?}");
    for name in &pats {
        let (status, _) = t
            .call(
                Method::DELETE,
                &format!("/v1/tokens/{name}"),
                Some(&t.admin),
                None,
            )
            .await;
        assert!(status.is_success(), "{status}");
    }
    assert!(!t.works(&laptop).await);
    assert!(!t.works(&json!({ "token": pat })).await);
    assert!(t.works(&json!({ "token": sam })).await);
    // A user listing another's tokens sees none of them.
    let (_, seen) = t
        .call(
            Method::GET,
            "/v1/tokens?labelSelector=drover.io/user%3Dsam",
            Some(&t.login("sam", "a long enough password").await),
            None,
        )
        .await;
    assert_eq!(seen["items"].as_array().unwrap().len(), 2);
    let pat_again = t.login_as("pat", false, "x").await;
    let (_, seen) = t
        .call(
            Method::GET,
            "/v1/tokens?labelSelector=drover.io/user%3Dsam",
            pat_again["token"].as_str(),
            None,
        )
        .await;
    assert!(seen["items"].as_array().unwrap().is_empty(), "{seen}");
}

#[tokio::test]
async fn expired_tokens_are_swept_and_live_ones_kept() {
    let t = setup().await;
    t.user("pat", None).await;
    let live = t.login_as("pat", false, "a").await;
    let past = (OffsetDateTime::now_utc() - Duration::minutes(1))
        .replace_nanosecond(0)
        .unwrap()
        .format(&Rfc3339)
        .unwrap();
    t.store
        .create(Object::new(
            Kind::Token.name(),
            "drt_texpired",
            json!({"user": "pat", "expiresAt": past, "secretHash": "0".repeat(64)}),
        ))
        .await
        .unwrap();
    assert_eq!(lifetimes::sweep(t.store.as_ref()).await.unwrap(), 1);
    assert!(
        t.store
            .get(Kind::Token.name(), "drt_texpired")
            .await
            .is_err()
    );
    assert!(t.works(&live).await);
    assert_eq!(lifetimes::sweep(t.store.as_ref()).await.unwrap(), 0);
}
