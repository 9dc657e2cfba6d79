//! `bench fleet --agents N`: how one hub holds a fleet. The release `drover-hub` runs as a
//! process of its own (its memory and CPU are read from `/proc`); N agents run in this process
//! through `sim::fleet`, the real agent and tunnel code (system-agents of simulated hosts by
//! default; `--kind node` for bare node-agent sessions that only beat), all dialling at once
//! from a cold start. Reports the time until all are connected, the hub's memory per agent (its
//! resident memory with the fleet less before it), its CPU while the fleet only beats, the time
//! from writing a new plan for every host (through the API, in `PlanList`s, 32 requests at a
//! time) until every host has applied it, and, after the hub is killed and started again on
//! the same port and data, the time until every agent is back. Before all that, alone on the
//! machine, the same numbers for the floor ([`crate::floor`]): N bare TLS + WebSocket
//! connections on a minimal server, each pinging once per beat interval; `vs_floor` is each of
//! the hub's figures over the floor's. The floor's idle CPU is read again at the end, alone
//! once more, and the hub's is set against the mean of both readings.
//!
//! Each process needs a file descriptor per agent: the fleet raises its soft limit to the hard
//! one, which must exceed N (plus some).

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tunnel::Connector;

use crate::{
    health_scenario::{cpu_seconds, cpu_seconds_in, prepare, round, start_hub_on},
    hub_scenario::rss_mib,
    proxy_scenario::Target,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Agents (tunnel sessions) to connect.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Seconds of quiet (heartbeats only) over which the hub's CPU is read.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    /// `system`: system-agents of simulated hosts (plans fan out to them); `node`: bare
    /// node-agent sessions that only beat (no plan fan-out).
    #[arg(long, default_value = "system")]
    kind: String,
    /// The fanned-out plan asks for nothing (instead of running `true`): the simulated hosts
    /// share the bench's CPUs, and a process started per host is theirs to pay, not the hub's.
    #[arg(long)]
    fanout_without_process: bool,
    /// Plans per request in the fan-out: `PlanList`s of that many (each list one transaction),
    /// as an operator writing a plan for thousands of hosts would; 1 posts each plan alone.
    #[arg(long, default_value_t = 500)]
    plan_list: usize,
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
    anyhow::ensure!(
        matches!(args.kind.as_str(), "system" | "node"),
        "--kind is system or node"
    );
    let data = std::env::temp_dir().join(format!("drover-bench-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let open_files = sim::fleet::raise_open_files_limit();
    // The floor first, alone on the machine: N bare TLS + WebSocket connections.
    let floor = floor_run(&data.join("floor"), n, args.idle_seconds).await?;
    let prepared = prepare(&data.join("hub")).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (hub, url) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let pid = hub.id().context("hub pid")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_mib(pid).unwrap_or(0.0);

    let stop = CancellationToken::new();
    let mut cold = Instant::now();
    let mut register_s = None;
    let connect_cpu;
    // Counts sessions up now: the fleet's own for system-agents, per session for node-agents.
    let (fleet, node_connected) = if args.kind == "system" {
        let shm = PathBuf::from("/dev/shm");
        let hosts = if shm.is_dir() { shm } else { data.clone() };
        let config = sim::fleet::FleetConfig {
            hub: url.clone(),
            ca_checksum: prepared.ca_checksum.clone(),
            token: prepared.custom_registration.clone(),
            agents: n,
            kind: sim::fleet::FleetKind::System,
            prefix: "bench".into(),
            dir: hosts.join(format!("drover-bench-fleet-{}", std::process::id())),
            concurrency: 200,
        };
        // First the fleet registers (every host once), then it is stopped and started again,
        // as after a power cut: the cold start of a registered fleet is what `connect_s` is.
        let first = CancellationToken::new();
        let registering = sim::fleet::start(config.clone(), first.clone()).await?;
        until(|| registering.connected() >= n, Duration::from_secs(900)).await;
        register_s = Some(round(cold.elapsed().as_secs_f64(), 2));
        first.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(60), registering.wait()).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        cold = Instant::now();
        connect_cpu = cpu_at_start(pid)?;
        (Some(sim::fleet::start(config, stop.clone()).await?), None)
    } else {
        connect_cpu = cpu_at_start(pid)?;
        (None, Some(node_agents(&prepared, &url, n, &stop)?))
    };
    let connected = |fleet: &Option<sim::fleet::Fleet>| match (fleet, &node_connected) {
        (Some(fleet), _) => fleet.connected(),
        (None, Some(count)) => count.load(Ordering::Relaxed),
        (None, None) => 0,
    };
    let connect = until(|| connected(&fleet) >= n, Duration::from_secs(600)).await;
    let connect_s = connect.map(|_| round(cold.elapsed().as_secs_f64(), 2));
    let (connect_hub_cpu_s, connect_clients_cpu_s) = cpu_since(pid, connect_cpu)?;

    // Quiet: the fleet only beats (every 10 s each).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(args.idle_seconds.max(1));
    let cpu_start = cpu_seconds(pid)?;
    tokio::time::sleep(window).await;
    let idle_cpu = (cpu_seconds(pid)? - cpu_start) / window.as_secs_f64();
    let rss_after = rss_mib(pid).unwrap_or(0.0);
    let connected_then = connected(&fleet);

    // A new plan for every host, through the API; done when every host has applied it.
    let mut fanout_cpu = None;
    let (plan_write_s, plan_fanout_s, fanout_cpu_ms, fanout_writes, hosts_work_s) = match &fleet {
        Some(fleet) => {
            let api = Target {
                addr,
                token: prepared.api_token.clone(),
            };
            let revision_before = store_revision(&api).await?;
            let cpu_start = cpu_at_start(pid)?;
            let (write, fanout, writers_cpu) =
                fan_out(fleet, &api, args.fanout_without_process, args.plan_list).await?;
            let (hub_cpu, bench_cpu) = cpu_since(pid, cpu_start)?;
            // The hub's CPU per host: steadier than the time on a shared, noisy machine.
            let per_host = hub_cpu * 1000.0 / n as f64;
            // What else drew on the same cores: the API clients (the writers' thread) and the
            // simulated hosts' agents (the rest of this process).
            fanout_cpu = Some(json!({
                "hub_s": hub_cpu,
                "writers_s": round(writers_cpu, 2),
                "agents_s": round(bench_cpu - writers_cpu, 2),
            }));
            // The store's writes per host (each a revision, one transaction: a `PlanList`'s
            // plans are one): the plans', and the reports' acknowledged after the host applied
            // it, so read once they have settled.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let writes = (store_revision(&api).await? - revision_before) as f64 / n as f64;
            // What the plan asks of the hosts, alone: as many `true` processes started from
            // this process (its open files and memory are the fleet's, which an exec pays
            // for), 200 at a time. Simulated hosts share this machine's cores; real ones would
            // each pay their own.
            let hosts_work = if args.fanout_without_process {
                None
            } else {
                Some(round(run_true(n).await?, 2))
            };
            (
                Some(round(write, 2)),
                Some(round(fanout, 2)),
                Some(round(per_host, 3)),
                Some(round(writes, 2)),
                hosts_work,
            )
        }
        None => (None, None, None, None, None),
    };

    // The hub dies and comes back on the same address: every agent reconnects by itself.
    drop(hub);
    let gone = Instant::now();
    while connected(&fleet) > 0 && gone.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarted = Instant::now();
    let (hub, _) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let reconnect = until(|| connected(&fleet) >= n, Duration::from_secs(600)).await;
    let reconnect_s = reconnect.map(|_| round(restarted.elapsed().as_secs_f64(), 2));
    // The restarted hub's memory with the same fleet, registered already (so without what
    // registering them left behind).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_restarted = hub.id().and_then(rss_mib).unwrap_or(0.0);
    let connected_end = connected(&fleet);
    stop.cancel();
    drop(hub);
    if let Some(fleet) = fleet {
        let _ = tokio::time::timeout(Duration::from_secs(30), fleet.wait()).await;
    }
    // The floor once more, alone again: its idle CPU moved between 2 and 4 % from one run to
    // the next (how its pings bunch decides how many each wakeup answers), so the hub's is set
    // against both readings' mean, and each is shown.
    let floor_after = floor_run(&data.join("floor-after"), n, args.idle_seconds).await?;
    let floor_idle = (floor.idle_cpu + floor_after.idle_cpu) / 2.0;
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(format!(
        "/dev/shm/drover-bench-fleet-{}",
        std::process::id()
    ));
    let ratio = |hub: Option<f64>, floor: Option<f64>| match (hub, floor) {
        (Some(h), Some(f)) if f > 0.0 => Some(round(h / f, 2)),
        _ => None,
    };
    let rss_per_agent_kib = round((rss_after - rss_before) * 1024.0 / n as f64, 1);
    let vs_floor = json!({
        "connect": ratio(connect_s, floor.connect_s),
        "rss_per_agent": ratio(Some(rss_per_agent_kib), Some(floor.rss_per_conn_kib)),
        "cpu_idle": ratio(Some(idle_cpu), Some(floor_idle)),
        "cpu_idle_each": [
            ratio(Some(idle_cpu), Some(floor.idle_cpu)),
            ratio(Some(idle_cpu), Some(floor_after.idle_cpu)),
        ],
    });
    Ok(json!({
        "scenario": "fleet",
        "floor": {
            "what": "bare TLS + WebSocket connections on a minimal server (tokio, rustls, tungstenite; its own process), a ping per connection per beat interval",
            "connected": floor.connected,
            "connect_s": floor.connect_s,
            "connect_server_cpu_s": floor.connect_server_cpu_s,
            "connect_clients_cpu_s": floor.connect_clients_cpu_s,
            "rss_per_conn_kib": floor.rss_per_conn_kib,
            "cpu_pct_idle": round(floor_idle * 100.0, 2),
            "cpu_pct_idle_before_after": [
                round(floor.idle_cpu * 100.0, 2),
                round(floor_after.idle_cpu * 100.0, 2),
            ],
        },
        "vs_floor": vs_floor,
        "kind": args.kind,
        "agents": n,
        "connected": connected_then,
        "connected_after_restart": connected_end,
        "register_s": register_s,
        "connect_s": connect_s,
        "connect_hub_cpu_s": connect_hub_cpu_s,
        "connect_clients_cpu_s": connect_clients_cpu_s,
        "hub_rss_mib_before": rss_before,
        "hub_rss_mib": rss_after,
        "rss_per_agent_kib": rss_per_agent_kib,
        // The restarted hub never saw the registrations: its memory is the fleet's alone.
        "rss_per_agent_kib_after_restart": round((rss_restarted - rss_before) * 1024.0 / n as f64, 1),
        "hub_cpu_pct_idle": round(idle_cpu * 100.0, 2),
        "idle_seconds": window.as_secs(),
        "plan_write_s": plan_write_s,
        "plan_fanout_s": plan_fanout_s,
        "plan_fanout_per_request": args.plan_list.max(1),
        "plan_fanout_hub_cpu_ms_per_host": fanout_cpu_ms,
        "plan_fanout_cpu": fanout_cpu,
        "plan_fanout_store_writes_per_host": fanout_writes,
        "plan_hosts_work_alone_s": hosts_work_s,
        "reconnect_s": reconnect_s,
        "hub_rss_mib_after_restart": rss_restarted,
        "heartbeat_seconds": 10,
        "open_files_limit": open_files,
    }))
}

/// What the floor measured.
struct FloorFigures {
    connected: usize,
    connect_s: Option<f64>,
    connect_server_cpu_s: f64,
    connect_clients_cpu_s: f64,
    rss_per_conn_kib: f64,
    idle_cpu: f64,
}

/// The floor's run: `n` connections from a cold start (200 handshakes at once, as the fleet's
/// agents), its memory per connection and its CPU over `idle_seconds` of pings.
async fn floor_run(
    dir: &std::path::Path,
    n: usize,
    idle_seconds: u64,
) -> anyhow::Result<FloorFigures> {
    let floor = crate::floor::Floor::start(dir).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_mib(floor.pid).unwrap_or(0.0);
    let stop = CancellationToken::new();
    let connect_cpu = cpu_at_start(floor.pid)?;
    let started = Instant::now();
    let connected = floor.connect(n, 200, Duration::from_secs(10), &stop);
    let connect = until(
        || connected.load(Ordering::Relaxed) >= n,
        Duration::from_secs(600),
    )
    .await;
    let connect_s = connect.map(|_| round(started.elapsed().as_secs_f64(), 2));
    let (connect_server_cpu_s, connect_clients_cpu_s) = cpu_since(floor.pid, connect_cpu)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(idle_seconds.max(1));
    let cpu_start = cpu_seconds(floor.pid)?;
    tokio::time::sleep(window).await;
    let idle_cpu = (cpu_seconds(floor.pid)? - cpu_start) / window.as_secs_f64();
    let rss_after = rss_mib(floor.pid).unwrap_or(0.0);
    let figures = FloorFigures {
        connected: connected.load(Ordering::Relaxed),
        connect_s,
        connect_server_cpu_s,
        connect_clients_cpu_s,
        rss_per_conn_kib: round((rss_after - rss_before) * 1024.0 / n as f64, 1),
        idle_cpu,
    };
    stop.cancel();
    floor.stop().await;
    // The clients' sockets close with the server; give the kernel a moment to let them go.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(figures)
}

/// The CPU seconds of the server `pid` and of this process (the clients) so far.
fn cpu_at_start(pid: u32) -> anyhow::Result<(f64, f64)> {
    Ok((cpu_seconds(pid)?, cpu_seconds(std::process::id())?))
}

/// The CPU the server `pid` and this process (the clients) spent since `start`: where a
/// connect's time went, since both share the machine's cores.
fn cpu_since(pid: u32, start: (f64, f64)) -> anyhow::Result<(f64, f64)> {
    let (server, clients) = cpu_at_start(pid)?;
    Ok((round(server - start.0, 2), round(clients - start.1, 2)))
}

/// Waits until `done`; the time it took, or `None` after `limit`.
async fn until(done: impl Fn() -> bool, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(started.elapsed())
}

/// N bare node-agent sessions, each beating as an idle agent does; the count of those up.
fn node_agents(
    prepared: &crate::health_scenario::Prepared,
    url: &str,
    n: usize,
    stop: &CancellationToken,
) -> anyhow::Result<Arc<AtomicUsize>> {
    let connected = Arc::new(AtomicUsize::new(0));
    for i in 0..n {
        let connector = Connector::new(prepared.node_agent(url, i))?;
        let (tx, mut sessions) = mpsc::channel(1);
        tokio::spawn(connector.run(tx, stop.clone()));
        let connected = connected.clone();
        tokio::spawn(async move {
            while let Some(session) = sessions.recv().await {
                connected.fetch_add(1, Ordering::Relaxed);
                agentkit::beat(&session, None).await;
                connected.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }
    Ok(connected)
}

/// Seconds to run `true` `n` times, 200 at once, from this process.
async fn run_true(n: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let runs = futures::stream::iter(0..n).map(|_| async {
        let status = tokio::process::Command::new("true").status().await?;
        anyhow::ensure!(status.success(), "true failed: {status}");
        anyhow::Ok(())
    });
    let mut runs = runs.buffer_unordered(200);
    while let Some(run) = runs.next().await {
        run?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The hub store's revision (a list's resourceVersion; clusters are few).
async fn store_revision(api: &Target) -> anyhow::Result<u64> {
    let list = api.call("GET", "/v1/clusters", None, 200).await?;
    list.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|rv| rv.parse().ok())
        .context("a list without a resourceVersion")
}

/// Writes one plan for every host of `fleet` through the API (`per_request` to a request, 32
/// writers, each on a connection of its own) and waits until every host has applied it:
/// seconds to write them all, and from the first write until the last host applied its plan.
async fn fan_out(
    fleet: &sim::fleet::Fleet,
    api: &Target,
    without_process: bool,
    per_request: usize,
) -> anyhow::Result<(f64, f64, f64)> {
    let plan = if without_process {
        json!({"maxFailures": 1})
    } else {
        json!({"instructions": [{"name": "noop", "command": "true"}]})
    };
    let target = proto::plan::v1::checksum(&serde_json::from_value(plan.clone())?);
    let hosts: Vec<(String, Arc<system_agent::record::Record>)> = fleet
        .system_agents()
        .map(|(host, agent)| Ok((host.to_owned(), agent.record.clone().context("a record")?)))
        .collect::<anyhow::Result<_>>()?;
    // For a profiler attached to the hub for this phase only (RUST_LOG=info).
    tracing::info!("fleet: writing a plan for every host");
    let started = Instant::now();
    let bodies: Vec<Value> = hosts
        .iter()
        .map(|(host, _)| {
            json!({"metadata": {"name": host},
                   "spec": {"host": host, "cluster": "edge", "plan": plan}})
        })
        .collect();
    let api = api.clone();
    // The writers run on a thread of their own, so that their CPU (what API clients pay, on
    // their own machines in real life) can be told from the simulated hosts'.
    let (done, written) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let cpu_start = thread_cpu_seconds()?;
            runtime.block_on(write_all(&api, bodies, per_request))?;
            Ok(thread_cpu_seconds()? - cpu_start)
        })();
        let _ = done.send(result);
    });
    let writers_cpu: anyhow::Result<f64> = written.await.context("the writers' thread")?;
    let writers_cpu = writers_cpu?;
    let write_s = started.elapsed().as_secs_f64();
    let applied = until(
        || {
            hosts
                .iter()
                .all(|(_, record)| record.status().applied_checksum == target)
        },
        Duration::from_secs(600),
    )
    .await;
    anyhow::ensure!(
        applied.is_some(),
        "not every host applied the plan within 600 s"
    );
    Ok((write_s, started.elapsed().as_secs_f64(), writers_cpu))
}

/// POSTs every body in `bodies` to `/v1/plans`, alone (`per_request` 1) or in `PlanList`s of
/// `per_request`, 32 requests at a time, each writer on a connection it keeps, as an HTTP
/// client does (a TLS handshake per request would be most of what is measured, on both ends).
async fn write_all(api: &Target, bodies: Vec<Value>, per_request: usize) -> anyhow::Result<()> {
    let requests: Vec<Value> = if per_request <= 1 {
        bodies
    } else {
        bodies
            .chunks(per_request)
            .map(|items| json!({"kind": "PlanList", "items": items}))
            .collect()
    };
    let next = AtomicUsize::new(0);
    let writers = (0..32).map(|_| async {
        let mut connection = api.connect().await?;
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(body) = requests.get(i) else {
                return anyhow::Ok(());
            };
            api.call_on(
                &mut connection,
                "POST",
                "/v1/plans",
                Some(body.clone()),
                201,
            )
            .await?;
        }
    });
    for written in futures::future::join_all(writers).await {
        written?;
    }
    Ok(())
}

/// The CPU seconds the calling thread has spent.
fn thread_cpu_seconds() -> anyhow::Result<f64> {
    cpu_seconds_in("/proc/thread-self/stat")
}
