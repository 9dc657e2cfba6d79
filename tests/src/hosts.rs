//! Hosts for provisioning tests: one Linux network namespace per host (each with its own
//! address on a bridge, and its own root directory, the host command's `--root`, under which
//! the agent and everything its plans write are kept), the hub on the bridge serving the air-gap
//! artifacts, and the hub's host command run on each. The distribution's binary and install
//! script among the artifacts are the `drover-sim` stand-ins (real K3s cannot be downloaded
//! here). Needs root.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{HubProcess, api, binary, create_custom_cluster, login, quiet, sh};

/// Whether this runs as root.
pub fn is_root() -> bool {
    let out = std::process::Command::new("id").arg("-u").output();
    out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The variable that lets a run without root skip the tests that need it.
pub const SKIP_ROOT_VAR: &str = "DROVER_SKIP_ROOT_TESTS";

/// What a test that needs root does: run, skip (only when asked to), or fail saying how to
/// run it. A test that cannot run must never pass silently.
#[derive(Debug, PartialEq, Eq)]
pub enum RootTest {
    Run,
    Skip,
    Fail(String),
}

/// The decision for a test that needs root for `why`, as root or not, with `skip_var` the
/// value of [`SKIP_ROOT_VAR`].
pub fn root_test(root: bool, skip_var: Option<&str>, why: &str) -> RootTest {
    match (root, skip_var) {
        (true, _) => RootTest::Run,
        (false, Some("1")) => RootTest::Skip,
        (false, _) => RootTest::Fail(format!(
            "{why}: run the tests as root (CI does), or set {SKIP_ROOT_VAR}=1 to skip the tests that need it"
        )),
    }
}

/// Whether the calling test, which needs root for `why`, must stop here: `true` only without
/// root and with [`SKIP_ROOT_VAR`]`=1`, noted in the file `$DROVER_ROOT_SKIPS` names so that
/// `scripts/test` can say how many were skipped. Without root and without the variable the
/// test fails.
pub fn skip_without_root(why: &str) -> bool {
    use std::io::Write as _;
    let skip_var = std::env::var(SKIP_ROOT_VAR).ok();
    match root_test(is_root(), skip_var.as_deref(), why) {
        RootTest::Run => false,
        RootTest::Skip => {
            // The run's own output says what was skipped (scripts/test counts them too).
            let _ = writeln!(std::io::stderr(), "SKIPPED ({SKIP_ROOT_VAR}=1): {why}");
            if let Some(file) = std::env::var_os("DROVER_ROOT_SKIPS")
                && let Ok(mut out) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(file)
            {
                let _ = out.write_all(format!("{why}\n").as_bytes());
            }
            true
        }
        RootTest::Fail(message) => panic!("{message}"),
    }
}

/// The hub on the bridge (where the hosts reach it), installing from its own artifacts for
/// `versions`, with custom cluster `edge` (K3s, or RKE2 for `+rke2r` versions, at the first
/// version, `spec` merged in); the
/// hosts installed with `roles`, registering in that order.
#[derive(Debug)]
pub struct Site {
    pub hub: HubProcess,
    pub hub_url: String,
    /// The hub's data directory and listen address, to start it again.
    hub_dir: PathBuf,
    listen: String,
    pub admin: String,
    pub admin_password: String,
    pub token: String,
    pub hosts: Vec<Host>,
}

/// How a host runs the hub's host command: `env` before the `curl` that fetches the script
/// (`HTTPS_PROXY=…`), `flags` after the script's own (`--proxy …`).
#[derive(Debug, Clone, Default)]
pub struct Install {
    pub env: String,
    pub flags: String,
}

impl Site {
    pub async fn start(dir: &Path, versions: &[&str], spec: Value, roles: &[&str]) -> Site {
        Self::start_with(dir, versions, spec, roles, |_| Install::default()).await
    }

    /// As [`Site::start`], host `i` (from 1) installed as `install(i)` says.
    pub async fn start_with(
        dir: &Path,
        versions: &[&str],
        spec: Value,
        roles: &[&str],
        install: impl Fn(usize) -> Install,
    ) -> Site {
        let port = std::net::TcpListener::bind(format!("{PREFIX}.1:0"))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let hub_url = format!("https://{PREFIX}.1:{port}");
        let listen = format!("{PREFIX}.1:{port}");
        let hub = HubProcess::start_with(
            &dir.join("hub"),
            &["--listen", &listen, "--server-url", &hub_url],
        )
        .await;
        let admin_password = hub.admin_password.clone().unwrap();
        let admin = login(hub.addr, "admin", &admin_password).await;
        let (code, body) = api(
            hub.addr,
            "POST",
            "/v1/settings",
            Some(&admin),
            Some(json!({"metadata": {"name": "install-source"}, "spec": {"value": "hub"}})),
        )
        .await;
        assert_eq!(code, 201, "{body}");
        // The air-gap artifacts the hub serves: for each version, the distribution's binary
        // (K3s) or tarball (RKE2), its images (these bytes) and install script (the
        // stand-ins), under the names each distribution's air-gap install uses.
        // The air-gap artifacts the hub serves: for each version, the stand-in distribution.
        let dist = sim::standin::artifacts::distribution_of(versions[0]);
        for version in versions {
            sim::standin::artifacts::write(
                &dir.join("hub/artifacts"),
                version,
                &binary("drover-sim"),
            )
            .unwrap();
        }
        let mut cluster = json!({"distribution": dist.name(), "version": versions[0]});
        if let (Value::Object(c), Value::Object(more)) = (&mut cluster, spec) {
            c.extend(more);
        }
        let registration = create_custom_cluster(hub.addr, &admin, "edge", cluster).await;
        let token = registration["token"].as_str().unwrap().to_owned();
        let hosts: Vec<Host> = (1..=roles.len()).map(|i| Host::new(dir, i)).collect();
        for (host, roles) in hosts.iter().zip(roles) {
            host.install_with(&hub_url, &token, &hub.ca_checksum, roles, &install(host.i));
            // One at a time, so the hosts register (and are ordered) as listed.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (_, list) = api(hub.addr, "GET", "/v1/hosts", Some(&admin), None).await;
                if list["items"].as_array().map_or(0, Vec::len) == host.i {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "host {} did not register: {list:#}",
                    host.i
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Site {
            hub,
            hub_url,
            hub_dir: dir.join("hub"),
            listen,
            admin,
            admin_password,
            token,
            hosts,
        }
    }

    /// A GET of the hub's API as the admin.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        api(self.hub.addr, "GET", path, Some(&self.admin), None).await
    }

    /// The admin's kubeconfig for cluster `edge` (through the hub), written to `path`.
    pub async fn kubeconfig(&self, path: &Path) {
        let (code, text) = crate::api_text(
            self.hub.addr,
            "POST",
            "/v1/clusters/edge/kubeconfig",
            Some(&self.admin),
        )
        .await;
        assert_eq!(code, 201, "{text}");
        std::fs::write(path, text).unwrap();
    }

    /// Kills the hub (SIGKILL) and starts it again on the same data and address.
    pub async fn crash_hub(&mut self) {
        self.hub.crash().await;
        self.start_hub().await;
    }

    /// Starts the hub again (after `self.hub.crash()`) on the same data and address.
    pub async fn start_hub(&mut self) {
        self.hub = HubProcess::start_with(
            &self.hub_dir,
            &["--listen", &self.listen, "--server-url", &self.hub_url],
        )
        .await;
    }

    /// The hosts' names, in the order they were installed.
    pub async fn host_names(&self) -> Vec<String> {
        let (_, list) = api(self.hub.addr, "GET", "/v1/hosts", Some(&self.admin), None).await;
        let mut items: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["spec"]["nodeName"].as_str().unwrap().to_owned(),
                    h["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        items.sort();
        items.into_iter().map(|(_, name)| name).collect()
    }
}

pub const PREFIX: &str = "10.213.0";
/// The second subnet on the switch (the fault tests' link), with its gateway in the root
/// namespace too.
pub const FAULTS_PREFIX: &str = "10.214.0";

/// The namespace of the hosts' switch, its bridge, and the cable to the root namespace.
pub const SWITCH: &str = "drv-sw";
const BRIDGE: &str = "drvbr0";
const UPLINK: &str = "drv-up";

/// Makes the hosts' switch if this process has not: a bridge in a namespace of its own, joined
/// to the root namespace (the hub's side) by one cable whose root end holds the gateways
/// (`{PREFIX}.1`, `{FAULTS_PREFIX}.1`). It is kept, also across runs: Chromium closes every
/// connection whenever a link or address of its namespace changes (`ERR_NETWORK_CHANGED`
/// failed a dashboard login while a provisioning test cabled its hosts), so hosts are cabled
/// behind the switch, out of the root namespace's sight, and a browser test makes the switch
/// before its browser starts. The cable's root end gets no IPv6 link-local address: the kernel
/// announces one only once duplicate address detection ends, about 1.7 s after the link is up,
/// which is while the first browser test (started just after the switch) loads its page.
pub fn switch() {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        let healthy = std::process::Command::new("sh")
            .args([
                "-c",
                &format!(
                    "ip -n {SWITCH} link show {BRIDGE} && ip addr show dev {UPLINK} | grep -q 'inet {PREFIX}.1/24' && \
                     ip addr show dev {UPLINK} | grep -q 'inet {FAULTS_PREFIX}.1/24'"
                ),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if healthy {
            return;
        }
        // What an older layout or a half-made switch left (the bridges were in the root namespace).
        quiet(&format!(
            "ip link del {BRIDGE}; ip link del drvfbr0; ip link del {UPLINK}; ip netns del {SWITCH}"
        ));
        sh(&format!(
            "ip netns add {SWITCH} && ip -n {SWITCH} link set lo up && \
             ip -n {SWITCH} link add {BRIDGE} type bridge && ip -n {SWITCH} link set {BRIDGE} up && \
             ip link add {UPLINK} type veth peer name {UPLINK}b netns {SWITCH} && \
             ip -n {SWITCH} link set {UPLINK}b master {BRIDGE} up && \
             ip link set {UPLINK} addrgenmode none && \
             ip addr add {PREFIX}.1/24 dev {UPLINK} && ip addr add {FAULTS_PREFIX}.1/24 dev {UPLINK} && \
             ip link set {UPLINK} up"
        ));
    });
}

/// Namespace `ns`, made and cabled to the switch with `address`/24 (the cable's switch end is
/// `{cable}a`, its host end `{cable}b`), routing through `gateway` if given.
pub fn cable(ns: &str, cable: &str, address: &str, gateway: Option<&str>) {
    switch();
    let route = gateway
        .map(|g| format!(" && ip -n {ns} route add default via {g}"))
        .unwrap_or_default();
    // The host's MAC address follows from its IP address: the root namespace's cable outlives
    // the hosts, and a host made again at an address would otherwise be unreachable while the
    // root namespace's ARP entry still names the old one's MAC (up to ~45 s).
    let octets: Vec<u8> = address.split('.').filter_map(|o| o.parse().ok()).collect();
    assert_eq!(octets.len(), 4, "{address} is not an IPv4 address");
    let mac = format!(
        "02:00:{:02x}:{:02x}:{:02x}:{:02x}",
        octets[0], octets[1], octets[2], octets[3]
    );
    sh(&format!(
        "ip netns add {ns} && ip -n {SWITCH} link add {cable}a type veth peer name {cable}b address {mac} netns {ns} && \
         ip -n {SWITCH} link set {cable}a master {BRIDGE} up && \
         ip -n {ns} addr add {address}/24 dev {cable}b && \
         ip -n {ns} link set {cable}b up && ip -n {ns} link set lo up{route}"
    ));
}

/// Everything in namespace `ns` killed, the namespace and its cable gone.
pub fn uncable(ns: &str, cable: &str) {
    quiet(&format!(
        "ip netns pids {ns} 2>/dev/null | xargs -r kill -9; ip netns del {ns}; ip -n {SWITCH} link del {cable}a"
    ));
}

/// The hosts' network: a namespace per host, cabled to the [`switch`].
#[derive(Debug)]
pub struct Network {
    hosts: usize,
    made_dirs: Vec<PathBuf>,
    /// One network at a time in a test binary: its tests run in parallel, and every network
    /// is the same hosts' namespaces. Dropped last (after the teardown).
    _alone: std::sync::MutexGuard<'static, ()>,
}

static ONE_NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Keeps every [`Network`] away while held: a network makes its hosts' mount points
/// (`/etc/rancher`, `/var/lib/rancher` …) on the machine itself, so a test that checks nothing
/// was written there holds this from its first look to its last. (Each test runs on its own
/// thread, so holding it across awaits blocks only a network's test, which waits its turn.)
#[derive(Debug)]
pub struct NoNetwork {
    _alone: std::sync::MutexGuard<'static, ()>,
}

pub fn no_network() -> NoNetwork {
    NoNetwork {
        _alone: ONE_NETWORK.lock().unwrap_or_else(|p| p.into_inner()),
    }
}

impl Network {
    pub fn new(hosts: usize) -> Network {
        // A test that failed holding it leaves nothing to fear: the next one tears down first.
        let alone = ONE_NETWORK.lock().unwrap_or_else(|p| p.into_inner());
        let net = Network {
            hosts,
            made_dirs: Vec::new(),
            _alone: alone,
        };
        net.teardown();
        for i in 1..=hosts {
            plug(i, &address(i));
        }
        let mut net = net;
        // Mount points for each host's own copy of the distribution's directories.
        for dir in [
            "/etc/rancher",
            "/etc/drover",
            "/var/lib/rancher",
            "/usr/local/bin",
        ] {
            if !Path::new(dir).exists() {
                std::fs::create_dir_all(dir).unwrap();
                net.made_dirs.push(PathBuf::from(dir));
            }
        }
        net
    }

    /// Cuts (or restores) host `i`'s link, as a pulled cable would.
    pub fn link(&self, i: usize, up: bool) {
        sh(&format!(
            "ip -n {SWITCH} link set drv-h{i}a {}",
            if up { "up" } else { "down" }
        ));
    }

    fn teardown(&self) {
        let plugged = PLUGGED.load(std::sync::atomic::Ordering::Relaxed);
        for i in 1..=self.hosts.max(plugged).max(3) {
            unplug(i);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown();
        for dir in &self.made_dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The highest host number plugged in (for the teardown of hosts added after the start).
static PLUGGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Host `i`'s namespace, cabled to the switch with `address` (on `{PREFIX}.0/24`): a
/// [`Network`]'s hosts, or a machine a test's cloud made while one is up.
pub fn plug(i: usize, address: &str) {
    PLUGGED.fetch_max(i, std::sync::atomic::Ordering::Relaxed);
    cable(
        &format!("drv-h{i}"),
        &format!("drv-h{i}"),
        address,
        Some(&format!("{PREFIX}.1")),
    );
}

/// Halts host `i` as a machine that died would: everything in its namespace killed (its
/// namespace stays).
pub fn halt(i: usize) {
    quiet(&format!(
        "ip netns pids drv-h{i} 2>/dev/null | xargs -r kill -9"
    ));
}

/// Powers host `i` off: everything in its namespace killed, its namespace and cable gone.
pub fn unplug(i: usize) {
    uncable(&format!("drv-h{i}"), &format!("drv-h{i}"));
}

pub fn address(i: usize) -> String {
    format!("{PREFIX}.{}", 10 + i)
}

/// One host: its namespace, its directories and what the test started in it.
#[derive(Debug)]
pub struct Host {
    pub i: usize,
    pub dir: PathBuf,
    started: std::sync::Mutex<Vec<std::process::Child>>,
}

impl Drop for Host {
    fn drop(&mut self) {
        for child in self.started.lock().unwrap().iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Host {
    pub fn new(base: &Path, i: usize) -> Host {
        let dir = base.join(format!("host-{i}"));
        std::fs::create_dir_all(dir.join("root")).unwrap();
        Host {
            i,
            dir,
            started: std::sync::Mutex::default(),
        }
    }

    /// `path` on this host: under its root directory, where the host command's `--root` put
    /// the agent, and where the agent keeps everything its plans write.
    pub fn file(&self, path: &str) -> PathBuf {
        self.dir.join("root").join(path.trim_start_matches('/'))
    }

    /// `command` in the host's network namespace, in a mount namespace of its own (so that a
    /// bind mount it makes, the machines' common install root, is its host's alone).
    pub fn spawn(&self, command: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &format!("drv-h{}", self.i)])
            .args([
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                command,
            ])
            // The stand-in installer "downloads" for two seconds: time to interrupt it.
            .env("DROVER_SIM_INSTALL_SECONDS", "2")
            .env("DROVER_RETRY_SECONDS", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.started.lock().unwrap().push(child);
    }

    /// Runs the hub's host command on this host.
    pub fn install(&self, hub_url: &str, token: &str, checksum: &str, roles: &str) {
        self.install_with(hub_url, token, checksum, roles, &Install::default());
    }

    pub fn install_with(
        &self,
        hub_url: &str,
        token: &str,
        checksum: &str,
        roles: &str,
        install: &Install,
    ) {
        self.spawn(&format!(
            "{env} curl --insecure -fsSL {hub_url}/system-agent-install.sh | sh -s - --server {hub_url} \
             --token {token} --ca-checksum {checksum} {roles} --node-name node-{i} --address {a} \
             --no-systemd --root {root} {flags}",
            env = install.env,
            flags = install.flags,
            i = self.i,
            a = address(self.i),
            root = self.dir.join("root").display()
        ));
    }

    /// Starts the installed agent again, as its systemd unit would.
    pub fn restart(&self) {
        let root = self.dir.join("root");
        self.spawn(&format!(
            "set -a; . {root}/etc/drover/system-agent.env; set +a; exec {root}/usr/local/bin/drover-system-agent",
            root = root.display()
        ));
    }

    pub fn kill_agent(&self) {
        let pid =
            std::fs::read_to_string(self.dir.join("root/var/lib/drover/system-agent/agent.pid"))
                .unwrap();
        sh(&format!("kill -9 {}", pid.trim()));
    }

    /// The stand-in installer's completed runs: "VERSION server|agent" per line.
    pub fn installs(&self) -> Vec<String> {
        ["k3s", "rke2"]
            .iter()
            .filter_map(|dist| {
                std::fs::read_to_string(
                    self.file(&format!("/var/lib/rancher/{dist}/drover-sim-installs")),
                )
                .ok()
            })
            .flat_map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    }
}

/// A plan's version and whether it is applied with its probes passing.
/// A Plan's checksum (`status.planChecksum`) as the API shows it.
pub fn plan_checksum(plan: &Value) -> String {
    plan["status"]["planChecksum"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub fn plan_state(plan: &Value) -> (String, bool) {
    let version = plan["spec"]["plan"]["instructions"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|e| {
            let e = e.as_str()?;
            e.strip_prefix("INSTALL_K3S_VERSION=")
                .or_else(|| e.strip_prefix("INSTALL_RKE2_VERSION="))
        })
        .unwrap_or_default()
        .to_owned();
    let status = &plan["status"];
    let probes = plan["spec"]["plan"]["probes"]
        .as_array()
        .map_or(0, Vec::len);
    let healthy = status["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["healthy"] == true)
        .count();
    // The plan's identity as the hub computes it of the whole plan (the API leaves secret
    // files' content out, so it cannot be computed here), against what the agent reports.
    let sum = plan_checksum(plan);
    let ready = status["state"] == "applied"
        && status["appliedChecksum"] == sum.as_str()
        && status["checksum"] == sum.as_str()
        && healthy >= probes;
    (version, ready)
}

pub async fn plans(hub: &HubProcess, admin: &str) -> HashMap<String, Value> {
    let (_, list) = api(hub.addr, "GET", "/v1/plans", Some(admin), None).await;
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p.clone(),
            )
        })
        .collect()
}

pub async fn cluster(hub: &HubProcess, admin: &str) -> Value {
    api(hub.addr, "GET", "/v1/clusters/edge", Some(admin), None)
        .await
        .1
}

pub async fn wait_active(hub: &HubProcess, admin: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let c = cluster(hub, admin).await;
        // Active counting every registered host: a host that registered a moment ago is not
        // yet in the status of a cluster the planner made active without it.
        let (_, hosts) = api(hub.addr, "GET", "/v1/hosts", Some(admin), None).await;
        let registered = hosts["items"].as_array().map_or(0, Vec::len);
        if c["state"]["state"] == "active" && c["status"]["hosts"]["total"] == registered {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "cluster not active within {within:?}: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod root_tests {
    use super::{RootTest, root_test};

    #[test]
    fn a_test_that_needs_root_fails_without_it_unless_skipping_is_asked_for() {
        let why = "hosts need network namespaces";
        assert_eq!(root_test(true, None, why), RootTest::Run);
        assert_eq!(root_test(true, Some("1"), why), RootTest::Run);
        assert_eq!(root_test(false, Some("1"), why), RootTest::Skip);
        for not_asked in [None, Some(""), Some("0"), Some("yes")] {
            let RootTest::Fail(message) = root_test(false, not_asked, why) else {
                panic!("{not_asked:?} skipped or ran a root test without root");
            };
            assert!(message.starts_with(why), "{message}");
            assert!(message.contains("DROVER_SKIP_ROOT_TESTS=1"), "{message}");
        }
    }
}
