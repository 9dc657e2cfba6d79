//! `bench explorer`: the cluster explorer against kubectl doing the same, in one run. A hub
//! with an imported (simulated) cluster of N pods (30,000 by default) and its real
//! cluster-agent, each on a runtime of its own in this process (the hub's CPU is its threads'
//! alone, as in `bench proxy`), and a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`) logged in to the dashboard:
//!
//! 1. **The pods list, first page** (all namespaces, 100 rows): over `views` page views, the
//!    page frame's time to first byte, the Table request's time to first byte and to its
//!    end, and the time until the rows are drawn (a User Timing mark the page sets), from
//!    navigation start; the hub's CPU per page view. Against `kubectl get pods -A
//!    --chunk-size=100` through the hub and straight to the API server: time to its first row
//!    and to its end (every page of the list).
//! 2. **A followed log**: the delay from the moment the (simulated) container writes a line
//!    (its timestamp) to the moment the page has it, against `kubectl logs -f --timestamps`
//!    through the hub.
//! 3. **A shell**: a keystroke's round trip to its echo on the exec WebSocket the page opens
//!    through the hub (with a terminal), and a command line's round trip without one, against
//!    `kubectl exec -i … -- sh` through the hub.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::Context;
use serde_json::{Value, json};
use tests::browser::{Browser, Driver};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::Command,
};

use crate::{
    health_scenario::round,
    proxy_scenario::{Setup, Target, part_cpu, setup},
};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Pods in the simulated cluster.
    #[arg(long, default_value_t = 30_000)]
    pods: usize,
    /// Page views of the pods list measured (after two to warm up).
    #[arg(long, default_value_t = 20)]
    views: usize,
    /// Seconds a followed log is watched.
    #[arg(long, default_value_t = 5)]
    log_seconds: u64,
    /// Round trips measured in each shell.
    #[arg(long, default_value_t = 50)]
    round_trips: usize,
}

const LOG_POD: (&str, &str) = ("load-0", "pod-0");

/// Median, 90th percentile and max of some milliseconds, rounded to 0.1 ms.
pub(crate) fn spread(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return Value::Null;
    }
    let at = |p: f64| ms[((p / 100.0) * (ms.len() - 1) as f64).round() as usize];
    json!({"median": round(at(50.0), 1), "p90": round(at(90.0), 1), "max": round(at(100.0), 1), "n": ms.len()})
}

/// A kubeconfig for `server` with `token` (loopback, certificates made for this run: not
/// checked, as `bench proxy` does not check them either).
pub(crate) fn kubeconfig(
    dir: &Path,
    name: &str,
    server: &str,
    token: &str,
) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )?;
    Ok(path)
}

