//! Scenario `hub`: how fast `drover-hub serve` is ready after exec, and how much memory it
//! holds when idle — on its first start (it creates its CA and the admin user) and on a
//! restart; and the size of each of Drover's binaries beside this one (what the README
//! states). Runs the release binary next to this one (`cargo build --release --bins` first).

use std::{
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The binaries whose sizes are reported (those built are).
const BINARIES: [&str; 6] = [
    "drover-hub",
    "drover-cluster-agent",
    "drover-node-agent",
    "drover-system-agent",
    "drover-kube-api-auth",
    "drover-sim",
];

/// How long the hub sits idle before its memory is read.
const IDLE: Duration = Duration::from_secs(3);

#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

pub(crate) async fn ready(addr: std::net::SocketAddr) -> bool {
    let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let Ok(tls) = tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
        .connect(name, tcp)
        .await
    else {
        return false;
    };
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await
    else {
        return false;
    };
    tokio::spawn(conn);
    let request = http::Request::get("/readyz")
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new());
    match request {
        Ok(request) => sender
            .send_request(request)
            .await
            .is_ok_and(|r| r.status() == 200),
        Err(_) => false,
    }
}

pub(crate) fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

async fn one_start(exe: &PathBuf, data: &PathBuf) -> anyhow::Result<(f64, Option<f64>)> {
    // A free port: bound and released just before the hub binds it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(exe)
        .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    // Polling is the measurement here: the first 200 is the figure.
    while !ready(addr).await {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the hub was not ready within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ms = (started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0;
    tokio::time::sleep(IDLE).await;
    let rss = child.id().and_then(rss_mib);
    child.kill().await?;
    Ok((ms, rss))
}

pub(crate) async fn run(_: Args) -> anyhow::Result<Value> {
    let exe = std::env::current_exe()?
        .parent()
        .map(|d| d.join("drover-hub"))
        .ok_or_else(|| anyhow::anyhow!("no directory for the bench binary"))?;
    anyhow::ensure!(
        exe.exists(),
        "{} is missing: run `cargo build --release -p hub` first",
        exe.display()
    );
    let data = std::env::temp_dir().join(format!("drover-bench-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let (first_ms, first_rss) = one_start(&exe, &data).await?;
    let (restart_ms, restart_rss) = one_start(&exe, &data).await?;
    let _ = std::fs::remove_dir_all(&data);
    let dir = exe.parent().unwrap_or(std::path::Path::new("."));
    let mut sizes = serde_json::Map::new();
    for name in BINARIES {
        if let Ok(meta) = std::fs::metadata(dir.join(name)) {
            let mib = meta.len() as f64 / (1024.0 * 1024.0);
            sizes.insert(name.to_owned(), json!((mib * 10.0).round() / 10.0));
        }
    }
    Ok(json!({
        "scenario": "hub",
        "binary_mib": sizes,
        "exec_to_readyz_ms_first_start": first_ms,
        "exec_to_readyz_ms_restart": restart_ms,
        "idle_rss_mib_first_start": first_rss,
        "idle_rss_mib_restart": restart_rss,
        "idle_seconds_before_rss": IDLE.as_secs(),
    }))
}
