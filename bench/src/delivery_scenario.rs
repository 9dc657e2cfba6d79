//! `bench delivery --clusters N --bundles B`: continuous delivery to a fleet. The release
//! `drover-hub` runs as a process of its own (its CPU and memory read from `/proc`); N
//! simulated clusters, each with the real cluster-agent, all labelled `env=prod`, run in
//! processes of this binary (`bench delivery-clusters`), as many as the open-files limit
//! needs: one up to about 570 clusters here. A git repository (served by `git daemon` on loopback) holds B paths, each a
//! ConfigMap and a Deployment; one GitRepo targets `env=prod`, so N × B BundleDeployments.
//!
//! Two commits are timed: the first (the GitRepo created) and a change to every path (pushed,
//! then announced by the webhook). For each: the time until every cluster holds the commit's
//! objects (read from the clusters themselves), the time until the hub reports every cluster
//! ready, and the hub's CPU over it. Then the hub's memory and store bytes per
//! BundleDeployment (resident memory and the store's files, with the deployments less
//! before). The agents and simulated API servers share this machine's cores with the hub:
//! the times include their work, which a real fleet does on its own machines.
//!
//! Fleet's documentation sizes its controller for 50 applications on 500 clusters at 16 vCPU
//! and 64 GiB; the report carries that beside the figures.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::Context;
use serde_json::{Value, json};
use sim::cluster::{Identity, SimCluster, SimConfig};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio_util::sync::CancellationToken;

use crate::{
    health_scenario::{cpu_seconds, prepare, round, start_hub_on},
    hub_scenario::rss_mib,
    proxy_scenario::Target,
};

const AGENT_TOKEN: &str = "bench-agent-token";
const AGENT_NAMESPACE: &str = "drover-system";
const WEBHOOK_SECRET: &str = "bench webhook secret";
/// Open files one simulated cluster and its agent hold in this process (measured at 100
/// clusters: 3,300 in all).
const FILES_PER_CLUSTER: u64 = 33;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Simulated clusters, each with its own cluster-agent. Each holds about 33 open files
    /// (its API server's and its agent's connections): the clusters are spread over as many
    /// processes as the open-files limit needs.
    #[arg(long, default_value_t = 1000)]
    clusters: usize,
    /// Paths of the repository, each one bundle (a ConfigMap and a Deployment).
    #[arg(long, default_value_t = 50)]
    bundles: usize,
    /// Seconds allowed for each phase before the run gives up.
    #[arg(long, default_value_t = 1800)]
    limit_seconds: u64,
}

/// `bench delivery-clusters`: simulated clusters with their agents for `bench delivery`, in a
/// process of their own so that the open-files limit binds per share of the fleet. Reads
/// `NAME TOKEN` lines (the registration tokens, never on a command line) until an empty
/// line, starts them and answers `started`; then each `at VERSION BUNDLES` line with how
/// many of its clusters hold that version; stops at the end of its input.
#[derive(clap::Args, Debug)]
pub(crate) struct SharesArgs {
    #[arg(long)]
    hub: String,
    #[arg(long)]
    ca_checksum: String,
    /// The agents' state directories go below it.
    #[arg(long)]
    dir: PathBuf,
}

/// Runs git in `dir`; fails with its stderr.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.org",
        ])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .context("git must be installed")?;
    anyhow::ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Writes every path's manifests for `version`, commits and pushes; the commit.
