//! Provisioning end to end, one Linux network namespace per host (each with its own address on
//! a bridge, and its own /etc/rancher, /etc/drover, /var/lib/rancher and /usr/local/bin by a
//! private mount namespace): the real hub, the real install script through `curl | sh`, the real
//! system-agent and planner, installing air-gapped from artifacts the hub serves. The
//! distribution's install script among them is the `drover-sim` stand-in (real K3s cannot be
//! downloaded here): it runs a simulated API server, writes the kubeconfig and node token where
//! K3s does, and answers the same probes. Needs root (CI runs as root); skipped, saying so,
//! otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::time::{Duration, Instant};

use serde_json::json;
use sim::standin::Distribution;
use tests::{
    api, api_text,
    hosts::{Network, Site, cluster, plan_state, plans, skip_without_root, wait_active},
    imported::kubectl_ok,
    temp_dir,
};

/// K3s and RKE2 the same way, one after the other (they share the hosts' bridge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_become_a_cluster_and_roll_one_at_a_time() {
    if skip_without_root("provisioning in network namespaces needs root") {
        return;
    }
    for dist in [Distribution::K3s, Distribution::Rke2] {
        eprintln!("provisioning with {}", dist.name());
        provision_and_roll(dist).await;
    }
}

async fn provision_and_roll(dist: Distribution) {
    // The distribution's releases: v1.33.4+k3s1 or v1.33.4+rke2r1.
    let release = |patch: u32| match dist {
        Distribution::K3s => format!("v1.33.{patch}+k3s1"),
        Distribution::Rke2 => format!("v1.33.{patch}+rke2r1"),
    };
    let (first, second, missing) = (release(4), release(5), release(6));
    let dir = temp_dir(&format!("provision-{}", dist.name()));
    let net = Network::new(3);
    let site = Site::start(
        &dir,
        &[&first, &second],
        json!({"upgradeStrategy": {"controlPlaneConcurrency": "1", "workerConcurrency": "1", "drain": true}}),
        &["--all-roles", "--worker", "--worker"],
    )
    .await;
    let (hub, admin, hosts) = (&site.hub, &site.admin, &site.hosts);

    // 1. A cluster: every plan applied, the cluster-agent connected, the nodes in the cluster.
    let started = Instant::now();
    let c = wait_active(hub, admin, Duration::from_secs(180)).await;
    eprintln!("provisioned 3 hosts in {:?}", started.elapsed());
    assert_eq!(c["status"]["hosts"], json!({"ready": 3, "total": 3}));
    assert_eq!(c["status"]["kubernetesVersion"], first);
    let all = plans(hub, admin).await;
    assert_eq!(all.len(), 3);
    for (name, plan) in &all {
        assert_eq!(plan_state(plan), (first.clone(), true), "{name}");
    }
    let (code, kubeconfig) = api_text(
        hub.addr,
        "POST",
        "/v1/clusters/edge/kubeconfig",
        Some(admin),
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
    assert_eq!(listed, wanted(&first), "kubectl through the hub");
    // Installed from the hub's artifacts, as an air-gapped host is.
    for host in hosts {
        let bin = host.file("/usr/local/bin");
        assert_eq!(
            std::fs::read_to_string(bin.join(dist.name())).unwrap(),
            sim::standin::binary_script(dist, &tests::binary("drover-sim"), &first),
            "the binary from the hub's artifacts"
        );
        // What each distribution's installer leaves to uninstall with.
        let uninstall = match (dist, host.i) {
            (Distribution::K3s, 1) => "k3s-uninstall.sh",
            (Distribution::K3s, _) => "k3s-agent-uninstall.sh",
            (Distribution::Rke2, _) => "rke2-uninstall.sh",
        };
        assert!(bin.join(uninstall).exists(), "host {}: {uninstall}", host.i);
        // The agents' images from the hub, where the distribution imports images at start.
        let images = host.file(&format!("/var/lib/rancher/{}/agent/images", dist.name()));
        for image in ["cluster-agent", "node-agent"] {
            let file = format!("drover-{image}-{}-amd64.oci.tar", env!("CARGO_PKG_VERSION"));
            assert_eq!(
                std::fs::read_to_string(images.join(&file)).ok().as_deref(),
                Some(format!("{image} image").as_str()),
                "host {}: {file}",
                host.i
            );
        }
    }

    // Two pods on node-2: one the drain before its upgrade must evict (once its disruption
    // budget allows), and one a DaemonSet owns, which a drain leaves alone.
    let pods = dir.join("pods.yaml");
    std::fs::write(
        &pods,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: default, labels: {app: web}}\n\
         spec: {nodeName: node-2, containers: [{name: web, image: nginx}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata:\n  name: logs-1\n  namespace: default\n  \
         ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: logs, uid: '1'}]\n\
         spec: {nodeName: node-2, containers: [{name: logs, image: fluent-bit}]}\n---\n\
         apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: default}\n\
         spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}\n",
    )
    .unwrap();
    kubectl_ok(&kubeconfig_path, &["apply", "-f", pods.to_str().unwrap()]).await;

    // 2. A version bump rolls one host at a time, server first. Meanwhile host 2's link is
    // cut while it waits for its turn, and host 3's agent is killed in the middle of its plan.
    let names = site.host_names().await;
    let (code, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(admin),
        Some(json!({"spec": {"version": second}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let new = second.as_str();
    let mut order: Vec<usize> = Vec::new();
    let mut most_in_flight = 0;
    let (mut cut, mut restored, mut killed) = (false, false, false);
    let (mut cordoned_at, mut budget_lifted) = (None::<Instant>, false);
    let mut cut_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let all = plans(hub, admin).await;
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
        // Node-2's drain evicts through the eviction API: while web-1's budget allows no
        // disruption the drain waits (the pod stays, the host does not upgrade); lifted, it
        // goes on.
        if restored && !budget_lifted {
            match cordoned_at {
                None => {
                    let node = kubectl_ok(
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
                    if node == "true" {
                        cordoned_at = Some(Instant::now());
                    }
                }
                Some(at) if at.elapsed() > Duration::from_secs(2) => {
                    let held = kubectl_ok(
                        &kubeconfig_path,
                        &["get", "pods", "-n", "default", "-o", "name"],
                    )
                    .await;
                    assert!(held.contains("pod/web-1"), "the budget holds web-1: {held}");
                    assert_ne!(states[1].0, new, "host 2 waits for its drain: {states:?}");
                    kubectl_ok(&kubeconfig_path, &["delete", "pdb", "web", "-n", "default"]).await;
                    budget_lifted = true;
                }
                Some(_) => {}
            }
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
        cut && restored && killed && budget_lifted,
        "cut {cut} restored {restored} killed {killed} budget lifted {budget_lifted}"
    );
    assert_eq!(order, [0, 1, 2], "server first, then the workers in turn");
    assert_eq!(most_in_flight, 1, "one host at a time");
    let c = wait_active(hub, admin, Duration::from_secs(60)).await;
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
    let all = plans(hub, admin).await;
    for name in &names {
        assert!(all[name]["status"].get("drainedFor").is_none(), "{name}");
    }

    // The installer ran exactly once per version on each host, the kill notwithstanding.
    assert_eq!(
        hosts[0].installs(),
        [format!("{first} server"), format!("{second} server")]
    );
    for host in &hosts[1..] {
        assert_eq!(
            host.installs(),
            [format!("{first} agent"), format!("{second} agent")],
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
        Some(admin),
        Some(json!({"spec": {"version": missing}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let c = loop {
        let c = cluster(hub, admin).await;
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
    let all = plans(hub, admin).await;
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
    drop(site);
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}
