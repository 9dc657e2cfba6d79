//! Scenario `tunnel`: the tunnel against raw rustls over TCP, on loopback, in one run.
//!
//! Three paths carry the same bench protocol, each ending in a task of this process:
//! - direct: a TLS client to a TLS server (the baseline);
//! - tunnel: a stream the hub opens through an agent's session to a service the agent runs,
//!   so exactly the tunnel's layers (TLS, WebSocket, yamux) sit between the two ends;
//! - dial: the hub dials through the agent to a plain TCP server beside it, the path a proxied
//!   Kubernetes request takes (the tunnel plus one loopback TCP hop).
//!
//! Every repeat runs the paths back to back, so machine noise hits them alike.

use std::{future::Future, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tunnel::{AcceptorConfig, Connector, Services, Session, testing, tls};

use crate::load::{self, cpu_time, mib_per_s, percentile_us};

const MIB: u64 = 1024 * 1024;

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// MiB moved by each single-stream throughput run.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Round trips of 64 bytes for each latency figure.
    #[arg(long, default_value_t = 10_000)]
    round_trips: usize,
    /// Concurrent streams for the aggregate figure.
    #[arg(long, default_value_t = 100)]
    streams: usize,
    /// MiB each concurrent stream moves.
    #[arg(long, default_value_t = 16)]
    stream_mib: u64,
    /// Runs of each throughput figure per path; the median is reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// KiB of window a session's streams may grow into beyond their 256 KiB each (both ends;
    /// default: the tunnel's own).
    #[arg(long)]
    window_growth_kib: Option<usize>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type BoxIo = Box<dyn Io>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Direct,
    Tunnel,
    Dial,
}

const PATHS: [Path; 3] = [Path::Direct, Path::Tunnel, Path::Dial];

struct Endpoints {
    tls_addr: SocketAddr,
    tls: TlsConnector,
    plain_addr: SocketAddr,
    session: Session,
}

impl Endpoints {
    async fn open(&self, path: Path) -> anyhow::Result<BoxIo> {
        Ok(match path {
            Path::Direct => {
                let tcp = TcpStream::connect(self.tls_addr).await?;
                tcp.set_nodelay(true)?;
                Box::new(self.tls.connect("127.0.0.1".try_into()?, tcp).await?)
            }
            Path::Tunnel => Box::new(self.session.open_service("bench").await?),
            Path::Dial => Box::new(self.session.dial(&self.plain_addr.to_string()).await?),
        })
    }
}

/// Median throughput (MiB/s) of a path's runs, and CPU seconds per GiB they used.
#[derive(Default)]
struct Runs {
    rates: Vec<f64>,
    cpu: Duration,
    cpu_known: bool,
}

impl Runs {
    async fn record(
        &mut self,
        bytes: u64,
        run: impl Future<Output = anyhow::Result<Duration>>,
    ) -> anyhow::Result<()> {
        let before = cpu_time();
        let elapsed = run.await?;
        let after = cpu_time();
        self.cpu_known =
            before.is_some() && after.is_some() && (self.rates.is_empty() || self.cpu_known);
        if let (Some(b), Some(a)) = (before, after) {
            self.cpu += a.saturating_sub(b);
        }
        self.rates.push(mib_per_s(bytes, elapsed));
        Ok(())
    }

    fn median(&self) -> f64 {
        let mut rates = self.rates.clone();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    }

    fn cpu_s_per_gib(&self, bytes: u64) -> Option<f64> {
        let gib = (bytes * self.rates.len() as u64) as f64 / (1024.0 * MIB as f64);
        self.cpu_known.then(|| round3(self.cpu.as_secs_f64() / gib))
    }
}

type Op<'a> = Box<
    dyn FnMut(Path) -> Pin<Box<dyn Future<Output = anyhow::Result<Duration>> + Send + 'a>>
        + Send
        + 'a,
>;

