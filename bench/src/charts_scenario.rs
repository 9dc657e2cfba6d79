//! `bench charts`: a day of usage charts for N machines written as the hub writes them (every
//! machine's closed minute, flushed once a minute in one go), beside the same minutes kept in
//! memory as the hub kept them before (24 bytes a minute), in the same process. Reports the
//! memory each takes per machine, the flush's time per minute of N machines, the file's size
//! per machine and the time to read one machine's day.

use std::{collections::VecDeque, time::Instant};

use hub::health::{
    charts::{Charts, FILE},
    history::{Kept, Point},
};
use serde_json::{Value, json};

use crate::health_scenario::round;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Machines reporting usage.
    #[arg(long, default_value_t = 10_000)]
    machines: usize,
    /// Minutes of usage (1,440: a day, the charts' window).
    #[arg(long, default_value_t = 1_440)]
    minutes: u32,
}

fn rss_mib() -> f64 {
    crate::hub_scenario::rss_mib(std::process::id()).unwrap_or(0.0)
}

fn minute_of(machine: usize, minute: u32) -> Kept {
    Kept::of(&Point {
        minute,
        cpu_percent: ((machine + minute as usize) % 100) as f32,
        memory_used_bytes: (machine as u64 + 1) << 24,
        disk_used_bytes: 40 << 30,
        load1: 0.5,
        net_rx_rate: 1_000.0 + minute as f32,
        net_tx_rate: 500.0,
    })
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let n = args.machines.max(1);
    let minutes = args.minutes.max(1);
    let dir = std::env::temp_dir().join(format!("drover-bench-charts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let last = u32::try_from(now / 60)?;
    let first = last + 1 - minutes;
    let peers: Vec<String> = (0..n).map(|i| format!("host/bench-{i:05}")).collect();

    // On disk, as the hub keeps them now.
    let path = dir.join(FILE);
    let rss_before = rss_mib();
    let charts = Charts::open(&path).map_err(anyhow::Error::msg)?;
    let mut flushes = Vec::with_capacity(minutes as usize);
    for minute in first..=last {
        for (i, peer) in peers.iter().enumerate() {
            charts.keep(peer, minute_of(i, minute));
        }
        let started = Instant::now();
        charts.flush(u64::from(minute) * 60 + 59);
        flushes.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let rss_disk = rss_mib() - rss_before;
    let mut reads = Vec::new();
    for i in (0..n).step_by((n / 100).max(1)) {
        let started = Instant::now();
        let points = charts.points(&peers[i], now);
        reads.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            points.len() == minutes as usize,
            "{} points read back for {}, {minutes} written",
            points.len(),
            peers[i]
        );
    }
    drop(charts);
    let bytes: u64 = ["", "-wal"]
        .iter()
        .filter_map(|suffix| std::fs::metadata(format!("{}{suffix}", path.display())).ok())
        .map(|m| m.len())
        .sum();
    let _ = std::fs::remove_dir_all(&dir);

    // In memory, as the hub kept them before: a buffer per machine grown exactly to a day.
    let rss_before = rss_mib();
    let kept: Vec<VecDeque<Kept>> = (0..n)
        .map(|i| {
            let mut day = VecDeque::with_capacity(minutes as usize);
            day.extend((first..=last).map(|minute| minute_of(i, minute)));
            day
        })
        .collect();
    let rss_memory = rss_mib() - rss_before;
    let held: usize = kept.iter().map(VecDeque::len).sum();
    anyhow::ensure!(
        held == n * minutes as usize,
        "the in-memory baseline is short"
    );
    drop(kept);

    flushes.sort_by(f64::total_cmp);
    reads.sort_by(f64::total_cmp);
    let median = |v: &[f64]| v.get(v.len() / 2).copied().unwrap_or(0.0);
    let p99 = |v: &[f64]| v.get(v.len() * 99 / 100).copied().unwrap_or(0.0);
    let per_machine_kib = |mib: f64| round(mib * 1024.0 / n as f64, 2);
    Ok(json!({
        "scenario": "charts",
        "machines": n,
        "minutes": minutes,
        "memory_per_machine_kib": {
            "on_disk": per_machine_kib(rss_disk),
            "in_memory_before": per_machine_kib(rss_memory),
        },
        "file_per_machine_kib": round(bytes as f64 / 1024.0 / n as f64, 1),
        "flush_ms_per_minute": {
            "median": round(median(&flushes), 1),
            "p99": round(p99(&flushes), 1),
        },
        "read_day_ms": {
            "median": round(median(&reads), 2),
            "p99": round(p99(&reads), 2),
        },
    }))
}
