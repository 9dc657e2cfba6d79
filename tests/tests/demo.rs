//! `drover-sim demo N`: one command gives a populated hub — N simulated imported
//! clusters whose real agents connect, and a custom cluster the hub provisions on three
//! simulated hosts — with no root privileges, writing nothing outside its data directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{HubProcess, api, login, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_fills_the_hub_with_connected_clusters_and_a_provisioned_one() {
    // What a host provisioned on the machine itself would write; the demo's hosts write in
    // their own roots under the data directory.
    let outside = ["/etc/rancher", "/var/lib/rancher", "/usr/local/bin/k3s"];
    let _alone = tests::hosts::no_network();
    let there_before: Vec<&str> = outside
        .iter()
        .copied()
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    let dir = temp_dir("demo");
    let hub = HubProcess::start_demo(&dir.join("hub"), 2).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, clusters) = api(hub.addr, "GET", "/v1/clusters", Some(&admin), None).await;
        let (_, hosts) = api(hub.addr, "GET", "/v1/hosts", Some(&admin), None).await;
        let (_, nodes) = api(
            hub.addr,
            "GET",
            "/v1/clusters/demo-2/nodes",
            Some(&admin),
            None,
        )
        .await;
        let state = |name: &str| {
            clusters["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["metadata"]["name"] == name)
                .map(|c| c["state"]["state"].clone())
                .unwrap_or(Value::Null)
        };
        let hosts_active = hosts["items"]
            .as_array()
            .is_some_and(|h| h.len() == 3 && h.iter().all(|h| h["state"]["state"] == "active"));
        let nodes_active = nodes["items"]
            .as_array()
            .is_some_and(|n| n.len() == 3 && n.iter().all(|n| n["state"] == "active"));
        if state("demo-1") == "active"
            && state("demo-2") == "active"
            && state("demo-edge") == "active"
            && hosts_active
            && nodes_active
        {
            // demo-2 has three nodes, as its cluster-agent reports from its API server.
            let demo2 = clusters["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["metadata"]["name"] == "demo-2")
                .unwrap();
            assert_eq!(demo2["status"]["nodes"]["total"], 3, "{demo2}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not come up within 120 s: {clusters:.2000} {hosts:.1000} {nodes:.500}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The custom cluster's hosts were provisioned in their roots under the data directory.
    for i in 0..3 {
        let root = dir.join(format!("hub/demo/demo-edge/host-{i}/root"));
        assert!(
            root.join("var/lib/rancher/k3s/installed").is_file(),
            "host {i} installed under {}",
            root.display()
        );
    }
    realistic_workloads(&hub, &admin).await;
    loads_differ(&hub, &admin).await;
    let there_after: Vec<&str> = outside
        .iter()
        .copied()
        .filter(|p| std::path::Path::new(p).exists())
        .collect();
    assert_eq!(
        there_after, there_before,
        "the demo wrote outside its data directory"
    );
    assert!(hub.terminate().await, "the hub stops cleanly with its demo");
}

/// The items of a list read through the hub's proxy as the admin.
async fn items(hub: &HubProcess, admin: &str, path: &str) -> Vec<Value> {
    let (status, list) = api(hub.addr, "GET", path, Some(admin), None).await;
    assert_eq!(status, 200, "{path}: {list}");
    list["items"].as_array().unwrap().clone()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap()
}

/// The first impression: a cluster runs what a small shop would, its workloads ready (the
/// agents' own among them), every pod owned by what started it.
async fn realistic_workloads(hub: &HubProcess, admin: &str) {
    let base = "/k8s/clusters/demo-1";
    let deployments = items(hub, admin, &format!("{base}/apis/apps/v1/deployments")).await;
    for wanted in ["web", "api", "coredns", "drover-cluster-agent"] {
        assert!(
            deployments.iter().any(|d| name(d) == wanted),
            "no deployment {wanted}"
        );
    }
    for d in &deployments {
        assert_eq!(
            d["status"]["readyReplicas"],
            d["spec"]["replicas"],
            "deployment {} is not ready: {d}",
            name(d)
        );
    }
    let sets = items(hub, admin, &format!("{base}/apis/apps/v1/statefulsets")).await;
    assert_eq!(sets.iter().map(name).collect::<Vec<_>>(), ["db"]);
    let cron = items(hub, admin, &format!("{base}/apis/batch/v1/cronjobs")).await;
    assert_eq!(
        cron.iter().map(name).collect::<Vec<_>>(),
        ["nightly-backup"]
    );
    let services = items(
        hub,
        admin,
        &format!("{base}/api/v1/namespaces/shop/services"),
    )
    .await;
    assert_eq!(services.len(), 3, "{services:?}");

    let replica_sets = items(hub, admin, &format!("{base}/apis/apps/v1/replicasets")).await;
    let pods = items(hub, admin, &format!("{base}/api/v1/pods")).await;
    let owner = |o: &Value| {
        let r = &o["metadata"]["ownerReferences"][0];
        (
            r["kind"].as_str().unwrap_or("none").to_owned(),
            r["name"].as_str().unwrap_or("").to_owned(),
        )
    };
    // web's pods belong to a ReplicaSet that belongs to the Deployment web.
    let web_pods: Vec<&Value> = pods
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .collect();
    assert_eq!(web_pods.len(), 3);
    for pod in &web_pods {
        let (kind, set) = owner(pod);
        assert_eq!(kind, "ReplicaSet");
        let set = replica_sets.iter().find(|r| name(r) == set).unwrap();
        assert_eq!(owner(set), ("Deployment".to_owned(), "web".to_owned()));
        assert_eq!(pod["status"]["phase"], "Running");
    }
    // Every pod has an owner and the running ones are ready; the backup's ran to completion.
    for pod in &pods {
        assert_ne!(owner(pod).0, "none", "an ownerless pod: {pod}");
        assert!(!name(pod).starts_with("pod-"), "{}", name(pod));
    }
    assert!(
        pods.iter()
            .any(|p| name(p) == "db-0" && owner(p).0 == "StatefulSet")
    );
    let backup = pods.iter().find(|p| owner(p).0 == "Job").unwrap();
    assert_eq!(backup["status"]["phase"], "Succeeded");
    let agents: Vec<&Value> = pods
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "drover-system")
        .collect();
    assert!(!agents.is_empty());
    for pod in agents {
        let ready = pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "agent pod {} not ready", name(pod));
    }
}

/// The stand-in machines, all on this one, each show a load of their own.
async fn loads_differ(hub: &HubProcess, admin: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = items(hub, admin, "/v1/clusters/demo-2/nodes").await;
        let hosts = items(hub, admin, "/v1/hosts").await;
        let mut cpu: Vec<f64> = nodes
            .iter()
            .filter_map(|n| n["usage"]["cpuPercent"].as_f64())
            .collect();
        for host in &hosts {
            let (_, usage) = api(
                hub.addr,
                "GET",
                &format!("/v1/hosts/{}/usage", name(host)),
                Some(admin),
                None,
            )
            .await;
            cpu.extend(usage["usage"]["cpuPercent"].as_f64());
        }
        if cpu.len() == 6 {
            let mut distinct = cpu.clone();
            distinct.sort_by(f64::total_cmp);
            distinct.dedup();
            assert_eq!(
                distinct.len(),
                6,
                "nodes and hosts show the same CPU: {cpu:?}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no usage from 3 nodes and 3 hosts within 60 s: {cpu:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
