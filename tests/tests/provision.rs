//! Provisioning end to end, one Linux network namespace per host (each with its own address on
//! a bridge, and its own /etc/rancher, /etc/drover, /var/lib/rancher and /usr/local/bin by a
//! private mount namespace): the real hub, the real install script through `curl | sh`, the real
//! system-agent and planner, installing air-gapped from artifacts the hub serves. The
//! distribution's install script among them is the `drover-sim` stand-in (real K3s cannot be
//! downloaded here): it runs a simulated API server, writes the kubeconfig and node token where
//! K3s does, and answers the same probes. Needs root (CI runs as root); skipped, saying so,
//! otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    HubProcess, api, api_text, binary, create_custom_cluster, imported::kubectl_ok, login, quiet,
    sh, temp_dir,
};

const BRIDGE: &str = "drvbr0";
const PREFIX: &str = "10.213.0";

/// The hosts' network: a bridge in the root namespace (the hub's side) and a namespace per host.
struct Network {
    hosts: usize,
    made_dirs: Vec<PathBuf>,
}

impl Network {
    fn new(hosts: usize) -> Network {
        let net = Network {
            hosts,
            made_dirs: Vec::new(),
        };
        net.teardown();
        sh(&format!(
            "ip link add {BRIDGE} type bridge && ip addr add {PREFIX}.1/24 dev {BRIDGE} && ip link set {BRIDGE} up"
        ));
        for i in 1..=hosts {
            let ns = format!("drv-h{i}");
            sh(&format!(
                "ip netns add {ns} && ip link add drv-h{i}a type veth peer name drv-h{i}b && \
                 ip link set drv-h{i}a master {BRIDGE} up && ip link set drv-h{i}b netns {ns} && \
                 ip netns exec {ns} ip addr add {} dev drv-h{i}b && \
                 ip netns exec {ns} ip link set drv-h{i}b up && ip netns exec {ns} ip link set lo up && \
                 ip netns exec {ns} ip route add default via {PREFIX}.1",
                format_args!("{}/24", address(i))
            ));
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
    fn link(&self, i: usize, up: bool) {
        sh(&format!(
            "ip link set drv-h{i}a {}",
            if up { "up" } else { "down" }
        ));
    }

    fn teardown(&self) {
        for i in 1..=self.hosts.max(3) {
            quiet(&format!(
                "ip netns pids drv-h{i} 2>/dev/null | xargs -r kill -9; ip netns del drv-h{i}; ip link del drv-h{i}a"
            ));
        }
        quiet(&format!("ip link del {BRIDGE}"));
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

fn address(i: usize) -> String {
    format!("{PREFIX}.{}", 10 + i)
}

/// One host: its namespace, its directories and what the test started in it.
struct Host {
    i: usize,
    dir: PathBuf,
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
    fn new(base: &Path, i: usize) -> Host {
        let dir = base.join(format!("host-{i}"));
        for sub in [
            "etc-rancher",
            "etc-drover",
            "var-lib-rancher",
            "usr-local-bin",
            "root",
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        Host {
            i,
            dir,
            started: std::sync::Mutex::default(),
        }
    }

    /// `command` in the host's network namespace with its own /etc/rancher and /var/lib/rancher.
    fn spawn(&self, command: &str) {
        let script = format!(
            "mount --bind {d}/etc-rancher /etc/rancher && mount --bind {d}/var-lib-rancher /var/lib/rancher && \
             mount --bind {d}/usr-local-bin /usr/local/bin && mount --bind {d}/etc-drover /etc/drover && {command}",
            d = self.dir.display()
        );
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
                &script,
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
    fn install(&self, hub_url: &str, token: &str, checksum: &str, roles: &str) {
        self.spawn(&format!(
            "curl --insecure -fsSL {hub_url}/system-agent-install.sh | sh -s - --server {hub_url} \
             --token {token} --ca-checksum {checksum} {roles} --node-name node-{i} --address {a} \
             --no-systemd --root {root}",
            i = self.i,
            a = address(self.i),
            root = self.dir.join("root").display()
        ));
    }

    /// Starts the installed agent again, as its systemd unit would.
    fn restart(&self) {
        let root = self.dir.join("root");
        self.spawn(&format!(
            "set -a; . {root}/etc/drover/system-agent.env; set +a; exec {root}/usr/local/bin/drover-system-agent",
            root = root.display()
        ));
    }

    fn kill_agent(&self) {
        let pid =
            std::fs::read_to_string(self.dir.join("root/var/lib/drover/system-agent/agent.pid"))
                .unwrap();
        sh(&format!("kill -9 {}", pid.trim()));
    }

    /// The stand-in installer's completed runs: "VERSION server|agent" per line.
    fn installs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("var-lib-rancher/k3s/drover-sim-installs"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

/// A plan's version and whether it is applied with its probes passing.
fn plan_state(plan: &Value) -> (String, bool) {
    let version = plan["spec"]["plan"]["instructions"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|e| e.as_str()?.strip_prefix("INSTALL_K3S_VERSION="))
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
    // The plan's identity, computed here as the agent computes it.
    let parsed: proto::plan::v1::Plan =
        serde_json::from_value(plan["spec"]["plan"].clone()).unwrap();
    let sum = proto::plan::v1::checksum(&parsed);
    let ready = status["state"] == "applied"
        && status["appliedChecksum"] == sum.as_str()
        && status["checksum"] == sum.as_str()
        && healthy >= probes;
    (version, ready)
}

async fn plans(hub: &HubProcess, admin: &str) -> HashMap<String, Value> {
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

async fn cluster(hub: &HubProcess, admin: &str) -> Value {
    api(hub.addr, "GET", "/v1/clusters/edge", Some(admin), None)
        .await
        .1
}

async fn wait_active(hub: &HubProcess, admin: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let c = cluster(hub, admin).await;
        if c["state"]["state"] == "active" {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "cluster not active within {within:?}: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_become_a_cluster_and_roll_one_at_a_time() {
    let root = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&root.stdout).trim() != "0" {
        eprintln!("SKIPPED: provisioning in network namespaces needs root (CI runs as root)");
        return;
    }
    let dir = temp_dir("provision");
    let net = Network::new(3);
    // The hub on the bridge, where the hosts reach it.
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
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/settings",
        Some(&admin),
        Some(json!({"metadata": {"name": "install-source"}, "spec": {"value": "hub"}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // The air-gap artifacts the hub serves: for each version, the distribution's binary and
    // images (stand-ins: these bytes) and its install script (the stand-in installer).
    for version in ["v1.33.4+k3s1", "v1.33.5+k3s1"] {
        let artifacts = dir.join("hub/artifacts").join(version);
        std::fs::create_dir_all(&artifacts).unwrap();
        std::fs::write(artifacts.join("k3s"), format!("k3s {version}\n")).unwrap();
        std::fs::write(artifacts.join("k3s-airgap-images-amd64.tar.zst"), b"images").unwrap();
        std::fs::write(
            artifacts.join("k3s-install.sh"),
            format!(
                "#!/bin/sh\nexec {} install k3s\n",
                binary("drover-sim").display()
            ),
        )
        .unwrap();
    }
    let registration = create_custom_cluster(
        hub.addr,
        &admin,
        "edge",
        json!({"distribution": "k3s", "version": "v1.33.4+k3s1",
               "upgradeStrategy": {"controlPlaneConcurrency": "1", "workerConcurrency": "1", "drain": true}}),
    )
    .await;
    let token = registration["token"].as_str().unwrap().to_owned();

    let hosts: Vec<Host> = (1..=3).map(|i| Host::new(&dir, i)).collect();
    for (host, roles) in hosts.iter().zip(["--all-roles", "--worker", "--worker"]) {
        host.install(&hub_url, &token, &hub.ca_checksum, roles);
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

    // 1. A cluster: every plan applied, the cluster-agent connected, the nodes in the cluster.
    let started = Instant::now();
    let c = wait_active(&hub, &admin, Duration::from_secs(180)).await;
    eprintln!("provisioned 3 hosts in {:?}", started.elapsed());
    assert_eq!(c["status"]["hosts"], json!({"ready": 3, "total": 3}));
    assert_eq!(c["status"]["kubernetesVersion"], "v1.33.4+k3s1");
    let all = plans(&hub, &admin).await;
    assert_eq!(all.len(), 3);
    for (name, plan) in &all {
        assert_eq!(
            plan_state(plan),
            ("v1.33.4+k3s1".to_owned(), true),
            "{name}"
        );
    }
    let (code, kubeconfig) = api_text(
        hub.addr,
        "POST",
        "/v1/clusters/edge/kubeconfig",
        Some(&admin),
    )
    .await;
    assert_eq!(code, 201, "{kubeconfig}");
    let kubeconfig_path = dir.join("edge.kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig).unwrap();
    let nodes = |out: String| -> Vec<String> {
        let mut v: Vec<String> = out.lines().map(str::to_owned).collect();
        v.sort();
        v
    };
    let wanted =
        |version: &str| -> Vec<String> { (1..=3).map(|i| format!("node-{i} {version}")).collect() };
    let columns = [
        "get",
        "nodes",
        "-o",
        "custom-columns=NAME:.metadata.name,VERSION:.status.nodeInfo.kubeletVersion",
        "--no-headers",
    ];
    let listed = nodes(kubectl_ok(&kubeconfig_path, &columns).await);
    let listed: Vec<String> = listed
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(listed, wanted("v1.33.4+k3s1"), "kubectl through the hub");
    // Installed from the hub's artifacts, as an air-gapped host is.
    for host in &hosts {
        let bin = host.dir.join("usr-local-bin");
        assert_eq!(
            std::fs::read_to_string(bin.join("k3s")).unwrap(),
            "k3s v1.33.4+k3s1\n"
        );
        let uninstall = if host.i == 1 {
            "k3s-uninstall.sh"
        } else {
            "k3s-agent-uninstall.sh"
        };
        assert!(bin.join(uninstall).exists(), "host {}: {uninstall}", host.i);
    }

    // Two pods on node-2: one the drain before its upgrade must evict, and one a DaemonSet owns,
    // which a drain leaves alone.
    let pods = dir.join("pods.yaml");
    std::fs::write(
        &pods,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: default}\n\
         spec: {nodeName: node-2, containers: [{name: web, image: nginx}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: logs-1\n  namespace: default\n  \
         ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: logs, uid: '1'}]\n\
         spec: {nodeName: node-2, containers: [{name: logs, image: fluent-bit}]}\n",
    )
    .unwrap();
    kubectl_ok(&kubeconfig_path, &["apply", "-f", pods.to_str().unwrap()]).await;

    // 2. A version bump rolls one host at a time, server first. Meanwhile host 2's link is
    // cut while it waits for its turn, and host 3's agent is killed in the middle of its plan.
    let names: Vec<String> = {
        let (_, list) = api(hub.addr, "GET", "/v1/hosts", Some(&admin), None).await;
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
    };
    let (code, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(&admin),
        Some(json!({"spec": {"version": "v1.33.5+k3s1"}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let new = "v1.33.5+k3s1";
    let mut order: Vec<usize> = Vec::new();
    let mut most_in_flight = 0;
    let (mut cut, mut restored, mut killed) = (false, false, false);
    let mut cut_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let all = plans(&hub, &admin).await;
        let states: Vec<(String, bool)> = names.iter().map(|n| plan_state(&all[n])).collect();
        let in_flight = states
            .iter()
            .filter(|(v, ready)| v == new && !ready)
            .count();
        most_in_flight = most_in_flight.max(in_flight);
        for (i, (v, _)) in states.iter().enumerate() {
            if v == new && !order.contains(&i) {
                order.push(i);
            }
        }
        // Host 2 is cut off as soon as the server starts upgrading.
        if !cut && states[0].0 == new {
            net.link(2, false);
            cut = true;
            cut_at = Instant::now();
        }
        // Ten seconds later (the server is done by then), the rollout must be waiting on host 2.
        if cut && !restored && cut_at.elapsed() > Duration::from_secs(10) {
            assert!(states[0].1, "the server upgraded meanwhile: {states:?}");
            assert!(
                !(states[1].0 == new && states[1].1),
                "host 2 cannot have applied its new plan while cut off: {states:?}"
            );
            assert_ne!(states[2].0, new, "host 3 waits for host 2: {states:?}");
            net.link(2, true);
            restored = true;
        }
        // Host 3's agent dies mid-plan (its stand-in installer is "downloading").
        if !killed && states[2].0 == new && all[&names[2]]["status"]["state"] == "in-progress" {
            hosts[2].kill_agent();
            hosts[2].restart();
            killed = true;
        }
        if states.iter().all(|(v, ready)| v == new && *ready) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rollout did not finish: {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cut && restored && killed,
        "cut {cut} restored {restored} killed {killed}"
    );
    assert_eq!(order, [0, 1, 2], "server first, then the workers in turn");
    assert_eq!(most_in_flight, 1, "one host at a time");
    let c = wait_active(&hub, &admin, Duration::from_secs(60)).await;
    assert_eq!(c["status"]["version"], new);

    // Node-2 was drained before its upgrade and made schedulable again after it.
    let left = kubectl_ok(
        &kubeconfig_path,
        &["get", "pods", "-n", "default", "-o", "name"],
    )
    .await;
    assert_eq!(
        left.trim(),
        "pod/logs-1",
        "the drain evicted web-1 and left the DaemonSet's pod"
    );
    let unschedulable = kubectl_ok(
        &kubeconfig_path,
        &[
            "get",
            "node",
            "node-2",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ],
    )
    .await;
    assert_eq!(unschedulable.trim(), "", "uncordoned after its upgrade");
    let all = plans(&hub, &admin).await;
    for name in &names {
        assert!(all[name]["status"].get("drainedFor").is_none(), "{name}");
    }

    // The installer ran exactly once per version on each host, the kill notwithstanding.
    assert_eq!(
        hosts[0].installs(),
        ["v1.33.4+k3s1 server", "v1.33.5+k3s1 server"]
    );
    for host in &hosts[1..] {
        assert_eq!(
            host.installs(),
            ["v1.33.4+k3s1 agent", "v1.33.5+k3s1 agent"],
            "host {}",
            host.i
        );
    }
    // The nodes report the new version (the kubelets updated their Node objects).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed: Vec<String> = nodes(kubectl_ok(&kubeconfig_path, &columns).await)
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        if listed == wanted(new) {
            break;
        }
        assert!(Instant::now() < deadline, "nodes: {listed:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 3. A version whose artifacts the hub does not have: the server's install instruction
    // fails (curl's 404), the cluster says where and why, the agent retries and stops at its
    // maximum (5), and the workers are never touched.
    let (code, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(&admin),
        Some(json!({"spec": {"version": "v1.33.6+k3s1"}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let c = loop {
        let c = cluster(&hub, &admin).await;
        let given_up = c["state"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("gave up after 5 attempts"));
        if given_up {
            break c;
        }
        assert!(Instant::now() < deadline, "no failure shown: {c:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(c["state"]["state"], "error");
    let message = c["state"]["message"].as_str().unwrap();
    assert!(
        message.contains(&names[0]) && message.contains("install") && message.contains("404"),
        "{message}"
    );
    let all = plans(&hub, &admin).await;
    let init = &all[&names[0]]["status"];
    assert_eq!(
        (init["state"].as_str(), init["failureCount"].as_u64()),
        (Some("failed"), Some(5))
    );
    assert!(
        init["results"][0]["stderr"]
            .as_str()
            .unwrap()
            .contains("404"),
        "{init:#}"
    );
    for name in &names[1..] {
        assert_eq!(plan_state(&all[name]).0, new, "{name} stays as it was");
    }
    assert_eq!(
        hosts[0].installs().len(),
        2,
        "the installer never ran for the missing version"
    );
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}
