//! A stand-in for the K3s and RKE2 installers, because their binaries cannot be downloaded on
//! these machines. Tests serve, as the hub's air-gap artifact `k3s-install.sh`, a script that
//! runs `drover-sim install k3s`; everything around it is the real thing: the plan fetches the
//! artifacts from the hub, writes the distribution's own `config.yaml`, passes the installer's
//! own environment (`INSTALL_K3S_VERSION`, `INSTALL_K3S_EXEC`, `INSTALL_RKE2_VERSION`,
//! `INSTALL_RKE2_TYPE`), probes the ports the distribution serves, and uninstalls with the
//! script the installer left (`/usr/local/bin/k3s-uninstall.sh`, …).
//!
//! "Installing" starts a node service (`drover-sim serve-node`) in the background, as the
//! installer's systemd unit would. On the first server it runs a simulated API server on :6443
//! (answering `/readyz`), writes the admin kubeconfig and the node token where the
//! distribution writes them, and applies the auto-deploy manifests directory, running the
//! `drover-cluster-agent` Deployment as a process (the one container a stand-in can run). Every
//! node answers the kubelet's `http://127.0.0.1:10248/healthz`, etcd nodes etcd's
//! `http://127.0.0.1:2381/health`, and each node keeps its Node object in the cluster. A joined
//! server answers probes with an API server of its own but registers its Node with the first
//! server, which holds the cluster's state. Each completed run is counted in
//! `/var/lib/rancher/<dist>/drover-sim-installs`, so tests can check a plan ran the installer
//! exactly once.

use std::{
    io::Write,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;
use serde_json::Value;

pub mod artifacts;
mod day2;
mod node;
pub use day2::{client_cert_path, command, systemctl, units};
pub use node::serve_node;

/// `path` on this host: under its root directory when it shares its machine with others (the
/// system-agent's `DROVER_ROOT`, which the plan's instructions, and so the installer and the
/// service it starts, inherit), else the machine's own.
pub fn rooted(path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    match std::env::var_os("DROVER_ROOT").filter(|r| !r.is_empty()) {
        Some(root) => Path::new(&root).join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_owned(),
    }
}

/// This host's own loopback address (the system-agent's `DROVER_LOOPBACK`, else 127.0.0.1):
/// where its services listen for what the real ones serve on 127.0.0.1, so that several hosts
/// on one machine each have their own ports.
pub fn loopback() -> std::net::Ipv4Addr {
    std::env::var("DROVER_LOOPBACK")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST)
}

/// Which distribution is stood in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Distribution {
    K3s,
    Rke2,
}

impl Distribution {
    pub fn name(self) -> &'static str {
        match self {
            Distribution::K3s => "k3s",
            Distribution::Rke2 => "rke2",
        }
    }

    /// `/etc/rancher/<dist>/config.yaml`, which the real distribution reads too.
    pub fn config_path(self) -> PathBuf {
        rooted(format!("/etc/rancher/{}/config.yaml", self.name()))
    }

    /// `/var/lib/rancher/<dist>`.
    pub fn data_dir(self) -> PathBuf {
        rooted(format!("/var/lib/rancher/{}", self.name()))
    }

    /// Where the distribution writes the admin kubeconfig.
    pub fn kubeconfig_path(self) -> PathBuf {
        rooted(format!("/etc/rancher/{0}/{0}.yaml", self.name()))
    }

    pub fn node_token_path(self) -> PathBuf {
        self.data_dir().join("server/node-token")
    }

    pub fn manifests_dir(self) -> PathBuf {
        self.data_dir().join("server/manifests")
    }

    /// The run counter tests read.
    pub fn installs_path(self) -> PathBuf {
        self.data_dir().join("drover-sim-installs")
    }

    fn env_names(self) -> (&'static str, &'static str) {
        match self {
            Distribution::K3s => ("INSTALL_K3S_VERSION", "INSTALL_K3S_EXEC"),
            Distribution::Rke2 => ("INSTALL_RKE2_VERSION", "INSTALL_RKE2_TYPE"),
        }
    }
}

/// The distribution's `config.yaml`, as far as the stand-in uses it (other keys are ignored,
/// as they would be meaningful only to the real thing).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct NodeConfig {
    pub server: Option<String>,
    pub token: Option<String>,
    pub node_name: Option<String>,
    pub node_ip: Option<String>,
    pub node_label: Vec<String>,
    pub node_taint: Vec<String>,
    pub node_external_ip: Option<String>,
    pub tls_san: Vec<String>,
    pub cluster_init: bool,
    pub disable_apiserver: bool,
    pub disable_etcd: bool,
    /// kube-apiserver's flags (`name=value`): the stand-in honours the token webhook's.
    pub kube_apiserver_arg: Vec<String>,
}

