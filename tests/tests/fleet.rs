//! `drover-sim fleet` against a real hub process: system-agents register as hosts and apply a
//! plan; cluster-agents import their clusters; the hub counts every session. (The `fleet`
//! benchmark runs the same code with thousands of agents.)

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use sim::fleet::{FleetConfig, FleetKind};
use tests::{
    HubProcess, https_get, login,
    system_agent::{applied, counted, create_paused_edge, put_plan, runs, until},
    temp_dir,
};
use tokio_util::sync::CancellationToken;

/// `drover_tunnel_sessions{kind="<kind>"}` from the hub's `/metrics`.
async fn sessions(hub: &HubProcess, kind: &str) -> u64 {
    let (_, text) = https_get(hub.addr, "/metrics").await;
    let wanted = format!("drover_tunnel_sessions{{kind=\"{kind}\"}} ");
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(&wanted)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_system_and_cluster_agents_joins_a_hub() {
    let dir = temp_dir("fleet");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let registration = create_paused_edge(hub.addr, &admin).await;
    let stop = CancellationToken::new();
    let config = |kind, token: &str, prefix: &str, agents| FleetConfig {
        hub: hub.url(),
        ca_checksum: hub.ca_checksum.clone(),
        token: token.to_owned(),
        agents,
        kind,
        prefix: prefix.into(),
        dir: dir.join(prefix),
        concurrency: 4,
    };
    let hosts = sim::fleet::start(
        config(
            FleetKind::System,
            registration["token"].as_str().unwrap(),
            "rack",
            6,
        ),
        stop.clone(),
    )
    .await
    .unwrap();
    let clusters = sim::fleet::start(config(FleetKind::Cluster, &admin, "shop", 3), stop.clone())
        .await
        .unwrap();

    // Every host registered under its own name, and every session is up at the hub.
    let listed = until(&hub, &admin, "/v1/hosts", Duration::from_secs(30), |v| {
        v["items"].as_array().is_some_and(|items| items.len() == 6)
    })
    .await;
    let mut names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["spec"]["nodeName"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["rack-0", "rack-1", "rack-2", "rack-3", "rack-4", "rack-5"]
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while hosts.connected() < 6
        || sessions(&hub, "system-agent").await < 6
        || sessions(&hub, "cluster-agent").await < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every agent connected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The imported clusters are active, with the simulated cluster's node.
    until(&hub, &admin, "/v1/clusters", Duration::from_secs(30), |v| {
        let shops: Vec<&Value> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["metadata"]["name"].as_str().unwrap().starts_with("shop-"))
            .collect();
        shops.len() == 3
            && shops
                .iter()
                .all(|c| c["state"]["state"] == "active" && c["status"]["nodes"]["total"] == 1)
    })
    .await;
    // A fleet host applies a plan for real.
    let (host, _) = hosts.system_agents().next().unwrap();
    let ran = dir.join("ran");
    put_plan(
        &hub,
        &admin,
        host,
        json!({"instructions": [counted("once", &ran, "true")]}),
    )
    .await;
    until(
        &hub,
        &admin,
        &format!("/v1/plans/{host}"),
        Duration::from_secs(30),
        applied,
    )
    .await;
    assert_eq!(runs(&ran), 1);

    stop.cancel();
    hosts.wait().await;
    clusters.wait().await;
}
