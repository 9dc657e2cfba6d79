//! Scenario `proxy`: Kubernetes requests through the hub's authentication proxy against the
//! same requests straight to the API server, in one run.
//!
//! The API server is `drover-sim cluster` (real kube-apiserver binaries cannot be downloaded
//! on these machines); hub, cluster-agent and simulated cluster all run in this process, with
//! the real code paths between them: the client speaks HTTPS to the hub, the hub authenticates
//! and authorizes the token, the request crosses the agent's tunnel session and the agent
//! forwards it to the API server with its own credential and `Impersonate-User`.
//!
//! - latency: one client on one kept-alive connection, GET one pod, direct and through the hub
//!   in alternating rounds;
//! - throughput: 64 clients, each on its own kept-alive connection, GET one pod for a while;
//! - floor: the same throughput through two bare TLS relays where the hub and the agent are
//!   (decrypt, copy, encrypt; nothing else): what no proxy that must read the requests can
//!   beat on this machine, since every part shares its cores;
//! - list: all 30,000 pods, straight from the API server and from the agent's cache through
//!   the hub (`/v1/clusters/<cluster>/cache/pods`), full body read.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sim::cluster::{ADMIN_TOKEN, Identity, SimCluster, SimConfig};
use tokio_util::sync::CancellationToken;

use crate::load::percentile_us;

/// The token the agent's service account has on the simulated cluster.
const AGENT_TOKEN: &str = "bench-agent-token";

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Sequential GETs per path for the latency figures.
    #[arg(long, default_value_t = 4_000)]
    requests: usize,
    /// Concurrent clients for the throughput figures.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Seconds each path is loaded for the throughput figures, in all (split over `rounds`).
    #[arg(long, default_value_t = 6)]
    seconds: u64,
    /// Rounds of the throughput figures: floor, direct and hub each loaded once a round, so a
    /// machine that slows for a while slows all three alike.
    #[arg(long, default_value_t = 6)]
    rounds: u32,
    /// Pods in the simulated cluster (the list figures list them all).
    #[arg(long, default_value_t = 30_000)]
    pods: usize,
    /// Lists per path; the median is reported.
    #[arg(long, default_value_t = 5)]
    lists: usize,
}

/// One HTTPS endpoint and the bearer token sent to it.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) token: String,
}

