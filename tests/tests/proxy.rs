//! Hosts behind an HTTP proxy, end to end: a network-namespace host whose direct route to the
//! hub is refused and whose only way out is Debian's `tinyproxy` (basic auth) installs, registers,
//! holds its tunnel, applies its plan and runs the cluster-agent through it; a host whose
//! `NO_PROXY` covers the hub goes direct; a wrong proxy password gives an error that says so.
//! The distribution is `drover-sim`'s stand-in, as in the provisioning tests. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use tests::{
    hosts::{Install, Network, PREFIX, Site, cable, skip_without_root, uncable, wait_active},
    imported::kubectl_ok,
    sh, temp_dir,
};

const PROXY_NS: &str = "drv-px";
const USER: &str = "drover";
const PASSWORD: &str = "proxy-pass-4711";

/// `tinyproxy` in a namespace of its own on the hosts' switch, asking for basic auth; killed
/// (with its namespace) on drop.
struct Proxy {
    address: String,
    log: std::path::PathBuf,
    child: std::process::Child,
}

impl Proxy {
    fn start(dir: &Path) -> Proxy {
        uncable(PROXY_NS, PROXY_NS);
        let address = format!("{PREFIX}.5");
        cable(PROXY_NS, PROXY_NS, &address, None);
        let log = dir.join("tinyproxy.log");
        let config = dir.join("tinyproxy.conf");
        // No ConnectPort line: CONNECT to any port (the hub's is chosen at random).
        std::fs::write(
            &config,
            format!(
                "Port 8888\nListen {address}\nTimeout 600\nMaxClients 100\n\
                 BasicAuth {USER} {PASSWORD}\nLogLevel Connect\nLogFile \"{}\"\n",
                log.display()
            ),
        )
        .unwrap();
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", PROXY_NS, "tinyproxy", "-d", "-c"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy (Debian's tinyproxy; scripts/test installs it)");
        // Listening once it logs its start: no sleep.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Initializing tinyproxy")) {
            assert!(Instant::now() < deadline, "tinyproxy did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Proxy {
            address,
            log,
            child,
        }
    }

    fn url(&self, password: &str) -> String {
        format!("http://{USER}:{password}@{}:8888", self.address)
    }

    /// The `CONNECT` requests it took, as `HOST:PORT` lines.
    fn connects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split("): CONNECT ").nth(1))
            .map(|l| l.trim_end_matches(" HTTP/1.1").to_owned())
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        uncable(PROXY_NS, PROXY_NS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_reach_the_hub_through_a_proxy_or_directly_as_no_proxy_says() {
    if skip_without_root("hosts in network namespaces need root") {
        return;
    }
    let dir = temp_dir("proxy");
    let net = Network::new(2);
    let proxy = Proxy::start(&dir);
    let hub_address = format!("{PREFIX}.1");
    // Host 1's only way to the hub is the proxy: its direct route is refused.
    sh(&format!("ip -n drv-h1 route add prohibit {hub_address}/32"));
    let good = proxy.url(PASSWORD);
    // Sent in a cluster's agentEnv: it must reach no audit log (scripts/test checks).
    tests::note_secret(PASSWORD);
    let hub_host = hub_address.clone();
    let site = Site::start_with(
        &dir,
        &["v1.33.4+k3s1"],
        // The cluster-agent runs on host 1 too: it reaches the hub through the proxy as well.
        json!({"agentEnv": [{"name": "HTTPS_PROXY", "value": good}]}),
        &["--all-roles", "--worker"],
        |i| match i {
            1 => Install {
                env: format!("HTTPS_PROXY={good}"),
                flags: format!("--proxy {good}"),
            },
            // Host 2: a proxy nobody answers at, and the hub in NO_PROXY: it must go direct.
            _ => Install {
                env: format!("NO_PROXY={hub_host}"),
                flags: format!(
                    "--proxy http://{USER}:{PASSWORD}@{PREFIX}.254:8888 --no-proxy {hub_host}"
                ),
            },
        },
    )
    .await;
    let (hub, admin) = (&site.hub, &site.admin);
    let port = hub.addr.port();
    // The proxy's password is write-only on the API.
    let (_, cluster) = site.get("/v1/clusters/edge").await;
    assert_eq!(
        cluster["spec"]["agentEnv"][0]["value"],
        format!("http://{USER}@{PREFIX}.5:8888")
    );
    let hub_authority = format!("{hub_address}:{port}");

    // Direct really is refused on host 1.
    let direct = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            "drv-h1",
            "curl",
            "--insecure",
            "-sS",
            "--noproxy",
            "*",
            "-m",
            "5",
        ])
        .arg(format!("https://{hub_authority}/cacerts"))
        .output()
        .unwrap();
    assert!(!direct.status.success(), "host 1 reached the hub directly");

    let c = wait_active(hub, admin, Duration::from_secs(180)).await;
    assert_eq!(c["status"]["hosts"], json!({"ready": 2, "total": 2}));
    // kubectl through the hub: the cluster-agent's tunnel (through the proxy) carries it.
    let kubeconfig = dir.join("edge.kubeconfig");
    site.kubeconfig(&kubeconfig).await;
    let nodes = kubectl_ok(&kubeconfig, &["get", "nodes", "-o", "name"]).await;
    assert_eq!(nodes.lines().count(), 2, "{nodes}");
    // Through the proxy: the install script's downloads, the registration and CA fetch, the
    // system-agent's tunnel, the distribution's air-gap downloads and the cluster-agent's
    // registration and tunnel; every one to the hub.
    let connects = proxy.connects();
    assert!(connects.len() >= 6, "{connects:?}");
    assert!(connects.iter().all(|c| *c == hub_authority), "{connects:?}");
    // The system-agent is configured with the proxy (its unit's environment file).
    let env = std::fs::read_to_string(site.hosts[0].dir.join("root/etc/drover/system-agent.env"))
        .unwrap();
    assert!(env.contains(&format!("HTTPS_PROXY='{good}'")), "{env}");
    // The distribution's service gets the cluster's agentEnv.
    for (host, unit) in [(0, "k3s"), (1, "k3s-agent")] {
        let path = site.hosts[host].file("/etc/default").join(unit);
        let service_env = std::fs::read_to_string(&path).unwrap();
        assert!(
            service_env.contains(&format!("HTTPS_PROXY=\"{good}\"")),
            "{service_env}"
        );
    }

    // A wrong password: the install script says the proxy refused its credentials…
    let wrong = proxy.url("wrong");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", "drv-h1", "sh", "-c"])
        .arg(format!(
            "HTTPS_PROXY={good} curl --insecure -fsSL https://{hub_authority}/system-agent-install.sh | \
             sh -s - --server https://{hub_authority} --token {token} --ca-checksum {sum} --worker \
             --no-systemd --root {root} --proxy {wrong}",
            token = site.token,
            sum = hub.ca_checksum,
            root = dir.join("wrong-root").display(),
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains(&format!(
            "the proxy http://{USER}@{}:8888 refused its credentials (HTTP 401)",
            proxy.address
        )),
        "{said}"
    );
    assert!(
        !said.contains("wrong@"),
        "the password is not shown: {said}"
    );
    // …and so does an agent.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", "drv-h1", "env", "-i"])
        .arg(format!("HTTPS_PROXY={wrong}"))
        .arg(format!("DROVER_SERVER=https://{hub_authority}"))
        .arg(format!("DROVER_TOKEN={}", site.token))
        .arg(format!("DROVER_CA_CHECKSUM={}", hub.ca_checksum))
        .arg(format!("DROVER_DIR={}", dir.join("wrong-agent").display()))
        .arg("DROVER_ROLES=worker")
        .arg("DROVER_NODE_NAME=node-x")
        .arg(tests::binary("drover-system-agent"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "cannot reach the hub at {hub_authority} through the proxy http://{USER}@{}:8888 (HTTPS_PROXY): the proxy refused the password of user \"{USER}\"",
            proxy.address
        )),
        "{said}"
    );
    assert!(!said.contains("wrong@"), "{said}");
    drop(site);
    drop(proxy);
    drop(net);
}
