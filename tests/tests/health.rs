//! Health of an imported (simulated) cluster's agents, with the real binaries as processes: a
//! stopped agent shows `disconnected` within 3 heartbeats and leaves an event, and `active`
//! again when it returns; with the cluster-agent gone, kubectl through the hub still answers
//! by a node-agent (`X-Drover-Route: node-agent`) until the cluster-agent is back.
//!
//! The downstream cluster is `sim`'s simulated API server (no real kube-apiserver can be
//! downloaded here); the agents, the hub and kubectl are the real ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::Value;
use sim::cluster::SimConfig;
use tests::{
    api, api_with_headers, binary,
    imported::{Imported, kubectl, until_allowed, user_kubeconfig},
    wait_for_event,
};
use tokio::process::{Child, Command};

/// The hub's heartbeat interval in these tests: 3 missed take 3 s.
const HEARTBEAT: &str = "1";

fn spawn(program: &str, env: &HashMap<String, String>) -> Child {
    Command::new(binary(program))
        .envs(env)
        .env("DROVER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"))
}

fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("still running").to_string();
    assert!(
        std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Polls `GET path` as the admin until `ok` accepts the body; panics with the last body after
/// `within`.
async fn until(imported: &Imported, path: &str, within: Duration, ok: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let (_, body) = api(imported.hub.addr, "GET", path, Some(&imported.admin), None).await;
        if ok(&body) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path} did not get there within {within:?}: {body:.1500}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls cluster `prod` until its state is `state`.
async fn until_cluster_is(imported: &Imported, state: &str, within: Duration) {
    until(imported, "/v1/clusters/prod", within, |c| {
        c["state"]["state"] == state
    })
    .await;
}

fn node<'a>(nodes: &'a Value, name: &str) -> Option<&'a Value> {
    nodes["items"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)
}

fn node_state(nodes: &Value, name: &str) -> String {
    node(nodes, name).map_or_else(String::new, |n| {
        n["state"].as_str().unwrap_or_default().to_owned()
    })
}

