//! Day-2 operations on a provisioned cluster, end to end in network namespaces (as the
//! provisioning test): etcd snapshots on demand and on a schedule with retention, a restore
//! that brings back the objects of snapshot time (with the hub killed in the middle of it),
//! certificate rotation, and removing the cluster. The distribution is the `drover-sim`
//! stand-in (real K3s cannot be downloaded here): its `k3s etcd-snapshot save` saves the
//! simulated API server's whole store, and `k3s server --cluster-reset
//! --cluster-reset-restore-path` puts it back, as K3s does with etcd. Needs root (CI runs as
//! root); skipped, saying so, otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use sim::standin::Distribution;
use tests::{
    api,
    hosts::{Network, Site, cluster, skip_without_root, wait_active},
    hub_cli,
    imported::{kubectl, kubectl_ok},
    temp_dir,
};
use tunnel::{ConnectError, Connector, ConnectorConfig, Peer, Secret, tls::Trust};

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // sha256 in hex, as the CA checksum is.
    tunnel::tls::ca_checksum(&bytes)
}

async fn snapshots(site: &Site) -> Vec<Value> {
    let (_, list) = site.get("/v1/etcdsnapshots").await;
    list["items"].as_array().cloned().unwrap_or_default()
}

/// Waits for snapshot `name` to be saved; returns it.
async fn saved(site: &Site, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, s) = site.get(&format!("/v1/etcdsnapshots/{name}")).await;
        if code == 200 && s["state"]["state"] == "active" {
            return s;
        }
        assert_ne!(s["state"]["state"], "error", "{s:#}");
        assert!(Instant::now() < deadline, "{name} not saved: {s:#}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Scheduled snapshots as the hub lists them (names, oldest first).
fn scheduled(list: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = list
        .iter()
        .filter(|s| s["spec"]["scheduled"] == true && s["metadata"]["deletionTimestamp"].is_null())
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// The snapshot files on host `i`, by name.
fn files_on(site: &Site, dist: Distribution, i: usize) -> BTreeSet<String> {
    std::fs::read_dir(site.hosts[i].file(&format!(
        "/var/lib/rancher/{}/server/db/snapshots",
        dist.name()
    )))
    .map(|d| {
        d.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    })
    .unwrap_or_default()
}

/// K3s and RKE2 the same way, one after the other (they share the hosts' bridge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restore_rotate_and_remove_a_provisioned_cluster() {
    if skip_without_root("provisioning in network namespaces needs root") {
        return;
    }
    for (dist, version) in [
        (Distribution::K3s, "v1.33.4+k3s1"),
        (Distribution::Rke2, "v1.33.4+rke2r1"),
    ] {
        eprintln!("day-2 operations with {}", dist.name());
        day2(dist, version).await;
    }
}

async fn day2(dist: Distribution, version: &str) {
    let name = dist.name();
    let dir = temp_dir(&format!("day2-{name}"));
    let net = Network::new(3);
    let mut site = Site::start(
        &dir,
        &[version],
        json!({}),
        &["--all-roles", "--etcd --controlplane", "--worker"],
    )
    .await;
    let started = Instant::now();
    wait_active(&site.hub, &site.admin, Duration::from_secs(180)).await;
    eprintln!("provisioned 3 hosts in {:?}", started.elapsed());
    let names = site.host_names().await;

    // A schedule every minute, keeping 3: it runs beside everything below.
    let schedule = async |site: &Site, cron: &str| {
        let spec = json!({"spec": {"etcdSnapshots": {"schedule": cron, "retention": 3}}});
        let path = "/v1/clusters/edge";
        api(site.hub.addr, "PATCH", path, Some(&site.admin), Some(spec)).await
    };
    let (code, body) = schedule(&site, "* * * * *").await;
    assert_eq!(code, 200, "{body}");
    let mut seen_scheduled = BTreeSet::new();
    let (code, body) = schedule(&site, "* * *").await;
    assert_eq!(code, 422, "a bad schedule is refused: {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.etcdSnapshots.schedule"),
        "{body}"
    );

    let kubeconfig = dir.join("edge.kubeconfig");
    site.kubeconfig(&kubeconfig).await;
    let configmaps = async |kubeconfig: &Path| -> Vec<String> {
        let out = kubectl_ok(
            kubeconfig,
            &["get", "configmaps", "-n", "default", "-o", "name"],
        )
        .await;
        let mut v: Vec<String> = out.lines().map(str::to_owned).collect();
        v.sort();
        v
    };

    // 1. A snapshot on demand, with objects in the cluster.
    // (kubectl create sends protobuf, which the simulated cluster does not read: apply YAML.)
    let apply = async |name: &str| {
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata: {{k: v}}\n"),
        )
        .unwrap();
        kubectl_ok(&kubeconfig, &["apply", "-f", file.to_str().unwrap()]).await;
    };
    apply("before").await;
    // Through the CLI, which waits until the snapshot is saved.
    let cli_config = dir.join("cli.json");
    let r = hub_cli(
        &cli_config,
        &[
            "login",
            "--server",
            &site.hub_url,
            "--password-stdin",
            "--ca-checksum",
            &site.hub.ca_checksum,
        ],
        &format!("{}\n", site.admin_password),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = hub_cli(
        &cli_config,
        &[
            "cluster",
            "snapshot",
            "edge",
            "--name",
            "before-change",
            "--copy-to-hub",
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with("Snapshot before-change saved on "),
        "{}",
        r.stdout
    );
    let snap = saved(&site, "before-change").await;
    let record = &snap["status"];
    assert_eq!(record["host"], names[0].as_str(), "taken on the init host");
    let file = record["file"].as_str().unwrap();
    assert!(
        file.starts_with(&format!(
            "/var/lib/rancher/{name}/server/db/snapshots/before-change-node-1-"
        )),
        "{file}"
    );
    // The file is on the host, as the hub says.
    let on_host = site.hosts[0].file(file);
    assert_eq!(record["sha256"], sha256(&on_host).as_str());
    assert_eq!(
        record["size"].as_u64().unwrap(),
        std::fs::metadata(&on_host).unwrap().len()
    );
    assert_eq!(record["version"], format!("{name} {version}"));
    // A copy came to the hub through the tunnel, byte for byte.
    assert_eq!(record["hubCopy"], "etcd-snapshots/edge/before-change");
    let copy = dir.join("hub/files/etcd-snapshots/edge/before-change");
    assert_eq!(sha256(&copy), sha256(&on_host), "the hub's copy");
    assert!(record["createdAt"].as_str().unwrap().ends_with('Z'));
    // The snapshot ran as a task, beside the host's plan: the installer ran once per host.
    for host in &site.hosts {
        assert_eq!(host.installs().len(), 1, "host {}", host.i);
    }

    // 2. Change the cluster, then restore: the objects of snapshot time are back. The hub is
    // killed while the restore runs; it carries on after its restart, and the cluster is never
    // reported active before the restore is over.
    kubectl_ok(
        &kubeconfig,
        &["delete", "configmap", "before", "-n", "default"],
    )
    .await;
    apply("after").await;
    // The host loses its snapshot file: the restore uses the hub's copy.
    std::fs::remove_file(&on_host).unwrap();
    assert!(
        configmaps(&kubeconfig)
            .await
            .contains(&"configmap/after".to_owned())
    );
    let (code, body) = api(
        site.hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(&site.admin),
        Some(json!({"spec": {"restore": {"snapshot": "before-change", "generation": 1}}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let started = Instant::now();
    let mut phases: Vec<String> = Vec::new();
    let mut crashed = false;
    loop {
        let c = cluster(&site.hub, &site.admin).await;
        let phase = c["status"]["restore"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if phases.last() != Some(&phase) && !phase.is_empty() {
            phases.push(phase.clone());
        }
        if phase == "Restored" && c["state"]["state"] == "active" {
            break;
        }
        assert_ne!(phase, "Failed", "{c:#}");
        if c["status"]["restore"]["generation"] == 1 {
            assert_ne!(
                c["state"]["state"], "active",
                "active before the restore is over: {c:#}"
            );
        }
        if !crashed && phase == "Restoring" {
            site.crash_hub().await;
            crashed = true;
        }
        collect_scheduled(&site, &mut seen_scheduled).await;
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "restore not done: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("restored in {:?}, phases {phases:?}", started.elapsed());
    assert!(crashed, "the hub was killed during the restore: {phases:?}");
    let events = async |site: &Site| -> String {
        let (_, events) = site.get("/v1/events?cluster=edge").await;
        events.to_string()
    };
    let shown = events(&site).await;
    assert!(
        shown.contains("restore of edge from before-change: Restored"),
        "each phase is an event: {shown}"
    );
    assert_eq!(phases.first().map(String::as_str), Some("Stopping"));
    assert!(phases.contains(&"Rejoining".to_owned()), "{phases:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The hub was restarted during the restore: until the cluster's agent is back, the
        // proxy answers 503 ("not connected"), which a user would also wait out.
        let (ok, out, err) = kubectl(
            &kubeconfig,
            &["get", "configmaps", "-n", "default", "-o", "name"],
        )
        .await;
        let now: Vec<&str> = out.lines().collect();
        if ok && now.contains(&"configmap/before") {
            assert!(!now.contains(&"configmap/after"), "{now:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restored objects: {now:?} {err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every host ran each step once: still one install each, and the restore's task on the
    // snapshot's host was applied once.
    for host in &site.hosts {
        assert_eq!(host.installs().len(), 1, "host {}", host.i);
    }

    // 3. Certificate rotation, host by host: the servers' certificates are new, and the
    // cluster is active again.
    let cert = |i: usize| {
        site.hosts[i].file(&format!(
            "/var/lib/rancher/{name}/server/tls/client-kube-apiserver.crt"
        ))
    };
    let before = [sha256(&cert(0)), sha256(&cert(1))];
    let r = hub_cli(&cli_config, &["cluster", "rotate-certificates", "edge"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    let started = Instant::now();
    loop {
        let c = cluster(&site.hub, &site.admin).await;
        if c["status"]["certificateRotation"]["phase"] == "Rotated"
            && c["state"]["state"] == "active"
        {
            assert_eq!(
                c["status"]["certificateRotation"]["done"]
                    .as_array()
                    .unwrap()
                    .len(),
                3
            );
            break;
        }
        assert_ne!(
            c["status"]["certificateRotation"]["phase"], "Failed",
            "{c:#}"
        );
        collect_scheduled(&site, &mut seen_scheduled).await;
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "rotation not done: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("rotated in {:?}", started.elapsed());
    let shown = events(&site).await;
    assert!(
        shown.contains("certificate rotation of edge: Rotating")
            && shown.contains("certificate rotation of edge: Rotated"),
        "{shown}"
    );
    assert_ne!(sha256(&cert(0)), before[0], "host 1's certificate is new");
    assert_ne!(sha256(&cert(1)), before[1], "host 2's certificate is new");
    kubectl_ok(&kubeconfig, &["get", "nodes"]).await;

    // 4. The schedule kept exactly the newest 3 of the (at least 4) it took, on the hub and
    // on the host; the snapshot taken on demand is not touched by retention.
    let deadline = Instant::now() + Duration::from_secs(360);
    let kept = loop {
        collect_scheduled(&site, &mut seen_scheduled).await;
        let list = snapshots(&site).await;
        let now = scheduled(&list);
        let settled = list.iter().all(|s| s["state"]["state"] == "active");
        if seen_scheduled.len() >= 4 && now.len() == 3 && settled {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "schedule: seen {seen_scheduled:?}, now {now:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let newest: Vec<String> = seen_scheduled.iter().rev().take(3).rev().cloned().collect();
    assert_eq!(kept, newest, "the newest 3 stay");
    let files = files_on(&site, dist, 0);
    let scheduled_files: Vec<&String> = files.iter().filter(|f| f.starts_with("edge-")).collect();
    assert_eq!(scheduled_files.len(), 3, "{files:?}");
    for name in &kept {
        assert!(
            files
                .iter()
                .any(|f| f.starts_with(&format!("{name}-node-1-"))),
            "{name} on the host: {files:?}"
        );
    }
    assert!(
        files.iter().any(|f| f.starts_with("before-change-")),
        "{files:?}"
    );
    let r = hub_cli(&cli_config, &["cluster", "snapshots", "edge"], "");
    assert_eq!(r.code, 0, "{}", r.stderr);
    for name in kept.iter().chain(["before-change".to_owned()].iter()) {
        assert!(r.stdout.contains(name.as_str()), "{name}: {}", r.stdout);
    }

    // 5. Remove the cluster: the hosts run their uninstall plan, and no agent of it can
    // connect again.
    // Each host's system-agent identity and credential, as it keeps them.
    let credentials: Vec<(String, String)> = site
        .hosts
        .iter()
        .map(|h| {
            let path = h
                .dir
                .join("root/var/lib/drover/system-agent/registration.json");
            let kept: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            (
                kept["id"].as_str().unwrap().to_owned(),
                kept["credential"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let (code, body) = api(
        site.hub.addr,
        "DELETE",
        "/v1/clusters/edge",
        Some(&site.admin),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let started = Instant::now();
    loop {
        let (code, c) = site.get("/v1/clusters/edge").await;
        if code == 404 {
            break;
        }
        assert_eq!(c["state"]["state"], "removing", "{c:#}");
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not removed: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("removed in {:?}", started.elapsed());
    for host in &site.hosts {
        let bin = host.file("/usr/local/bin");
        assert!(
            [
                "k3s-uninstall.sh",
                "k3s-agent-uninstall.sh",
                "rke2-uninstall.sh"
            ]
            .iter()
            .all(|script| !bin.join(script).exists()),
            "host {} uninstalled",
            host.i
        );
        assert!(
            !host
                .file(&format!("/var/lib/rancher/{name}/installed"))
                .exists(),
            "host {}",
            host.i
        );
    }
    for (id, credential) in &credentials {
        let connector = Connector::new(ConnectorConfig::new(
            site.hub_url.clone(),
            Secret::new(credential),
            Peer {
                id: id.clone(),
                kind: "system-agent".into(),
            },
            Trust::CaChecksum(site.hub.ca_checksum.clone()),
        ))
        .unwrap();
        let err = connector.connect().await.unwrap_err();
        assert!(
            matches!(err, ConnectError::Unauthorized { status: 401, .. }),
            "a removed cluster's agent cannot connect: {err}"
        );
    }
    for kind in [
        "hosts",
        "plans",
        "etcdsnapshots",
        "registrationtokens",
        "projects",
        "rolebindings",
    ] {
        let (_, list) = site.get(&format!("/v1/{kind}")).await;
        let left: Vec<&Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["spec"]["cluster"] == "edge")
            .collect();
        assert!(left.is_empty(), "{kind} left: {left:?}");
    }
    let (_, tokens) = site.get("/v1/tokens").await;
    assert!(
        !tokens.to_string().contains("\"cluster\":\"edge\""),
        "agent tokens left: {tokens:#}"
    );
    let shown = events(&site).await;
    assert!(
        shown.contains("cluster edge removed"),
        "the removal is an event: {shown}"
    );

    drop(site);
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Adds the scheduled snapshots the hub lists now to `seen`.
async fn collect_scheduled(site: &Site, seen: &mut BTreeSet<String>) {
    seen.extend(scheduled(&snapshots(site).await));
}