impl Target {
    /// A new connection, for one request or many ([`Target::call_on`]).
    pub(crate) async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        // Both servers are on loopback with certificates from CAs made for this run; what is
        // measured is the same whether or not the client checks them.
        let tls = tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
            .connect(
                rustls::pki_types::ServerName::IpAddress(self.addr.ip().into()),
                tcp,
            )
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::ACCEPT, "application/json");
        if !self.token.is_empty() {
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            );
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        if !body.is_empty() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        request
            .body(Full::new(body))
            .unwrap_or_else(|_| unreachable!("the bench's own requests are well formed"))
    }

    /// Sends one request on `sender`; the status and the whole body.
    pub(crate) async fn send(
        &self,
        sender: &mut SendRequest<Full<Bytes>>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Bytes)> {
        sender.ready().await?;
        let response = sender
            .send_request(self.request(method, path, body))
            .await?;
        let status = response.status().as_u16();
        Ok((status, response.into_body().collect().await?.to_bytes()))
    }

    /// One request on a new connection, expecting `want`; the body as text.
    pub(crate) async fn call_text(
        &self,
        method: &str,
        path: &str,
        want: u16,
    ) -> anyhow::Result<String> {
        let mut sender = self.connect().await?;
        let (status, bytes) = self.send(&mut sender, method, path, None).await?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status != want {
            bail!("{method} {path}: HTTP {status}: {text}");
        }
        Ok(text)
    }

    /// One request on a new connection, expecting `want`; the body as JSON.
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        want: u16,
    ) -> anyhow::Result<Value> {
        let mut sender = self.connect().await?;
        self.call_on(&mut sender, method, path, body, want).await
    }

    /// One request on `sender`, expecting `want`; the body as JSON.
    pub(crate) async fn call_on(
        &self,
        sender: &mut SendRequest<Full<Bytes>>,
        method: &str,
        path: &str,
        body: Option<Value>,
        want: u16,
    ) -> anyhow::Result<Value> {
        let (status, bytes) = self.send(sender, method, path, body.as_ref()).await?;
        if status != want {
            bail!(
                "{method} {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

/// A TLS relay to `next`, listening on a port of its own: each connection it accepts is
/// decrypted and its bytes are copied, unread, to a TLS connection of its own to `next` (and
/// back). No HTTP, no authentication, no tunnel: the least that any proxy which must see the
/// requests (as an authenticating one must) does at each place it sits.
async fn relay(next: SocketAddr) -> anyhow::Result<SocketAddr> {
    // The bench's clients do not check certificates (see `Target::connect`), nor does the relay.
    let cert = tunnel::testing::ca().issue_server(&["127.0.0.1".to_owned()])?;
    let acceptor = tokio_rustls::TlsAcceptor::from(tunnel::tls::server_config(
        cert.cert_pem.as_bytes(),
        cert.key_pem.as_bytes(),
    )?);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let Ok(mut inbound) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(out) = tokio::net::TcpStream::connect(next).await else {
                    return;
                };
                let _ = out.set_nodelay(true);
                let Ok(mut outbound) =
                    tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
                        .connect(
                            rustls::pki_types::ServerName::IpAddress(next.ip().into()),
                            out,
                        )
                        .await
                else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    Ok(addr)
}

/// Each part runs on a runtime of its own, as it would in its own process, with its threads
/// named after it so that the CPU time each part spends can be told apart.
// Short: Linux keeps 15 bytes of a thread's name.
const PARTS: [&str; 3] = ["sim", "hub", "agent"];

pub(crate) fn runtime(part: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(format!("bench-{part}"))
        .enable_all()
        .build()?)
}

/// The threads the hub starts and names itself (not its runtime's): the audit log's writer.
const HUB_THREADS: [&str; 1] = [hub::audit::WRITER_THREAD];

/// The part a thread named `name` belongs to (`None`: the client's).
pub(crate) fn part_of(name: &str) -> Option<&'static str> {
    if HUB_THREADS.contains(&name) {
        return Some("hub");
    }
    PARTS.into_iter().find(|p| {
        name.strip_prefix("bench-")
            .is_some_and(|n| n.starts_with(p))
    })
}

/// CPU time used so far by the threads of `part`, or by the rest (the client) when `part` is
/// `None`.
pub(crate) fn part_cpu(part: Option<&str>) -> Duration {
    threads_cpu(|name| part_of(name) == part)
}

/// CPU time used so far by this process's threads whose name `mine` accepts.
pub(crate) fn threads_cpu(mine: impl Fn(&str) -> bool) -> Duration {
    let mut ticks = 0u64;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n);
        if !mine(name) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let parse = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        ticks += parse(11) + parse(12);
    }
    // USER_HZ is 100 on every architecture Drover builds for.
    Duration::from_millis(ticks * 10)
}

/// The simulated cluster, a hub with it imported, and a connected cluster-agent.
pub(crate) struct Setup {
    pub(crate) direct: Target,
    /// Two bare TLS relays, where the hub and the agent are (see `relay`).
    floor: Target,
    /// The hub's proxy with a kubeconfig token the hub issued to its admin.
    pub(crate) hub: Target,
    /// The hub's API with the admin's API token.
    pub(crate) hub_api: Target,
    /// The admin's password (the dashboard's login).
    pub(crate) admin_password: String,
    pub(crate) data_dir: PathBuf,
    pub(crate) shutdown: CancellationToken,
    pub(crate) runtimes: Vec<tokio::runtime::Runtime>,
}

/// A hub on 127.0.0.1 (port 0) keeping its state in `data_dir`.
pub(crate) fn hub_config(data_dir: &std::path::Path) -> hub::Config {
    hub_config_with(data_dir, true)
}

/// As [`hub_config`], with the audit log on or off.
pub(crate) fn hub_config_with(data_dir: &std::path::Path, audit: bool) -> hub::Config {
    let mut audit_config = hub::audit::AuditConfig::in_data_dir(data_dir);
    if !audit {
        audit_config.path = None;
    }
    hub::Config {
        data_dir: data_dir.to_owned(),
        listen: ([127, 0, 0, 1], 0).into(),
        server_url: None,
        host_name: "127.0.0.1".into(),
        tls: None,
        agent_binaries: None,
        heartbeat: hub::config::DEFAULT_HEARTBEAT,
        store: hub::config::StoreLocation::Sqlite,
        max_handshakes: hub::config::DEFAULT_MAX_HANDSHAKES,
        max_silent_per_address: tunnel::listener::DEFAULT_SILENT_PER_ADDRESS,
        max_streams_per_user: hub::config::DEFAULT_MAX_STREAMS_PER_USER,
        replica_url: None,
        audit: audit_config,
    }
}

