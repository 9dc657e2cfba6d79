//! Against a real Kubernetes cluster, when there is one: `KUBECONFIG` naming a kubeconfig whose
//! current context authenticates with a bearer token allowed to impersonate (a cluster-admin).
//! Ignored by default (these machines have no real cluster; the other end-to-end tests use
//! `drover-sim cluster` instead). Run with
//! `KUBECONFIG=… cargo test --workspace --test real_cluster -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, time::Duration};

use serde_json::Value;
use tests::{
    HubProcess, api,
    imported::{check_import_manifest, kubectl_ok, user_kubeconfig},
    login, temp_dir, wait_for_event,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: set KUBECONFIG and run with --ignored"]
async fn a_real_cluster_is_imported_listed_from_the_cache_and_reached_through_the_hub() {
    let real =
        std::env::var("KUBECONFIG").expect("KUBECONFIG must name a real cluster's kubeconfig");
    let dir = temp_dir("real");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let registration = tests::create_imported_cluster(hub.addr, &admin, "prod").await;
    let registration = registration.as_str();

    // The agent as it runs outside a pod: the registration token, and the cluster's API server
    // from KUBECONFIG. Its lease goes to `default`, under a name of this run's own.
    let lease = format!("drover-e2e-{}", std::process::id());
    let env = [
        ("DROVER_SERVER", hub.url()),
        ("DROVER_TOKEN", registration.to_owned()),
        ("DROVER_CA_CHECKSUM", hub.ca_checksum.clone()),
        ("DROVER_CLUSTER", "prod".to_owned()),
        ("DROVER_POD_NAME", "e2e-0".to_owned()),
        ("DROVER_STATE_DIR", dir.join("agent").display().to_string()),
        ("DROVER_NAMESPACE", "default".to_owned()),
        ("KUBECONFIG", real.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut config = cluster_agent::Config::from_env(&env).unwrap();
    config.lease.name = lease.clone();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(cluster_agent::run(config, shutdown.clone()));
    let connected = wait_for_event(
        hub.addr,
        "/v1/clusters?watch=true",
        &admin,
        Duration::from_secs(60),
        |e| e["object"]["status"]["nodes"]["total"].as_u64() > Some(0),
    )
    .await;
    let version = connected["object"]["status"]["kubernetesVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let server = kubectl_ok(Path::new(&real), &["version", "-o", "json"]).await;
    let server: Value = serde_json::from_str(&server).unwrap();
    assert_eq!(server["serverVersion"]["gitVersion"], version.as_str());

    // The cached namespaces are the cluster's (namespaces rarely change during a test).
    let names = |list: &Value| {
        let mut names: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    let direct: Value = serde_json::from_str(
        &kubectl_ok(Path::new(&real), &["get", "--raw", "/api/v1/namespaces"]).await,
    )
    .unwrap();
    let (status, cached) = api(
        hub.addr,
        "GET",
        "/v1/clusters/prod/cache/namespaces",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{cached}");
    assert_eq!(names(&cached), names(&direct));

    // A cluster-member's kubectl through the hub sees the same namespaces, once the import
    // manifest's bindings for the hub's roles are in the cluster (the rest of the manifest,
    // the agents' Deployment and DaemonSet, is not wanted here: the agent runs in this test).
    let (_, manifest) =
        tests::https_get(hub.addr, &format!("/v3/import/{registration}.yaml")).await;
    let bindings = check_import_manifest(
        std::str::from_utf8(&manifest).unwrap(),
        "prod",
        registration,
    );
    let bindings_file = dir.join("bindings.yaml");
    std::fs::write(&bindings_file, bindings.join("\n---\n")).unwrap();
    let bindings_file = bindings_file.to_str().unwrap();
    kubectl_ok(Path::new(&real), &["apply", "-f", bindings_file]).await;
    let member = user_kubeconfig(&hub, &admin, &dir, "mia", Some("cluster-member")).await;
    let through_hub = kubectl_ok(&member, &["get", "namespaces", "-o", "name"]).await;
    assert_eq!(
        through_hub.lines().count(),
        names(&direct).len(),
        "{through_hub}"
    );

    shutdown.cancel();
    agent.await.unwrap().unwrap();
    kubectl_ok(
        Path::new(&real),
        &[
            "delete",
            "lease",
            &lease,
            "-n",
            "default",
            "--ignore-not-found",
        ],
    )
    .await;
    kubectl_ok(Path::new(&real), &["delete", "-f", bindings_file]).await;
    kubectl_ok(
        Path::new(&real),
        &[
            "delete",
            "secret",
            cluster_agent::CREDENTIAL_SECRET,
            "-n",
            "default",
            "--ignore-not-found",
        ],
    )
    .await;
}
