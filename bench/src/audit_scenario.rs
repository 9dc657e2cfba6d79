//! Scenario `audit`: what the audit log costs the proxy, in one run. The proxy scenario's set-up
//! (simulated API server, hub, cluster-agent in this process) is made with the hub's audit log
//! on, then off, then on, then off (alternating, so drift hits both alike); each time 64
//! clients GET one pod through the hub for a while. Every one of those requests is a record
//! when the log is on.

use serde_json::{Value, json};

use crate::proxy_scenario::{POD, proxied, setup_with, threads_cpu, throughput};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    pub(crate) clients: usize,
    /// Seconds of load per round.
    #[arg(long, default_value_t = 5)]
    pub(crate) seconds: u64,
    /// Rounds per setting (each its own hub).
    #[arg(long, default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Pods in the simulated cluster.
    #[arg(long, default_value_t = 100)]
    pub(crate) pods: usize,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let mut rounds = Vec::new();
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..args.rounds.max(1) {
        for audit in [true, false] {
            let setup = setup_with(args.pods, audit).await?;
            // Warm the connections and the agent's pool before the load is timed.
            throughput(
                &setup.hub,
                &proxied(POD),
                args.clients,
                std::time::Duration::from_secs(1),
            )
            .await?;
            let writer_before = threads_cpu(|name| name == hub::audit::WRITER_THREAD);
            let (rps, cpu) = throughput(
                &setup.hub,
                &proxied(POD),
                args.clients,
                std::time::Duration::from_secs(args.seconds),
            )
            .await?;
            let writer =
                threads_cpu(|name| name == hub::audit::WRITER_THREAD).saturating_sub(writer_before);
            let requests = rps * args.seconds as f64;
            let log = setup.data_dir.join("hub").join("audit").join("audit.log");
            let records = std::fs::read_to_string(&log)
                .map(|t| t.lines().count())
                .unwrap_or(0);
            rounds.push(json!({
                "audit": audit,
                "requests_per_s": (rps * 10.0).round() / 10.0,
                "cpu_us_per_request": cpu.json(),
                "audit_writer_cpu_us_per_request": (writer.as_secs_f64() * 1e6 / requests.max(1.0) * 100.0).round() / 100.0,
                "records_in_log": records,
            }));
            if audit {
                on.push(rps)
            } else {
                off.push(rps)
            }
            setup.shutdown.cancel();
            let _ = std::fs::remove_dir_all(&setup.data_dir);
            for runtime in setup.runtimes {
                runtime.shutdown_background();
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    Ok(json!({
        "scenario": "audit",
        "what": "GET one pod through the hub's proxy, 64 clients on kept-alive connections, with the hub's audit log on and off (alternating hubs in one run); CPU per request by part (the audit writer's thread counted apart)",
        "clients": args.clients,
        "seconds_per_round": args.seconds,
        "rounds": rounds,
        "requests_per_s_audit_on": (mean(&on) * 10.0).round() / 10.0,
        "requests_per_s_audit_off": (mean(&off) * 10.0).round() / 10.0,
        "on_over_off": (mean(&on) / mean(&off).max(1.0) * 1000.0).round() / 1000.0,
    }))
}
