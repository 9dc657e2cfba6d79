//! The whole router, built as the hub builds it, answered without a socket: each kind of route
//! reaches its handler with its state, and what needs a caller refuses one without.

#![allow(clippy::unwrap_used)]

use axum::http::{Method, StatusCode};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::*;
use crate::store::{StoreError, sqlite::SqliteStore};

struct App {
    router: super::Front,
    dir: std::path::PathBuf,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn app() -> App {
    app_with(None)
}

/// The router on `store`, or on a new SQLite store.
fn app_with(store: Option<Arc<dyn store::Store>>) -> App {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-routes-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn store::Store> =
        store.unwrap_or_else(|| Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap()));
    let refuse_all = |_: &http::request::Parts| -> tunnel::AuthFuture {
        Box::pin(async { Err(tunnel::AuthError("no agents in this test".into())) })
    };
    let registry = Registry::default();
    let acceptor = Acceptor::new(
        tunnel::AcceptorConfig::default(),
        refuse_all,
        registry.clone(),
        CancellationToken::new(),
    );
    let ca_pem: Arc<str> = "-----BEGIN CERTIFICATE-----\n".into();
    let api = api::state::Api {
        store: store.clone(),
        limiter: Arc::default(),
        known: Arc::default(),
        server_url: "https://hub.example:8443".into(),
        ca_checksum: "ab".repeat(32),
        ca_pem: ca_pem.clone(),
        streams: crate::auth::streams::Streams::new(0),
        audit: Arc::new(crate::audit::Audit::off()),
        audit_keep: 0,
        recordings: Arc::new(crate::recording::Recordings::off()),
    };
    let router = router(Parts {
        api,
        health: Arc::new(health::Health::new(
            store,
            std::time::Duration::from_secs(10),
        )),
        acceptor,
        registry,
        replicas: replicas::Replicas::single(),
        peers: None,
        ca_pem,
        downloads: registration::Downloads {
            binaries: dir.join("bin"),
            artifacts: dir.join("artifacts"),
        },
    });
    App { router, dir }
}

async fn call(method: Method, path: &str) -> (StatusCode, String, http::HeaderMap) {
    call_with(method, path, "").await
}

async fn call_with(
    method: Method,
    path: &str,
    body: &str,
) -> (StatusCode, String, http::HeaderMap) {
    send(
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap(),
    )
    .await
}

/// The router's answer to `request`: status, body and headers.
async fn send(request: Request<Body>) -> (StatusCode, String, http::HeaderMap) {
    let app = app();
    let response = app.router.clone().oneshot(request).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

async fn get(path: &str) -> (StatusCode, String) {
    let (status, body, _) = call(Method::GET, path).await;
    (status, body)
}

#[tokio::test]
async fn health_endpoints_answer_ok() {
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok\n".into()));
    assert_eq!(get("/readyz").await, (StatusCode::OK, "ok\n".into()));
}

/// A store that cannot be reached, as an etcd hub's is while etcd is down.
#[derive(Debug)]
struct Unreachable;

impl store::Store for Unreachable {
    fn get(&self, _: &str, _: &str) -> store::BoxFuture<'_, Result<store::Object, StoreError>> {
        Box::pin(async { Err(down()) })
    }

    fn list(
        &self,
        _: &str,
        _: &store::LabelSelector,
    ) -> store::BoxFuture<'_, Result<(Vec<store::Object>, u64), StoreError>> {
        Box::pin(async { Err(down()) })
    }

    fn transact(
        &self,
        _: Vec<store::Op>,
    ) -> store::BoxFuture<'_, Result<Vec<store::Object>, StoreError>> {
        Box::pin(async { Err(down()) })
    }

    fn watch(
        &self,
        _: Option<&str>,
        _: Option<u64>,
    ) -> store::BoxFuture<'_, Result<store::WatchStream, StoreError>> {
        Box::pin(async { Err(down()) })
    }

    fn revision(&self) -> store::BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Err(down()) })
    }
}

fn down() -> StoreError {
    StoreError::Backend("etcd: connection refused".into())
}

#[tokio::test]
async fn a_hub_whose_store_does_not_answer_is_alive_but_not_ready() {
    let app = app_with(Some(Arc::new(Unreachable)));
    let answer = |path: &'static str| {
        let router = app.router.clone();
        async move {
            let response = router
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(answer("/healthz").await, (StatusCode::OK, "ok\n".into()));
    let (status, body) = answer("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body,
        "not ready: the store does not answer (store failure: etcd: connection refused)\n"
    );
}

#[tokio::test]
async fn cacerts_serves_the_ca_pem() {
    let (status, body) = get("/cacerts").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("-----BEGIN CERTIFICATE-----"));
}

#[tokio::test]
async fn connect_without_an_upgrade_says_what_it_expects() {
    let (status, body) = get("/v3/connect").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("WebSocket upgrade"), "{body}");
}

