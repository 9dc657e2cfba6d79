//! `bench planner`: the planner's own writes for a cluster of N worker hosts (and one server),
//! without the rest of a hub: the hub's planner on its SQLite store in a temporary directory
//! (on this machine's disk), every host's status written straight to the store as its
//! system-agent's report would be. Times the pass that writes every worker's install plan and,
//! after a version change, the pass that writes every worker's upgrade (worker concurrency
//! 100 %). Nothing is delivered to any host: delivery and reports are `bench fleet`'s. The
//! floor, in the same run: as many plan changes written straight to the store, as many at once
//! as the planner writes, with nothing decided, listed or checked.

use std::{sync::Arc, time::Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use hub::{
    model::{Kind, parse_plan},
    planner::Planner,
    store::{LabelSelector, Modifier, Object, Op, Store, sqlite::SqliteStore},
};
use proto::plan::v1::{InstructionResult, PlanState, PlanStatus, ProbeStatus, checksum};
use serde_json::{Value, json};

use crate::health_scenario::round;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Worker hosts in the cluster (besides its one server).
    #[arg(long, default_value_t = 5000)]
    hosts: usize,
}

const SERVER: &str = "server-0";

fn cluster_spec(version: &str) -> Value {
    json!({"type": "custom", "distribution": "k3s", "version": version,
           "upgradeStrategy": {"workerConcurrency": "100%"}})
}

/// Reports `host`'s current plan applied, as its system-agent would (`output` as the saved
/// output of the instructions that keep theirs: the server's join token), through the hub's
/// own report handling. `seq` grows with every report, as an agent's does.
async fn applied(store: &dyn Store, host: &str, output: &str, seq: u64) -> anyhow::Result<()> {
    let object = store.get(Kind::Plan.name(), host).await?;
    let plan = parse_plan(&object.spec["plan"]).map_err(anyhow::Error::msg)?;
    let sum = checksum(&plan);
    let status = PlanStatus {
        checksum: sum.clone(),
        applied_checksum: sum.clone(),
        state: PlanState::Applied as i32,
        results: plan
            .instructions
            .iter()
            .map(|i| InstructionResult {
                name: i.name.clone(),
                stdout: if i.save_output {
                    output.into()
                } else {
                    String::new()
                },
                ..InstructionResult::default()
            })
            .collect(),
        probes: plan
            .probes
            .iter()
            .map(|p| ProbeStatus {
                name: p.name.clone(),
                healthy: true,
                ..ProbeStatus::default()
            })
            .collect(),
        seq,
        ..PlanStatus::default()
    };
    hub::plans::record(store, host, "", &sum, status).await?;
    Ok(())
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.hosts.max(1);
    let dir = std::env::temp_dir().join(format!("drover-bench-planner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let measured = measure(&dir, n).await;
    let _ = std::fs::remove_dir_all(&dir);
    measured
}

async fn measure(dir: &std::path::Path, n: usize) -> anyhow::Result<Value> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db"))?);
    let planner = Planner {
        store: store.clone(),
        server_url: "https://hub.example:8443".into(),
        ca_checksum: "ab".repeat(32),
        ca_pem: String::new(),
        agents: None,
        files: None,
    };
    store
        .create(Object::new("Cluster", "edge", cluster_spec("v1.33.4+k3s1")))
        .await?;
    let host = |name: &str, server: bool, address: String| {
        Object::new(
            "Host",
            name,
            json!({"cluster": "edge", "nodeName": name, "address": address,
                   "roles": {"etcd": server, "controlPlane": server, "worker": !server}}),
        )
    };
    store.create(host(SERVER, true, "10.0.0.1".into())).await?;
    for i in 0..n {
        let address = format!("10.{}.{}.{}", 1 + i / 62500, (i / 250) % 250, i % 250 + 1);
        store
            .create(host(&format!("worker-{i}"), false, address))
            .await?;
    }
    let workers: Vec<String> = (0..n).map(|i| format!("worker-{i}")).collect();

    // The server first; once it has applied its plan (with the join token), one pass writes
    // every worker's install plan.
    planner.pass().await?;
    applied(store.as_ref(), SERVER, "join-token", 1).await?;
    let started = Instant::now();
    planner.pass().await?;
    let install = started.elapsed().as_secs_f64();
    let planned = store.get(Kind::Plan.name(), &workers[n - 1]).await.is_ok();
    anyhow::ensure!(
        planned,
        "the install pass wrote no plan for the last worker"
    );
    for worker in &workers {
        applied(store.as_ref(), worker, "", 1).await?;
    }
    planner.pass().await?;

    // The workers' plans as installed, for the floor below.
    let installed: Vec<Value> = store
        .list(Kind::Plan.name(), &LabelSelector::everything())
        .await?
        .0
        .into_iter()
        .filter(|p| p.metadata.name.starts_with("worker-"))
        .map(|p| p.spec)
        .collect();

    // A new version: the server's plan, then every worker's in one pass.
    let mut cluster = store.get("Cluster", "edge").await?;
    cluster.spec = cluster_spec("v1.33.5+k3s1");
    store.update(cluster).await?;
    planner.pass().await?;
    applied(store.as_ref(), SERVER, "join-token", 2).await?;
    let started = Instant::now();
    planner.pass().await?;
    let upgrade = started.elapsed().as_secs_f64();
    let last = store.get(Kind::Plan.name(), &workers[n - 1]).await?;
    let upgraded = serde_json::to_string(&last.spec)
        .context("the last worker's plan")?
        .contains("v1.33.5+k3s1");
    anyhow::ensure!(upgraded, "the upgrade pass did not reach the last worker");

    // The floor: the same number of plans changed straight in the store, as many at once as
    // the planner writes (each back to its installed spec: the same size of change), with
    // nothing decided, listed or checked.
    let started = Instant::now();
    let writes = installed.into_iter().map(|spec| {
        let name = spec["host"].as_str().unwrap_or_default().to_owned();
        store.transact(vec![Op::Modify {
            kind: Kind::Plan.name().into(),
            name,
            change: Modifier::new(move |p| p.spec = spec.clone()),
        }])
    });
    futures::stream::iter(writes)
        .buffer_unordered(256)
        .try_collect::<Vec<_>>()
        .await?;
    let floor = started.elapsed().as_secs_f64();

    Ok(json!({
        "scenario": "planner",
        "what": "one planner pass writing every worker's plan (worker concurrency 100 %): the hub's planner on its SQLite store, hosts' reports written straight to the store, nothing delivered",
        "hosts": n,
        "install_pass_s": round(install, 2),
        "upgrade_pass_s": round(upgrade, 2),
        "upgrade_ms_per_host": round(upgrade * 1000.0 / n as f64, 3),
        "floor": {
            "what": "the same number of plans changed straight in the store (Op::Modify, 256 at once), nothing decided or read",
            "writes_s": round(floor, 2),
        },
        "upgrade_vs_floor": round(upgrade / floor, 2),
    }))
}
