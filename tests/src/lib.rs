//! Helpers for end-to-end tests: start the real binaries (built by `cargo test --workspace`
//! before any test runs), read what they print, and speak HTTPS to them.

// Test support: a failure to set up is a failed test, said plainly by a panic.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Path of a workspace binary next to the running test executable (`target/<profile>/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// A fresh, empty directory under the system's temporary directory.
pub fn temp_dir(label: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "drover-e2e-{label}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `drover-hub serve` process.
#[derive(Debug)]
pub struct HubProcess {
    child: Child,
    pub addr: SocketAddr,
    pub ca_checksum: String,
    /// Every line the hub has written to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl HubProcess {
    /// Starts the hub on 127.0.0.1 port 0 with `data_dir`; returns once it says it is up.
    pub async fn start(data_dir: &Path) -> Self {
        let mut child = Command::new(binary("drover-hub"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("DROVER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start drover-hub");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let up = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                log.lock().unwrap().push(line.clone());
                if line.contains("hub is up") {
                    return line;
                }
            }
            panic!(
                "drover-hub exited before it was up: {:?}",
                log.lock().unwrap()
            );
        })
        .await
        .expect("drover-hub up within 60 s");
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        let field = |name: &str| {
            up.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= in {up:?}"))
                .to_owned()
        };
        Self {
            addr: field("listen").parse().unwrap(),
            ca_checksum: field("ca_checksum"),
            child,
            log,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub async fn terminate(mut self) -> bool {
        let pid = self.child.id().expect("hub still running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("hub exits within 30 s of SIGTERM")
            .unwrap();
        status.success()
    }
}

/// GET `path` from `addr` over TLS without verifying the certificate (for checks of what the
/// server sends, such as `/cacerts`, whose bytes the caller verifies).
pub async fn https_get(addr: SocketAddr, path: &str) -> (u16, Bytes) {
    let config = tunnel::tls::unverified_client_config();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}