fn commit(work: &Path, bundles: usize, version: &str) -> anyhow::Result<String> {
    for b in 0..bundles {
        let dir = work.join(format!("apps/app-{b}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("drover.yaml"), "defaultNamespace: apps\n")?;
        std::fs::write(
            dir.join("app.yaml"),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-{b}}}\ndata: {{version: \"{version}\"}}\n---\n\
                 apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: app-{b}}}\nspec:\n  replicas: 1\n  \
                 selector: {{matchLabels: {{app: app-{b}}}}}\n  template:\n    metadata: {{labels: {{app: app-{b}}}}}\n    \
                 spec:\n      containers:\n      - name: app\n        image: registry.example.org/app:{version}\n"
            ),
        )?;
    }
    git(work, &["add", "-A"])?;
    git(work, &["commit", "--quiet", "-m", version])?;
    git(work, &["push", "--quiet", "origin", "HEAD:refs/heads/main"])?;
    git(work, &["rev-parse", "HEAD"])
}

/// How many of `sims` hold every path's ConfigMap at `version`.
fn clusters_at(sims: &[SimCluster], bundles: usize, version: &str) -> usize {
    sims.iter()
        .filter(|sim| {
            let maps = sim.list("v1", "ConfigMap", "").unwrap_or_default();
            let at = maps
                .iter()
                .filter(|m| {
                    m["metadata"]["namespace"] == "apps"
                        && m["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("app-"))
                        && m["data"]["version"] == version
                })
                .count();
            at == bundles
        })
        .count()
}

/// The bytes of the hub's store on disk (the database and its write-ahead log).
fn store_bytes(data: &Path) -> u64 {
    ["state.db", "state.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(data.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Polls `done` every half second until it holds or `limit` passes; the time it took.
async fn until<F: Future<Output = bool>>(
    mut done: impl FnMut() -> F,
    limit: Duration,
) -> Option<f64> {
    let started = Instant::now();
    while !done().await {
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Some(round(started.elapsed().as_secs_f64(), 2))
}

/// A simulated cluster for cluster `name` and its cluster-agent, registering with
/// `registration`.
async fn cluster(
    name: &str,
    registration: &str,
    url: &str,
    ca_checksum: &str,
    dir: &Path,
    stop: &CancellationToken,
) -> anyhow::Result<SimCluster> {
    let sim = SimCluster::start(SimConfig::default(), stop.clone()).await?;
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: format!("system:serviceaccount:{AGENT_NAMESPACE}:drover-agent"),
            // The import manifest's RBAC is not what is measured: the agent is cluster-admin.
            groups: vec!["system:serviceaccounts".into(), "system:masters".into()],
        },
    );
    sim.apply_manifest(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {AGENT_NAMESPACE}}}\n"
    ))
    .map_err(anyhow::Error::msg)?;
    let config = cluster_agent::Config {
        hub: agentkit::HubSettings {
            server: url.to_owned(),
            token: tunnel::Secret::new(registration.to_owned()),
            ca_checksum: ca_checksum.to_owned(),
            state_dir: dir.join(name),
            local_address: None,
            proxy: Default::default(),
        },
        cluster: name.to_owned(),
        name: format!("{name}-agent"),
        kube: cluster_agent::KubeTarget::from_kubeconfig_text(
            &sim.kubeconfig(AGENT_TOKEN),
            "the simulated cluster",
        )?,
        // The agent's default.
        drift: Duration::from_secs(30),
        lease: cluster_agent::lease::LeaseConfig {
            namespace: AGENT_NAMESPACE.into(),
            name: "drover-cluster-agent".into(),
            identity: format!("{name}-agent"),
            duration: Duration::from_secs(15),
        },
    };
    tokio::spawn(cluster_agent::run(config, stop.clone()));
    Ok(sim)
}