/// Imports the simulated cluster `sim` as cluster `prod` of `hub`: applies the hub's import
/// manifest to it (the agent's RBAC among it, as `kubectl apply` would) and returns the
/// cluster-agent's configuration, its service account's token `agent_token`, its lease in
/// `namespace`, its state under `data_dir`.
pub(crate) async fn import_into(
    hub: &hub::Hub,
    sim: &SimCluster,
    agent_token: &str,
    registration: String,
    data_dir: &std::path::Path,
    namespace: &str,
) -> anyhow::Result<cluster_agent::Config> {
    let manifest = hub::registration::agents_manifest(
        hub.store().as_ref(),
        hub.url(),
        hub.ca_checksum(),
        "prod",
        &serde_json::from_value(serde_json::json!({"type": "imported"}))?,
        &registration,
    )
    .await?;
    sim.apply_manifest(&manifest).map_err(anyhow::Error::msg)?;
    Ok(cluster_agent::Config {
        hub: agentkit::HubSettings {
            server: hub.url().to_owned(),
            token: tunnel::Secret::new(registration),
            ca_checksum: hub.ca_checksum().to_owned(),
            state_dir: data_dir.join("agent"),
            local_address: None,
            proxy: Default::default(),
        },
        cluster: "prod".into(),
        name: "bench-0".into(),
        kube: cluster_agent::KubeTarget::from_kubeconfig_text(
            &sim.kubeconfig(agent_token),
            "the simulated cluster",
        )?,
        drift: std::time::Duration::from_secs(30),
        lease: cluster_agent::lease::LeaseConfig {
            namespace: namespace.into(),
            name: "drover-cluster-agent".into(),
            identity: "bench-0".into(),
            duration: Duration::from_secs(15),
        },
    })
}

/// Logs in to a new `hub` as its bootstrap admin and creates `cluster`; returns the admin's
/// API and the cluster's registration token.
pub(crate) async fn admin_with_cluster(
    hub: &hub::Hub,
    cluster: Value,
) -> anyhow::Result<(Target, String)> {
    let password = hub
        .bootstrap_password()
        .context("a new hub has a bootstrap password")?
        .to_owned();
    let mut api = Target {
        addr: hub.local_addr(),
        token: String::new(),
    };
    let login = api
        .call(
            "POST",
            "/v1/login",
            Some(json!({"username": "admin", "password": password, "session": false})),
            200,
        )
        .await?;
    api.token = login["token"].as_str().context("login token")?.to_owned();
    let created = api.call("POST", "/v1/clusters", Some(cluster), 201).await?;
    let registration = created["registration"]["token"]
        .as_str()
        .context("registration token")?
        .to_owned();
    Ok((api, registration))
}

pub(crate) async fn setup(pods: usize) -> anyhow::Result<Setup> {
    setup_with(pods, true).await
}

