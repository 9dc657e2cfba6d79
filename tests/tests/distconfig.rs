//! A custom cluster's own configuration of its distribution, end to end on network-namespace
//! hosts (the distribution is `drover-sim`'s stand-in for K3s, as in the provisioning tests):
//! custom CIDRs, `tls-san`, a system default registry, a mirror with a login and a CA, and a
//! registry with a client certificate. Each host's `config.yaml` and `registries.yaml` hold
//! what K3s documents for them (compared as parsed YAML with the documented shapes: flags as
//! keys, `mirrors.<registry>.endpoint`, `configs.<host>.auth`/`tls`), server options only on
//! servers; kubectl reaching a server by a `tls-san` name verifies its certificate; a change
//! to `spec.config` rolls the servers one at a time and leaves the worker alone; an unknown
//! key is refused with its name. Needs root.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    api,
    hosts::{Install, Network, Site, address, plans, skip_without_root, wait_active},
    imported::kubectl,
    temp_dir,
};

/// The mirror's CA: a real certificate (the hub parses a CA bundle).
static CA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    tunnel::tls::CertificateAuthority::generate("corp mirror CA")
        .unwrap()
        .pem()
        .cert_pem
        .clone()
});
const CLIENT_CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBclient\n-----END CERTIFICATE-----\n";
const CLIENT_KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIEkey\n-----END PRIVATE KEY-----\n";

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// kubectl to host `i`'s API server directly, checking its certificate for `name`, as the
/// cluster's admin (the distribution's own kubeconfig on that host).
async fn direct(site: &Site, i: usize, name: &str) -> (bool, String) {
    let kubeconfig = site.hosts[i - 1].file("/etc/rancher/k3s/k3s.yaml");
    let server = format!("--server=https://{}:6443", address(i));
    let tls_name = format!("--tls-server-name={name}");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[&server, &tls_name, "get", "nodes", "-o", "name"],
    )
    .await;
    (ok, format!("{out}{err}"))
}

