//! The API through its router (no sockets), on a real SQLite store in a temporary directory.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use axum::{
    Router,
    body::Body,
    http::{Method, Request, StatusCode},
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::{
    auth::known::{Known, Tracked},
    bootstrap,
    store::{self as st, Store, sqlite::SqliteStore},
};

struct TestApi {
    router: Router,
    admin: String,
    dir: PathBuf,
    /// The store under the API, for what no API call can do (a hole's aftermath).
    store: Arc<dyn Store>,
    api: Api,
}

impl Drop for TestApi {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn setup() -> TestApi {
    setup_over(|store| store).await
}

/// [`setup`] over a store that `wrap` makes of the SQLite one.
async fn setup_over(wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>) -> TestApi {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-api-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite: Arc<dyn Store> = wrap(Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap()));
    // As the hub runs it: callers are remembered between requests, so revocations, logouts
    // and role changes below also check that nothing stale is served from memory.
    let known = Arc::new(Known::default());
    let store: Arc<dyn Store> = Arc::new(Tracked::new(sqlite, known.clone()));
    tokio::spawn(
        known
            .clone()
            .follow(store.clone(), tokio_util::sync::CancellationToken::new()),
    );
    while !known.following() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let password = bootstrap::first_admin(store.as_ref())
        .await
        .unwrap()
        .unwrap();
    let api = Api {
        store: store.clone(),
        limiter: Arc::default(),
        known,
        server_url: "https://hub.example:8443".into(),
        ca_checksum: "c".repeat(64),
        ca_pem: "-----BEGIN CERTIFICATE-----\n".into(),
        streams: crate::auth::streams::Streams::new(3),
        audit: Arc::new(crate::audit::Audit::off()),
        audit_keep: 0,
        recordings: Arc::new(crate::recording::Recordings::off()),
    };
    let router = router(api.clone());
    let mut t = TestApi {
        router,
        admin: String::new(),
        dir,
        store,
        api,
    };
    t.admin = t.login("admin", &password).await;
    t
}

