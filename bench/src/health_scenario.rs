//! `bench health`: what heartbeats cost the hub, and what the machine agents hold in memory
//! while they report. Runs the release binaries next to this one (`cargo build --release -p hub
//! -p node-agent -p system-agent -p bench` first).
//!
//! 1. A hub's state (an imported cluster, a custom one, a node-agent credential) is prepared
//!    in-process; then `drover-hub serve` runs on it as a process of its own, so its CPU time
//!    is its alone. N node-agent sessions (real tunnel code, in this process; 10,000 by
//!    default) connect, and the hub's CPU is read over a quiet window (sessions up, no beats)
//!    and over a window in which every session beats once per interval (10 s by default, as
//!    agents do), spread over the interval as independent agents would be: with the defaults
//!    the shape of a 10,000-agent fleet, 1,000 beats/s. The difference, per beat (beats as the
//!    hub counted them), is the figure: in one window the beats are gRPC calls (the baseline:
//!    how agents beat before messages, and still do to a hub without them), in the next
//!    messages on the session itself, as agents send them now. The hub is told a 300 s
//!    interval so none is marked missed while quiet.
//! 2. A second hub process (1 s interval) and the real `drover-node-agent` (against a simulated
//!    API server; it only needs its address) and `drover-system-agent` (on a paused custom
//!    cluster: it reports, installs nothing): their RSS after they have reported for a while.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use proto::health::v1::{Heartbeat, Usage, health_client::HealthClient};
use serde_json::{Value, json};
use sim::cluster::{Identity, SimCluster, SimConfig};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tunnel::{Connector, ConnectorConfig, Peer, Secret, tls::Trust};

use crate::{
    hub_scenario::{ready, rss_mib},
    proxy_scenario::{Target, admin_with_cluster, hub_config},
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Simulated node-agent sessions, each a connection of its own to the hub.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Seconds between one session's heartbeats (the agents' interval).
    #[arg(long, default_value_t = 10)]
    interval_seconds: u64,
    /// Length of each measured window (at least one interval is sensible).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

/// CPU seconds `pid` has used (user + system). Linux counts them in USER_HZ ticks, which is
/// 100 on every configuration these machines run.
pub(crate) fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    cpu_seconds_in(&format!("/proc/{pid}/stat"))
}

/// The user and system CPU seconds in a `/proc` `stat` file (a process's or a thread's).
pub(crate) fn cpu_seconds_in(path: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').context("/proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

async fn start_hub(exe: &Path, data: &Path, heartbeat: &str) -> anyhow::Result<(Child, String)> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    start_hub_on(exe, data, heartbeat, addr).await
}