/// Follows cluster `prod`'s events from now on; the handle gives the first one `wanted`
/// accepts (within 30 s).
async fn next_event(
    hub: std::net::SocketAddr,
    admin: &str,
    wanted: impl FnMut(&Value) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Value> {
    let (_, events) = api(hub, "GET", "/v1/events?cluster=prod", Some(admin), None).await;
    let since = events["items"]
        .as_array()
        .and_then(|items| items.last())
        .map_or(0, |e| e["seq"].as_u64().unwrap());
    let path = format!("/v1/events?cluster=prod&since={since}&watch=true");
    let admin = admin.to_owned();
    let follow = tokio::spawn(async move {
        wait_for_event(hub, &path, &admin, Duration::from_secs(30), wanted).await
    });
    // Time for the watch to be open before what it waits for is done.
    tokio::time::sleep(Duration::from_millis(300)).await;
    follow
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_go_and_return_and_kubectl_falls_back_to_a_node_agent() {
    let imported = Imported::start_with(
        "health",
        SimConfig {
            nodes: 2,
            ..SimConfig::default()
        },
        &["--listen", "127.0.0.1:0", "--heartbeat-seconds", HEARTBEAT],
    )
    .await;
    let hub = imported.hub.addr;
    let admin = imported.admin.clone();

    let agent_env = imported.agent_env("drover-cluster-agent-0").await;
    let mut cluster_agent = spawn("drover-cluster-agent", &agent_env);
    let mut node_agents = HashMap::new();
    for name in ["node-0", "node-1"] {
        let env = imported.node_agent_env(name).await;
        assert_eq!(env["DROVER_NODE_NAME"], name);
        node_agents.insert(name, spawn("drover-node-agent", &env));
    }

    // Both nodes report in, with their machine's facts and usage.
    until(
        &imported,
        "/v1/clusters/prod/nodes",
        Duration::from_secs(60),
        |nodes| {
            ["node-0", "node-1"].iter().all(|n| {
                node(nodes, n).is_some_and(|n| {
                    n["state"] == "active"
                        && n["facts"]["cpus"].as_u64() >= Some(1)
                        && n["usage"]["memoryTotalBytes"].as_u64() > Some(0)
                })
            })
        },
    )
    .await;
    until_cluster_is(&imported, "active", Duration::from_secs(60)).await;
    let (status, usage) = api(
        hub,
        "GET",
        "/v1/clusters/prod/nodes/node-0/usage",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{usage}");
    assert_eq!(usage["resolutionSeconds"], 60);
    assert!(!usage["points"].as_array().unwrap().is_empty(), "{usage}");

    let kubeconfig = user_kubeconfig(
        &imported.hub,
        &admin,
        &imported.dir,
        "dev",
        Some("cluster-member"),
    )
    .await;
    until_allowed(&kubeconfig, &["list", "nodes"]).await;
    let user = tests::login(hub, "dev", "a long enough password").await;
    let route = |headers: &http::HeaderMap| {
        headers
            .get("x-drover-route")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (status, headers, _) =
        api_with_headers(hub, "/k8s/clusters/prod/api/v1/nodes", &user).await;
    assert_eq!((status, route(&headers)), (200, None));

    // The cluster-agent dies: the cluster shows disconnected, with an event, and kubectl still
    // answers, by a node-agent.
    let gone = next_event(hub, &admin, |e| {
        e["reason"] == "AgentDisconnected"
            && e["message"].as_str().unwrap().contains("cluster-agent")
    })
    .await;
    cluster_agent.kill().await.unwrap();
    let event = gone.await.unwrap();
    assert_eq!(event["type"], "Warning");
    until_cluster_is(&imported, "disconnected", Duration::from_secs(10)).await;
    let (ok, out, err) = kubectl(&kubeconfig, &["get", "nodes", "-o", "name"]).await;
    assert!(ok, "kubectl through the fallback: {err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let (status, headers, body) =
        api_with_headers(hub, "/k8s/clusters/prod/api/v1/namespaces/default", &user).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(route(&headers).as_deref(), Some("node-agent"));
    // The cache lives in the cluster-agent: no fallback there, and the answer says why.
    let (status, body) = api(
        hub,
        "GET",
        "/v1/clusters/prod/cache/nodes",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    // Another cluster's traffic never goes through this cluster's agents.
    tests::create_imported_cluster(hub, &admin, "other").await;
    let (status, body) = api(
        hub,
        "GET",
        "/k8s/clusters/other/api/v1/nodes",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"other\""),
        "{body}"
    );

    // Back: the primary route again.
    cluster_agent = spawn("drover-cluster-agent", &agent_env);
    until_cluster_is(&imported, "active", Duration::from_secs(60)).await;
    let (status, headers, _) =
        api_with_headers(hub, "/k8s/clusters/prod/api/v1/namespaces/default", &user).await;
    assert_eq!((status, route(&headers)), (200, None));

    // A node-agent that hangs (its tunnel stands, its beats stop) shows disconnected within
    // 3 heartbeats, and active when it beats again.
    let missed = next_event(hub, &admin, |e| {
        e["reason"] == "HeartbeatsMissed" && e["node"] == "node-1"
    })
    .await;
    let stopped = Instant::now();
    signal(&node_agents["node-1"], "-STOP");
    missed.await.unwrap();
    let after = stopped.elapsed();
    eprintln!("a hung node-agent was noticed after {after:?}");
    // 3 × 1 s, a beat that may have just been sent, and the check's own period.
    assert!(after < Duration::from_secs(6), "noticed after {after:?}");
    until(
        &imported,
        "/v1/clusters/prod/nodes",
        Duration::from_secs(5),
        |n| node_state(n, "node-1") == "disconnected" && node_state(n, "node-0") == "active",
    )
    .await;
    signal(&node_agents["node-1"], "-CONT");
    until(
        &imported,
        "/v1/clusters/prod/nodes",
        Duration::from_secs(10),
        |n| node_state(n, "node-1") == "active",
    )
    .await;

    // A node-agent that dies shows disconnected at once, and active when restarted.
    node_agents.get_mut("node-0").unwrap().kill().await.unwrap();
    until(
        &imported,
        "/v1/clusters/prod/nodes",
        Duration::from_secs(10),
        |n| node_state(n, "node-0") == "disconnected",
    )
    .await;
    let env = imported.node_agent_env("node-0").await;
    node_agents.insert("node-0", spawn("drover-node-agent", &env));
    until(
        &imported,
        "/v1/clusters/prod/nodes",
        Duration::from_secs(30),
        |n| node_state(n, "node-0") == "active",
    )
    .await;

    // The account of it all, oldest first.
    let (_, events) = api(hub, "GET", "/v1/events?cluster=prod", Some(&admin), None).await;
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    for reason in [
        "AgentConnected",
        "AgentDisconnected",
        "HeartbeatsMissed",
        "HeartbeatsResumed",
        "StateChanged",
    ] {
        assert!(reasons.contains(&reason), "no {reason} in {reasons:?}");
    }
    // A user with no role on the cluster sees none of it.
    let (_, stranger) = {
        let (status, _) = api(
            hub,
            "POST",
            "/v1/users",
            Some(&admin),
            Some(serde_json::json!({"metadata": {"name": "stranger"}, "spec": {"password": "a long enough password"}})),
        )
        .await;
        assert_eq!(status, 201);
        let token = tests::login(hub, "stranger", "a long enough password").await;
        api(hub, "GET", "/v1/events", Some(&token), None).await
    };
    assert_eq!(stranger["items"], serde_json::json!([]));

    let (_, metrics) = tests::api_text(hub, "GET", "/metrics", None).await;
    assert!(
        metrics.contains("drover_agents{kind=\"node-agent\",state=\"active\"} 2"),
        "{metrics}"
    );
    let beats = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drover_heartbeat_lag_seconds_count "))
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert!(beats > 0, "{metrics}");

    drop(node_agents);
    drop(cluster_agent);
    imported.shutdown.cancel();
}