/// As [`setup`], with the hub's audit log on or off.
pub(crate) async fn setup_with(pods: usize, audit: bool) -> anyhow::Result<Setup> {
    let runtimes = PARTS
        .iter()
        .map(|p| runtime(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    match start_parts(&runtimes, pods, audit).await {
        Ok(setup) => Ok(Setup { runtimes, ..setup }),
        Err(e) => {
            // Dropping a runtime inside this async context would panic and hide `e`.
            for runtime in runtimes {
                runtime.shutdown_background();
            }
            Err(e)
        }
    }
}

/// The parts of [`setup_with`] on their runtimes (`Setup::runtimes` left empty).
async fn start_parts(
    runtimes: &[tokio::runtime::Runtime],
    pods: usize,
    audit: bool,
) -> anyhow::Result<Setup> {
    let shutdown = CancellationToken::new();
    let [api_rt, hub_rt, agent_rt] = [&runtimes[0], &runtimes[1], &runtimes[2]];
    let sim = api_rt
        .spawn(SimCluster::start(
            SimConfig {
                nodes: 100,
                pods,
                ..SimConfig::default()
            },
            shutdown.clone(),
        ))
        .await??;
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: "system:serviceaccount:drover-system:drover-agent".into(),
            // The bench measures the proxy, not the import manifest's RBAC: cluster-admin.
            groups: vec!["system:serviceaccounts".into(), "system:masters".into()],
        },
    );
    let data_dir = std::env::temp_dir().join(format!("drover-bench-proxy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let hub = hub_rt
        .spawn(hub::Hub::start(
            hub_config_with(&data_dir.join("hub"), audit),
            shutdown.clone(),
        ))
        .await??;
    let admin_password = hub
        .bootstrap_password()
        .context("a new hub has a bootstrap password")?
        .to_owned();
    let (hub_api, registration) = admin_with_cluster(
        &hub,
        json!({"metadata": {"name": "prod"}, "spec": {"type": "imported"}}),
    )
    .await?;

    let agent = import_into(&hub, &sim, AGENT_TOKEN, registration, &data_dir, "default").await?;
    agent_rt.spawn(cluster_agent::run(agent, shutdown.clone()));

    // A kubeconfig token, as `kubectl` through the hub would send (the kubeconfig is YAML).
    let mut sender = hub_api.connect().await?;
    let (status, kubeconfig) = hub_api
        .send(&mut sender, "POST", "/v1/clusters/prod/kubeconfig", None)
        .await?;
    if status != 201 {
        bail!("no kubeconfig from the hub: HTTP {status}");
    }
    let kubeconfig_token = String::from_utf8_lossy(&kubeconfig).into_owned();
    let token = kubeconfig_token
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .context("the kubeconfig has a token")?
        .trim_matches('"')
        .to_owned();
    let hub_proxy = Target {
        addr: hub.local_addr(),
        token,
    };
    let direct = Target {
        addr: sim.addr(),
        token: ADMIN_TOKEN.into(),
    };
    // The floor: a TLS relay on the agent's runtime in front of the API server, and one on the
    // hub's in front of it. The client's own request (the admin's token, no impersonation)
    // reaches the API server, so the API server does less than through the hub.
    let relay_agent = agent_rt.spawn(relay(sim.addr())).await??;
    let relay_hub = hub_rt.spawn(relay(relay_agent)).await??;
    let floor = Target {
        addr: relay_hub,
        token: ADMIN_TOKEN.into(),
    };
    // Until the agent leads and has connected, the proxy answers 503.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut sender = hub_proxy.connect().await?;
        let (status, body) = hub_proxy
            .send(&mut sender, "GET", &proxied(POD), None)
            .await?;
        if status == 200 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster-agent did not connect within 60 s (last answer HTTP {status}: {})",
                String::from_utf8_lossy(&body)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Setup {
        direct,
        floor,
        hub: hub_proxy,
        hub_api,
        admin_password,
        data_dir,
        shutdown,
        runtimes: Vec::new(),
    })
}

pub(crate) const POD: &str = "/api/v1/namespaces/load-0/pods/pod-0";

pub(crate) fn proxied(path: &str) -> String {
    format!("/k8s/clusters/prod{path}")
}

/// Round-trip times of `n` sequential GETs on one connection.
pub(crate) async fn latencies(
    target: &Target,
    path: &str,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut sender = target.connect().await?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let (status, _) = target.send(&mut sender, "GET", path, None).await?;
        times.push(start.elapsed());
        if status != 200 {
            bail!("GET {path}: HTTP {status}");
        }
    }
    Ok(times)
}

/// CPU time per request, µs, of each part.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cpu {
    client: f64,
    api_server: f64,
    hub: f64,
    agent: f64,
}

impl Cpu {
    fn now() -> [Duration; 4] {
        [
            part_cpu(None),
            part_cpu(Some("sim")),
            part_cpu(Some("hub")),
            part_cpu(Some("agent")),
        ]
    }

    fn per_request(start: [Duration; 4], end: [Duration; 4], requests: f64) -> Self {
        let us = |i: usize| end[i].saturating_sub(start[i]).as_secs_f64() * 1e6 / requests;
        Self {
            client: us(0),
            api_server: us(1),
            hub: us(2),
            agent: us(3),
        }
    }

    fn total(&self) -> f64 {
        self.client + self.api_server + self.hub + self.agent
    }

