//! Helpers for end-to-end tests: start the real binaries (built by `cargo test --workspace`
//! before any test runs), read what they print, and speak HTTPS to them.

// Test support: a failure to set up is a failed test, said plainly by a panic.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

pub mod browser;
pub mod cloud;
pub mod delivery;
pub mod ec2_front;
pub mod eks_auth;
pub mod eks_front;
pub mod etcd_proxy;
pub mod git_http;
pub mod github;
pub mod guide;
pub mod ha;
pub mod hosts;
pub mod imported;
pub mod ldap;
pub mod local_host;
pub mod oidc;
pub mod signin;
pub mod sshd;
pub mod system_agent;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// Path of a workspace binary next to the running test executable (`target/<profile>/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>; a binary using these helpers
    // (the bench) is in target/<profile>/ itself.
    let parent = exe.parent().expect("target directory");
    let dir = if parent.ends_with("deps") {
        parent.parent().expect("target directory")
    } else {
        parent
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// A loopback port free now (for a server that must be told its port before it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// Runs `command` with `sh -c`; panics with its stderr unless it succeeds. Its stdout.
pub fn sh(command: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `command` with `sh -c`, whatever comes of it (clean-ups of what may not exist).
pub fn quiet(command: &str) {
    let _ = std::process::Command::new("sh")
        .args(["-c", command])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// What a `drover-hub` client command did.
#[derive(Debug)]
pub struct CliRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `drover-hub ARGS --config CONFIG` with `stdin`, as a person at a shell would.
pub fn hub_cli(config: &Path, args: &[&str], stdin: &str) -> CliRun {
    let config = config.to_str().unwrap();
    let args: Vec<&str> = args.iter().copied().chain(["--config", config]).collect();
    hub_command(&args, stdin)
}

/// Runs `drover-hub ARGS` with `stdin`, with none of the caller's `DROVER_*` settings.
pub fn hub_command(args: &[&str], stdin: &str) -> CliRun {
    use std::io::Write as _;
    let mut command = std::process::Command::new(binary("drover-hub"));
    command.args(args);
    for (name, _) in std::env::vars().filter(|(k, _)| k.starts_with("DROVER_")) {
        command.env_remove(name);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    CliRun {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The new admin password `drover-hub reset-admin-password` printed (its indented line).
pub fn printed_password(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with("    "))
        .unwrap_or_else(|| panic!("no password in {stdout:?}"))
        .trim()
        .to_owned()
}

/// Whether `user` can log in with `password` (the API's answer: 200, or 401 refused).
pub async fn logs_in(addr: SocketAddr, user: &str, password: &str) -> bool {
    let (status, value) = login_answer(addr, user, password).await;
    assert!(matches!(status, 200 | 401), "{status} {value}");
    status == 200
}

/// `POST /v1/login` for an API token: the status and the answer.
async fn login_answer(addr: SocketAddr, user: &str, password: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"username": user, "password": password, "session": false});
    api(addr, "POST", "/v1/login", None, Some(body)).await
}

/// A `drover-hub serve` process.
#[derive(Debug)]
pub struct HubProcess {
    child: Child,
    pub addr: SocketAddr,
    pub ca_checksum: String,
    /// The bootstrap admin password, if this start printed one.
    pub admin_password: Option<String>,
    /// Every line the hub has written to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

/// The unprivileged user tests run a person's commands as, when they run as root.
pub const NOBODY: &str = "65534";

impl HubProcess {
    /// Starts the hub on 127.0.0.1 port 0 with `data_dir`; returns once it says it is up.
    pub async fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &["--listen", "127.0.0.1:0"]).await
    }

    /// As [`HubProcess::start`], with `serve` flags of the caller's choosing.
    pub async fn start_with(data_dir: &Path, flags: &[&str]) -> Self {
        Self::start_with_env(data_dir, flags, &[]).await
    }

    /// As [`HubProcess::start_with`], with `env` added to the environment it inherits.
    pub async fn start_with_env(data_dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(binary("drover-hub"));
        command.arg("serve").args(flags).envs(env.iter().copied());
        Self::spawn(command, data_dir).await
    }

    /// As [`HubProcess::start`], on a port chosen first so the hub's URL (`--server-url`) is
    /// the address the test reaches it by: what a provider's redirect back to the hub needs.
    pub async fn start_at_own_url(data_dir: &Path) -> Self {
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        Self::start_with(
            data_dir,
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--server-url",
                &url,
            ],
        )
        .await
    }

    /// `drover-sim demo CLUSTERS`: the hub with a simulated fleet in one process, on
    /// 127.0.0.1 port 0 with `data_dir`.
    /// As a person would run it: with no root privileges (as `nobody`, by `setpriv`, when the
    /// tests run as root), its data directory theirs.
    pub async fn start_demo(data_dir: &Path, clusters: usize) -> Self {
        let mut command = if hosts::is_root() {
            std::fs::create_dir_all(data_dir).unwrap();
            // The way to it must be open to others (a test run's temp directory is 0700).
            for dir in data_dir.ancestors().skip(1) {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir).unwrap().permissions().mode();
                if mode & 0o001 == 0 {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001))
                        .unwrap();
                }
            }
            let chowned = std::process::Command::new("chown")
                .args([&format!("{NOBODY}:{NOBODY}"), data_dir.to_str().unwrap()])
                .status()
                .unwrap();
            assert!(chowned.success());
            let mut command = Command::new("setpriv");
            command
                .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
                .arg(binary("drover-sim"));
            command
        } else {
            Command::new(binary("drover-sim"))
        };
        command
            .args(["demo", &clusters.to_string()])
            .args(["--listen", "127.0.0.1:0"]);
        Self::spawn(command, data_dir).await
    }

    /// Runs `command` (a hub, told its data directory here) until it says it is up.
    async fn spawn(mut command: Command, data_dir: &Path) -> Self {
        let mut child = command
            .arg("--data-dir")
            .arg(data_dir)
            .env("DROVER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the hub");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let mut errors = BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = errors.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        // stdout: the first-start password block, then "Drover hub is up" and its three lines.
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut printed = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = out.next_line().await.unwrap() {
                let done = line.trim_start().starts_with("CA checksum:");
                printed.push(line);
                if done {
                    return true;
                }
            }
            false
        })
        .await
        .expect("drover-hub up within 60 s");
        assert!(
            read,
            "drover-hub exited before it was up: {:?}",
            log.lock().unwrap()
        );
        tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
        let value = |label: &str| {
            printed
                .iter()
                .find_map(|l| l.trim_start().strip_prefix(label))
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|| panic!("no {label} in {printed:?}"))
        };
        let admin_password = printed
            .iter()
            .position(|l| l.contains("with password"))
            .and_then(|i| printed.iter().skip(i + 1).find(|l| !l.trim().is_empty()))
            .map(|l| l.trim().to_owned());
        if let Some(password) = &admin_password {
            note_secret(password);
        }
        Self {
            addr: value("listening on:").parse().unwrap(),
            ca_checksum: value("CA checksum:"),
            admin_password,
            child,
            log,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// `drover-hub login` as the admin (with the password this start printed), into a CLI
    /// config `dir/cli.json`; returns its path.
    pub fn cli_login(&self, dir: &Path) -> PathBuf {
        let config = dir.join("cli.json");
        let password = self.admin_password.clone().unwrap();
        let r = hub_cli(
            &config,
            &[
                "login",
                "--server",
                &self.url(),
                "--password-stdin",
                "--ca-checksum",
                &self.ca_checksum,
            ],
            &format!("{password}\n"),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        config
    }

    /// The process's environment as the system shows it (`/proc/PID/environ`): what the hub
    /// runs with, not what it was started with.
    pub fn environment(&self) -> HashMap<String, String> {
        let pid = self.child.id().expect("hub still running");
        let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        raw.split(|b| *b == 0)
            .filter_map(|pair| {
                let pair = String::from_utf8_lossy(pair);
                let (name, value) = pair.split_once('=')?;
                Some((name.to_string(), value.to_string()))
            })
            .collect()
    }

    /// Kills the process at once (SIGKILL), as a crash or power cut would.
    pub async fn kill(mut self) {
        self.crash().await;
    }

    /// As [`HubProcess::kill`], keeping the handle (to replace it with a new start).
    pub async fn crash(&mut self) {
        self.child.kill().await.unwrap();
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

/// Where `text` holds a token's secret part (`drt_`/`drr_` name, a dot, then the secret), or
/// any of `secrets`: for checking that logs never hold a credential.
pub fn leaked_secrets(text: &str, secrets: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = secrets
        .iter()
        .filter(|s| !s.is_empty() && text.contains(*s))
        .map(|s| format!("{}…", s.chars().take(8).collect::<String>()))
        .collect();
    for prefix in ["drt_", "drr_"] {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let name_len = rest
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(rest.len());
            let after = &rest[name_len..];
            if let Some(secret) = after.strip_prefix('.') {
                let secret_len = secret
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                    .unwrap_or(secret.len());
                if secret_len >= 8 {
                    found.push(format!("{prefix}{}.…", &rest[..name_len]));
                }
            }
        }
    }
    found
}

/// An HTTP/1.1 connection to the hub over TLS, without verifying the certificate (checks of
/// what the server sends, such as `/cacerts`, verify the bytes themselves).
async fn connect(
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>> {
    try_connect(addr).await.unwrap()
}

/// One HTTPS connection to a hub from the loopback address `source` (the hub counts some
/// limits per address): requests go one after another on it.
#[derive(Debug)]
pub struct ClientFrom {
    sender: hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>,
    addr: SocketAddr,
}

impl ClientFrom {
    pub async fn connect(source: std::net::IpAddr, addr: SocketAddr) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(source, 0)).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(tunnel::tls::unverified_client_config())
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        ClientFrom { sender, addr }
    }

    /// `GET path`: the status and where a redirect points (empty if none).
    pub async fn get(&mut self, path: &str) -> (u16, String) {
        let (status, headers) = self.get_headers(path).await;
        let location = headers
            .get(http::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (status, location)
    }

    /// `GET path`: the status and the answer's headers.
    pub async fn get_headers(&mut self, path: &str) -> (u16, http::HeaderMap) {
        self.sender.ready().await.unwrap();
        let response = self
            .sender
            .send_request(request(self.addr, "GET", path, None, None))
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let _ = response.into_body().collect().await;
        (status, headers)
    }
}

async fn try_connect(
    addr: SocketAddr,
) -> Result<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>, String> {
    let config = tunnel::tls::unverified_client_config();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect("127.0.0.1".try_into().unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> http::Request<http_body_util::Full<Bytes>> {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string());
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let body = match body {
        Some(v) => {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    request.body(http_body_util::Full::new(body)).unwrap()
}

/// GET `path` without credentials; returns the status and the raw body.
pub async fn https_get(addr: SocketAddr, path: &str) -> (u16, Bytes) {
    https_get_as(addr, path, None).await
}

/// GET `path` with `token`, if any; returns the status and the raw body.
pub async fn https_get_as(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, Bytes) {
    let mut sender = connect(addr).await;
    let response = sender
        .send_request(request(addr, "GET", path, token, None))
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// A JSON request; returns the status and the body as JSON (`Null` if empty).
pub async fn api(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    try_api(addr, method, path, token, body).await.unwrap()
}

/// As [`api`], reporting connection failures (a hub being killed) instead of panicking.
pub async fn try_api(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> Result<(u16, serde_json::Value), String> {
    send_json(addr, method, path, token, body, &[]).await
}

/// As [`api`], with more request headers (as a client that sends its own would).
pub async fn api_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    send_json(addr, method, path, token, body, headers)
        .await
        .unwrap()
}

async fn send_json(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
    headers: &[(&str, &str)],
) -> Result<(u16, serde_json::Value), String> {
    let mut sender = try_connect(addr).await?;
    let mut request = request(addr, method, path, token, body.as_ref());
    for (name, value) in headers {
        request.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?,
            http::HeaderValue::from_str(value).map_err(|e| e.to_string())?,
        );
    }
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let value = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    // Passwords and secrets sent, tokens received: none may be in any audit log of the run.
    if let Some(body) = &body {
        secrets_in(path, body);
    }
    if let Some(token) = value.get("token").and_then(serde_json::Value::as_str) {
        note_secret(token);
    }
    Ok((status, value))
}

/// `POST /v3/register` with a registration token, as an agent would; returns the status and
/// the answer.
pub async fn api_as_agent(
    addr: SocketAddr,
    registration: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    api(addr, "POST", "/v3/register", Some(registration), Some(body)).await
}

/// A GET as `token`; returns the status, the response's headers and the body as text.
/// POSTs `body` to `path` with `headers` and no token (a webhook's call); the status and text.
pub async fn post_raw(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, String) {
    let mut sender = connect(addr).await;
    let mut request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header(http::header::HOST, addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

pub async fn api_with_headers(
    addr: SocketAddr,
    path: &str,
    token: &str,
) -> (u16, http::HeaderMap, String) {
    let mut sender = connect(addr).await;
    let response = sender
        .send_request(request(addr, "GET", path, Some(token), None))
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// A request whose answer is text (a kubeconfig, a manifest); returns the status and the text.
pub async fn api_text(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut sender = connect(addr).await;
    let response = sender
        .send_request(request(addr, method, path, token, None))
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Creates the imported cluster `name` as `admin`; returns its registration token.
/// Creates `body` at `/v1/{plural}` on `hub` as `token`; panics unless 201. The object made.
pub async fn create(
    hub: &HubProcess,
    token: &str,
    plural: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let (status, created) = api(
        hub.addr,
        "POST",
        &format!("/v1/{plural}"),
        Some(token),
        Some(body),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created
}

pub async fn create_imported_cluster(addr: SocketAddr, admin: &str, name: &str) -> String {
    let (status, cluster) = api(
        addr,
        "POST",
        "/v1/clusters",
        Some(admin),
        Some(serde_json::json!({"metadata": {"name": name}, "spec": {"type": "imported"}})),
    )
    .await;
    assert_eq!(status, 201, "{cluster}");
    cluster["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Creates the custom cluster `name` as `admin` with `spec` (its `type` is filled in); returns
/// the registration the hub answers with (`token`, `hostCommand`).
pub async fn create_custom_cluster(
    addr: SocketAddr,
    admin: &str,
    name: &str,
    mut spec: serde_json::Value,
) -> serde_json::Value {
    spec["type"] = serde_json::json!("custom");
    let (status, cluster) = api(
        addr,
        "POST",
        "/v1/clusters",
        Some(admin),
        Some(serde_json::json!({"metadata": {"name": name}, "spec": spec})),
    )
    .await;
    assert_eq!(status, 201, "{cluster}");
    cluster["registration"].clone()
}

/// Logs in as `user`; returns an API token.
pub async fn login(addr: SocketAddr, user: &str, password: &str) -> String {
    let (status, value) = login_answer(addr, user, password).await;
    assert_eq!(status, 200, "{value}");
    value["token"].as_str().unwrap().to_owned()
}

/// Watches `path` (server-sent events) until `wanted` accepts an event's data; panics after
/// `within`. This is how tests wait for the hub to reach a state, without polling.
pub async fn wait_for_event(
    addr: SocketAddr,
    path: &str,
    token: &str,
    within: Duration,
    mut wanted: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut sender = connect(addr).await;
    let response = sender
        .send_request(request(addr, "GET", path, Some(token), None))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut pending = String::new();
    tokio::time::timeout(within, async {
        loop {
            let frame = body.frame().await.expect("watch ended").unwrap();
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    let value: serde_json::Value = serde_json::from_str(data).unwrap();
                    if wanted(&value) {
                        return value;
                    }
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no matching event on {path} within {within:?}"))
}

/// Remembers a password, secret or token the tests used, in the file `$DROVER_SECRETS_SEEN`
/// names (`scripts/test` sets it): after the whole run, no audit log of any hub may hold one.
/// A value of any length counts: a short one (which as a bare substring would match text
/// that merely contains it) is looked for as a whole JSON string, as the log would hold it,
/// plain or inside another JSON string (kubectl's last-applied-configuration).
pub fn note_secret(secret: &str) {
    use std::io::Write as _;
    let Some(file) = std::env::var_os("DROVER_SECRETS_SEEN") else {
        return;
    };
    if secret.is_empty() || secret.contains('\n') {
        return;
    }
    let patterns = if secret.len() >= 12 {
        vec![secret.to_owned()]
    } else {
        let quoted = serde_json::Value::from(secret).to_string();
        let inner = serde_json::Value::from(quoted.clone()).to_string();
        vec![quoted, inner[1..inner.len() - 1].to_owned()]
    };
    if let Ok(mut out) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
    {
        // One write: appends from several test processes do not interleave.
        let _ = out.write_all(format!("{}\n", patterns.join("\n")).as_bytes());
    }
}

/// The hub's own kinds whose objects are made of secrets, by API plural (an AuthProvider's
/// two secrets are named as such: `bindPassword`, `clientSecret`).
const SECRET_KINDS: &[&str] = &["projectsecrets", "cloudcredentials"];

/// Whether a request to `path` carries secrets whatever its fields are called: a Secret
/// through the proxy, or one of the hub's secret-bearing kinds.
fn secret_bearing(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["k8s", "clusters", _, rest @ ..] => {
            let tail = match rest {
                ["api", _, tail @ ..] | ["apis", _, _, tail @ ..] => tail,
                _ => return false,
            };
            let tail = match tail {
                ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
                other => other,
            };
            tail.first() == Some(&"secrets")
        }
        ["v1", plural, ..] => SECRET_KINDS.contains(plural),
        _ => false,
    }
}

/// Fields of a secret-bearing body that name or describe rather than hold a secret.
const NOT_SECRET: &[&str] = &[
    "metadata",
    "kind",
    "apiVersion",
    "type",
    "driver",
    "cluster",
    "project",
    "region",
    "endpoint",
    "endpointCA",
    "certificate",
    "username",
    "op",
    "path",
    "from",
];

/// Notes every secret a request body to `path` sends: every value of a secret-bearing
/// request (but what only names or describes), and elsewhere every value under a key that
/// names a secret (password, secret, token, key data) or a Secret's data.
fn secrets_in(path: &str, body: &serde_json::Value) {
    fn all(value: &serde_json::Value) {
        match value {
            serde_json::Value::String(text) => note_secret(text),
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    if !NOT_SECRET.contains(&key.as_str()) {
                        all(value);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(all),
            _ => {}
        }
    }
    fn named(body: &serde_json::Value) {
        match body {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let key = key.to_ascii_lowercase();
                    let secret = ["password", "secret", "token"]
                        .iter()
                        .any(|k| key.contains(k))
                        || key == "stringdata";
                    if secret {
                        all(value);
                    } else {
                        named(value);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(named),
            _ => {}
        }
    }
    if secret_bearing(path) {
        all(body);
    } else {
        named(body);
    }
}

/// Waits until `check` holds, polling every 200 ms (for what no watch reports: files, kubectl's
/// answers); panics naming `what` after `within`. Returns how long it took.
pub async fn until<F: AsyncFn() -> bool>(
    what: &str,
    within: std::time::Duration,
    check: F,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    started.elapsed()
}

/// Does `change`, then waits until a watch of `/v1/<plural>` from before it sends an event
/// `wanted` accepts (so an event the change caused at once is not missed).
pub async fn after_change(
    addr: SocketAddr,
    admin: &str,
    plural: &str,
    change: impl std::future::Future<Output = ()>,
    wanted: impl FnMut(&serde_json::Value) -> bool,
) {
    let (_, list) = api(addr, "GET", &format!("/v1/{plural}"), Some(admin), None).await;
    let from = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    change.await;
    wait_for_event(
        addr,
        &format!("/v1/{plural}?watch=true&resourceVersion={from}"),
        admin,
        Duration::from_secs(60),
        wanted,
    )
    .await;
}

/// Does `change`, then waits (watching tokens from before it) until the API token `token` is
/// deleted, and checks it no longer authenticates: how tests see a user's access revoked.
pub async fn revoked_by(
    addr: SocketAddr,
    admin: &str,
    token: &str,
    change: impl std::future::Future<Output = ()>,
) {
    let name = token
        .strip_prefix("drt_")
        .and_then(|t| t.split_once('.'))
        .expect("an API token")
        .0
        .to_owned();
    after_change(addr, admin, "tokens", change, |e| {
        e["type"] == "DELETED" && e["object"]["metadata"]["name"] == name.as_str()
    })
    .await;
    let (status, _) = api(addr, "GET", "/v1/me", Some(token), None).await;
    assert_eq!(status, 401, "the token still works");
}

#[cfg(test)]
mod tests {
    use super::leaked_secrets;

    #[test]
    fn a_token_secret_or_a_password_in_text_is_found_a_token_name_is_not() {
        assert!(leaked_secrets("revoked token drt_k3j2h1 of admin", &[]).is_empty());
        assert_eq!(
            leaked_secrets("bearer drt_k3j2h1.Zx9_qWe-rTy12 sent", &[]),
            ["drt_k3j2h1.…"]
        );
        assert_eq!(
            leaked_secrets("import drr_a1.b2c3d4e5f6g7h8.yaml", &[]).len(),
            1
        );
        assert_eq!(
            leaked_secrets("password=hunter2-is-long", &["hunter2-is-long"]),
            ["hunter2-…"]
        );
    }
}
