//! `bench fleet --agents N`: how one hub holds a fleet of idle agents. The release
//! `drover-hub` runs as a process of its own (its memory and CPU are read from `/proc`); N
//! node-agent sessions — the real tunnel code with its reconnect loop, each beating at the
//! hub's interval as an idle agent does — run in this process. Reports the time from cold
//! start to all connected, the hub's memory per agent (its resident memory with the fleet less
//! before it), its CPU while the fleet only beats, and, after the hub is killed and started
//! again on the same port and data, the time until every agent is back.
//!
//! Each process needs a file descriptor per agent: `ulimit -n` must exceed N (plus some).

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::Connector;

use crate::{
    health_scenario::{cpu_seconds, prepare, round, start_hub_on},
    hub_scenario::rss_mib,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Agents (tunnel sessions) to connect.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Seconds of quiet (heartbeats only) over which the hub's CPU is read.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
}

/// Waits until `connected` reaches `n`; the time it took, or `None` after `limit`.
async fn until_all(connected: &AtomicUsize, n: usize, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while connected.load(Ordering::Relaxed) < n {
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(started.elapsed())
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.agents.max(1);
    let dir: PathBuf = std::env::current_exe()?
        .parent()
        .context("no directory for the bench binary")?
        .to_owned();
    let exe = dir.join("drover-hub");
    anyhow::ensure!(
        exe.exists(),
        "drover-hub is missing next to bench: run `cargo build --release -p hub -p bench` first"
    );
    let data = std::env::temp_dir().join(format!("drover-bench-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let prepared = prepare(&data.join("hub")).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (hub, url) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let pid = hub.id().context("hub pid")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_mib(pid).unwrap_or(0.0);

    // Each agent: the connector's own loop (backoff, reconnect) and, per session, heartbeats.
    let connected = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    // A cold start of the whole fleet at once: every agent dials at the same moment.
    for i in 0..n {
        let connector = Connector::new(prepared.node_agent(&url, i))?;
        let (tx, mut sessions) = mpsc::channel(1);
        tokio::spawn(connector.run(tx, stop.clone()));
        let connected = connected.clone();
        tokio::spawn(async move {
            while let Some(session) = sessions.recv().await {
                connected.fetch_add(1, Ordering::Relaxed);
                hostinfo::beat(&session, None).await;
                connected.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }
    let connect = until_all(&connected, n, Duration::from_secs(300)).await;
    let connect_s = connect.map(|d| round(d.as_secs_f64(), 2));

    // Quiet: the fleet only beats (every 10 s each).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(args.idle_seconds.max(1));
    let cpu_start = cpu_seconds(pid)?;
    tokio::time::sleep(window).await;
    let idle_cpu = (cpu_seconds(pid)? - cpu_start) / window.as_secs_f64();
    let rss_after = rss_mib(pid).unwrap_or(0.0);
    let connected_then = connected.load(Ordering::Relaxed);

    // The hub dies and comes back on the same address: every agent reconnects by itself.
    drop(hub);
    let gone = Instant::now();
    while connected.load(Ordering::Relaxed) > 0 && gone.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarted = Instant::now();
    let (hub, _) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let reconnect = until_all(&connected, n, Duration::from_secs(300)).await;
    let reconnect_s = reconnect.map(|_| round(restarted.elapsed().as_secs_f64(), 2));
    let connected_end = connected.load(Ordering::Relaxed);
    stop.cancel();
    drop(hub);
    let _ = std::fs::remove_dir_all(&data);
    Ok(json!({
        "scenario": "fleet",
        "agents": n,
        "connected": connected_then,
        "connected_after_restart": connected_end,
        "connect_s": connect_s,
        "hub_rss_mib_before": rss_before,
        "hub_rss_mib": rss_after,
        "rss_per_agent_kib": round((rss_after - rss_before) * 1024.0 / n as f64, 1),
        "hub_cpu_pct_idle": round(idle_cpu * 100.0, 2),
        "idle_seconds": window.as_secs(),
        "reconnect_s": reconnect_s,
        "heartbeat_seconds": 10,
    }))
}
