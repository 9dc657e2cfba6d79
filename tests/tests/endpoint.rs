//! The authorized cluster endpoint end to end, on a network-namespace host as the provisioning
//! tests use (the real hub, install script, system-agent, planner, cluster-agent and
//! `drover-kube-api-auth`; the distribution is the `drover-sim` stand-in, whose API server
//! honours kube-apiserver's token webhook flags): kubectl reaches the cluster's API server
//! directly with the hub's kubeconfig, as the same user with the same groups as through the
//! hub, also while the hub is down; revoked tokens and other clusters' tokens are refused;
//! turning the endpoint off takes the webhook out of the API server. Needs root (CI runs as
//! root); skipped, saying so, otherwise.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    api, api_text,
    hosts::{Network, Site, address, cluster, plan_state, plans, skip_without_root, wait_active},
    imported::{kubectl, kubectl_ok},
    login, temp_dir, until,
};

const VERSION: &str = "v1.33.4+k3s1";
const DIRECT: &str = "edge-node-1";

/// kubectl through the direct context of `kubeconfig`.
async fn direct(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["--context", DIRECT];
    all.extend_from_slice(args);
    kubectl(kubeconfig, &all).await
}

/// A user with `role` on `edge` (and local group `ops`), and the kubeconfig the hub issues
/// them, written to `dir/<name>.kubeconfig`.
async fn user(site: &Site, dir: &Path, name: &str, role: &str) -> PathBuf {
    let hub = &site.hub;
    let password = "a long enough password";
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(&site.admin),
        Some(
            json!({"metadata": {"name": name}, "spec": {"password": password, "groups": ["ops"]}}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let binding = json!({"metadata": {"name": format!("{name}-{role}")},
                         "spec": {"user": name, "role": role, "cluster": "edge"}});
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/rolebindings",
        Some(&site.admin),
        Some(binding),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let session = login(hub.addr, name, password).await;
    kubeconfig(site, &session, dir, name).await
}

async fn kubeconfig(site: &Site, token: &str, dir: &Path, name: &str) -> PathBuf {
    let (code, text) = api_text(
        site.hub.addr,
        "POST",
        "/v1/clusters/edge/kubeconfig",
        Some(token),
    )
    .await;
    assert_eq!(code, 201, "{text}");
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

fn token_of(kubeconfig: &Path) -> String {
    let config: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    config["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn contexts(kubeconfig: &Path) -> Vec<String> {
    let config: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    config["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The stand-in API server's audit log, read as its admin at the host's address.
async fn cluster_audit(site: &Site, dir: &Path) -> Vec<Value> {
    let admin = site.hosts[0].file("/etc/rancher/k3s/k3s.yaml");
    let text = std::fs::read_to_string(admin)
        .unwrap()
        .replace("127.0.0.1", &address(1));
    let path = dir.join("cluster-admin.kubeconfig");
    std::fs::write(&path, text).unwrap();
    let out = kubectl_ok(&path, &["get", "--raw", "/sim/audit"]).await;
    serde_json::from_str::<Vec<Value>>(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_the_cluster_directly_with_the_hubs_tokens_also_while_the_hub_is_down() {
    if skip_without_root("provisioning in network namespaces needs root") {
        return;
    }
    let dir = temp_dir("endpoint");
    let _net = Network::new(1);
    let mut site = Site::start(
        &dir,
        &[VERSION],
        json!({"authorizedEndpoint": {"enabled": true}}),
        &["--all-roles"],
    )
    .await;
    let started = Instant::now();
    wait_active(&site.hub, &site.admin, Duration::from_secs(180)).await;
    eprintln!("provisioned in {:?}", started.elapsed());
    // The API server was installed with the webhook: its flags in the distribution's config.
    let config_path = site.hosts[0].file("/etc/rancher/k3s/config.yaml");
    let config_yaml = || std::fs::read_to_string(&config_path).unwrap();
    assert!(
        config_yaml().contains("authentication-token-webhook-config-file="),
        "{}",
        config_yaml()
    );
    // The cluster-agent reports the cluster's CA; until then no direct context can be made.
    until(
        "the cluster's CA on the hub",
        Duration::from_secs(60),
        async || {
            cluster(&site.hub, &site.admin).await["status"]["apiServerCA"]
                .as_str()
                .is_some_and(|ca| ca.contains("BEGIN CERTIFICATE"))
        },
    )
    .await;

    let member = user(&site, &dir, "member", "cluster-member").await;
    let reader = user(&site, &dir, "reader", "read-only").await;
    assert_eq!(contexts(&member), ["edge", DIRECT]);
    let current = kubectl_ok(&member, &["config", "current-context"]).await;
    assert_eq!(
        current.trim(),
        "edge",
        "the hub's context stays the default"
    );
    let took = until(
        "the member's token copied into the cluster",
        Duration::from_secs(60),
        async || direct(&member, &["get", "namespaces"]).await.0,
    )
    .await;
    eprintln!("direct context usable {took:?} after the kubeconfig was issued");
    until(
        "the reader's token copied into the cluster",
        Duration::from_secs(60),
        async || direct(&reader, &["get", "namespaces"]).await.0,
    )
    .await;

    // get, apply and exec, through the hub and directly.
    let manifest = dir.join("app.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: default}\ndata: {mode: a}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default}\n\
         spec: {nodeName: node-1, containers: [{name: web, image: nginx}]}\n",
    )
    .unwrap();
    let file = manifest.to_str().unwrap();
    kubectl_ok(&member, &["apply", "-f", file]).await;
    let (ok, _, stderr) = direct(&member, &["apply", "-f", file]).await;
    assert!(ok, "{stderr}");
    for via in [vec![], vec!["--context", DIRECT]] {
        let mut get = via.clone();
        get.extend([
            "get",
            "configmap",
            "settings",
            "-o",
            "jsonpath={.data.mode}",
        ]);
        assert_eq!(kubectl_ok(&member, &get).await, "a", "{via:?}");
        let mut exec = via.clone();
        exec.extend(["exec", "web", "--", "echo", "hello", "there"]);
        assert_eq!(
            kubectl_ok(&member, &exec).await.trim(),
            "hello there",
            "{via:?}"
        );
    }
    // The cluster's audit: the same user and groups either way (through the hub impersonated
    // by the cluster-agent, directly authenticated by the webhook).
    let audit = cluster_audit(&site, &dir).await;
    let who = |through_hub: bool| -> Vec<(String, Vec<String>)> {
        let mut seen: Vec<(String, Vec<String>)> = audit
            .iter()
            .filter(|e| e["user"] == "member" && e["impersonatedBy"].is_null() != through_hub)
            .map(|e| {
                let mut groups: Vec<String> = serde_json::from_value(e["groups"].clone()).unwrap();
                groups.sort();
                (e["user"].as_str().unwrap().to_owned(), groups)
            })
            .collect();
        seen.dedup();
        seen
    };
    let member_is = vec![(
        "member".to_owned(),
        vec![
            "drover:authenticated".to_owned(),
            "ops".to_owned(),
            "system:authenticated".to_owned(),
        ],
    )];
    assert_eq!(who(true), member_is, "through the hub");
    assert_eq!(who(false), member_is, "directly");

    // The hub down: the direct context still works, and read-only stays read-only there.
    site.hub.crash().await;
    let (ok, out, stderr) = direct(
        &member,
        &[
            "get",
            "configmap",
            "settings",
            "-o",
            "jsonpath={.data.mode}",
        ],
    )
    .await;
    assert!(ok && out == "a", "member with the hub down: {stderr}");
    let (ok, _, stderr) = direct(&reader, &["get", "configmap", "settings"]).await;
    assert!(ok, "reader with the hub down: {stderr}");
    let (ok, _, stderr) = direct(
        &reader,
        &[
            "create",
            "configmap",
            "mine",
            "-n",
            "default",
            "--from-literal=a=b",
        ],
    )
    .await;
    assert!(
        !ok && stderr.contains("forbidden"),
        "reader writes: {stderr}"
    );
    let (ok, out, stderr) = kubectl(&member, &["get", "namespaces"]).await;
    assert!(!ok, "the hub's context with the hub down: {out}");
    eprintln!("hub down, hub context: {}", stderr.trim());

    // The hub back: a revoked token is refused directly within the sync and the webhook's
    // cache TTL (10 s); a token made for another cluster never opens this one.
    site.start_hub().await;
    let name = token_of(&member)
        .strip_prefix("drt_")
        .and_then(|t| t.split_once('.'))
        .map(|(n, _)| n.to_owned())
        .unwrap();
    let (code, body) = api(
        site.hub.addr,
        "DELETE",
        &format!("/v1/tokens/{name}"),
        Some(&site.admin),
        None,
    )
    .await;
    assert!((200..300).contains(&code), "{code} {body}");
    let took = until(
        "the revoked token refused directly",
        Duration::from_secs(60),
        async || {
            let (ok, _, stderr) = direct(&member, &["get", "namespaces"]).await;
            !ok && stderr.contains("Unauthorized")
        },
    )
    .await;
    eprintln!("revoked token refused at the direct context {took:?} after the revocation");
    // The admin's tokens for `other` and for `edge`, made together: once the one for `edge`
    // works directly, the cluster has heard of both, and the one for `other` must not work.
    create_other_cluster(&site).await;
    let (code, other) = api_text(
        site.hub.addr,
        "POST",
        "/v1/clusters/other/kubeconfig",
        Some(&site.admin),
    )
    .await;
    assert_eq!(code, 201, "{other}");
    let admin_edge = kubeconfig(&site, &site.admin, &dir, "admin-edge").await;
    let other_token = other
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let admin_other = dir.join("admin-other.kubeconfig");
    std::fs::write(
        &admin_other,
        std::fs::read_to_string(&admin_edge)
            .unwrap()
            .replace(&token_of(&admin_edge), &other_token),
    )
    .unwrap();
    until(
        "the admin's token for edge copied into the cluster",
        Duration::from_secs(60),
        async || direct(&admin_edge, &["get", "namespaces"]).await.0,
    )
    .await;
    let (ok, _, stderr) = direct(&admin_other, &["get", "namespaces"]).await;
    assert!(
        !ok && stderr.contains("Unauthorized"),
        "another cluster's token: {stderr}"
    );

    // Off: the API server rolls without the webhook, the kubeconfig has no direct context.
    let (code, body) = api(
        site.hub.addr,
        "PATCH",
        "/v1/clusters/edge",
        Some(&site.admin),
        Some(json!({"spec": {"authorizedEndpoint": {"enabled": false}}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    until(
        "the control plane rolled without the webhook",
        Duration::from_secs(120),
        async || {
            let all = plans(&site.hub, &site.admin).await;
            !config_yaml().contains("authentication-token-webhook")
                && all.values().all(|p| plan_state(p).1)
        },
    )
    .await;
    let again = kubeconfig(&site, &site.admin, &dir, "admin-after").await;
    assert_eq!(contexts(&again), ["edge"]);
    // The reader's token is still valid on the hub, and the cluster's API server no longer
    // asks anyone about it.
    kubectl_ok(&reader, &["get", "namespaces"]).await;
    until(
        "the API server back without the webhook",
        Duration::from_secs(60),
        async || {
            let (ok, _, stderr) = direct(&reader, &["get", "namespaces"]).await;
            !ok && stderr.contains("Unauthorized")
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn create_other_cluster(site: &Site) {
    let (code, body) = api(
        site.hub.addr,
        "POST",
        "/v1/clusters",
        Some(&site.admin),
        Some(json!({"metadata": {"name": "other"},
                    "spec": {"type": "custom", "distribution": "k3s", "version": VERSION,
                             "authorizedEndpoint": {"enabled": true}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}
