//! The hub on etcd (`--store etcd://…`), with a real etcd (Debian's `etcd-server`) per test:
//! an imported cluster reached with kubectl through it, the hub killed and started again, and
//! etcd itself killed and started again under the running hub.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sim::{cluster::SimConfig, etcd::LocalEtcd};
use tests::{
    HubProcess, api,
    imported::{Imported, kubectl_ok, until_allowed, user_kubeconfig},
    temp_dir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_on_etcd_keeps_its_clusters_across_its_own_and_etcds_restarts() {
    let mut etcd = LocalEtcd::start(&temp_dir("ha-etcd")).unwrap();
    let store = etcd.store_url();
    let flags = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let sim = SimConfig {
        pods: 3,
        ..SimConfig::default()
    };
    let imported = Imported::start_with("ha-one", sim, &flags).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let Imported {
        dir,
        mut hub,
        admin,
        shutdown,
        ..
    } = imported;
    let member = user_kubeconfig(&hub, &admin, &dir, "mia", Some("cluster-member")).await;
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    let pods = kubectl_ok(&member, &["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 3, "{pods}");

    // The hub dies and comes back on the same port: everything it knew was in etcd.
    let port = hub.addr.port().to_string();
    hub.crash().await;
    let listen = format!("127.0.0.1:{port}");
    let flags = ["--listen", listen.as_str(), "--store", store.as_str()];
    let hub = HubProcess::start_with(&dir.join("hub"), &flags).await;
    assert!(hub.admin_password.is_none(), "the admin was kept in etcd");
    let (status, cluster) = api(hub.addr, "GET", "/v1/clusters/prod", Some(&admin), None).await;
    assert_eq!(
        status, 200,
        "the admin's token and the cluster survive: {cluster}"
    );
    // The agent reconnects by itself; mia's kubeconfig works as before.
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    let app = dir.join("app.yaml");
    std::fs::write(
        &app,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after-hub-restart, namespace: default}\n",
    )
    .unwrap();
    kubectl_ok(&member, &["apply", "-f", app.to_str().unwrap()]).await;

    // etcd dies under the running hub and comes back: the hub carries on, watches included
    // (a new user's role reaches the cluster, which takes the hub's watch of role bindings).
    etcd.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    etcd.restart().unwrap();
    let late = user_kubeconfig(&hub, &admin, &dir, "lou", Some("cluster-member")).await;
    until_allowed(&late, &["create", "configmaps", "-n", "default"]).await;
    let names = kubectl_ok(&late, &["get", "configmaps", "-n", "default", "-o", "name"]).await;
    assert!(names.contains("configmap/after-hub-restart"), "{names}");

    shutdown.cancel();
    let _ = agent.await;
}
