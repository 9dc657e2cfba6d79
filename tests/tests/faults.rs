//! Faults on an agent's link, with the agents in a network namespace of their own and the hub
//! outside it: a slow, lossy link (200 ms each way, 5 % of packets dropped each way) under
//! which the tunnel, the proxy and plans still work; then a black-holed link (iptables DROP)
//! that both ends detect within the keepalive bound (3 × the 10 s ping interval) and that the
//! agents recover from once it is lifted.
//!
//! Loss is real packet loss (iptables `statistic`), so TCP retransmits as on a bad link. This
//! kernel has no `netem` (CONFIG_NET_SCH_NETEM is unset), so the latency comes from a relay in
//! this test that holds every byte 200 ms in each direction between the agents and the hub.
//! Needs root (CI runs as root); skipped, saying so, otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    api, binary,
    imported::{Imported, kubectl, until_allowed, user_kubeconfig},
    sh,
    system_agent::create_paused_edge,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
};

const NS: &str = "drv-f1";
/// The root namespace's end of the hosts' switch on the fault tests' subnet, and the agents'.
const HUB_SIDE: &str = "10.214.0.1";
const AGENT_SIDE: &str = "10.214.0.11";
/// Each way, so a round trip takes 400 ms before any retransmission.
const DELAY: Duration = Duration::from_millis(200);
/// The agents' and hub's ping interval (the default) and the bound it gives: a peer silent
/// this long is declared dead (the keepalive's timer fires at that instant, not at a later
/// ping).
const KEEPALIVE_BOUND: Duration = Duration::from_secs(30);
/// What detection may take beyond the bound: the hub's status write and this test's polling
/// (every 200 ms).
const SEEN_WITHIN: Duration = Duration::from_secs(3);

/// The agents' namespace, cabled to the hosts' switch (whose root end is `HUB_SIDE`).
struct Link;

impl Link {
    fn new() -> Link {
        Self::teardown();
        tests::hosts::cable(NS, NS, AGENT_SIDE, None);
        Link
    }

    /// Drops `probability` of the packets in each direction, at random.
    fn lossy(&self, probability: f64) {
        for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            sh(&format!(
                "ip netns exec {NS} iptables -A {chain} {dir} drv-f1b -m statistic --mode random --probability {probability} -j DROP"
            ));
        }
    }

    /// Drops every packet (`true`), or stops doing so.
    fn black_hole(&self, on: bool) {
        let op = if on { "-I" } else { "-D" };
        for (chain, dir) in [("INPUT", "-i"), ("OUTPUT", "-o")] {
            sh(&format!(
                "ip netns exec {NS} iptables {op} {chain} {dir} drv-f1b -j DROP"
            ));
        }
    }

    fn teardown() {
        tests::hosts::uncable(NS, NS);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        Self::teardown();
    }
}

/// Copies `from` to `to`, each chunk delivered `DELAY` after it was read, in order.
async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((read_at, chunk)) = rx.recv().await {
            tokio::time::sleep_until((read_at + DELAY).into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Listens on the hub's side of the link and relays to the hub with `DELAY` each way.
async fn latency_relay(hub: SocketAddr) -> u16 {
    let listener = TcpListener::bind((HUB_SIDE, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((agent, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(hub) = TcpStream::connect(hub).await else {
                    return;
                };
                let _ = (agent.set_nodelay(true), hub.set_nodelay(true));
                let (agent_in, agent_out) = agent.into_split();
                let (hub_in, hub_out) = hub.into_split();
                tokio::join!(delayed(agent_in, hub_out), delayed(hub_in, agent_out));
            });
        }
    });
    port
}

/// `program` in the agents' namespace.
fn spawn_in_namespace(
    program: &str,
    env: &HashMap<String, String>,
    log: &std::path::Path,
) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new("ip")
        .args(["netns", "exec", NS])
        .arg(binary(program))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .env("DROVER_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"))
}