/// Each host's plan checksum and whether it is applied (with its probes healthy).
fn checksums(all: &HashMap<String, Value>, names: &[String]) -> Vec<(String, bool)> {
    names
        .iter()
        .map(|n| {
            let plan = &all[n];
            let sum = tests::hosts::plan_checksum(plan);
            let (_, ready) = tests::hosts::plan_state(plan);
            (sum, ready)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distributions_configuration_and_registries_reach_every_host() {
    if skip_without_root("provisioning in network namespaces needs root") {
        return;
    }
    let dir = temp_dir("distconfig");
    let net = Network::new(3);
    let site = Site::start_with(
        &dir,
        &["v1.33.4+k3s1"],
        json!({
            "config": {"cluster-cidr": "10.52.0.0/16", "service-cidr": "10.53.0.0/16",
                       "cluster-dns": "10.53.0.10", "tls-san": ["api.edge.example"],
                       "disable": ["traefik"], "kubelet-arg": ["max-pods=150"]},
            "hostConfig": [{"selector": {"labels": {"pool": "small"}}, "config": {"kubelet-arg": ["max-pods=60"]}}],
            "systemDefaultRegistry": "registry.corp.example:5000",
            "registries": {
                "mirrors": {"docker.io": {"endpoint": ["https://registry.corp.example:5000"]}},
                "configs": {"registry.corp.example:5000": {"credential": "corp-mirror", "tls": {"caBundle": *CA}},
                            "mtls.corp.example": {"credential": "corp-mtls"}}},
            "upgradeStrategy": {"controlPlaneConcurrency": "1", "workerConcurrency": "1"}
        }),
        &["--all-roles", "--all-roles", "--worker"],
        // The worker is labelled for the hostConfig's selector.
        |i| Install {
            flags: if i == 3 { "--label pool=small".into() } else { String::new() },
            ..Install::default()
        },
    )
    .await;
    let (hub, admin) = (&site.hub, &site.admin);
    // The credentials the registries name: until they exist, nothing is planned.
    for (name, registry) in [
        (
            "corp-mirror",
            json!({"username": "puller", "password": "pull s3cret"}),
        ),
        (
            "corp-mtls",
            json!({"certificate": CLIENT_CERT, "key": CLIENT_KEY}),
        ),
    ] {
        let (code, body) = api(
            hub.addr,
            "POST",
            "/v1/cloudcredentials",
            Some(admin),
            Some(json!({"metadata": {"name": name}, "spec": {"driver": "registry", "registry": registry}})),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    wait_active(hub, admin, Duration::from_secs(180)).await;

    // config.yaml: K3s's flags as keys; the cluster's options on servers, the node options
    // (kubelet-arg; the labelled worker's own) everywhere.
    let k3s = |i: usize, file: &str| site.hosts[i - 1].file("/etc/rancher/k3s").join(file);
    for i in 1..=3 {
        let config = yaml(&k3s(i, "config.yaml"));
        let server = i < 3;
        for (key, value) in [
            ("cluster-cidr", json!("10.52.0.0/16")),
            ("service-cidr", json!("10.53.0.0/16")),
            ("cluster-dns", json!("10.53.0.10")),
            ("tls-san", json!(["api.edge.example"])),
            ("disable", json!(["traefik"])),
            (
                "system-default-registry",
                json!("registry.corp.example:5000"),
            ),
        ] {
            if server {
                assert_eq!(config[key], value, "host {i}: {key}: {config:#}");
            } else {
                assert!(
                    config.get(key).is_none(),
                    "host {i} is an agent: {key}: {config:#}"
                );
            }
        }
        let max_pods = if server {
            "max-pods=150"
        } else {
            "max-pods=60"
        };
        assert!(
            config["kubelet-arg"]
                .as_array()
                .unwrap()
                .contains(&json!(max_pods)),
            "host {i}: {config:#}"
        );
        // Drover's own node fields are there, and not overridden.
        assert_eq!(config["node-name"], format!("node-{i}"), "host {i}");
        assert_eq!(mode(&k3s(i, "config.yaml")), 0o600);

        // registries.yaml, as K3s documents it, on every host; its files beside it.
        let registries = yaml(&k3s(i, "registries.yaml"));
        let d = "/etc/rancher/k3s/registries.d";
        assert_eq!(
            registries,
            json!({
                "mirrors": {"docker.io": {"endpoint": ["https://registry.corp.example:5000"]}},
                "configs": {
                    "mtls.corp.example": {"tls": {
                        "cert_file": format!("{d}/mtls.corp.example/client.crt"),
                        "key_file": format!("{d}/mtls.corp.example/client.key")}},
                    "registry.corp.example:5000": {
                        "auth": {"username": "puller", "password": "pull s3cret"},
                        "tls": {"ca_file": format!("{d}/registry.corp.example_5000/ca.crt")}}}
            }),
            "host {i}"
        );
        assert_eq!(
            mode(&k3s(i, "registries.yaml")),
            0o600,
            "it holds a password"
        );
        let files = site.hosts[i - 1].file("/etc/rancher/k3s/registries.d");
        assert_eq!(
            std::fs::read_to_string(files.join("registry.corp.example_5000/ca.crt")).unwrap(),
            *CA
        );
        assert_eq!(
            std::fs::read_to_string(files.join("mtls.corp.example/client.crt")).unwrap(),
            CLIENT_CERT
        );
        let key = files.join("mtls.corp.example/client.key");
        assert_eq!(std::fs::read_to_string(&key).unwrap(), CLIENT_KEY);
        assert_eq!(mode(&key), 0o600);
    }
    // The registry's secrets never come back from the API.
    let (_, credentials) = site.get("/v1/cloudcredentials").await;
    let text = credentials.to_string();
    assert!(
        !text.contains("pull s3cret") && !text.contains("MIIEkey"),
        "{text}"
    );

    // The servers' certificates name the tls-san: kubectl verifies one by that name (and not
    // by a name it does not carry).
    let (ok, out) = direct(&site, 1, "api.edge.example").await;
    assert!(ok, "{out}");
    let (ok, out) = direct(&site, 1, "api2.edge.example").await;
    assert!(!ok && out.contains("x509"), "{out}");

    // A change of the cluster's options rolls the servers, one at a time; the worker's plan
    // (no server options) stays as it is.
    let names = site.host_names().await;
    let before = checksums(&plans(hub, admin).await, &names);
    let (code, body) = api(
        hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(admin),
        Some(json!({"spec": {"config": {"cluster-cidr": "10.52.0.0/16", "service-cidr": "10.53.0.0/16",
            "cluster-dns": "10.53.0.10", "tls-san": ["api.edge.example", "api2.edge.example"],
            "disable": ["traefik"], "kubelet-arg": ["max-pods=150"]}}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let mut most_in_flight = 0;
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let now = checksums(&plans(hub, admin).await, &names);
        let changed: Vec<bool> = now.iter().zip(&before).map(|(n, b)| n.0 != b.0).collect();
        let in_flight = now
            .iter()
            .zip(&changed)
            .filter(|((_, ready), changed)| **changed && !ready)
            .count();
        most_in_flight = most_in_flight.max(in_flight);
        for (i, changed) in changed.iter().enumerate() {
            if *changed && !order.contains(&i) {
                order.push(i);
            }
        }
        if changed[0] && changed[1] && now.iter().all(|(_, ready)| *ready) {
            assert!(!changed[2], "the worker's plan holds no server option");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the servers did not roll: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server that initialised the cluster first (whichever registered host the planner
    // chose), then the other.
    let (_, cluster) = site.get("/v1/clusters/edge").await;
    let init = cluster["status"]["initHost"].as_str().unwrap();
    let first = names.iter().position(|n| n == init).unwrap();
    assert_eq!(order, [first, 1 - first], "the servers, in turn: {init}");
    assert_eq!(most_in_flight, 1, "one server at a time");
    let (ok, out) = direct(&site, 2, "api2.edge.example").await;
    assert!(ok, "{out}");

    // Keys the distribution does not have are refused by name; Drover's own with a hint.
    for (key, value) in [
        ("cluster-cidrs", "10.52.0.0/16"),
        ("node-name", "elsewhere"),
    ] {
        let (code, body) = api(
            hub.addr,
            "PATCH",
            "/v1/clusters/edge",
            Some(admin),
            Some(json!({"spec": {"config": {key: value}}})),
        )
        .await;
        assert_eq!(code, 422, "{body}");
        assert!(body["message"].as_str().unwrap().contains(key), "{body}");
    }
    let (_, cluster) = site.get("/v1/clusters/edge").await;
    assert_eq!(
        cluster["spec"]["config"]["tls-san"],
        json!(["api.edge.example", "api2.edge.example"]),
        "nothing stored is lost"
    );
    drop(site);
    drop(net);
}
