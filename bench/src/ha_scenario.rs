//! Scenario `ha`: three hub replicas (their own processes) on a three-member etcd (Debian's
//! `etcd-server`), with an imported simulated cluster whose cluster-agent knows all three, as
//! the HA tests start them. A client writes and reads through every replica in turn, kubectl
//! lists the cluster's pods through each in turn, and every replica is asked whether it leads,
//! first for a window where nothing fails (the baseline), then for one window per etcd member,
//! that member SIGKILLed for longer than a replica's lease and started again. Per window:
//! requests made and failed, and the longest time no replica led.

use std::time::Duration;

use anyhow::Context as _;
use hub::store::local_etcd::LocalEtcd;
use serde_json::{Value, json};
use tests::ha::{Replicas, Window, leader_of};

use crate::health_scenario::round;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Seconds each member stays down (a replica's lease lasts 10 s).
    #[arg(long, default_value_t = 12)]
    down_seconds: u64,
}

/// A window's figures.
fn figures(window: &Window) -> Value {
    let seconds = window.elapsed.as_secs_f64();
    json!({
        "seconds": round(seconds, 1),
        "writes": window.writes,
        "writes_per_second": round(window.writes as f64 / seconds, 1),
        "requests_failed": window.failed.len(),
        "kubectl": window.kubectl,
        "kubectl_failed": window.kubectl_failed.len(),
        "no_leader_ms": window.leaderless.as_millis(),
        // What failed, in the words the client got.
        "failures": window.failed.iter().chain(&window.kubectl_failed).take(5).collect::<Vec<_>>(),
    })
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let dir = tests::temp_dir("bench-ha");
    let mut cluster = LocalEtcd::start_cluster(&dir, 3)?;
    let replicas = Replicas::start("bench-ha", &LocalEtcd::cluster_url(&cluster)).await;
    let hubs: Vec<_> = replicas.hubs.iter().collect();
    leader_of(&hubs, Duration::from_secs(30)).await;
    let down = Duration::from_secs(args.down_seconds);
    // The same length as a member's window: 2 s before the kill, the outage, 2 s after.
    let steady = replicas
        .load_while("steady", tokio::time::sleep(down + Duration::from_secs(4)))
        .await;
    let mut losses = Vec::new();
    for (m, member) in cluster.iter_mut().enumerate() {
        let mut restarted = Ok(());
        let window = replicas
            .load_while(&format!("m{m}"), async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                member.kill();
                tokio::time::sleep(down).await;
                restarted = tokio::task::block_in_place(|| member.restart());
                tokio::time::sleep(Duration::from_secs(2)).await;
            })
            .await;
        restarted.with_context(|| format!("restarting etcd member {}", m + 1))?;
        let mut figures = figures(&window);
        figures["member"] = json!(m + 1);
        losses.push(figures);
    }
    replicas.stop().await;
    Ok(json!({
        "scenario": "ha",
        "replicas": 3,
        "etcd_members": 3,
        "member_down_seconds": args.down_seconds,
        "lease_ttl_seconds": hub::replicas::LEASE_TTL,
        "baseline_nothing_fails": figures(&steady),
        "member_lost": losses,
    }))
}
