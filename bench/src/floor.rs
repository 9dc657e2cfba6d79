//! The floor of `bench fleet`: what any WebSocket hub must pay per agent. A minimal server on
//! the hub's runtime (tokio's multi-threaded runtime and mimalloc, as `drover-hub` runs; TLS by
//! rustls with the hub's provider; WebSocket by tokio-tungstenite) holds N bare TLS + WebSocket
//! connections, as its own process (`bench floor-server`, so its memory and CPU are read from
//! `/proc` as the hub's are); no yamux, no gRPC, no registry, no store. Its clients, in the
//! bench's process, dial as the fleet does (at most as many handshakes at once as the fleet
//! allows) and then only keep their connection alive: a WebSocket ping every beat interval,
//! which the server answers, the least an idle connection must carry for either end to notice
//! the other is gone.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::{SinkExt as _, StreamExt as _};
use tokio::{io::AsyncBufReadExt as _, process::Child};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug)]
pub(crate) struct ServerArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// The server's certificate and key (PEM).
    #[arg(long)]
    cert: std::path::PathBuf,
    #[arg(long)]
    key: std::path::PathBuf,
}

/// `bench floor-server`: accepts TLS, upgrades to WebSocket, answers pings, until killed.
/// Prints `listening PORT` once it accepts.
pub(crate) async fn serve(args: ServerArgs) -> anyhow::Result<serde_json::Value> {
    let config =
        tunnel::tls::server_config(&std::fs::read(&args.cert)?, &std::fs::read(&args.key)?)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    #[allow(clippy::print_stdout)] // the parent reads the port from it
    {
        println!("listening {}", listener.local_addr()?.port());
    }
    loop {
        let (tcp, _) = listener.accept().await?;
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let Ok(mut ws) = tokio_tungstenite::accept_async_with_config(tls, Some(lean())).await
            else {
                return;
            };
            // tungstenite queues the pong for each ping it reads; a flush sends it.
            while let Some(Ok(message)) = ws.next().await {
                if message.is_close() {
                    break;
                }
                if ws.flush().await.is_err() {
                    break;
                }
            }
        });
    }
}

/// tungstenite with small buffers: its defaults (128 KiB to read, 128 KiB before a write) are
/// for throughput, and would make the floor's memory per connection several times the hub's.
fn lean() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0)
}

/// The floor server, running as a process of its own.
pub(crate) struct Floor {
    child: Child,
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    client: Arc<rustls::ClientConfig>,
}

impl Floor {
    /// Starts `bench floor-server` (this executable) with a certificate made in `dir`.
    pub(crate) async fn start(dir: &Path) -> anyhow::Result<Floor> {
        std::fs::create_dir_all(dir)?;
        let ca = tunnel::tls::CertificateAuthority::generate("floor")?;
        let served = ca.issue_server(&["localhost".into(), "127.0.0.1".into()])?;
        let (cert, key) = (dir.join("floor.pem"), dir.join("floor-key.pem"));
        std::fs::write(&cert, &served.cert_pem)?;
        std::fs::write(&key, &served.key_pem)?;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["floor-server", "--listen", "127.0.0.1:0", "--cert"])
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().context("floor server pid")?;
        let stdout = child.stdout.take().context("floor server output")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let port: u16 = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the floor server did not start")??
            .and_then(|l| l.strip_prefix("listening ")?.parse().ok())
            .context("the floor server did not say its port")?;
        let client =
            tunnel::tls::client_config(tunnel::tls::roots_from_pem(ca.pem().cert_pem.as_bytes())?);
        Ok(Floor {
            child,
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            client,
        })
    }

    /// `n` clients, at most `concurrency` handshakes at once, each pinging every `interval`
    /// once connected, until `stop`; the count of those connected.
    pub(crate) fn connect(
        &self,
        n: usize,
        concurrency: usize,
        interval: Duration,
        stop: &CancellationToken,
    ) -> Arc<AtomicUsize> {
        let connected = Arc::new(AtomicUsize::new(0));
        let handshakes = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        for i in 0..n {
            let (connected, handshakes, stop) =
                (connected.clone(), handshakes.clone(), stop.clone());
            let (addr, client) = (self.addr, self.client.clone());
            tokio::spawn(async move {
                let opened = async {
                    let _permit = handshakes.acquire().await.ok()?;
                    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
                    let _ = tcp.set_nodelay(true);
                    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
                    let tls = tokio_rustls::TlsConnector::from(client)
                        .connect(name, tcp)
                        .await
                        .ok()?;
                    let url = format!("wss://localhost:{}/v3/connect", addr.port());
                    tokio_tungstenite::client_async_with_config(url, tls, Some(lean()))
                        .await
                        .ok()
                };
                let Some((mut ws, _)) = opened.await else {
                    tracing::warn!(client = i, "a floor client did not connect");
                    return;
                };
                connected.fetch_add(1, Ordering::Relaxed);
                // The beats' schedule: the first at once, then every interval.
                let mut next = Instant::now();
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep_until(next.into()) => {
                            if ws.send(Message::Ping(Vec::new().into())).await.is_err() {
                                break;
                            }
                            next += interval;
                        }
                        message = ws.next() => match message {
                            Some(Ok(_)) => {}
                            _ => break,
                        },
                    }
                }
                connected.fetch_sub(1, Ordering::Relaxed);
                let _ = ws.close(None).await;
            });
        }
        connected
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