/// Sends the push webhook for `commit`, signed as GitHub signs it.
async fn webhook(api: &Target, commit: &str) -> anyhow::Result<()> {
    let body = json!({"ref": "refs/heads/main", "after": commit}).to_string();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, WEBHOOK_SECRET.as_bytes());
    let tag = ring::hmac::sign(&key, body.as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let mut sender = api.connect().await?;
    let request = http::Request::builder()
        .method("POST")
        .uri("/v1/gitrepos/fleet/webhook")
        .header(http::header::HOST, api.addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header("x-hub-signature-256", format!("sha256={hex}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    anyhow::ensure!(
        response.status() == 202,
        "the webhook answered {}",
        response.status()
    );
    Ok(())
}

/// What a run that gave up saw: the GitRepo's status, and how many deployments stand how.
async fn diagnosis(api: &Target) -> anyhow::Result<String> {
    let repo = api.call("GET", "/v1/gitrepos/fleet", None, 200).await?;
    let deployments = api.call("GET", "/v1/bundledeployments", None, 200).await?;
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    for d in deployments["items"].as_array().into_iter().flatten() {
        let applied = d["status"]["revision"] == d["spec"]["revision"];
        let state = d["status"]["state"].as_str().unwrap_or("unreported");
        *states
            .entry(format!(
                "{state}{}",
                if applied { "" } else { " (older revision)" }
            ))
            .or_default() += 1;
    }
    Ok(format!(
        "the GitRepo: {}; deployments: {states:?}",
        repo["status"]
    ))
}

/// One commit's figures: until every cluster holds it, until the hub reports every cluster
/// ready, and the hub's CPU seconds over both.
async fn timed(
    api: &Target,
    fleet: &Fleet,
    args: &Args,
    version: &str,
    hub_pid: u32,
    start: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Value> {
    let limit = Duration::from_secs(args.limit_seconds);
    let (n, b) = (fleet.clusters, args.bundles);
    let cpu = cpu_seconds(hub_pid)?;
    let started = Instant::now();
    start.await?;
    if until(
        async || fleet.at(b, version).await.is_ok_and(|held| held == n),
        limit,
    )
    .await
    .is_none()
    {
        let held = fleet.at(b, version).await?;
        anyhow::bail!(
            "{held} of {n} clusters held {version} after {limit:?}; {}",
            diagnosis(api).await?
        );
    }
    let applied_s = round(started.elapsed().as_secs_f64(), 2);
    let all_ready = format!("{n} of {n} clusters ready");
    if until(
        async || {
            let repo = api
                .call("GET", "/v1/gitrepos/fleet", None, 200)
                .await
                .unwrap_or_default();
            repo["status"]["summary"] == all_ready.as_str()
        },
        limit,
    )
    .await
    .is_none()
    {
        anyhow::bail!(
            "the hub did not report {all_ready} within {limit:?}; {}",
            diagnosis(api).await?
        );
    }
    Ok(json!({
        "every_cluster_applied_s": applied_s,
        "hub_reports_all_ready_s": round(started.elapsed().as_secs_f64(), 2),
        "hub_cpu_s": round(cpu_seconds(hub_pid)? - cpu, 2),
    }))
}

pub(crate) async fn run_share(args: SharesArgs) -> anyhow::Result<Value> {
    sim::fleet::raise_open_files_limit();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    let stop = CancellationToken::new();
    let mut sims = Vec::new();
    while let Some(line) = lines.next_line().await? {
        let Some((name, token)) = line.split_once(' ') else {
            break;
        };
        let sim = cluster(name, token, &args.hub, &args.ca_checksum, &args.dir, &stop).await?;
        sims.push(sim);
    }
    out.write_all(b"started\n").await?;
    out.flush().await?;
    while let Some(line) = lines.next_line().await? {
        let mut words = line.split(' ').skip(1);
        let (Some(version), Some(bundles)) = (words.next(), words.next()) else {
            anyhow::bail!("bench delivery-clusters: cannot read {line:?}");
        };
        let held = clusters_at(&sims, bundles.parse()?, version);
        out.write_all(format!("{held}\n").as_bytes()).await?;
        out.flush().await?;
    }
    stop.cancel();
    Ok(Value::Null)
}

/// One `bench delivery-clusters` process and the pipes to it.
struct Share {
    child: tokio::process::Child,
    input: tokio::process::ChildStdin,
    output: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

/// The fleet, spread over processes of [`FILES_PER_CLUSTER`]-sized shares of the open-files
/// limit: this machine's hard limit (20,000, not raisable here) holds about 570 clusters in
/// one process.
struct Fleet {
    shares: tokio::sync::Mutex<Vec<Share>>,
    clusters: usize,
}

impl Fleet {
    /// Starts `clusters` (name, registration token) in as few processes as the limit allows.
    async fn start(
        clusters: &[(String, String)],
        per_process: usize,
        hub: &str,
        ca_checksum: &str,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let processes = clusters.len().div_ceil(per_process.max(1));
        let each = clusters.len().div_ceil(processes.max(1));
        let mut shares = Vec::new();
        for part in clusters.chunks(each.max(1)) {
            let mut child = tokio::process::Command::new(&exe)
                .args([
                    "delivery-clusters",
                    "--hub",
                    hub,
                    "--ca-checksum",
                    ca_checksum,
                ])
                .arg("--dir")
                .arg(dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("bench delivery-clusters")?;
            let mut input = child.stdin.take().context("its input")?;
            let output = BufReader::new(child.stdout.take().context("its output")?).lines();
            for (name, token) in part {
                input
                    .write_all(format!("{name} {token}\n").as_bytes())
                    .await?;
            }
            input.write_all(b"\n").await?;
            input.flush().await?;
            shares.push(Share {
                child,
                input,
                output,
            });
        }
        for share in &mut shares {
            let line = share.output.next_line().await?;
            anyhow::ensure!(
                line.as_deref() == Some("started"),
                "a share of the fleet did not start (it said {line:?}; its errors are above)"
            );
        }
        Ok(Self {
            shares: tokio::sync::Mutex::new(shares),
            clusters: clusters.len(),
        })
    }

    fn processes(&self) -> usize {
        self.shares.try_lock().map(|s| s.len()).unwrap_or_default()
    }

    /// How many clusters hold every path's ConfigMap at `version`.
    async fn at(&self, bundles: usize, version: &str) -> anyhow::Result<usize> {
        let mut shares = self.shares.lock().await;
        let mut held = 0;
        for share in shares.iter_mut() {
            share
                .input
                .write_all(format!("at {version} {bundles}\n").as_bytes())
                .await?;
            share.input.flush().await?;
        }
        for share in shares.iter_mut() {
            let line = share.output.next_line().await?;
            held += line
                .context("a share of the fleet exited")?
                .trim()
                .parse::<usize>()?;
        }
        Ok(held)
    }

    /// Ends every share (the end of its input stops it).
    async fn stop(self) {
        for mut share in self.shares.into_inner() {
            drop(share.input);
            let _ = share.child.wait().await;
        }
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let (n, b) = (args.clusters.max(1), args.bundles.max(1));
    let exe: PathBuf = std::env::current_exe()?
        .parent()
        .context("no directory for the bench binary")?
        .join("drover-hub");
    anyhow::ensure!(
        exe.exists(),
        "drover-hub is missing next to bench: run `cargo build --release -p hub -p bench` first"
    );
    let data = std::env::temp_dir().join(format!("drover-bench-delivery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let open_files = sim::fleet::raise_open_files_limit();
    let per_process =
        usize::try_from(open_files.saturating_sub(1000) / FILES_PER_CLUSTER).unwrap_or(usize::MAX);
    anyhow::ensure!(
        per_process > 0,
        "the open-files limit ({open_files}) is too low for even one cluster: raise it (ulimit -n)"
    );
    let prepared = prepare(&data.join("hub")).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (hub, url) = start_hub_on(&exe, &data.join("hub"), "10", addr).await?;
    let pid = hub.id().context("hub pid")?;
    let api = Target {
        addr,
        token: prepared.api_token.clone(),
    };

    // The repository: B paths, served by git daemon.
    let repos = data.join("repos");
    std::fs::create_dir_all(repos.join("fleet.git"))?;
    git(&repos.join("fleet.git"), &["init", "--quiet", "--bare"])?;
    let work = data.join("work");
    std::fs::create_dir_all(&work)?;
    git(&work, &["init", "--quiet"])?;
    let bare = repos.join("fleet.git").display().to_string();
    git(&work, &["remote", "add", "origin", &bare])?;
    let git_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut daemon = tokio::process::Command::new("git")
        .args([
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--listen=127.0.0.1",
        ])
        .arg(format!("--port={git_port}"))
        .arg(format!("--base-path={}", repos.display()))
        .arg(&repos)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: `git daemon` runs git-daemon as a child, and both must go.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("git daemon")?;
    let daemon_group = daemon.id().context("git daemon's pid")?;

    // The fleet: N clusters labelled env=prod, each a simulated cluster with its agent.
    let agents_dir = data.join("agents");
    let mut registrations = Vec::with_capacity(n);
    let made = Instant::now();
    for i in 0..n {
        let name = format!("c-{i:04}");
        let created = api
            .call(
                "POST",
                "/v1/clusters",
                Some(
                    json!({"metadata": {"name": name, "labels": {"env": "prod"}},
                            "spec": {"type": "imported"}}),
                ),
                201,
            )
            .await?;
        let registration = created["registration"]["token"]
            .as_str()
            .context("registration token")?;
        registrations.push((name, registration.to_owned()));
    }
    let fleet = Fleet::start(
        &registrations,
        per_process,
        &url,
        &prepared.ca_checksum,
        &agents_dir,
    )
    .await?;
    let limit = Duration::from_secs(args.limit_seconds);
    until(
        async || {
            let list = api
                .call("GET", "/v1/clusters?labelSelector=env%3Dprod", None, 200)
                .await
                .unwrap_or_default();
            let up = (list["items"].as_array().into_iter().flatten())
                .filter(|c| {
                    (c["status"]["conditions"].as_array().into_iter().flatten())
                        .any(|c| c["type"] == "Connected" && c["status"] == "True")
                })
                .count();
            up == n
        },
        limit,
    )
    .await
    .context("not every cluster-agent connected")?;
    let fleet_s = round(made.elapsed().as_secs_f64(), 2);
    // Settled: the agents' first reports in.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_before = rss_mib(pid).unwrap_or(0.0);
    let store_before = store_bytes(&data.join("hub"));

    let first_commit = commit(&work, b, "v1")?;
    let first = timed(&api, &fleet, &args, "v1", pid, async {
        api.call(
            "POST",
            "/v1/gitrepos",
            Some(json!({"metadata": {"name": "fleet"}, "spec": {
                "repo": format!("git://127.0.0.1:{git_port}/fleet.git"),
                "paths": (0..b).map(|i| format!("apps/app-{i}")).collect::<Vec<_>>(),
                "pollingInterval": "1h", "webhookSecret": WEBHOOK_SECRET,
                "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            }})),
            201,
        )
        .await
        .map(|_| ())
    })
    .await?;
    let deployments = n * b;
    let rss_after = rss_mib(pid).unwrap_or(0.0);
    let store_after = store_bytes(&data.join("hub"));
    let second_commit = commit(&work, b, "v2")?;
    let second = timed(
        &api,
        &fleet,
        &args,
        "v2",
        pid,
        webhook(&api, &second_commit),
    )
    .await?;
    let idle_cpu = cpu_seconds(pid)?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_cpu_per_s = round((cpu_seconds(pid)? - idle_cpu) / 10.0, 3);
    let processes = fleet.processes();
    fleet.stop().await;
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{daemon_group}")])
        .status();
    let _ = daemon.wait().await;
    drop(hub);
    let _ = std::fs::remove_dir_all(&data);
    Ok(json!({
        "scenario": "delivery",
        "clusters": n,
        "bundles": b,
        "bundle_deployments": deployments,
        "objects_per_bundle": 2,
        "open_files_limit": open_files,
        "cluster_processes": processes,
        "fleet_connected_s": fleet_s,
        "commits": [first_commit, second_commit],
        "first_commit": first,
        "change_to_every_path": second,
        "hub_rss_mib": {"before": round(rss_before, 1), "after": round(rss_after, 1)},
        "hub_kib_per_bundle_deployment": round((rss_after - rss_before) * 1024.0 / deployments as f64, 2),
        "store_bytes_per_cluster_per_bundle": round((store_after.saturating_sub(store_before)) as f64 / deployments as f64, 0),
        "hub_idle_cpu_per_s_after": idle_cpu_per_s,
        "fleet_documented_sizing": "Fleet's docs: 50 apps x 500 clusters at 16 vCPU / 64 GiB for the fleet controller",
        "machine": {"cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(0)},
    }))
}