impl NodeConfig {
    pub fn read(dist: Distribution) -> Result<NodeConfig, String> {
        let path = dist.config_path();
        match std::fs::read_to_string(&path) {
            Ok(text) if text.trim().is_empty() => Ok(NodeConfig::default()),
            Ok(text) => {
                serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NodeConfig::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// The value of kube-apiserver flag `name` (the last one given wins, as with flags).
    fn apiserver_arg(&self, name: &str) -> Option<&str> {
        self.kube_apiserver_arg.iter().rev().find_map(|a| {
            a.trim_start_matches('-')
                .strip_prefix(name)?
                .strip_prefix('=')
        })
    }

    /// The token webhook kube-apiserver's flags configure, if any.
    fn token_webhook(&self) -> Result<Option<crate::cluster::webhook::TokenWebhook>, String> {
        let Some(file) = self.apiserver_arg("authentication-token-webhook-config-file") else {
            return Ok(None);
        };
        let ttl = match self.apiserver_arg("authentication-token-webhook-cache-ttl") {
            None => crate::cluster::webhook::DEFAULT_TTL,
            Some(text) => crate::cluster::webhook::go_duration(text).map_err(|e| {
                format!("kube-apiserver-arg authentication-token-webhook-cache-ttl={text:?}: {e}")
            })?,
        };
        let version = self
            .apiserver_arg("authentication-token-webhook-version")
            .unwrap_or("v1beta1");
        crate::cluster::webhook::TokenWebhook::from_config_file(&rooted(file), version, ttl)
            .map(Some)
    }

    fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "node".into())
        })
    }
}

/// What `install` recorded: the version and whether this node is a server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Installed {
    version: String,
    server: bool,
}

fn read_installed(dist: Distribution) -> Result<Installed, String> {
    let path = dist.data_dir().join("installed");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}; run `drover-sim install` first", path.display()))?;
    let mut lines = text.lines();
    Ok(Installed {
        version: lines.next().unwrap_or_default().to_owned(),
        server: lines.next() == Some("server"),
    })
}

/// `drover-sim install <dist>`: what the real installer does, as far as a plan can tell.
pub fn install(dist: Distribution) -> Result<String, String> {
    let (version_var, type_var) = dist.env_names();
    let version = std::env::var(version_var)
        .ok()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("{version_var} is required (the version to install)"))?;
    let kind = std::env::var(type_var).unwrap_or_else(|_| "server".into());
    let server = match kind.split_whitespace().next().unwrap_or("server") {
        "server" => true,
        "agent" => false,
        other => return Err(format!("{type_var}={other:?}: expected server or agent")),
    };
    let config = NodeConfig::read(dist)?;
    if !server && (config.server.is_none() || config.token.is_none()) {
        return Err(format!(
            "{}: an agent needs `server` and `token`",
            dist.config_path().display()
        ));
    }
    let data = dist.data_dir();
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    // The real installer spends a while downloading; so does this one (DROVER_SIM_INSTALL_SECONDS,
    // default 1), which gives tests a window to interrupt it.
    let seconds = std::env::var("DROVER_SIM_INSTALL_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    // As the real installer says what it is doing while it downloads.
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "[INFO] stand-in {} {version}: downloading ({seconds} s, DROVER_SIM_INSTALL_SECONDS)",
            dist.name()
        );
    }
    std::thread::sleep(Duration::from_secs_f64(seconds.clamp(0.0, 600.0)));
    std::fs::write(
        data.join("installed"),
        format!("{version}\n{}\n", if server { "server" } else { "agent" }),
    )
    .map_err(|e| e.to_string())?;
    stop_service(dist);
    let pid = start_service(dist)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // The distribution's own command (`k3s etcd-snapshot …`, `rke2 certificate rotate`): the
    // K3s installer downloads it unless told the binary is in place (an air-gapped install
    // put it there), the RKE2 installer unpacks it from its tarball.
    let skip = dist == Distribution::K3s
        && std::env::var("INSTALL_K3S_SKIP_DOWNLOAD").is_ok_and(|v| v == "true");
    if !skip {
        write_script(
            &rooted("/usr/local/bin").join(dist.name()),
            &binary_script(dist, &exe, &version),
        )?;
    }
    // A test's network namespace has no systemd: a `systemctl` for the stand-in's units.
    write_script(
        &rooted("/usr/local/bin/systemctl"),
        &format!(
            "#!/bin/sh\n# stand-in: no systemd in this network namespace\nexec {} systemctl \"$@\"\n",
            exe.display()
        ),
    )?;
    // The uninstall script the real installer leaves behind.
    let uninstall = match (dist, server) {
        (Distribution::K3s, true) => "/usr/local/bin/k3s-uninstall.sh",
        (Distribution::K3s, false) => "/usr/local/bin/k3s-agent-uninstall.sh",
        (Distribution::Rke2, _) => "/usr/local/bin/rke2-uninstall.sh",
    };
    let uninstall = rooted(uninstall);
    write_script(
        &uninstall,
        &format!(
            "#!/bin/sh\n# stand-in for the {0} uninstall script\nrm -f '{2}'\nexec {1} uninstall {0}\n",
            dist.name(),
            exe.display(),
            uninstall.display()
        ),
    )?;
    // Counted once the install is complete: an interrupted run does not count.
    let mut runs = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dist.installs_path())
        .map_err(|e| e.to_string())?;
    writeln!(
        runs,
        "{version} {}",
        if server { "server" } else { "agent" }
    )
    .map_err(|e| e.to_string())?;
    Ok(format!(
        "[INFO] stand-in {} {version} installed as {}; service started (pid {})",
        dist.name(),
        if server { "server" } else { "agent" },
        pid
    ))
}

