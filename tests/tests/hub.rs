//! The real `drover-hub` binary, as an operator and an agent meet it.

#![allow(clippy::unwrap_used)]

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use serde_json::json;
use tests::{HubProcess, api, https_get, login, temp_dir};
use tunnel::{ConnectError, Connector, ConnectorConfig, Peer, Secret, tls::Trust};

#[tokio::test]
async fn the_hub_serves_its_ca_refuses_unknown_agents_and_keeps_its_state_across_restarts() {
    let data = temp_dir("hub");
    let hub = HubProcess::start(&data).await;
    let password = hub
        .admin_password
        .clone()
        .expect("the first start prints the admin password");

    // The data directory (made 0755 by the test, as an operator's mkdir would) and the
    // store are its owner's only.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |name: &str| {
            std::fs::metadata(data.join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(""), 0o700);
        for file in ["state.db", "state.db-wal", "state.db-shm"] {
            assert_eq!(mode(file), 0o600, "{file}");
        }
    }
    // It runs with mimalloc giving freed memory back after 10 ms, not its default second
    // (what a fleet's reconnect leaves resident otherwise); an operator's own setting is kept
    // (below, at the restart).
    const PURGE_DELAY: &str = "MIMALLOC_PURGE_DELAY";
    if std::env::var_os(PURGE_DELAY).is_none() {
        let env = hub.environment();
        assert_eq!(env.get(PURGE_DELAY).map(String::as_str), Some("10"));
    }
    let (status, body) = https_get(hub.addr, "/healthz").await;
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
    let (status, ca) = https_get(hub.addr, "/cacerts").await;
    assert_eq!(status, 200);
    assert_eq!(
        tunnel::tls::ca_checksum(&ca),
        hub.ca_checksum,
        "the printed checksum is that of /cacerts"
    );

    // An agent pinning that checksum gets through TLS and is refused at the credential.
    let identity = Peer {
        id: "cluster/c-1".into(),
        kind: "cluster-agent".into(),
    };
    let config = ConnectorConfig::new(
        hub.url(),
        Secret::new("made-up"),
        identity,
        Trust::CaChecksum(hub.ca_checksum.clone()),
    );
    match Connector::new(config).unwrap().connect().await {
        Err(ConnectError::Unauthorized { status: 401, .. }) => {}
        other => panic!("expected 401, got {other:?}"),
    }

    let admin = login(hub.addr, "admin", &password).await;
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "kept"}, "spec": {"type": "imported"}})),
    )
    .await;
    assert_eq!(status, 201);

    let checksum = hub.ca_checksum.clone();
    assert!(hub.terminate().await, "SIGTERM stops the hub cleanly");
    let again =
        HubProcess::start_with_env(&data, &["--listen", "127.0.0.1:0"], &[(PURGE_DELAY, "250")])
            .await;
    assert_eq!(
        again.environment().get(PURGE_DELAY).map(String::as_str),
        Some("250")
    );
    assert_eq!(again.ca_checksum, checksum, "a restart keeps the CA");
    assert_eq!(
        again.admin_password, None,
        "the password is shown on the first start only"
    );
    let admin = login(again.addr, "admin", &password).await;
    let (status, cluster) = api(again.addr, "GET", "/v1/clusters/kept", Some(&admin), None).await;
    assert_eq!(status, 200, "{cluster}");
    assert!(again.terminate().await);
    std::fs::remove_dir_all(&data).unwrap();
}

#[tokio::test]
async fn kill_9_during_a_burst_of_writes_loses_no_acknowledged_write() {
    let data = temp_dir("crash");
    let hub = HubProcess::start(&data).await;
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    let addr = hub.addr;
    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..8 {
        let (admin, acknowledged, started) = (admin.clone(), acknowledged.clone(), started.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                started.fetch_add(1, Ordering::SeqCst);
                let name = format!("c-{w}-{i}");
                let body = json!({"metadata": {"name": name}, "spec": {"type": "imported"}});
                // A request cut off by the kill is not acknowledged; stop at the first one.
                let ok = tests::try_api(addr, "POST", "/v1/clusters", Some(&admin), Some(body))
                    .await
                    .is_ok_and(|(status, _)| status == 201);
                if !ok {
                    return;
                }
                acknowledged.lock().unwrap().push(name);
            }
        }));
    }
    // Let the burst get going, then pull the plug.
    while started.load(Ordering::SeqCst) < 100 {
        tokio::task::yield_now().await;
    }
    hub.kill().await;
    for w in writers {
        let _ = w.await;
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 50,
        "only {} writes acknowledged before the kill",
        acknowledged.len()
    );

    let again = HubProcess::start(&data).await;
    let admin = login(again.addr, "admin", &password).await;
    let (_, list) = api(again.addr, "GET", "/v1/clusters", Some(&admin), None).await;
    let stored: std::collections::HashSet<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !stored.contains(*n))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost: {lost:?}",
        lost.len(),
        acknowledged.len()
    );
    eprintln!(
        "kill -9: {} acknowledged, {} stored, none lost",
        acknowledged.len(),
        stored.len()
    );
    assert!(again.terminate().await);
    std::fs::remove_dir_all(&data).unwrap();
}

#[tokio::test]
async fn a_page_the_user_may_not_see_is_a_page_that_says_so() {
    let data = temp_dir("hub-denied");
    let hub = HubProcess::start(&data).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(&admin),
        Some(json!({"metadata": {"name": "bob"}, "spec": {"password": "a long enough password"}})),
    )
    .await;
    assert_eq!(status, 201);
    let bob = login(hub.addr, "bob", "a long enough password").await;
    // bob holds no role on prod: its page answers with a page (not JSON) that says why and
    // leads back, the same as for a cluster that does not exist.
    for path in ["/clusters/prod", "/clusters/nope"] {
        let (status, body) = tests::api_text(hub.addr, "GET", path, Some(&bob)).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.starts_with("<!doctype html>"), "{path}: {body}");
        assert!(body.contains("<h1>Not found</h1>"), "{path}: {body}");
        assert!(body.contains(r#"href="/clusters""#), "{path}: {body}");
    }
}