/// Polls `GET path` as `token` until `ok` accepts it; returns how long that took.
async fn until(
    hub: SocketAddr,
    token: &str,
    path: &str,
    within: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let (_, body) = api(hub, "GET", path, Some(token), None).await;
        if ok(&body) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{path} not as wanted within {within:?}: {body:.1500}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn connected(object: &Value) -> Option<bool> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Connected")
        .map(|c| c["status"] == "True")
}

/// A plan whose one instruction appends a line to `file`; applied means it ran.
async fn apply_plan(
    hub: SocketAddr,
    admin: &str,
    host: &str,
    file: &std::path::Path,
    n: u32,
) -> Duration {
    let path = format!("/v1/plans/{host}");
    let (status, current) = api(hub, "GET", &path, Some(admin), None).await;
    let mut body = json!({
        "metadata": {"name": host},
        "spec": {"host": host, "cluster": "edge", "plan": {"instructions": [
            {"name": format!("step-{n}"), "script": format!("echo {n} >> {}", file.display())}
        ]}},
    });
    let started = Instant::now();
    let (code, written) = if status == 404 {
        api(hub, "POST", "/v1/plans", Some(admin), Some(body)).await
    } else {
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        api(hub, "PUT", &path, Some(admin), Some(body)).await
    };
    assert!(code == 200 || code == 201, "{written}");
    until(hub, admin, &path, Duration::from_secs(120), |p| {
        p["status"]["state"] == "applied"
            && p["status"]["appliedChecksum"] == p["status"]["planChecksum"]
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lossy_link_still_works_and_a_black_hole_is_detected_and_recovered() {
    if tests::hosts::skip_without_root("fault injection in a network namespace needs root") {
        return;
    }
    let link = Link::new();
    // The hub outside the namespace; the agents reach it only through the relay, whose
    // address its certificate must name.
    let hub_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let relay_port = latency_relay(([127, 0, 0, 1], hub_port).into()).await;
    let relay = format!("https://{HUB_SIDE}:{relay_port}");
    let imported = Imported::start_with(
        "faults",
        sim::cluster::SimConfig {
            // The cluster's API server is on the hub's side too: every byte the
            // cluster-agent sends or receives crosses the bad link.
            listen: (HUB_SIDE.parse::<std::net::IpAddr>().unwrap(), 0).into(),
            ..Default::default()
        },
        &[
            "--listen",
            &format!("127.0.0.1:{hub_port}"),
            "--server-url",
            &relay,
        ],
    )
    .await;
    let (hub, admin) = (imported.hub.addr, imported.admin.clone());
    let dir = imported.dir.clone();
    link.lossy(0.05);

    // A cluster-agent and a system-agent behind the link.
    let mut cluster_env = imported.agent_env("agent-0").await;
    cluster_env.insert("DROVER_SERVER".into(), relay.clone());
    let _cluster_agent = spawn_in_namespace(
        "drover-cluster-agent",
        &cluster_env,
        &dir.join("cluster-agent.log"),
    );
    let registration = create_paused_edge(hub, &admin).await;
    let host_env: HashMap<String, String> = [
        ("DROVER_SERVER", relay.clone()),
        (
            "DROVER_TOKEN",
            registration["token"].as_str().unwrap().to_owned(),
        ),
        ("DROVER_CA_CHECKSUM", imported.hub.ca_checksum.clone()),
        ("DROVER_DIR", dir.join("system-agent").display().to_string()),
        ("DROVER_ROLES", "all".into()),
        ("DROVER_NODE_NAME", "faulty".into()),
        ("DROVER_RETRY_SECONDS", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let _system_agent = spawn_in_namespace(
        "drover-system-agent",
        &host_env,
        &dir.join("system-agent.log"),
    );

    let joined = until(
        hub,
        &admin,
        "/v1/clusters/prod",
        Duration::from_secs(120),
        |c| connected(c) == Some(true),
    )
    .await;
    let looking = Instant::now();
    let host = loop {
        assert!(
            looking.elapsed() < Duration::from_secs(120),
            "no host connected within 120 s"
        );
        let (_, hosts) = api(hub, "GET", "/v1/hosts", Some(&admin), None).await;
        if let Some(name) = hosts["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|h| connected(h) == Some(true))
                .and_then(|h| h["metadata"]["name"].as_str().map(str::to_owned))
        }) {
            break name;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Through the slow, lossy link: kubectl through the hub's proxy, and a plan.
    let kubeconfig = user_kubeconfig(
        &imported.hub,
        &admin,
        &dir,
        "operator",
        Some("cluster-member"),
    )
    .await;
    until_allowed(&kubeconfig, &["list", "nodes"]).await;
    let started = Instant::now();
    let (ok, nodes, err) = kubectl(&kubeconfig, &["get", "nodes", "-o", "name"]).await;
    assert!(ok && nodes.lines().count() == 3, "{nodes}{err}");
    let manifest = dir.join("configmap.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: over-a-bad-link\n  namespace: default\ndata:\n  k: v\n",
    )
    .unwrap();
    let (ok, out, err) = kubectl(&kubeconfig, &["apply", "-f", manifest.to_str().unwrap()]).await;
    assert!(ok, "{out}{err}");
    let kubectl_lossy = started.elapsed();
    let runs = dir.join("runs");
    let plan_lossy = apply_plan(hub, &admin, &host, &runs, 1).await;
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "1\n",
        "applied once"
    );

    // The black hole: both agents must be seen gone within the keepalive bound.
    link.black_hole(true);
    let cut = Instant::now();
    let detect_cluster = until(
        hub,
        &admin,
        "/v1/clusters/prod",
        KEEPALIVE_BOUND + SEEN_WITHIN,
        |c| connected(c) == Some(false),
    )
    .await;
    let host_path = format!("/v1/hosts/{host}");
    until(
        hub,
        &admin,
        &host_path,
        KEEPALIVE_BOUND + SEEN_WITHIN,
        |h| connected(h) == Some(false),
    )
    .await;
    let detect_host = cut.elapsed();
    // Requests meanwhile fail (none hangs past kubectl's timeout); once the session is
    // declared dead, the hub answers at once that the cluster is not connected.
    loop {
        let (ok, _, err) = kubectl(&kubeconfig, &["get", "nodes", "--request-timeout=5s"]).await;
        assert!(!ok, "a request through a black hole succeeded");
        if err.contains("prod") {
            break;
        }
        assert!(
            cut.elapsed() < KEEPALIVE_BOUND + Duration::from_secs(15),
            "no clear answer for a cut-off cluster: {err}"
        );
    }

    // Lifted: both come back on their own, and work.
    link.black_hole(false);
    let lifted = Instant::now();
    until(
        hub,
        &admin,
        "/v1/clusters/prod",
        Duration::from_secs(90),
        |c| connected(c) == Some(true),
    )
    .await;
    until(hub, &admin, &host_path, Duration::from_secs(90), |h| {
        connected(h) == Some(true)
    })
    .await;
    let recovered = lifted.elapsed();
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "configmap",
            "over-a-bad-link",
            "-n",
            "default",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(
        ok && out.trim() == "configmap/over-a-bad-link",
        "{out}{err}"
    );
    apply_plan(hub, &admin, &host, &runs, 2).await;
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "1\n2\n",
        "each plan applied once"
    );

    eprintln!(
        "faults: joined over 200 ms + 5 % loss in {:.1} s; kubectl get+apply {:.1} s; plan applied in {:.1} s; \
         black hole seen by the hub in {:.1} s (cluster-agent) / {:.1} s (system-agent), bound {} s; \
         both back {:.1} s after the link returned",
        joined.as_secs_f64(),
        kubectl_lossy.as_secs_f64(),
        plan_lossy.as_secs_f64(),
        detect_cluster.as_secs_f64(),
        detect_host.as_secs_f64(),
        KEEPALIVE_BOUND.as_secs(),
        recovered.as_secs_f64(),
    );
    imported.shutdown.cancel();
    drop(link);
}