fn kubectl(config: &Path) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// `kubectl get pods -A --chunk-size=N`: ms to its first row, and to its end. kubectl prints
/// nothing before it has read every chunk, and its REST client keeps to client-go's default
/// rate (5 requests/s after a burst of 10), so chunked lists of 30,000 pods wait on kubectl.
async fn kubectl_list(config: &Path, chunk: usize) -> anyhow::Result<(f64, f64)> {
    let started = std::time::Instant::now();
    let mut child = kubectl(config)
        .args(["get", "pods", "-A", "--no-headers"])
        .arg(format!("--chunk-size={chunk}"))
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    lines.next_line().await?.context("kubectl printed no row")?;
    let first = started.elapsed();
    while lines.next_line().await?.is_some() {}
    anyhow::ensure!(child.wait().await?.success(), "kubectl get pods failed");
    Ok((ms(first), ms(started.elapsed())))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A log line's delay, ms: now less the timestamp kubectl or the page shows before it
/// (RFC 3339 with nanoseconds, as the kubelet writes it).
fn line_delay(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let at =
        time::OffsetDateTime::parse(stamp, &time::format_description::well_known::Rfc3339).ok()?;
    Some((time::OffsetDateTime::now_utc() - at).as_seconds_f64() * 1e3)
}

/// `kubectl logs -f --timestamps` through the hub for `seconds`: each new line's delay.
async fn kubectl_log_delays(config: &Path, seconds: u64) -> anyhow::Result<Vec<f64>> {
    let mut child = kubectl(config)
        .args([
            "logs",
            "-f",
            "--timestamps",
            "--tail=1",
            "-n",
            LOG_POD.0,
            LOG_POD.1,
        ])
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    // The first line is the tail, written before the request: not a new line.
    lines.next_line().await?;
    let mut delays = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while let Ok(Ok(Some(line))) = tokio::time::timeout_at(deadline, lines.next_line()).await {
        delays.extend(line_delay(&line));
    }
    child.kill().await?;
    Ok(delays)
}

/// `kubectl exec -i … -- sh` through the hub: each `echo` line's round trip to its output.
pub(crate) async fn kubectl_exec_round_trips(
    config: &Path,
    n: usize,
    spdy: bool,
) -> anyhow::Result<Vec<f64>> {
    let mut command = kubectl(config);
    if spdy {
        // kubectl 1.32 speaks SPDY/3.1, as kubectls before 1.31 do, when told to.
        command.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
    }
    let mut child = command
        .args(["exec", "-i", "-n", LOG_POD.0, LOG_POD.1, "--", "sh"])
        .stdin(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let started = std::time::Instant::now();
        stdin.write_all(format!("echo k{i}\n").as_bytes()).await?;
        stdin.flush().await?;
        let line = lines.next_line().await?.context("the shell ended")?;
        anyhow::ensure!(line == format!("k{i}"), "the shell answered {line:?}");
        times.push(ms(started.elapsed()));
    }
    drop(stdin);
    let _ = child.wait().await;
    Ok(times)
}

/// Runs `script` in the page (it sets `window.benchResult` when done) and waits for it.
async fn in_page(browser: &Browser<'_>, script: &str, args: Value) -> anyhow::Result<Value> {
    browser
        .run(
            &format!("window.benchResult = undefined; {script}; return true;"),
            args,
        )
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let result = browser.run("return window.benchResult;", json!([])).await;
        if !result.is_null() {
            if let Some(error) = result.get("error") {
                anyhow::bail!("in the page: {error}");
            }
            return Ok(result);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the page did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Round trips on an exec WebSocket the page opens through the hub, as the shell page does:
/// with a terminal, one keystroke and its echo; without, one `echo` line and its output.
const SHELL_ROUND_TRIPS: &str = r##"
(async ([namespace, pod, tty, n]) => {
  const query = new URLSearchParams({ container: "main", stdin: "true", stdout: "true", tty: String(tty), command: "sh" });
  const socket = new WebSocket(`wss://${location.host}/k8s/clusters/prod/api/v1/namespaces/${namespace}/pods/${pod}/exec?${query}`, ["v5.channel.k8s.io"]);
  socket.binaryType = "arraybuffer";
  await new Promise((resolve, reject) => { socket.onopen = resolve; socket.onerror = () => reject(new Error("no WebSocket")); });
  const decoder = new TextDecoder(), encoder = new TextEncoder();
  let output = "", waiting = null;
  socket.onmessage = (m) => {
    const bytes = new Uint8Array(m.data);
    if (bytes[0] !== 1) return;
    output += decoder.decode(bytes.subarray(1));
    if (waiting && output.includes(waiting.want)) { const w = waiting; waiting = null; output = ""; w.done(); }
  };
  if (tty) await new Promise((done) => { waiting = { want: "/ # ", done }; });
  const times = [];
  for (let i = 0; i < n; i++) {
    const [send, want] = tty ? ["x", "x"] : [`echo k${i}\n`, `k${i}\n`];
    const started = performance.now();
    await new Promise((done) => {
      waiting = { want, done };
      const bytes = encoder.encode(send);
      const message = new Uint8Array(bytes.length + 1);
      message.set(bytes, 1);
      socket.send(message);
    });
    times.push(performance.now() - started);
  }
  socket.close();
  window.benchResult = times;
})(arguments).catch((e) => { window.benchResult = { error: String(e) }; })
"##;

/// The page's delay for each new line of the followed log: a line is timed when it is added
/// to the page (a MutationObserver), against its timestamp.
const LOG_DELAYS: &str = r##"
const [seconds] = arguments;
const log = document.getElementById("log");
const delays = [];
let first = true;
new MutationObserver((changes) => {
  const now = Date.now();
  for (const change of changes) for (const node of change.addedNodes) {
    for (const line of node.textContent.split("\n")) {
      const stamp = line.split(" ")[0];
      if (!stamp.endsWith("Z")) continue;
      // The tail line was written before the request: not a new line.
      if (first) { first = false; continue; }
      delays.push(now - Date.parse(stamp.slice(0, 23) + "Z"));
    }
  }
}).observe(log, { childList: true });
document.getElementById("timestamps").checked = true;
document.getElementById("follow").checked = true;
document.getElementById("tail").value = "1";
document.querySelector("#log-options button[type=submit]").click();
setTimeout(() => { window.benchResult = delays; }, seconds * 1000);
"##;

/// What one view of the pods list took, from the page's own timings.
/// The same reads from both sources, timed in the page (`fetch`, to the whole body parsed): a
/// first page of 100 rows as a Table, a page sorted by a column (the cache sorts; through the
/// proxy that is every row read, 500 at a time, then ordered), alternating, n times each.
const SOURCES: &str = r##"
const [n] = arguments;
const TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json";
const read = async (url) => {
  const r = await fetch(url, { headers: { Accept: TABLE }, cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return r.json();
};
const readJson = async (url) => {
  const r = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return r.json();
};
const timed = async (f) => { const t = performance.now(); await f(); return performance.now() - t; };
const out = { cache_page: [], proxy_page: [], cache_sorted_page: [], proxy_sorted_page: [], overview: [], every_pod: [] };
(async () => {
  // The cluster dashboard's one request, beside what summing it in the page would read first:
  // every pod, from the cache.
  for (let i = 0; i < n; i += 1) {
    out.overview.push(await timed(() => readJson("/v1/clusters/prod/overview")));
  }
  for (let i = 0; i < Math.min(n, 3); i += 1) {
    out.every_pod.push(await timed(() => readJson("/v1/clusters/prod/cache/pods")));
  }
  for (let i = 0; i < n; i += 1) {
    out.cache_page.push(await timed(() => read("/v1/clusters/prod/cache/pods?limit=100")));
    out.proxy_page.push(await timed(() => read("/k8s/clusters/prod/api/v1/pods?limit=100")));
  }
  // Apart from the pages: reading 30,000 rows leaves the page's garbage collector work that
  // would land on whichever request came next.
  for (let i = 0; i < n; i += 1) {
    out.cache_sorted_page.push(await timed(() => read("/v1/clusters/prod/cache/pods?limit=100&sort=-Name")));
    out.proxy_sorted_page.push(await timed(async () => {
      const rows = [];
      let token = null;
      do {
        const page = await read(`/k8s/clusters/prod/api/v1/pods?limit=500${token ? `&continue=${encodeURIComponent(token)}` : ""}`);
        rows.push(...page.rows);
        token = page.metadata.continue;
      } while (token);
      rows.sort((a, b) => b.object.metadata.name.localeCompare(a.object.metadata.name, undefined, { numeric: true }));
      rows.length = 100;
    }));
  }
  window.benchResult = out;
})().catch((e) => { window.benchResult = { error: String(e) }; });
"##;

const VIEW_TIMINGS: &str = r##"
const nav = performance.getEntriesByType("navigation")[0];
const table = performance.getEntriesByType("resource").find((e) => e.name.includes("/cache/pods?limit=100") || e.name.includes("/api/v1/pods?limit=100"));
const drawn = performance.getEntriesByName("drover:list-drawn")[0];
return {
  frame_ttfb: nav.responseStart - nav.startTime,
  table_ttfb: table ? table.responseStart - table.startTime : null,
  table_done: table ? table.responseEnd - table.startTime : null,
  drawn: drawn ? drawn.startTime : null,
};
"##;

async fn wait_for(browser: &Browser<'_>, script: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while browser.run(script, json!([])).await != Value::Bool(true) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the page did not settle: {script}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn numbers(values: &Value) -> Vec<f64> {
    values
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let setup = setup(args.pods).await?;
    let measured = measure(&setup, &args).await;
    setup.shutdown.cancel();
    let _ = std::fs::remove_dir_all(&setup.data_dir);
    // Dropping a runtime inside this async context would panic (and hide `measured`'s error).
    for runtime in setup.runtimes {
        runtime.shutdown_background();
    }
    measured
}

async fn measure(setup: &Setup, args: &Args) -> anyhow::Result<Value> {
    let dir = setup.data_dir.join("explorer");
    std::fs::create_dir_all(&dir)?;
    let base = format!("https://{}", setup.hub.addr);
    let through_hub = kubeconfig(
        &dir,
        "hub",
        &format!("{base}/k8s/clusters/prod"),
        &setup.hub.token,
    )?;
    let Target { addr, token } = &setup.direct;
    let direct = kubeconfig(&dir, "direct", &format!("https://{addr}"), token.as_str())?;

    let driver = Driver::start(&dir).await;
    let browser = driver.browser("bench", 1280, 900).await;
    browser
        .goto(&format!("{base}/login?next=/clusters/prod/explorer"))
        .await;
    browser.type_into("#username", "admin").await;
    browser.type_into("#password", &setup.admin_password).await;
    browser.click("form#login button[type=submit]").await;
    wait_for(&browser, "return document.querySelector('span.count[data-resource=\"pods\"]') !== null && /^\\d+$/.test(document.querySelector('span.count[data-resource=\"pods\"]').textContent);").await?;

    // 1. The pods list's first page: page views, then kubectl.
    let list = format!("{base}/clusters/prod/explorer/pods");
    let drawn = "const l = document.getElementById('list'); return l !== null && l.dataset.shown !== undefined;";
    for _ in 0..2 {
        browser.goto(&list).await;
        wait_for(&browser, drawn).await?;
    }
    let (mut frame, mut table_ttfb, mut table_done, mut rows) = (vec![], vec![], vec![], vec![]);
    let cpu_before = part_cpu(Some("hub"));
    for _ in 0..args.views {
        browser.goto(&list).await;
        wait_for(&browser, drawn).await?;
        let t = browser.run(VIEW_TIMINGS, json!([])).await;
        frame.extend(t["frame_ttfb"].as_f64());
        table_ttfb.extend(t["table_ttfb"].as_f64());
        table_done.extend(t["table_done"].as_f64());
        rows.extend(t["drawn"].as_f64());
    }
    let hub_cpu_ms =
        ms(part_cpu(Some("hub")).saturating_sub(cpu_before)) / args.views.max(1) as f64;
    // A sort of the whole list by name (the cache sorts it; the page shows the first page), twice.
    let mut sorts = Vec::new();
    for _ in 0..2 {
        browser.goto(&list).await;
        wait_for(&browser, drawn).await?;
        browser.click("button.sort[data-sort='0']").await;
        wait_for(
            &browser,
            "return document.getElementById('list-status').textContent.includes(' rows sorted by ');",
        )
        .await?;
        let status = browser.text("#list-status").await;
        sorts.extend(
            status
                .split(" in ")
                .nth(1)
                .and_then(|rest| rest.split(" ms").next())
                .and_then(|n| n.parse::<f64>().ok()),
        );
    }
    let sources = in_page(&browser, SOURCES, json!([args.views])).await?;
    let source = |name: &str| spread(numbers(&sources[name]));
    tracing::info!("page views measured; kubectl lists");
    // kubectl's default chunks (500), and the whole list in one request.
    let mut kubectl_lists = serde_json::Map::new();
    for (name, config) in [("through_hub", &through_hub), ("direct", &direct)] {
        for chunk in [500, 0] {
            let (mut first, mut all) = (vec![], vec![]);
            for _ in 0..2 {
                let (f, a) = kubectl_list(config, chunk).await?;
                first.push(f);
                all.push(a);
            }
            kubectl_lists.insert(
                format!("{name}_chunk_{chunk}"),
                json!({"first_row": spread(first), "all": spread(all)}),
            );
        }
    }
    tracing::info!("list measured; following a log");
    // 2. A followed log.
    browser
        .goto(&format!(
            "{base}/clusters/prod/explorer/pods/{}/{}/logs",
            LOG_POD.0, LOG_POD.1
        ))
        .await;
    wait_for(
        &browser,
        "return document.querySelectorAll('#container option').length > 0;",
    )
    .await?;
    let page_log = in_page(&browser, LOG_DELAYS, json!([args.log_seconds])).await?;
    let kubectl_log = kubectl_log_delays(&through_hub, args.log_seconds).await?;

    tracing::info!("log measured; shells");
    // 3. A shell.
    let keystrokes = in_page(
        &browser,
        SHELL_ROUND_TRIPS,
        json!([LOG_POD.0, LOG_POD.1, true, args.round_trips]),
    )
    .await?;
    let page_lines = in_page(
        &browser,
        SHELL_ROUND_TRIPS,
        json!([LOG_POD.0, LOG_POD.1, false, args.round_trips]),
    )
    .await?;
    let kubectl_lines = kubectl_exec_round_trips(&through_hub, args.round_trips, false).await?;
    browser.close().await;

    Ok(json!({
        "scenario": "explorer",
        "pods": args.pods,
        "pods_list_first_page_ms": {
            "what": "the explorer's pods list, all namespaces, first page of 100 rows, from navigation start (Chromium's timings)",
            "page_frame_ttfb": spread(frame),
            "table_request_ttfb": spread(table_ttfb),
            "table_request_done": spread(table_done),
            "rows_drawn": spread(rows),
            "views": args.views,
            "hub_cpu_ms_per_view": round(hub_cpu_ms, 2),
            "sort_all_by_name": spread(sorts),
        },
        "page_read_by_source_ms": {
            "what": "in the page, alternating the two sources: the first 100 pods as a Table from the cluster-agent's cache (what the explorer reads) and through the proxy from the API server; the first 100 sorted by name, descending, from the cache (sorted there) and through the proxy (every row read in chunks of 500, then ordered)",
            "cache_page": source("cache_page"),
            "proxy_page": source("proxy_page"),
            "cache_sorted_page": source("cache_sorted_page"),
            "proxy_sorted_page": source("proxy_sorted_page"),
        },
        "cluster_overview_ms": {
            "what": "in the page: the cluster dashboard's GET /v1/clusters/prod/overview (the cluster-agent sums every node, pod, deployment and event of its caches), and the baseline a dashboard summing in the page would start from: every pod read from the cache as JSON (at most 3 times)",
            "overview": source("overview"),
            "baseline_every_pod_read": source("every_pod"),
        },
        "kubectl_get_pods_all_namespaces_ms": {
            "what": "kubectl get pods -A --no-headers, with kubectl's default --chunk-size=500 and with 0 (one request): to its first row and to its end, 2 runs each; kubectl prints after the last chunk, and its client keeps to 5 requests/s after a burst of 10",
            "runs": kubectl_lists,
        },
        "log_line_delay_ms": {
            "what": "from the line's timestamp (the simulated container writes it) until the page has it / kubectl prints it, following through the hub",
            "page": spread(numbers(&page_log)),
            "kubectl_through_hub": spread(kubectl_log),
        },
        "shell_round_trip_ms": {
            "what": "exec through the hub: the page's WebSocket (terminal: a keystroke to its echo; no terminal: an echo line to its output) against kubectl exec -i (an echo line)",
            "page_keystroke_echo": spread(numbers(&keystrokes)),
            "page_line": spread(numbers(&page_lines)),
            "kubectl_line": spread(kubectl_lines),
        },
    }))
}