#[tokio::test]
async fn every_api_asks_for_a_caller_first() {
    for path in [
        "/v1/clusters",
        "/v1/me",
        "/v1/events",
        "/v1/clusters/prod/nodes",
        "/v1/hosts/h1/usage",
        "/v1/clusters/prod/cache/pods",
        "/k8s/clusters/prod/api/v1/pods",
    ] {
        let (status, body) = get(path).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert!(body.contains("\"kind\":\"Status\""), "{path}: {body}");
    }
    // A registration needs its token; a relay needs a replica's certificate.
    let (status, body, _) =
        call_with(Method::POST, "/v3/register", r#"{"kind": "node-agent"}"#).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = get("/v3/relay/cluster-agent/prod/kube-api/api").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_dashboard_downloads_and_metrics_are_served_with_the_security_headers() {
    let (status, body, headers) = call(Method::GET, "/login").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.contains_key("content-security-policy"));
    // Sent by the browser itself (the page's script not run), the form posts to the hub, not
    // its password into the page's address; from no page of the hub, it is sent back.
    assert!(
        body.contains(r#"<form id="login" method="post" action="/login""#),
        "{body}"
    );
    let (status, body, headers) =
        call_with(Method::POST, "/login", "username=admin&password=x").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(
        headers["location"]
            .to_str()
            .unwrap()
            .starts_with("/login?next=%2Fclusters&error="),
        "{headers:?}"
    );
    let (status, body) = get("/system-agent-install.sh").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("#!/bin/sh"), "{body:.100}");
    let (status, body) = get("/v3/import/drr_unknown.yaml").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("drover_tunnel_sessions"), "{body:.200}");
    let (status, _) = get("/no/such/page").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn explorer_pages_send_a_caller_without_a_session_to_log_in() {
    for path in [
        "/clusters/prod/explorer",
        "/clusters/prod/explorer/pods",
        // A list's filters are in its query: the way back keeps them.
        "/clusters/prod/explorer/pods?namespace=shop&labelSelector=app%3Dweb",
        "/clusters/prod/explorer/deployments.apps/shop/web",
        "/clusters/prod/explorer/nodes/node-1",
        "/clusters/prod/explorer/pods/shop/web-0/shell",
    ] {
        let (status, body, headers) = call(Method::GET, path).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{path}: {body}");
        let next: String = form_urlencoded::byte_serialize(path.as_bytes()).collect();
        assert_eq!(headers["location"], format!("/login?next={next}"), "{path}");
    }
    // A user's drain, like every API, asks who is calling first.
    let (status, body, _) = call_with(Method::POST, "/v1/clusters/prod/nodes/n1/drain", "").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // The explorer's script and the terminal it draws come from the hub itself, under the
    // same policy as every page.
    for (path, kind) in [
        ("/assets/explorer.js", "text/javascript"),
        ("/assets/xterm/xterm.js", "text/javascript"),
        ("/assets/xterm/addon-fit.js", "text/javascript"),
        ("/assets/xterm/xterm.css", "text/css"),
    ] {
        let (status, _, headers) = call(Method::GET, path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], kind, "{path}");
        assert!(headers.contains_key("content-security-policy"), "{path}");
    }
}

#[tokio::test]
async fn another_sites_page_cannot_open_a_shell_with_the_session_cookie() {
    // What a foreign page's `new WebSocket("wss://hub/k8s/…/exec")` sends: the user's cookie,
    // the foreign Origin. Refused before anyone is looked up.
    let (status, body, _) = send(
        Request::builder()
            .uri("/k8s/clusters/prod/api/v1/namespaces/shop/pods/web-0/exec?command=sh&stdin=true&stdout=true&tty=true")
            .header(header::HOST, "hub.example:8443")
            .header(header::COOKIE, format!("{}=drt_x.y", crate::auth::SESSION_COOKIE))
            .header(header::ORIGIN, "https://evil.example")
            .header(header::UPGRADE, "websocket")
            .header(header::CONNECTION, "Upgrade")
            .header("sec-websocket-protocol", "v5.channel.k8s.io")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("hub's own pages"), "{body}");
}

#[test]
fn only_what_the_router_would_send_to_the_proxy_goes_there_directly() {
    for path in [
        "/k8s/clusters/prod/api",
        "/k8s/clusters/prod/api/v1/pods",
        "/k8s/clusters/pr%6Fd/version",
    ] {
        assert!(super::proxied(path), "{path}");
    }
    for path in [
        "/k8s/clusters/prod",
        "/k8s/clusters/prod/",
        "/k8s/clusters//api",
        "/k8s/clusters/",
        "/k8s/clusterz/prod/api",
        "/v1/clusters/prod/cache/pods",
        "/v3/relay/cluster-agent/prod/kube-api/version",
    ] {
        assert!(!super::proxied(path), "{path}");
    }
}