/// `drover-hub serve` on `addr` with `data`, once it answers `/readyz`.
pub(crate) async fn start_hub_on(
    exe: &Path,
    data: &Path,
    heartbeat: &str,
    addr: std::net::SocketAddr,
) -> anyhow::Result<(Child, String)> {
    let child = Command::new(exe)
        .args([
            "serve",
            "--listen",
            &addr.to_string(),
            "--heartbeat-seconds",
            heartbeat,
        ])
        .arg("--data-dir")
        .arg(data)
        .env("DROVER_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let started = Instant::now();
    while !ready(addr).await {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the hub was not ready within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((child, format!("https://{addr}")))
}

/// What the in-process hub leaves for the process hub to serve.
pub(crate) struct Prepared {
    pub(crate) api_token: String,
    pub(crate) ca_checksum: String,
    pub(crate) imported_registration: String,
    pub(crate) custom_registration: String,
    pub(crate) node_credential: String,
}

impl Prepared {
    /// The tunnel of simulated node-agent `i` of cluster `prod` (sharing the one credential).
    pub(crate) fn node_agent(&self, url: &str, i: usize) -> ConnectorConfig {
        ConnectorConfig::new(
            url,
            Secret::new(self.node_credential.clone()),
            Peer {
                id: format!("node/prod/n{i}"),
                kind: "node-agent".into(),
            },
            Trust::from_checksum(&self.ca_checksum),
        )
    }
}

pub(crate) async fn prepare(data: &Path) -> anyhow::Result<Prepared> {
    let shutdown = CancellationToken::new();
    let hub = hub::Hub::start(hub_config(data), shutdown.clone()).await?;
    let (api, imported_registration) = admin_with_cluster(
        &hub,
        json!({"metadata": {"name": "prod"}, "spec": {"type": "imported"}}),
    )
    .await?;
    let custom = api
        .call(
            "POST",
            "/v1/clusters",
            Some(json!({"metadata": {"name": "edge"},
                        "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1", "paused": true}})),
            201,
        )
        .await?;
    let settings = agentkit::HubSettings {
        server: hub.url().to_owned(),
        token: Secret::new(imported_registration.clone()),
        ca_checksum: hub.ca_checksum().to_owned(),
        state_dir: data.join("node-agent"),
        local_address: None,
        proxy: Default::default(),
    };
    let node_credential = agentkit::hub::register(
        &settings,
        Peer {
            id: "node/prod".into(),
            kind: proto::register::AgentKind::NodeAgent.as_str().into(),
        },
        &proto::register::RegisterRequest::of(proto::register::AgentKind::NodeAgent),
    )
    .await?
    .credential
    .expose()
    .to_owned();
    let prepared = Prepared {
        api_token: api.token.clone(),
        ca_checksum: hub.ca_checksum().to_owned(),
        imported_registration,
        custom_registration: custom["registration"]["token"]
            .as_str()
            .context("custom registration token")?
            .to_owned(),
        node_credential,
    };
    shutdown.cancel();
    hub.wait().await;
    Ok(prepared)
}

/// A typical machine's usage; the counters move so the hub computes rates.
fn usage(i: u64) -> Usage {
    Usage {
        cpu_percent: 12.5,
        memory_used_bytes: 3 << 30,
        memory_total_bytes: 16 << 30,
        disk_used_bytes: 40 << 30,
        disk_total_bytes: 100 << 30,
        load1: 0.7,
        load5: 0.6,
        load15: 0.5,
        net_rx_bytes: 1_000_000 + i * 5_000,
        net_tx_bytes: 2_000_000 + i * 3_000,
    }
}

async fn beats_cost(
    args: &Args,
    exe: &Path,
    data: &Path,
    prepared: &Prepared,
) -> anyhow::Result<Value> {
    // A descriptor per session here and in the hub (which inherits the raised limit).
    let open_files = sim::fleet::raise_open_files_limit();
    let n = args.agents.max(1);
    anyhow::ensure!(
        (n as u64) + 200 < open_files,
        "{n} sessions need more open files than this process may have ({open_files}): ask for fewer --agents"
    );
    let (hub, url) = start_hub(exe, data, "300").await?;
    let pid = hub.id().context("hub pid")?;
    let connecting = Instant::now();
    let mut sessions = Vec::with_capacity(n);
    for batch in (0..n).collect::<Vec<_>>().chunks(50) {
        let connects = batch.iter().map(|i| {
            let config = prepared.node_agent(&url, *i);
            async move { Connector::new(config)?.connect().await }
        });
        for session in futures::future::join_all(connects).await {
            sessions.push(session?);
        }
    }
    let connect_s = connecting.elapsed().as_secs_f64();
    let window = Duration::from_secs(args.seconds.max(1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let quiet_start = cpu_seconds(pid)?;
    tokio::time::sleep(window).await;
    let quiet = (cpu_seconds(pid)? - quiet_start) / window.as_secs_f64();

    let period = Duration::from_secs(args.interval_seconds.max(1));
    // The same sessions beat first as gRPC calls (how every agent beat until messages, and
    // how one still beats on a hub that does not take them), then as messages on the session.
    let api = api_of(&url, prepared)?;
    let calls = beating(&sessions, Via::Calls, period, window, (pid, &api)).await?;
    let messages = beating(&sessions, Via::Messages, period, window, (pid, &api)).await?;
    let hub_rss = rss_mib(pid);
    drop(hub);
    let per_beat = |window: &Beating| {
        if window.rate > 0.0 {
            (window.busy - quiet) / window.rate
        } else {
            f64::NAN
        }
    };
    let figures = |window: &Beating| {
        json!({
            "beats_per_second_taken": round(window.rate, 1),
            "hub_cpu_us_per_beat": round(per_beat(window) * 1e6, 1),
            "beat_failures": window.failures,
            "hub_cpu_cores_beating": round(window.busy, 4),
        })
    };
    Ok(json!({
        "agents": n,
        "interval_seconds": period.as_secs(),
        "connect_s": round(connect_s, 2),
        "beats_per_second_expected": round(n as f64 / period.as_secs_f64(), 1),
        "hub_cpu_us_per_beat": round(per_beat(&messages) * 1e6, 1),
        "hub_cpu_us_per_beat_as_calls": round(per_beat(&calls) * 1e6, 1),
        "messages_vs_calls": round(per_beat(&messages) / per_beat(&calls), 3),
        "as_messages": figures(&messages),
        "as_calls": figures(&calls),
        "hub_cpu_cores_quiet": round(quiet, 4),
        "hub_rss_mib_after": hub_rss,
        "window_seconds": window.as_secs(),
    }))
}

/// The hub at `url`'s API, as the prepared admin.
fn api_of(url: &str, prepared: &Prepared) -> anyhow::Result<Target> {
    Ok(Target {
        addr: url
            .trim_start_matches("https://")
            .parse()
            .context("hub address")?,
        token: prepared.api_token.clone(),
    })
}

/// The hub's `drover_heartbeats_total`.
async fn heartbeats_taken(api: &Target) -> anyhow::Result<u64> {
    let text = api.call_text("GET", "/metrics", 200).await?;
    text.lines()
        .find_map(|line| line.strip_prefix("drover_heartbeats_total "))
        .context("the hub's metrics have no drover_heartbeats_total")?
        .trim()
        .parse()
        .context("drover_heartbeats_total")
}

/// How the sessions of a beating window send their beats.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    Calls,
    Messages,
}

/// The hub's CPU (cores) and the beats taken per second over one beating window.
struct Beating {
    busy: f64,
    rate: f64,
    failures: u64,
}

async fn beating(
    sessions: &[tunnel::AgentSession],
    via: Via,
    period: Duration,
    window: Duration,
    (pid, api): (u32, &Target),
) -> anyhow::Result<Beating> {
    let n = sessions.len();
    let beats = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let mut tasks = Vec::with_capacity(n);
    for (i, session) in sessions.iter().enumerate() {
        if via == Via::Messages {
            anyhow::ensure!(
                session.messages.is_some(),
                "the hub did not take heartbeats as messages"
            );
        }
        let session = session.clone();
        let (beats, failures, stop) = (beats.clone(), failures.clone(), stop.clone());
        // Spread the sessions over the period, as independent agents would be.
        let offset = period.mul_f64(i as f64 / n as f64);
        tasks.push(tokio::spawn(async move {
            let mut client = HealthClient::new(session.channel.clone());
            tokio::time::sleep(offset).await;
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seq = 0u64;
            while !stop.is_cancelled() {
                ticks.tick().await;
                seq += 1;
                let beat = Heartbeat {
                    seq,
                    facts: (seq == 1).then(|| proto::health::v1::HostFacts {
                        hostname: format!("n{i}"),
                        cpus: 8,
                        memory_bytes: 16 << 30,
                        ..Default::default()
                    }),
                    usage: Some(usage(seq)),
                };
                let taken = match via {
                    Via::Calls => client.beat(beat).await.is_ok(),
                    // What agents do (`agentkit::heartbeat::beat`).
                    Via::Messages => agentkit::heartbeat::send(&session, beat).await.is_ok(),
                };
                if taken {
                    beats.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Past every session's first beat (facts, first history points) before measuring.
    tokio::time::sleep(period + Duration::from_secs(1)).await;
    // Beats as the hub counted them (a message is not answered, so the sender cannot count
    // them), read before and after the window; the CPU between the two reads.
    let taken_start = heartbeats_taken(api).await?;
    let (cpu_start, started) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    let busy = (cpu_seconds(pid)? - cpu_start) / started.elapsed().as_secs_f64();
    let elapsed = started.elapsed().as_secs_f64();
    let rate = (heartbeats_taken(api).await? - taken_start) as f64 / elapsed;
    anyhow::ensure!(
        beats.load(Ordering::Relaxed) > 0,
        "no beat was sent in the {via:?} window"
    );
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Ok(Beating {
        busy,
        rate,
        failures: failures.load(Ordering::Relaxed),
    })
}

pub(crate) fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

async fn agents_rss(dir: &Path, data: &Path, prepared: &Prepared) -> anyhow::Result<Value> {
    let hub_exe = dir.join("drover-hub");
    let (_hub, url) = start_hub(&hub_exe, data, "1").await?;
    let shutdown = CancellationToken::new();
    let sim = SimCluster::start(SimConfig::default(), shutdown.clone()).await?;
    sim.add_token(
        "bench-node-agent",
        Identity {
            user: "system:serviceaccount:drover-system:drover-agent".into(),
            // The bench measures the proxy, not the import manifest's RBAC: cluster-admin.
            groups: vec!["system:serviceaccounts".into(), "system:masters".into()],
        },
    );
    let work = data.join("agents");
    std::fs::create_dir_all(&work)?;
    let kubeconfig = work.join("kubeconfig");
    std::fs::write(&kubeconfig, sim.kubeconfig("bench-node-agent"))?;
    let common = [
        ("DROVER_SERVER", url.clone()),
        ("DROVER_CA_CHECKSUM", prepared.ca_checksum.clone()),
        ("DROVER_LOG", "warn".into()),
    ];
    let node = Command::new(dir.join("drover-node-agent"))
        .envs(common.clone())
        .env("DROVER_TOKEN", &prepared.imported_registration)
        .env("DROVER_CLUSTER", "prod")
        .env("DROVER_NODE_NAME", "rss-node")
        .env("DROVER_STATE_DIR", work.join("node-agent"))
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let system = Command::new(dir.join("drover-system-agent"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(common)
        .env("DROVER_TOKEN", &prepared.custom_registration)
        .env("DROVER_DIR", work.join("system-agent"))
        .env("DROVER_NODE_NAME", "rss-host")
        .env("DROVER_ROLES", "worker")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let api = api_of(&url, prepared)?;
    // Reporting for a while: both seen beating with their usage, then 10 s more.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = api
            .call("GET", "/v1/clusters/prod/nodes", None, 200)
            .await?;
        let hosts = api.call("GET", "/v1/hosts", None, 200).await?;
        let node_ok = nodes["items"][0]["usage"].is_object();
        let host_ok = hosts["items"][0]["status"]["facts"].is_object();
        if node_ok && host_ok {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the agents did not report within 60 s: {nodes} {hosts}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let report = json!({
        "node_agent_rss_mib": node.id().and_then(rss_mib),
        "system_agent_rss_mib": system.id().and_then(rss_mib),
        "reported_for_seconds_before_rss": 10,
    });
    shutdown.cancel();
    Ok(report)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let dir: PathBuf = std::env::current_exe()?
        .parent()
        .context("no directory for the bench binary")?
        .to_owned();
    for exe in ["drover-hub", "drover-node-agent", "drover-system-agent"] {
        anyhow::ensure!(
            dir.join(exe).exists(),
            "{exe} is missing next to bench: run `cargo build --release -p hub -p node-agent -p system-agent -p bench` first"
        );
    }
    let data = std::env::temp_dir().join(format!("drover-bench-health-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let prepared = prepare(&data.join("hub")).await?;
    // The agents' memory first: the heartbeat part leaves ten thousand sessions to wind down.
    let rss = agents_rss(&dir, &data.join("hub"), &prepared).await?;
    let cost = beats_cost(&args, &dir.join("drover-hub"), &data.join("hub"), &prepared).await?;
    let _ = std::fs::remove_dir_all(&data);
    Ok(json!({
        "scenario": "health",
        "heartbeats": cost,
        "agents": rss,
    }))
}
