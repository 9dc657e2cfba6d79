//! `bench pages --clusters N --hosts N`: the dashboard's fleet lists with N clusters and N
//! hosts registered. The release `drover-hub` runs as its own process; the bench creates the
//! clusters (imported, half labelled `env=prod`) and the hosts (of one custom cluster) through
//! the API in lists of 1,000, then asks, `--repeat` times each on one kept connection, for the
//! clusters page and the hosts page as a browser first opens them, a filtered view, a deep page
//! of a sorted selector view, and the API's first page (`limit=50`). The baseline, in the same
//! run on the same hub: the API's whole list of each kind, which is what every view reads from
//! the store before it cuts its page (and what the dashboard rendered row by row before the
//! lists were paged). Reports the median and 95th percentile of each, and its size.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{
    health_scenario::{prepare, round, start_hub_on},
    proxy_scenario::Target,
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Clusters registered.
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    /// Hosts registered.
    #[arg(long, default_value_t = 10_000)]
    hosts: usize,
    /// Times each view is asked for.
    #[arg(long, default_value_t = 20)]
    repeat: usize,
}

/// Creates `n` objects of `plural` made by `item`, 1,000 to a request.
async fn create(
    api: &Target,
    plural: &str,
    list_kind: &str,
    n: usize,
    item: impl Fn(usize) -> Value,
) -> anyhow::Result<()> {
    let mut from = 1;
    while from <= n {
        let to = (from + 999).min(n);
        let items: Vec<Value> = (from..=to).map(&item).collect();
        api.call(
            "POST",
            &format!("/v1/{plural}"),
            Some(json!({"kind": list_kind, "items": items})),
            201,
        )
        .await?;
        from = to + 1;
    }
    Ok(())
}

/// Asks for `path` `repeat` times on one connection: median and p95 in ms, and its size.
async fn timed(
    api: &Target,
    path: &str,
    repeat: usize,
    rows: Option<usize>,
) -> anyhow::Result<Value> {
    let mut sender = api.connect().await?;
    let mut times = Vec::with_capacity(repeat);
    let mut bytes = 0;
    for _ in 0..repeat.max(1) {
        let started = Instant::now();
        let (status, body) = api.send(&mut sender, "GET", path, None).await?;
        times.push(started.elapsed());
        anyhow::ensure!(status == 200, "GET {path}: HTTP {status}");
        bytes = body.len();
        if let Some(rows) = rows {
            let text = String::from_utf8_lossy(&body);
            let shown = text.matches("<tr data-name=").count();
            anyhow::ensure!(shown == rows, "GET {path}: {shown} rows, not {rows}");
        }
    }
    times.sort();
    let at = |q: f64| -> f64 {
        let i = ((times.len() as f64 - 1.0) * q).round() as usize;
        round(times[i].as_secs_f64() * 1000.0, 1)
    };
    Ok(json!({"median_ms": at(0.5), "p95_ms": at(0.95), "bytes": bytes}))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let dir = std::env::current_exe()?
        .parent()
        .context("no directory for the bench binary")?
        .to_owned();
    let exe = dir.join("drover-hub");
    anyhow::ensure!(
        exe.exists(),
        "drover-hub is missing next to bench: run `cargo build --release -p hub -p bench` first"
    );
    let data = std::env::temp_dir().join(format!("drover-bench-pages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    // An admin, an imported cluster `prod` and a custom cluster `edge` (paused).
    let prepared = prepare(&data.join("hub")).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (hub, _url) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let api = Target {
        addr,
        token: prepared.api_token.clone(),
    };

    let started = Instant::now();
    create(&api, "clusters", "ClusterList", args.clusters, |i| {
        let env = if i % 2 == 0 { "prod" } else { "dev" };
        json!({"metadata": {"name": format!("fleet-{i}"), "labels": {"env": env}},
               "spec": {"type": "imported"}})
    })
    .await?;
    let clusters_s = round(started.elapsed().as_secs_f64(), 2);
    let started = Instant::now();
    create(&api, "hosts", "HostList", args.hosts, |i| {
        json!({"metadata": {"name": format!("host-{i}")},
               "spec": {"cluster": "edge", "nodeName": format!("w{i}"), "roles": {"worker": true}}})
    })
    .await?;
    let hosts_s = round(started.elapsed().as_secs_f64(), 2);
    // Whatever the hub does on its own after the writes settles first.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let r = args.repeat;
    let page = |n: usize| Some(n.min(50));
    let clusters = args.clusters + 2;
    let report = json!({
        "clusters": clusters,
        "hosts": args.hosts,
        "created_s": {"clusters": clusters_s, "hosts": hosts_s},
        "clusters_page": {
            "first": timed(&api, "/clusters", r, page(clusters)).await?,
            "filtered": timed(&api, "/clusters?part=rows&q=fleet-9999", r, None).await?,
            "selector_by_age_page_50": timed(&api, "/clusters?part=rows&selector=env%3Dprod&sort=-age&page=50", r, None).await?,
        },
        "hosts_page": {
            "first": timed(&api, "/hosts", r, page(args.hosts)).await?,
            "filtered": timed(&api, "/hosts?part=rows&q=w9999", r, None).await?,
        },
        "api_first_page": timed(&api, "/v1/clusters?limit=50", r, None).await?,
        "baseline_api_whole_list": {
            "clusters": timed(&api, "/v1/clusters", r, None).await?,
            "hosts": timed(&api, "/v1/hosts", r, None).await?,
        },
    });
    drop(hub);
    let _ = std::fs::remove_dir_all(&data);
    Ok(report)
}