impl TestApi {
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = match body {
            Some(v) => {
                request = request.header("content-type", "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let response = self
            .router
            .clone()
            .oneshot(request.body(body).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, value)
    }

    async fn login(&self, user: &str, password: &str) -> String {
        let (status, body) = self
            .call(
                Method::POST,
                "/v1/login",
                None,
                Some(json!({"username": user, "password": password, "session": false})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["token"].as_str().unwrap().to_owned()
    }

    /// `GET /v1/me` with the session `cookie` (`name=value`) alone.
    async fn me_by_cookie(&self, cookie: &str) -> Value {
        let (status, me) = self.me_by_cookie_status(cookie).await;
        assert_eq!(status, StatusCode::OK);
        me
    }

    async fn me_by_cookie_status(&self, cookie: &str) -> (StatusCode, Value) {
        let request = Request::builder()
            .uri("/v1/me")
            .header("cookie", cookie)
            .body(Body::empty())
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn create(&self, token: &str, plural: &str, body: Value) -> Value {
        let (status, value) = self
            .call(
                Method::POST,
                &format!("/v1/{plural}"),
                Some(token),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{value}");
        value
    }

    /// A user with `role` on `cluster` (or none); returns their API token.
    async fn user(&self, name: &str, role: Option<(&str, &str)>) -> String {
        let password = "a long enough password";
        self.create(
            &self.admin,
            "users",
            json!({"metadata": {"name": name}, "spec": {"password": password}}),
        )
        .await;
        if let Some((role, cluster)) = role {
            self.create(
                &self.admin,
                "rolebindings",
                json!({"metadata": {"name": format!("{name}-{role}")}, "spec": {"user": name, "role": role, "cluster": cluster}}),
            )
            .await;
        }
        self.login(name, password).await
    }
}

fn imported(name: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"type": "imported"}})
}

#[tokio::test]
async fn anonymous_requests_get_401_in_the_status_shape() {
    let t = setup().await;
    let (status, body) = t.call(Method::GET, "/v1/clusters", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["code"], 401);
    assert!(
        body["message"].as_str().unwrap().contains("Bearer"),
        "{body}"
    );
    let (status, _) = t
        .call(Method::GET, "/v1/clusters", Some("drt_tnope.secret"), None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn wrong_passwords_are_refused_then_rate_limited() {
    let t = setup().await;
    let wrong = json!({"username": "admin", "password": "not the password"});
    for _ in 0..5 {
        let (status, body) = t
            .call(Method::POST, "/v1/login", None, Some(wrong.clone()))
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    let (status, body) = t.call(Method::POST, "/v1/login", None, Some(wrong)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body["message"].as_str().unwrap().contains("try again"));
}

#[tokio::test]
async fn an_imported_cluster_comes_with_its_import_command() {
    let t = setup().await;
    let created = t.create(&t.admin, "clusters", imported("prod")).await;
    let registration = &created["registration"];
    let command = registration["importCommand"].as_str().unwrap();
    // The hub's CA fetched, checked against its checksum, then trusted for the manifest.
    let pinned = format!(
        "curl -fsSk https://hub.example:8443/cacerts -o drover-ca.pem && echo '{}  drover-ca.pem' | sha256sum -c --quiet && curl -fsS --cacert drover-ca.pem https://hub.example:8443/v3/import/drr_",
        t.api.ca_checksum
    );
    assert!(command.starts_with(&pinned), "{command}");
    assert!(command.ends_with(".yaml | kubectl apply -f -"), "{command}");
    let trusted = registration["importCommandTrusted"].as_str().unwrap();
    assert!(
        trusted.starts_with("kubectl apply -f https://hub.example:8443/v3/import/drr_"),
        "{trusted}"
    );
    assert_eq!(created["state"]["state"], "pending");
    assert_eq!(created["metadata"]["generation"], 1);

    // The token's value is never shown again; its object exists without the hash.
    let (_, tokens) = t
        .call(Method::GET, "/v1/registrationtokens", Some(&t.admin), None)
        .await;
    let items = tokens["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["spec"], json!({"cluster": "prod"}));
    assert!(!tokens.to_string().contains("secretHash"));
}

#[tokio::test]
async fn a_custom_cluster_comes_with_its_host_command() {
    let t = setup().await;
    let created = t
        .create(
            &t.admin,
            "clusters",
            json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}}),
        )
        .await;
    let command = created["registration"]["hostCommand"].as_str().unwrap();
    assert!(command.contains(
        "system-agent-install.sh | sudo sh -s - --server https://hub.example:8443 --token drr_"
    ));
    assert!(command.contains(&format!("--ca-checksum {}", "c".repeat(64))));
}

#[tokio::test]
async fn invalid_objects_get_422_naming_the_field() {
    let t = setup().await;
    let cases = [
        (
            "clusters",
            json!({"metadata": {"name": "x"}, "spec": {"type": "custom"}}),
            "spec.distribution",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "Bad_Name"}, "spec": {"type": "imported"}}),
            "name",
        ),
        (
            "clusters",
            json!({"spec": {"type": "imported"}}),
            "metadata.name",
        ),
        (
            "hosts",
            json!({"metadata": {"name": "h"}, "spec": {"cluster": "nowhere"}}),
            "does not exist",
        ),
        (
            "users",
            json!({"metadata": {"name": "u"}, "spec": {}}),
            "needs a password",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "y", "labels": {"bad key!": "v"}}, "spec": {"type": "imported"}}),
            "label key",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "custom", "distribution": "rke2",
                   "version": "v1.33.4+rke2r1", "config": {"flannel-backend": "wireguard-native"}}}),
            "spec.config.flannel-backend: not a RKE2 config.yaml option",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "custom", "distribution": "k3s",
                   "version": "v1.33.4+k3s1",
                   "hostConfig": [{"selector": {"roles": ["worker"]}, "config": {"node-ip": "10.0.0.9"}}]}}),
            "spec.hostConfig[0].config.node-ip: Drover sets node-ip itself",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "imported", "config": {"tls-san": "x"}}}),
            "spec.config and spec.hostConfig are for custom clusters",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "custom", "distribution": "k3s",
                   "version": "v1.33.4+k3s1",
                   "registries": {"mirrors": {"docker.io": {"endpoint": ["mirror.example.com"]}}}}}),
            "spec.registries.mirrors[\"docker.io\"].endpoint: \"mirror.example.com\" must be an https:// or http:// URL",
        ),
        (
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "custom", "distribution": "k3s",
                   "version": "v1.33.4+k3s1",
                   "registries": {"configs": {"r.example.com": {"tls": {"caBundle": "not a cert"}}}}}}),
            "spec.registries.configs[\"r.example.com\"].tls.caBundle",
        ),
        (
            // A PEM header around what is no certificate: parsed, not just looked at.
            "clusters",
            json!({"metadata": {"name": "z"}, "spec": {"type": "custom", "distribution": "k3s",
                   "version": "v1.33.4+k3s1",
                   "registries": {"configs": {"r.example.com": {"tls": {"caBundle":
                       "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}}}}}),
            "spec.registries.configs[\"r.example.com\"].tls.caBundle",
        ),
        (
            "cloudcredentials",
            json!({"metadata": {"name": "login"}, "spec": {"driver": "registry", "registry": {"username": "u"}}}),
            "spec.registry.password",
        ),
    ];
    for (plural, body, expect) in cases {
        let (status, value) = t
            .call(
                Method::POST,
                &format!("/v1/{plural}"),
                Some(&t.admin),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
        assert!(
            value["message"].as_str().unwrap().contains(expect),
            "{value}"
        );
    }
    let (status, value) = t
        .call(Method::GET, "/v1/widgets", Some(&t.admin), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        value["message"].as_str().unwrap().contains("clusters"),
        "{value}"
    );
}

#[tokio::test]
async fn updates_use_optimistic_concurrency_and_patches_merge() {
    let t = setup().await;
    let created = t.create(&t.admin, "clusters", imported("a")).await;
    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh["spec"]["description"] = json!("first writer");
    let (status, first) = t
        .call(Method::PUT, "/v1/clusters/a", Some(&t.admin), Some(fresh))
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["metadata"]["generation"], 2);
    stale["spec"]["description"] = json!("second writer");
    let (status, conflict) = t
        .call(Method::PUT, "/v1/clusters/a", Some(&t.admin), Some(stale))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(conflict["reason"], "Conflict");

    let patch = json!({"metadata": {"labels": {"env": "prod"}}});
    let (status, patched) = t
        .call(Method::PATCH, "/v1/clusters/a", Some(&t.admin), Some(patch))
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["metadata"]["labels"]["env"], "prod");
    assert_eq!(
        patched["spec"]["description"], "first writer",
        "a patch keeps what it does not name"
    );
    t.create(&t.admin, "clusters", imported("b")).await;
    let (_, list) = t
        .call(
            Method::GET,
            "/v1/clusters?labelSelector=env%3Dprod",
            Some(&t.admin),
            None,
        )
        .await;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a"]);
    let (status, _) = t
        .call(
            Method::GET,
            "/v1/clusters?labelSelector=env+in+(",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn secrets_are_shown_once_and_never_returned() {
    let t = setup().await;
    let alice = t.user("alice", None).await;
    let (status, me) = t
        .call(Method::GET, "/v1/users/alice", Some(&alice), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        me["spec"].get("passwordHash").is_none() && me["spec"].get("password").is_none(),
        "{me}"
    );
    let created = t
        .create(&alice, "tokens", json!({"spec": {"description": "ci"}}))
        .await;
    let value = created["token"].as_str().unwrap().to_owned();
    assert!(value.starts_with("drt_"));
    let (_, list) = t.call(Method::GET, "/v1/tokens", Some(&alice), None).await;
    assert!(!list.to_string().contains(value.split('.').nth(1).unwrap()));
    assert!(!list.to_string().contains("secretHash"));

    // A forged hash in the body is ignored: the token still needs its real secret.
    let name = created["metadata"]["name"].as_str().unwrap();
    let (status, _) = t
        .call(
            Method::PATCH,
            &format!("/v1/tokens/{name}"),
            Some(&t.admin),
            Some(json!({"spec": {"secretHash": "00"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = t.call(Method::GET, "/v1/me", Some(&value), None).await;
    assert_eq!(status, StatusCode::OK);

    // Revoked: refused from then on.
    let (status, _) = t
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{name}"),
            Some(&alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = t.call(Method::GET, "/v1/me", Some(&value), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn logout_ends_the_session() {
    let t = setup().await;
    let token = t.user("bob", None).await;
    let (status, _) = t.call(Method::POST, "/v1/logout", Some(&token), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = t.call(Method::GET, "/v1/me", Some(&token), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The login page's form sent by the browser itself (its script did not load): a session and
/// the way on, or back to the form with the reason; never from another site.
#[tokio::test]
async fn the_login_form_signs_in_without_the_pages_script() {
    let t = setup().await;
    t.user("bob", None).await;
    let send = |origin: &'static str, password: &'static str| {
        let api = t.api.clone();
        async move {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("host", "hub.example:8443".parse().unwrap());
            headers.insert("origin", origin.parse().unwrap());
            let body = format!("next=%2Fclusters%2Fprod&username=bob&password={password}");
            form_login(&api, None, &headers, body.as_bytes()).await
        }
    };
    let cookie_of = |response: &axum::response::Response| {
        response
            .headers()
            .get("set-cookie")
            .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
    };

    let signed_in = send("https://hub.example:8443", "a+long+enough+password").await;
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert_eq!(signed_in.headers()["location"], "/clusters/prod");
    let cookie = cookie_of(&signed_in).expect("a session cookie");
    assert_eq!(t.me_by_cookie(&cookie).await["user"], "bob");

    for (origin, password, why) in [
        (
            "https://hub.example:8443",
            "wrong",
            "wrong+username+or+password",
        ),
        (
            "https://elsewhere.example",
            "a+long+enough+password",
            "this+hub",
        ),
    ] {
        let refused = send(origin, password).await;
        assert_eq!(refused.status(), StatusCode::SEE_OTHER, "{origin}");
        let location = refused.headers()["location"].to_str().unwrap().to_owned();
        assert!(
            location.starts_with("/login?next=%2Fclusters%2Fprod&error=") && location.contains(why),
            "{origin}: {location}"
        );
        assert!(
            !location.contains("password=") && cookie_of(&refused).is_none(),
            "{location}"
        );
    }
}

/// Every role × every verb on its own cluster and on another, and anonymous, through the API.
#[tokio::test]
async fn rbac_matrix_through_the_api() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("mine")).await;
    t.create(&t.admin, "clusters", imported("theirs")).await;
    let users = [
        ("owner", Some("cluster-owner")),
        ("member", Some("cluster-member")),
        ("viewer", Some("read-only")),
        ("nobody", None),
    ];
    for (name, role) in users {
        let token = t.user(name, role.map(|r| (r, "mine"))).await;
        let token = Some(token.as_str());
        for cluster in ["mine", "theirs"] {
            let has_role = role.is_some() && cluster == "mine";
            let owner = role == Some("cluster-owner") && cluster == "mine";
            let path = format!("/v1/clusters/{cluster}");
            let (get, _) = t.call(Method::GET, &path, token, None).await;
            assert_eq!(get.is_success(), has_role, "{name} get {cluster}: {get}");
            let patch = json!({"spec": {"description": name}});
            let (update, _) = t.call(Method::PATCH, &path, token, Some(patch)).await;
            assert_eq!(
                update.is_success(),
                owner,
                "{name} update {cluster}: {update}"
            );
            let token_body = json!({"spec": {"cluster": cluster}});
            let (reg, _) = t
                .call(
                    Method::POST,
                    "/v1/registrationtokens",
                    token,
                    Some(token_body),
                )
                .await;
            assert_eq!(
                reg.is_success(),
                owner,
                "{name} registration token for {cluster}: {reg}"
            );
            if !has_role {
                // Not readable is "not found": the answer does not say the cluster exists.
                assert_eq!(get, StatusCode::NOT_FOUND);
            }
        }
        let (list, body) = t.call(Method::GET, "/v1/clusters", token, None).await;
        assert_eq!(list, StatusCode::OK);
        let visible = body["items"].as_array().unwrap().len();
        assert_eq!(
            visible,
            usize::from(role.is_some()),
            "{name} sees only clusters it has a role on"
        );
        let (create, _) = t
            .call(
                Method::POST,
                "/v1/clusters",
                token,
                Some(imported(&format!("{name}-new"))),
            )
            .await;
        assert_eq!(create, StatusCode::FORBIDDEN, "{name} create cluster");
        let (delete, _) = t
            .call(Method::DELETE, "/v1/clusters/theirs", token, None)
            .await;
        assert_eq!(
            delete,
            StatusCode::NOT_FOUND,
            "{name} delete another's cluster"
        );
        // No user but an admin lists users: refused, not an empty list.
        let (users_list, _) = t.call(Method::GET, "/v1/users", token, None).await;
        assert_eq!(users_list, StatusCode::FORBIDDEN, "{name} lists users");
    }
    for (method, path) in [
        (Method::GET, "/v1/clusters/mine"),
        (Method::DELETE, "/v1/clusters/mine"),
        (Method::GET, "/v1/users"),
    ] {
        let (status, _) = t.call(method.clone(), path, None, None).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "anonymous {method} {path}"
        );
    }
    let owner = t.login("owner", "a long enough password").await;
    let (status, _) = t
        .call(Method::DELETE, "/v1/clusters/mine", Some(&owner), None)
        .await;
    assert_eq!(status, StatusCode::OK, "an owner deletes its cluster");
}

#[tokio::test]
async fn a_watch_streams_changes_as_server_sent_events() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("a")).await;
    let request = Request::get("/v1/clusters?watch=true")
        .header("authorization", format!("Bearer {}", t.admin))
        .body(Body::empty())
        .unwrap();
    let response = t.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut next_event = async || loop {
        let frame = body.frame().await.unwrap().unwrap();
        let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
        if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) {
            return serde_json::from_str::<Value>(data).unwrap();
        }
    };
    let first = next_event().await;
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );
    t.create(&t.admin, "clusters", imported("b")).await;
    let second = next_event().await;
    assert_eq!(
        (
            second["type"].as_str(),
            second["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
    assert!(second["object"]["state"]["state"].is_string());
}

/// Every path the hub serves, its pages aside: read from the sources that build the routers
/// (the root router and the API's), so a route added without its documentation fails here.
#[test]
fn every_route_but_the_pages_is_in_the_openapi_document() {
    let doc = openapi::document();
    let paths = doc["paths"].as_object().unwrap();
    let mut routes = Vec::new();
    for source in [include_str!("../../routes.rs"), include_str!("../mod.rs")] {
        for piece in source.split(".route(").skip(1) {
            if let Some(path) = piece
                .trim_start()
                .strip_prefix('"')
                .and_then(|p| p.split('"').next())
            {
                routes.push(path.to_owned());
            }
        }
    }
    assert!(routes.len() >= 20, "{routes:?}");
    for route in routes {
        // axum's catch-all is one path parameter here; the object routes, one path per kind.
        let documented = route
            .replace("{*rest}", "{path}")
            .replace("/v1/{plural}", "/v1/clusters");
        assert!(
            paths.contains_key(&documented),
            "{route} is served but not in /v1/openapi.json"
        );
    }
}

#[tokio::test]
async fn the_openapi_document_is_whole_and_describes_every_kind() {
    let t = setup().await;
    let (status, doc) = t.call(Method::GET, "/v1/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.0.3");
    assert_eq!(openapi::dangling_refs(&doc), Vec::<String>::new());
    for kind in Kind::ALL {
        for path in [
            format!("/v1/{}", kind.plural()),
            format!("/v1/{}/{{name}}", kind.plural()),
        ] {
            assert!(doc["paths"].get(&path).is_some(), "{path} missing");
        }
        assert!(doc["components"]["schemas"].get(kind.name()).is_some());
    }
    // Secret fields are not part of the described shape.
    let spec = doc["components"]["schemas"]["UserSpec"].to_string();
    assert!(!spec.contains("passwordHash"), "{spec}");
}

/// A private key's text as a credential holds it (its body is not a real key: the API checks
/// the shape, the ssh driver's tests use real ones).
const TEST_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n";

/// One valid object of every kind, created through the API.
fn example(kind: Kind) -> Value {
    let spec = match kind {
        Kind::Cluster => {
            json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"})
        }
        Kind::Host | Kind::RegistrationToken => json!({"cluster": "c1"}),
        Kind::User => json!({"password": "a long enough password"}),
        Kind::Token => json!({"description": "ci"}),
        Kind::RoleBinding => json!({"user": "admin", "role": "read-only", "cluster": "c1"}),
        // A plan is named after its host (created just before it).
        Kind::Plan => json!({"host": "hosts-1", "cluster": "c1", "plan": {}}),
        Kind::Setting => json!({"value": "x"}),
        Kind::Project => json!({"cluster": "c1", "displayName": "Shop"}),
        Kind::ProjectSecret => {
            json!({"cluster": "c1", "project": "projects-1", "data": {"password": "czNjcmV0"}})
        }
        Kind::EtcdSnapshot => json!({"cluster": "c1"}),
        Kind::AuthProvider => json!({"type": "ldap", "ldap": {
            "url": "ldaps://ldap.example.org", "bindDn": "cn=reader,dc=example,dc=org",
            "bindPassword": "reader's secret", "userSearchBase": "ou=people,dc=example,dc=org"}}),
        Kind::CloudCredential => json!({"driver": "ssh", "ssh": {"privateKey": TEST_KEY}}),
        Kind::MachineTemplate => json!({"driver": "ssh", "credential": "cloudcredentials-1",
            "ssh": {"addresses": ["10.0.0.1", "10.0.0.2"]}}),
        Kind::Machine => {
            json!({"cluster": "c1", "pool": "workers", "template": "machinetemplates-1"})
        }
        Kind::RoleTemplate => json!({"context": "cluster", "inherits": ["read-only"],
            "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]}),
        Kind::GlobalRole => json!({"inheritedClusterRoles": ["roletemplates-1"],
            "rules": [{"apiGroups": ["management.drover.io"], "resources": ["clusters"], "verbs": ["create"]}]}),
        Kind::ClusterGroup => json!({"selector": {"matchLabels": {"env": "prod"}}}),
        Kind::Bundle => json!({"targets": [{"clusterGroup": "clustergroups-1"}],
            "manifests": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: '1'}\n"}),
        Kind::GitRepo => json!({"repo": "https://git.example.org/shop.git", "paths": ["apps"],
            "pollingInterval": "5m", "webhookSecret": "hook s3cret",
            "targets": [{"clusterName": "c1"}]}),
        Kind::BundleDeployment => json!({"bundle": "bundles-1", "cluster": "c1", "target": "t",
            "content": {"digest": "sha256-x", "chunks": [], "objects": 0, "bytes": 0}}),
    };
    let name = match kind {
        Kind::Cluster => "c1".to_owned(),
        Kind::Plan => "hosts-1".to_owned(),
        Kind::BundleDeployment => "bundles-1.c1".to_owned(),
        _ => format!("{}-1", kind.plural()),
    };
    json!({"metadata": {"name": name, "labels": {"test": "yes"}}, "spec": spec})
}

#[tokio::test]
async fn every_answer_conforms_to_the_openapi_document() {
    let t = setup().await;
    let doc = openapi::document();
    let schema = |path: &str, method: &str, code: &str| {
        doc["paths"][path][method]["responses"][code]["content"]["application/json"]["schema"]
            .clone()
    };
    let check = |schema: Value, value: &Value, what: &str| {
        openapi::conformance(&doc, &schema, value, what)
            .unwrap_or_else(|e| panic!("{what}: {e}\n{value:#}"));
    };
    for kind in Kind::ALL {
        let (collection, item) = (
            format!("/v1/{}", kind.plural()),
            format!("/v1/{}/{{name}}", kind.plural()),
        );
        let (status, created) = t
            .call(
                Method::POST,
                &collection,
                Some(&t.admin),
                Some(example(kind)),
            )
            .await;
        let created = if matches!(kind, Kind::Machine | Kind::BundleDeployment) {
            // The hub makes machines itself (from pools), and what a cluster is given of a
            // bundle (from its targets); the API refuses to, even to admins.
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{created}");
            let value = example(kind);
            let mut object = crate::store::Object::new(
                kind.name(),
                value["metadata"]["name"].as_str().unwrap(),
                value["spec"].clone(),
            );
            object.metadata.labels.insert("test".into(), "yes".into());
            let mut ops = vec![crate::store::Op::Create(object)];
            crate::refs::stamp_all(t.store.as_ref(), &mut ops)
                .await
                .unwrap();
            t.store.transact(ops).await.unwrap();
            let url = format!(
                "{collection}/{}",
                value["metadata"]["name"].as_str().unwrap()
            );
            t.call(Method::GET, &url, Some(&t.admin), None).await.1
        } else {
            assert_eq!(status, StatusCode::CREATED, "{created}");
            check(
                schema(&collection, "post", "201"),
                &created,
                &format!("create {}", kind.name()),
            );
            created
        };
        let name = created["metadata"]["name"].as_str().unwrap().to_owned();
        let url = format!("{collection}/{name}");
        let (_, got) = t.call(Method::GET, &url, Some(&t.admin), None).await;
        check(
            schema(&item, "get", "200"),
            &got,
            &format!("get {}", kind.name()),
        );
        let (_, list) = t.call(Method::GET, &collection, Some(&t.admin), None).await;
        check(
            schema(&collection, "get", "200"),
            &list,
            &format!("list {}", kind.name()),
        );
        let (status, patched) = t
            .call(
                Method::PATCH,
                &url,
                Some(&t.admin),
                Some(json!({"metadata": {"labels": {"patched": "yes"}}})),
            )
            .await;
        if kind == Kind::Token {
            assert_eq!(status, StatusCode::OK);
        }
        check(
            schema(&item, "patch", "200"),
            &patched,
            &format!("patch {}", kind.name()),
        );
        let (status, missing) = t
            .call(
                Method::GET,
                &format!("{collection}/nope"),
                Some(&t.admin),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        check(schema(&item, "get", "404"), &missing, "not found");
    }
    // Deletions last: later kinds refer to the cluster.
    for kind in Kind::ALL.iter().rev() {
        let (_, list) = t
            .call(
                Method::GET,
                &format!("/v1/{}?labelSelector=test%3Dyes", kind.plural()),
                Some(&t.admin),
                None,
            )
            .await;
        for item in list["items"].as_array().unwrap() {
            let url = format!(
                "/v1/{}/{}",
                kind.plural(),
                item["metadata"]["name"].as_str().unwrap()
            );
            let (status, deleted) = t.call(Method::DELETE, &url, Some(&t.admin), None).await;
            assert_eq!(status, StatusCode::OK, "{deleted}");
            check(
                schema(&format!("/v1/{}/{{name}}", kind.plural()), "delete", "200"),
                &deleted,
                "delete",
            );
        }
    }
    let (_, unauthorized) = t.call(Method::GET, "/v1/clusters", None, None).await;
    check(schema("/v1/clusters", "get", "401"), &unauthorized, "401");
}

#[tokio::test]
async fn the_conformance_check_catches_answers_that_do_not_match() {
    let t = setup().await;
    let doc = openapi::document();
    let schema = doc["paths"]["/v1/clusters"]["post"]["responses"]["201"]["content"]["application/json"]["schema"].clone();
    let good = t.create(&t.admin, "clusters", imported("z")).await;
    assert!(openapi::conformance(&doc, &schema, &good, "good").is_ok());
    let mut no_state = good.clone();
    no_state.as_object_mut().unwrap().remove("state");
    let mut bad_generation = good.clone();
    bad_generation["metadata"]["generation"] = json!("one");
    let mut bad_type = good.clone();
    bad_type["spec"]["type"] = json!("managed");
    for (what, value) in [
        ("no state", no_state),
        ("generation", bad_generation),
        ("type", bad_type),
    ] {
        assert!(
            openapi::conformance(&doc, &schema, &value, what).is_err(),
            "{what} slipped through"
        );
    }
}

#[tokio::test]
async fn a_hosts_task_is_named_after_the_host_and_kept_beside_its_plan() {
    let t = setup().await;
    t.create(
        &t.admin,
        "clusters",
        json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}}),
    )
    .await;
    t.create(
        &t.admin,
        "hosts",
        json!({"metadata": {"name": "h1"}, "spec": {"cluster": "edge"}}),
    )
    .await;
    let task = |name: &str, slot: &str| {
        json!({"metadata": {"name": name}, "spec": {"host": "h1", "cluster": "edge", "slot": slot,
            "plan": {"instructions": [{"name": "snap", "command": "true"}]}}})
    };
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/plans",
            Some(&t.admin),
            Some(task("h1", "task")),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"task-h1\""),
        "{body}"
    );
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/plans",
            Some(&t.admin),
            Some(task("task-h1", "chores")),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("spec.slot"),
        "{body}"
    );
    t.create(&t.admin, "plans", task("task-h1", "task")).await;
    t.create(&t.admin, "plans", task("h1", "")).await;
    let (_, list) = t.call(Method::GET, "/v1/plans", Some(&t.admin), None).await;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        2,
        "a plan and a task"
    );
}

mod credentials;
mod holes;
mod kube_watch;
mod lifetimes;
mod lists;
mod machines;
mod roles;
mod signin;

/// A dashboard's "Pause" is a merge patch without a resourceVersion; a controller writing the
/// cluster's status at the same moment must not turn it into a 409 (kube-apiserver re-applies
/// such a patch), while a patch that names a stale resourceVersion still is one.
#[tokio::test]
async fn a_patch_without_a_resource_version_survives_a_concurrent_status_writer() {
    // Before three of every four writes of cluster `busy`'s spec, the store writes the
    // cluster's status itself: the controller that races a user's edit, every time.
    let spec_writes = Arc::new(AtomicU32::new(0));
    let meddled = Arc::new(AtomicU32::new(0));
    let t = setup_over({
        let meddled = meddled.clone();
        move |inner| {
            Arc::new(st::before_writes::BeforeWrites::new(inner, move |store, ops| {
                let spec_write = matches!(ops, [st::Op::Update(o)]
                    if o.kind == "Cluster" && o.metadata.name == "busy" && o.spec.get("description").is_some());
                let meddle = spec_write && spec_writes.fetch_add(1, Ordering::Relaxed) % 4 != 3;
                let beat = meddle.then(|| meddled.fetch_add(1, Ordering::Relaxed));
                Box::pin(async move {
                    if let Some(beat) = beat {
                        let mut object = store.get("Cluster", "busy").await?;
                        object.status = json!({ "beat": beat });
                        store.update(object).await?;
                    }
                    Ok(())
                })
            }))
        }
    })
    .await;
    let created = t.create(&t.admin, "clusters", imported("busy")).await;
    for i in 0..5 {
        let (status, body) = t
            .call(
                Method::PATCH,
                "/v1/clusters/busy",
                Some(&t.admin),
                Some(json!({"spec": {"description": format!("d{i}")}})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "patch {i}: {body}");
        assert_eq!(body["spec"]["description"], format!("d{i}"));
    }
    assert_eq!(
        meddled.load(Ordering::Relaxed),
        15,
        "the controller raced each patch three times"
    );
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/clusters/busy",
            Some(&t.admin),
            Some(json!({"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "spec": {"description": "late"}})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("changed by someone else"),
        "{body}"
    );
}

/// A list the caller may never see any of is refused, as Kubernetes refuses it, instead of
/// answering an empty list a client would show as "nothing here"; lists of what the caller
/// may partly see stay filtered.
#[tokio::test]
async fn a_list_no_object_of_which_is_readable_is_refused_not_empty() {
    let t = setup().await;
    let bob = t.user("bob", None).await;
    for plural in ["users", "authproviders", "cloudcredentials"] {
        let (status, body) = t
            .call(Method::GET, &format!("/v1/{plural}"), Some(&bob), None)
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{plural}: {body}");
        assert_eq!(
            body["message"],
            format!("user \"bob\" may not list {plural}: that needs the admin role")
        );
        let (status, _) = t
            .call(
                Method::GET,
                &format!("/v1/{plural}?watch=true"),
                Some(&bob),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "watching {plural}");
        let (status, _) = t
            .call(Method::GET, &format!("/v1/{plural}"), Some(&t.admin), None)
            .await;
        assert_eq!(status, StatusCode::OK, "an admin lists {plural}");
    }
    // bob still reads himself, and lists clusters (none of which he sees).
    let (status, _) = t.call(Method::GET, "/v1/users/bob", Some(&bob), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, clusters) = t.call(Method::GET, "/v1/clusters", Some(&bob), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(clusters["items"], json!([]));
}

/// A browser that signs in again, its session cookie still set, gets a new session in place
/// of the old one (by `POST /v1/login` or the page's form): one session per browser, not one
/// per login. A cookie naming someone else's session without its secret removes nothing.
#[tokio::test]
async fn signing_in_again_in_a_browser_replaces_its_session() {
    let t = setup().await;
    t.user("bob", None).await;
    let sessions = |t: &TestApi| {
        let store = t.store.clone();
        async move {
            let (tokens, _) = store
                .list(
                    Kind::Token.name(),
                    &crate::store::LabelSelector::everything(),
                )
                .await
                .unwrap();
            tokens
                .into_iter()
                .filter(|o| o.spec["user"] == "bob" && o.spec["session"] == true)
                .map(|o| o.metadata.name)
                .collect::<Vec<_>>()
        }
    };
    let login = |cookie: Option<String>| {
        let router = t.router.clone();
        async move {
            let mut request = Request::builder()
                .method(Method::POST)
                .uri("/v1/login")
                .header("content-type", "application/json");
            if let Some(cookie) = cookie {
                request = request.header("cookie", cookie);
            }
            let body = json!({"username": "bob", "password": "a long enough password"});
            let response = router
                .oneshot(request.body(Body::from(body.to_string())).unwrap())
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let set = response.headers()["set-cookie"].to_str().unwrap();
            set.split(';').next().unwrap().to_owned()
        }
    };
    let first = login(None).await;
    assert_eq!(sessions(&t).await.len(), 1);
    let second = login(Some(first.clone())).await;
    let now = sessions(&t).await;
    assert_eq!(now.len(), 1, "the first session was replaced: {now:?}");
    assert_eq!(t.me_by_cookie(&second).await["user"], "bob");
    let (status, _) = t.me_by_cookie_status(&first).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the old session ends");

    // The page's form does the same.
    let mut headers = axum::http::HeaderMap::new();
    headers.insert("host", "hub.example:8443".parse().unwrap());
    headers.insert("origin", "https://hub.example:8443".parse().unwrap());
    headers.insert("cookie", second.parse().unwrap());
    let body = "next=%2Fclusters&username=bob&password=a+long+enough+password";
    let signed_in = form_login(&t.api, None, &headers, body.as_bytes()).await;
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    assert_eq!(sessions(&t).await.len(), 1);

    // A cookie with bob's session name and a made-up secret: a new session, bob's kept.
    let kept = sessions(&t).await;
    login(Some(format!(
        "{}=drt_{}.not-the-secret",
        crate::auth::SESSION_COOKIE,
        kept[0]
    )))
    .await;
    let after = sessions(&t).await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.contains(&kept[0]));
}