    /// Adds `share` of `other` (one round's figures, for a mean over rounds).
    fn add_share(&mut self, other: Self, share: f64) {
        self.client += other.client * share;
        self.api_server += other.api_server * share;
        self.hub += other.hub * share;
        self.agent += other.agent * share;
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "client": round1(self.client),
            "api_server": round1(self.api_server),
            "hub": round1(self.hub),
            "agent": round1(self.agent),
            "total": round1(self.total()),
        })
    }
}

/// Requests per second that `clients` connections complete together in `load`, and the CPU
/// time each part spent per request.
pub(crate) async fn throughput(
    target: &Target,
    path: &str,
    clients: usize,
    load: Duration,
) -> anyhow::Result<(f64, Cpu)> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::with_capacity(clients);
    for _ in 0..clients {
        senders.push(target.connect().await?);
    }
    let start = Instant::now();
    let cpu_start = Cpu::now();
    let mut tasks = Vec::with_capacity(clients);
    for mut sender in senders {
        let (target, path, done, stop) =
            (target.clone(), path.to_owned(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (status, _) = target.send(&mut sender, "GET", &path, None).await?;
                if status != 200 {
                    bail!("GET {path}: HTTP {status}");
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    tokio::time::sleep(load).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    let done = done.load(Ordering::Relaxed).max(1) as f64;
    let cpu = Cpu::per_request(cpu_start, Cpu::now(), done);
    Ok((done / elapsed.as_secs_f64(), cpu))
}

/// Milliseconds to fetch and read a whole list, and how many items it held.
async fn list_ms(target: &Target, path: &str) -> anyhow::Result<(f64, usize)> {
    let mut sender = target.connect().await?;
    let start = Instant::now();
    let (status, body) = target.send(&mut sender, "GET", path, None).await?;
    let elapsed = start.elapsed();
    if status != 200 {
        bail!(
            "GET {path}: HTTP {status}: {:.300}",
            String::from_utf8_lossy(&body)
        );
    }
    // Counted after the clock stops: parsing is the client's business, not the server's.
    let items = serde_json::from_slice::<Value>(&body)?["items"]
        .as_array()
        .map_or(0, Vec::len);
    Ok((elapsed.as_secs_f64() * 1e3, items))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

pub(crate) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let setup = setup(args.pods).await?;
    let hub_pod = proxied(POD);

    // Warm every path (connections, caches, allocator) before anything is timed.
    latencies(&setup.direct, POD, 200).await?;
    latencies(&setup.hub, &hub_pod, 200).await?;
    latencies(&setup.floor, POD, 200).await?;

    // Latency: alternate the paths in rounds so noise hits both alike.
    const ROUNDS: usize = 8;
    let per_round = args.requests.div_ceil(ROUNDS);
    let (mut direct, mut through_hub) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        direct.extend(latencies(&setup.direct, POD, per_round).await?);
        through_hub.extend(latencies(&setup.hub, &hub_pod, per_round).await?);
    }
    let direct_p50 = percentile_us(&mut direct, 50.0);
    let hub_p50 = percentile_us(&mut through_hub, 50.0);
    let hub_p99 = percentile_us(&mut through_hub, 99.0);

    // Throughput: floor, direct, hub, in short rounds (this machine's speed drifts by 10-25 %
    // within minutes, which two long rounds took as the hub's); the means over all rounds,
    // and each round's hub ÷ floor for the spread.
    let rounds = args.rounds.max(1);
    let each = Duration::from_secs(args.seconds.max(1)) / rounds;
    let share = 1.0 / f64::from(rounds);
    let (mut direct_rps, mut hub_rps, mut floor_rps) = (0.0, 0.0, 0.0);
    let (mut direct_cpu, mut hub_cpu, mut floor_cpu) =
        (Cpu::default(), Cpu::default(), Cpu::default());
    let mut round_ratios = Vec::new();
    for _ in 0..rounds {
        let (floor, cpu) = throughput(&setup.floor, POD, args.clients, each).await?;
        floor_rps += floor * share;
        floor_cpu.add_share(cpu, share);
        let (rps, cpu) = throughput(&setup.direct, POD, args.clients, each).await?;
        direct_rps += rps * share;
        direct_cpu.add_share(cpu, share);
        let (hub, cpu) = throughput(&setup.hub, &hub_pod, args.clients, each).await?;
        hub_rps += hub * share;
        hub_cpu.add_share(cpu, share);
        round_ratios.push((hub / floor * 1000.0).round() / 1000.0);
    }

    // Where the hub's and the agent's CPU goes: one more hub run, sampled by perf (apart from
    // the runs above, so sampling costs them nothing); the shares split their CPU figures.
    let stages = match crate::stages::start(&setup.data_dir).await {
        Ok(sampling) => {
            throughput(&setup.hub, &hub_pod, args.clients, Duration::from_secs(3)).await?;
            match sampling.stop(&["hub", "agent"]).await {
                Ok(shares) => json!({
                    "how": "perf samples of the hub's and the agent's threads during a further hub run, each put in the stage of the function it was in (not its callers')",
                    "hub_us_per_request": shares.get("hub").map(|s| crate::stages::breakdown(s, hub_cpu.hub)),
                    "agent_us_per_request": shares.get("agent").map(|s| crate::stages::breakdown(s, hub_cpu.agent)),
                }),
                Err(e) => json!({"missing": format!("{e:#}")}),
            }
        }
        Err(e) => json!({"missing": format!("{e:#}")}),
    };

    // Lists of every pod, alternating.
    let (mut direct_lists, mut cache_lists) = (Vec::new(), Vec::new());
    for _ in 0..args.lists.max(1) {
        let (ms, items) = list_ms(&setup.direct, "/api/v1/pods").await?;
        if items != args.pods {
            bail!("the API server listed {items} pods, not {}", args.pods);
        }
        direct_lists.push(ms);
        let (ms, items) = list_ms(&setup.hub_api, "/v1/clusters/prod/cache/pods").await?;
        if items != args.pods {
            bail!("the cache listed {items} pods, not {}", args.pods);
        }
        cache_lists.push(ms);
    }

    setup.shutdown.cancel();
    let _ = std::fs::remove_dir_all(&setup.data_dir);
    for runtime in setup.runtimes {
        // Dropping a runtime from async code is not allowed; this is the way out.
        runtime.shutdown_background();
    }
    Ok(json!({
        "scenario": "proxy",
        "api_server": "drover-sim cluster (simulated; real kube-apiserver binaries cannot be downloaded here)",
        "requests": args.requests,
        "clients": args.clients,
        "pods": args.pods,
        "direct_p50_us": round1(direct_p50),
        "hub_p50_us": round1(hub_p50),
        "hub_p99_us": round1(hub_p99),
        "overhead_p50_us": round1(hub_p50 - direct_p50),
        "direct_rps": direct_rps.round(),
        "hub_rps": hub_rps.round(),
        "hub_rps_ratio": (hub_rps / direct_rps * 100.0).round() / 100.0,
        // Client, hub, agent and API server share this machine's cores, so throughput here is
        // the cores divided by the CPU time a request costs on its whole path; by part:
        "direct_cpu_us_per_request": direct_cpu.json(),
        // Two bare TLS relays where the hub and the agent are: the most any proxy that reads
        // the requests can do here.
        "floor_rps": floor_rps.round(),
        "floor_rps_ratio": (floor_rps / direct_rps * 100.0).round() / 100.0,
        "floor_cpu_us_per_request": floor_cpu.json(),
        // What the acceptance reads: the hub's throughput over the floor's, and each round's.
        "hub_vs_floor": (hub_rps / floor_rps * 1000.0).round() / 1000.0,
        "hub_vs_floor_rounds": round_ratios,
        "hub_cpu_us_per_request": hub_cpu.json(),
        "hub_cpu_stages": stages,
        "cores": std::thread::available_parallelism().map_or(0, usize::from),
        "direct_list_ms": round1(median(&mut direct_lists)),
        "cache_list_ms": round1(median(&mut cache_lists)),
    }))
}

#[cfg(test)]
mod tests {
    use super::part_of;

    #[test]
    fn threads_are_counted_in_the_part_that_runs_them() {
        assert_eq!(part_of("bench-hub"), Some("hub"));
        assert_eq!(part_of("bench-agent"), Some("agent"));
        assert_eq!(part_of("bench-sim"), Some("sim"));
        // The hub's audit writer is the hub's, though not named after its runtime.
        assert_eq!(part_of("audit-log"), Some("hub"));
        assert_eq!(part_of("bench"), None);
        assert_eq!(part_of("tokio-rt-worker"), None);
    }
}
