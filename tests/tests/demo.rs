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