/// Runs `op` on every path, `repeat` rounds, paths interleaved within each round.
async fn measure(repeat: usize, bytes: u64, mut op: Op<'_>) -> anyhow::Result<[Runs; 3]> {
    let mut runs: [Runs; 3] = Default::default();
    for _ in 0..repeat {
        for (i, path) in PATHS.into_iter().enumerate() {
            runs[i].record(bytes, op(path)).await?;
        }
    }
    Ok(runs)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn direction(runs: &[Runs; 3], bytes: u64) -> Value {
    let [direct, tunnel, dial] = runs;
    json!({
        "direct_mib_s": round1(direct.median()),
        "tunnel_mib_s": round1(tunnel.median()),
        "ratio": round3(tunnel.median() / direct.median()),
        "dial_path_mib_s": round1(dial.median()),
        "dial_path_ratio": round3(dial.median() / direct.median()),
        "direct_cpu_s_per_gib": direct.cpu_s_per_gib(bytes),
        "tunnel_cpu_s_per_gib": tunnel.cpu_s_per_gib(bytes),
        "dial_path_cpu_s_per_gib": dial.cpu_s_per_gib(bytes),
    })
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    anyhow::ensure!(args.repeat > 0, "--repeat must be at least 1");
    // Beside the agent: a plain TCP server, as an API server next to it would be.
    let plain = TcpListener::bind("127.0.0.1:0").await?;
    let plain_addr = plain.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = plain.accept().await {
            let _ = tcp.set_nodelay(true);
            tokio::spawn(load::serve(tcp));
        }
    });

    // The direct baseline: the same protocol over rustls.
    let leaf = testing::ca().issue_server(&["127.0.0.1".into()])?;
    let acceptor = TlsAcceptor::from(tls::server_config(
        leaf.cert_pem.as_bytes(),
        leaf.key_pem.as_bytes(),
    )?);
    let direct = TcpListener::bind("127.0.0.1:0").await?;
    let tls_addr = direct.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = direct.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = load::serve(tls).await;
                }
            });
        }
    });
    let roots = tls::roots_from_pem(testing::ca_pem().as_bytes())?;
    let tls = TlsConnector::from(tls::client_config(roots));

    let mut settings = tunnel::SessionSettings::default();
    if let Some(kib) = args.window_growth_kib {
        settings.window_growth = kib * 1024;
    }
    let hub = testing::TestHub::start(AcceptorConfig {
        settings,
        ..AcceptorConfig::default()
    })
    .await;
    let mut agent_config = testing::agent_config(&hub, "bench");
    agent_config.settings = settings;
    agent_config.services = Services::default().add("bench", |stream| async move {
        let _ = load::serve(stream).await;
    });
    let agent = Connector::new(agent_config)?
        .connect()
        .await
        .context("agent could not connect to the in-process hub")?;
    let session = hub.session("bench").await;
    let ends = Arc::new(Endpoints {
        tls_addr,
        tls,
        plain_addr,
        session,
    });

    let bytes = args.size_mib * MIB;
    let e = &ends;
    // hub -> agent: the hub writes (request bodies); agent -> hub: the agent writes (responses,
    // the direction WebSocket masks).
    let up = measure(
        args.repeat,
        bytes,
        Box::new(|path| Box::pin(async move { load::upload(e.open(path).await?, bytes).await })),
    )
    .await?;
    let down = measure(
        args.repeat,
        bytes,
        Box::new(|path| Box::pin(async move { load::download(e.open(path).await?, bytes).await })),
    )
    .await?;

    let mut rtt = Vec::new();
    for path in PATHS {
        rtt.push(load::round_trips(ends.open(path).await?, args.round_trips, 64).await?);
    }

    // The tunnel's round trips again while another stream of the same session copies
    // agent -> hub flat out.
    let bulk_ends = ends.clone();
    let bulk = tokio::spawn(async move {
        let stream = bulk_ends.open(Path::Tunnel).await?;
        load::download(stream, u64::MAX / 2).await
    });
    // Let the bulk stream reach full speed first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut loaded =
        load::round_trips(ends.open(Path::Tunnel).await?, args.round_trips, 64).await?;
    let bulk_failed = bulk.is_finished();
    bulk.abort();
    anyhow::ensure!(
        !bulk_failed,
        "the bulk stream stopped before the round trips ended"
    );

    let each = args.stream_mib * MIB;
    let total = each * args.streams as u64;
    let mut many = Vec::new();
    for path in [Path::Direct, Path::Tunnel] {
        many.push(concurrent(args.streams, ends.clone(), path, each).await?);
    }

    agent.session.close();
    hub.stop().await;

    let ratio_up = up[1].median() / up[0].median();
    let ratio_down = down[1].median() / down[0].median();
    let low = if ratio_down <= ratio_up { &down } else { &up };
    let [direct_rtt, tunnel_rtt, dial_rtt] = &mut rtt[..] else {
        unreachable!("one latency run per path")
    };
    Ok(json!({
        "scenario": "tunnel",
        "stream_mib": args.size_mib,
        "repeat": args.repeat,
        "direct_mib_s": round1(low[0].median()),
        "tunnel_mib_s": round1(low[1].median()),
        "throughput_ratio": round3(ratio_up.min(ratio_down)),
        "agent_to_hub": direction(&down, bytes),
        "hub_to_agent": direction(&up, bytes),
        "round_trips": args.round_trips,
        "direct_rtt_p50_us": round1(percentile_us(direct_rtt, 50.0)),
        "direct_rtt_p99_us": round1(percentile_us(direct_rtt, 99.0)),
        "tunnel_rtt_p50_us": round1(percentile_us(tunnel_rtt, 50.0)),
        "tunnel_rtt_p99_us": round1(percentile_us(tunnel_rtt, 99.0)),
        "dial_path_rtt_p50_us": round1(percentile_us(dial_rtt, 50.0)),
        "dial_path_rtt_p99_us": round1(percentile_us(dial_rtt, 99.0)),
        "tunnel_rtt_p50_under_load_us": round1(percentile_us(&mut loaded, 50.0)),
        "tunnel_rtt_p99_under_load_us": round1(percentile_us(&mut loaded, 99.0)),
        "window_growth_kib": settings.window_growth / 1024,
        "streams": args.streams,
        "streams_each_mib": args.stream_mib,
        "direct_streams100_mib_s": round1(mib_per_s(total, many[0].wall)),
        "streams100_mib_s": round1(mib_per_s(total, many[1].wall)),
        // Fairness: when the first and the last of the concurrent streams finished.
        "direct_streams_fastest_s": round3(many[0].fastest.as_secs_f64()),
        "direct_streams_slowest_s": round3(many[0].slowest.as_secs_f64()),
        "streams_fastest_s": round3(many[1].fastest.as_secs_f64()),
        "streams_slowest_s": round3(many[1].slowest.as_secs_f64()),
        "streams_slowest_over_fastest": round3(
            many[1].slowest.as_secs_f64() / many[1].fastest.as_secs_f64().max(1e-9)
        ),
    }))
}

/// How `n` concurrent downloads went: the wall time until all finished, and when the first
/// and the last of them finished (a fair session finishes them together).
struct Concurrent {
    wall: Duration,
    fastest: Duration,
    slowest: Duration,
}

/// `n` downloads of `bytes` each at once over `path`.
async fn concurrent(
    n: usize,
    ends: Arc<Endpoints>,
    path: Path,
    bytes: u64,
) -> anyhow::Result<Concurrent> {
    let start = std::time::Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let ends = ends.clone();
            tokio::spawn(async move {
                load::download(ends.open(path).await?, bytes).await?;
                anyhow::Ok(start.elapsed())
            })
        })
        .collect();
    let mut finished = Vec::with_capacity(n);
    for task in tasks {
        finished.push(task.await??);
    }
    Ok(Concurrent {
        wall: start.elapsed(),
        fastest: finished.iter().copied().min().unwrap_or_default(),
        slowest: finished.iter().copied().max().unwrap_or_default(),
    })
}