/// The stand-in for the distribution's binary: a script running `drover-sim <dist>`.
pub fn binary_script(dist: Distribution, sim: &Path, version: &str) -> String {
    format!(
        "#!/bin/sh\n# stand-in for the {0} {version} binary\nexec {1} {0} \"$@\"\n",
        dist.name(),
        sim.display()
    )
}

/// Starts the node service, as systemd would run it: its own process group, no pipes back to
/// whoever started it (the installer's output is read to its end by the system-agent).
fn start_service(dist: Distribution) -> Result<u32, String> {
    let data = dist.data_dir();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.join("service.log"))
        .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = std::process::Command::new(&exe)
        .args(["serve-node", dist.name()])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .env("DROVER_LOG", "info")
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the {} service: {e}", dist.name()))?;
    std::fs::write(data.join("service.pid"), child.id().to_string()).map_err(|e| e.to_string())?;
    Ok(child.id())
}

/// Whether the node service runs.
fn service_running(dist: Distribution) -> bool {
    std::fs::read_to_string(dist.data_dir().join("service.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(alive)
}

/// The server's client certificate, made once and kept across restarts (as K3s keeps its
/// certificates); `renew` makes a new one (`certificate rotate`).
fn write_client_cert(dist: Distribution, renew: bool) -> Result<(), String> {
    let cert = client_cert_path(dist);
    if cert.exists() && !renew {
        return Ok(());
    }
    let client = tunnel::tls::CertificateAuthority::generate("system:admin stand-in")
        .map_err(|e| e.to_string())?;
    write_private(&cert.with_extension("key"), &client.pem().key_pem)?;
    write_private(&cert, &client.pem().cert_pem)
}

/// `drover-sim uninstall <dist>`: stops the service and removes what install and the service
/// wrote, as the distribution's uninstall script does.
pub fn uninstall(dist: Distribution) -> Result<String, String> {
    stop_service(dist);
    // The pods the service ran, as the kubelet's containers go with the distribution.
    for entry in std::fs::read_dir(dist.data_dir().join("pods"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.path().extension().is_some_and(|x| x == "pid") {
            stop_pid_file(&entry.path());
        }
    }
    let _ = std::fs::remove_file(rooted("/usr/local/bin").join(dist.name()));
    for dir in [
        dist.data_dir(),
        dist.config_path()
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    ] {
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("{}: {e}", dir.display()));
            }
            _ => {}
        }
    }
    Ok(format!("[INFO] stand-in {} removed", dist.name()))
}

fn stop_service(dist: Distribution) {
    stop_pid_file(&dist.data_dir().join("service.pid"));
}

/// Sends SIGTERM to the pid in `file` and waits (up to 10 s) for it to go.
fn stop_pid_file(file: &Path) {
    let Some(pid) = std::fs::read_to_string(file)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    else {
        return;
    };
    let _ = std::process::Command::new("kill")
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status();
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if alive(pid) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let _ = std::fs::remove_file(file);
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// Writes an executable script.
fn write_script(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes the datastore: a temp file renamed over the old one.
fn save(path: &Path, state: &Value) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, state.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}
