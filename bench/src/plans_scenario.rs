//! `bench plans`: a hub and N system-agents in one process (the real hub, tunnel and agent
//! code; no-op plans), measuring how long a plan written for every host takes to be applied on
//! all of them (`fanout_s`, the target is ≤ 5 s for 1,000 hosts) and how far the hub's
//! record of each host's status trails the host (`status_lag_*_ms`).
//!
//! Each simulated host keeps its state on tmpfs (`/dev/shm`) when there is one: real hosts each
//! fsync to their own disk, and a thousand of them fsyncing to this machine's one disk would
//! measure that disk, not Drover. The hub's store is on the real disk.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::StreamExt;
use proto::plan::v1::{Instruction, Plan, checksum};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::proxy_scenario::{admin_with_cluster, hub_config};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Simulated hosts, each with its own system-agent and tunnel session.
    #[arg(long, default_value_t = 1000)]
    hosts: usize,
}

/// Percentile `p` (0–100) of sorted `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.hosts.max(1);
    let shutdown = CancellationToken::new();
    let pid = std::process::id();
    let hub_dir = std::env::temp_dir().join(format!("drover-bench-plans-{pid}"));
    let shm = PathBuf::from("/dev/shm");
    let (hosts_dir, host_state) = if shm.is_dir() {
        (shm.join(format!("drover-bench-plans-{pid}")), "tmpfs")
    } else {
        (hub_dir.join("hosts"), "disk")
    };
    let _ = std::fs::remove_dir_all(&hub_dir);
    let _ = std::fs::remove_dir_all(&hosts_dir);
    let hub = hub::Hub::start(hub_config(&hub_dir.join("hub")), shutdown.clone()).await?;
    // Paused: the plans here are written by the benchmark, not the planner.
    let (_, token) = admin_with_cluster(
        &hub,
        json!({"metadata": {"name": "fleet"},
               "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1", "paused": true}}),
    )
    .await?;

    // Register and connect every host, 50 at a time.
    let started = Instant::now();
    let mut agents = Vec::with_capacity(n);
    for batch in (0..n).collect::<Vec<_>>().chunks(50) {
        let starts = batch.iter().map(|i| {
            let dir = hosts_dir.join(format!("host-{i}"));
            let config = system_agent::Config {
                hub: Some(system_agent::HubSettings {
                    server: hub.url().to_owned(),
                    token: tunnel::Secret::new(token.clone()),
                    ca_checksum: hub.ca_checksum().to_owned(),
                    state_dir: dir.clone(),
                    local_address: None,
                    proxy: Default::default(),
                }),
                dir: dir.clone(),
                host: system_agent::HostSpec {
                    roles: system_agent::Roles {
                        worker: true,
                        ..system_agent::Roles::default()
                    },
                    node_name: format!("node-{i}"),
                    ..system_agent::HostSpec::default()
                },
                local_plans: None,
                root: system_agent::Root::default(),
                machine: None,
                retry: system_agent::Retry::default(),
            };
            let shutdown = shutdown.clone();
            async move {
                let agent = system_agent::Agent::start(config, shutdown).await?;
                let registration: Value =
                    serde_json::from_slice(&std::fs::read(dir.join("registration.json"))?)?;
                let host = registration["id"]
                    .as_str()
                    .and_then(|id| id.strip_prefix("host/"))
                    .context("registration id")?
                    .to_owned();
                anyhow::Ok((host, agent))
            }
        });
        for started in futures::future::join_all(starts).await {
            agents.push(started?);
        }
    }
    let register_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(180);
    while hub.sessions().sessions().len() < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} hosts connected",
            hub.sessions().sessions().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_s = started.elapsed().as_secs_f64();

    // One no-op plan for every host, written in one transaction.
    let plan = Plan {
        instructions: vec![Instruction {
            name: "noop".into(),
            command: "true".into(),
            ..Instruction::default()
        }],
        ..Plan::default()
    };
    let target = checksum(&plan);
    let store = hub.store().clone();

    // When each host applied it (from its own record), and when the hub had that status.
    let (applied_tx, mut applied_rx) = mpsc::unbounded_channel::<(String, Instant)>();
    for (host, agent) in &agents {
        let record = agent
            .record
            .clone()
            .context("an agent with a hub has a record")?;
        let (host, tx, target) = (host.clone(), applied_tx.clone(), target.clone());
        tokio::spawn(async move {
            let mut changes = record.watch_status();
            loop {
                if record.status().applied_checksum == target {
                    let _ = tx.send((host, Instant::now()));
                    return;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    drop(applied_tx);
    let revision = store.revision().await?;
    let mut watch = store.watch(Some("Plan"), Some(revision)).await?;
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<(String, Instant)>();
    {
        let target = target.clone();
        tokio::spawn(async move {
            let mut done = std::collections::HashSet::new();
            while let Some(Ok(event)) = watch.next().await {
                let object = &event.object;
                if object.status.get("appliedChecksum").and_then(Value::as_str) == Some(&target)
                    && done.insert(object.metadata.name.clone())
                {
                    let _ = seen_tx.send((object.metadata.name.clone(), Instant::now()));
                }
            }
        });
    }
    let plan_json = serde_json::to_value(&plan)?;
    let mut ops: Vec<hub::store::Op> = agents
        .iter()
        .map(|(host, _)| {
            hub::store::Op::Create(hub::store::Object::new(
                "Plan",
                host,
                json!({"host": host, "cluster": "fleet", "plan": plan_json}),
            ))
        })
        .collect();
    let written = Instant::now();
    hub::refs::stamp_all(store.as_ref(), &mut ops).await?;
    store.transact(ops).await?;

    let mut applied: HashMap<String, Instant> = HashMap::new();
    let mut seen: HashMap<String, Instant> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while applied.len() < n || seen.len() < n {
        tokio::select! {
            Some((host, at)) = applied_rx.recv(), if applied.len() < n => { applied.insert(host, at); }
            Some((host, at)) = seen_rx.recv(), if seen.len() < n => { seen.insert(host, at); }
            () = tokio::time::sleep_until(deadline) => anyhow::bail!(
                "after 300 s: {} of {n} hosts applied the plan, the hub saw {}", applied.len(), seen.len()
            ),
        }
    }
    let last = |m: &HashMap<String, Instant>| {
        m.values()
            .map(|at| at.duration_since(written).as_secs_f64())
            .fold(0.0, f64::max)
    };
    let mut lags: Vec<f64> = applied
        .iter()
        .filter_map(|(host, at)| {
            Some(seen.get(host)?.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    let report = json!({
        "scenario": "plans",
        "hosts": n,
        "host_state": host_state,
        "register_s": register_s,
        "connect_s": connect_s,
        "fanout_s": last(&applied),
        "fanout_hub_s": last(&seen),
        "status_lag_p50_ms": percentile(&lags, 50.0),
        "status_lag_p99_ms": percentile(&lags, 99.0),
        "process_rss_mib": rss_mib(),
    });
    shutdown.cancel();
    drop(agents);
    let _ = std::fs::remove_dir_all(&hub_dir);
    let _ = std::fs::remove_dir_all(&hosts_dir);
    Ok(report)
}
