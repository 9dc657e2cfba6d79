//! The cluster-agent's work inside an imported (simulated) cluster: its watch-driven cache
//! answers the hub's list queries exactly as the API server would, and of its two replicas one
//! leads (holds the Lease and the hub's session) while the other takes over when it dies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::Value;
use sim::cluster::SimConfig;
use tests::{
    api, api_with, binary,
    imported::{Imported, kubectl, kubectl_ok, until_allowed, user_kubeconfig},
    wait_for_event,
};
use tokio_util::sync::CancellationToken;

/// Waits until the hub shows cluster `prod` as connected.
async fn until_connected(imported: &Imported) {
    until_connected_is(imported, "True").await;
}

/// (namespace, name, resourceVersion) of each item of a List, sorted.
fn identities(list: &Value) -> Vec<(String, String, String)> {
    let mut ids: Vec<_> = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a List: {list:.300}"))
        .iter()
        .map(|o| {
            let meta = &o["metadata"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&meta["namespace"]),
                text(&meta["name"]),
                text(&meta["resourceVersion"]),
            )
        })
        .collect();
    ids.sort();
    ids
}

/// A list straight from the simulated API server, through kubectl.
async fn direct(kubeconfig: &Path, path: &str) -> Value {
    let json = kubectl_ok(kubeconfig, &["get", "--raw", path]).await;
    serde_json::from_str(&json).unwrap()
}

/// A list from the hub's cache endpoint for cluster `prod`.
async fn cached(imported: &Imported, resource_and_query: &str) -> (u16, Value) {
    api(
        imported.hub.addr,
        "GET",
        &format!("/v1/clusters/prod/cache/{resource_and_query}"),
        Some(&imported.admin),
        None,
    )
    .await
}

/// A Table (the API server's columns) from the hub, as its admin.
async fn table(imported: &Imported, path: &str) -> Value {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json";
    let (status, table) = api_with(
        imported.hub.addr,
        "GET",
        path,
        Some(&imported.admin),
        None,
        &[("accept", TABLE)],
    )
    .await;
    assert_eq!(status, 200, "{path}: {table:.300}");
    assert_eq!(table["kind"], "Table", "{path}: {table:.300}");
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cached_list_of_30000_pods_matches_a_direct_list() {
    let imported = Imported::start(
        "cache",
        SimConfig {
            nodes: 100,
            pods: 30_000,
            ..SimConfig::default()
        },
    )
    .await;
    let config =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-0").await)
            .unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    until_connected(&imported).await;

    // The whole list, then filtered by namespace and by label, as the API server has it.
    for (cache_query, api_path, expected) in [
        ("pods", "/api/v1/pods", 30_000),
        (
            "pods?namespace=load-3",
            "/api/v1/namespaces/load-3/pods",
            3_000,
        ),
        (
            "pods?labelSelector=app%3Dapp-7",
            "/api/v1/pods?labelSelector=app%3Dapp-7",
            300,
        ),
        (
            "pods?namespace=load-7&labelSelector=app+in+%28app-7%2Capp-17%29",
            "/api/v1/namespaces/load-7/pods?labelSelector=app+in+%28app-7%2Capp-17%29",
            600,
        ),
        ("nodes", "/api/v1/nodes", 100),
        ("namespaces", "/api/v1/namespaces", 0),
    ] {
        let want = identities(&direct(&imported.sim_admin, api_path).await);
        let (status, list) = cached(&imported, cache_query).await;
        assert_eq!(status, 200, "{cache_query}: {list:.300}");
        assert!(
            list["kind"].as_str().unwrap().ends_with("List"),
            "{list:.300}"
        );
        let got = identities(&list);
        if expected > 0 {
            assert_eq!(got.len(), expected, "{cache_query}");
        }
        assert!(
            got == want,
            "{cache_query}: the cache and the API server differ"
        );
    }

    // Asked for a Table, the cache answers the API server's own: the same columns and, row for
    // row, the same cells (compared with the Table the proxy fetches from the cluster).
    // Ages are printed per answer (to the second, by apimachinery's rules: unit-tested), so two
    // answers a moment apart may differ there; every other cell must be the same.
    let rows = |table: &Value| -> Vec<(Value, Vec<Value>)> {
        let age = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .position(|c| c["name"] == "Age")
            .unwrap();
        table["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut cells = r["cells"].as_array().unwrap().clone();
                cells.remove(age);
                (r["object"]["metadata"]["name"].clone(), cells)
            })
            .collect()
    };
    let want = table(
        &imported,
        "/k8s/clusters/prod/api/v1/namespaces/load-3/pods?limit=250",
    )
    .await;
    let got = table(
        &imported,
        "/v1/clusters/prod/cache/pods?namespace=load-3&limit=250",
    )
    .await;
    assert_eq!(got["columnDefinitions"], want["columnDefinitions"]);
    assert_eq!(rows(&got).len(), 250);
    assert!(
        rows(&got) == rows(&want),
        "the cache's rows differ from the API server's"
    );
    // The rest of the namespace, from the cache's continue token: 3,000 in all.
    assert_eq!(got["metadata"]["remainingItemCount"], 2_750);
    let token = got["metadata"]["continue"].as_str().unwrap();
    let rest = table(
        &imported,
        &format!("/v1/clusters/prod/cache/pods?namespace=load-3&limit=5000&continue={token}"),
    )
    .await;
    assert_eq!(rest["rows"].as_array().unwrap().len(), 2_750);
    assert!(
        rest["metadata"].get("continue").is_none(),
        "{:.300}",
        rest["metadata"]
    );

    // A change on the cluster reaches the cache through its watch; asked for the revision the
    // change made, the cache answers once it has it.
    let labelled = kubectl_ok(
        &imported.sim_admin,
        &[
            "label",
            "pod",
            "pod-3",
            "-n",
            "load-3",
            "cached=yes",
            "-o",
            "json",
        ],
    )
    .await;
    let labelled: Value = serde_json::from_str(&labelled).unwrap();
    let revision = labelled["metadata"]["resourceVersion"].as_str().unwrap();
    let (status, list) = cached(
        &imported,
        &format!("pods?labelSelector=cached%3Dyes&resourceVersion={revision}"),
    )
    .await;
    assert_eq!(status, 200, "{list:.300}");
    assert_eq!(
        identities(&list)
            .into_iter()
            .map(|i| i.1)
            .collect::<Vec<_>>(),
        ["pod-3"]
    );

    // Mistakes are named; a user with no role on the cluster is refused.
    let (status, answer) = cached(&imported, "pods?labelSelectr=app").await;
    assert_eq!(status, 400);
    assert!(answer["message"].as_str().unwrap().contains("labelSelectr"));
    let (status, answer) = cached(&imported, "configmaps").await;
    assert_eq!(status, 404);
    assert!(answer["message"].as_str().unwrap().contains("pods"));
    let (status, _) = cached(&imported, "nodes?namespace=load-1").await;
    assert_eq!(status, 400);
    let (status, _) = api(
        imported.hub.addr,
        "GET",
        "/v1/clusters/prod/cache/pods",
        None,
        None,
    )
    .await;
    assert_eq!(status, 401);

    imported.shutdown.cancel();
    agent.await.unwrap().unwrap();
}

/// Who holds the agent's Lease, as the cluster records it.
async fn holder(imported: &Imported) -> String {
    kubectl_ok(
        &imported.sim_admin,
        &[
            "get",
            "lease",
            "drover-cluster-agent",
            "-n",
            "drover-system",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leading_replica_dies_the_other_takes_over() {
    const LEASE_SECONDS: u64 = 3;
    let imported = Imported::start(
        "failover",
        SimConfig {
            pods: 10,
            ..SimConfig::default()
        },
    )
    .await;
    let member = user_kubeconfig(
        &imported.hub,
        &imported.admin,
        &imported.dir,
        "mia",
        Some("cluster-member"),
    )
    .await;

    // Two replicas of the real binary, as the Deployment runs them.
    let mut replicas = HashMap::new();
    for pod in ["drover-cluster-agent-a", "drover-cluster-agent-b"] {
        let mut env = imported.agent_env(pod).await;
        env.insert("DROVER_LEASE_SECONDS".into(), LEASE_SECONDS.to_string());
        let log = std::fs::File::create(imported.dir.join(format!("{pod}.log"))).unwrap();
        let child = tokio::process::Command::new(binary("drover-cluster-agent"))
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        replicas.insert(pod.to_owned(), child);
    }
    until_connected(&imported).await;
    until_allowed(&member, &["list", "pods", "--all-namespaces"]).await;
    let pods = kubectl_ok(&member, &["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 10, "{pods}");

    let leader = holder(&imported).await;
    assert!(replicas.contains_key(&leader), "lease held by {leader:?}");
    let mut dead = replicas.remove(&leader).unwrap();
    dead.start_kill().unwrap();
    dead.wait().await.unwrap();
    let killed = Instant::now();

    // Without restarting the hub, requests work again once the standby leads.
    let standby = replicas.keys().next().unwrap().clone();
    let deadline = killed + Duration::from_secs(LEASE_SECONDS * 5 + 30);
    loop {
        let (ok, stdout, _) = kubectl(
            &member,
            &["get", "pods", "-A", "--no-headers", "--request-timeout=5s"],
        )
        .await;
        if ok && stdout.lines().count() == 10 && holder(&imported).await == standby {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never took over; its log:\n{}",
            std::fs::read_to_string(imported.dir.join(format!("{standby}.log"))).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "takeover: requests work again {} ms after the leader was killed (lease {LEASE_SECONDS} s)",
        killed.elapsed().as_millis()
    );

    for (_, mut child) in replicas {
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }
    imported.shutdown.cancel();
}

/// Waits until the hub shows cluster `prod` with `Connected` = `status`.
async fn until_connected_is(imported: &Imported, status: &str) {
    wait_for_event(
        imported.hub.addr,
        "/v1/clusters?watch=true",
        &imported.admin,
        Duration::from_secs(60),
        |e| {
            e["object"]["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Connected" && c["status"] == status)
                })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_started_after_the_registration_token_is_revoked_still_connects() {
    let imported = Imported::start("restart", SimConfig::default()).await;
    // The first pod registers; the credential it gets is kept in the cluster.
    let first =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-a").await)
            .unwrap();
    let stop = CancellationToken::new();
    let agent = tokio::spawn(cluster_agent::run(first, stop.clone()));
    until_connected_is(&imported, "True").await;
    stop.cancel();
    agent.await.unwrap().unwrap();
    until_connected_is(&imported, "False").await;
    let kept = kubectl_ok(
        &imported.sim_admin,
        &[
            "get",
            "secret",
            cluster_agent::CREDENTIAL_SECRET,
            "-n",
            "drover-system",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(
        kept.trim(),
        format!("secret/{}", cluster_agent::CREDENTIAL_SECRET)
    );

    // The registration token in the manifest is revoked on the hub.
    let name = imported
        .registration
        .strip_prefix("drr_")
        .and_then(|rest| rest.split_once('.'))
        .unwrap()
        .0;
    let (status, answer) = api(
        imported.hub.addr,
        "DELETE",
        &format!("/v1/registrationtokens/{name}"),
        Some(&imported.admin),
        None,
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // A new pod (its state directory empty, its token the revoked one) connects all the same.
    let second =
        cluster_agent::Config::from_env(&imported.agent_env("drover-cluster-agent-b").await)
            .unwrap();
    let stop = CancellationToken::new();
    let agent = tokio::spawn(cluster_agent::run(second, stop.clone()));
    until_connected_is(&imported, "True").await;
    stop.cancel();
    agent.await.unwrap().unwrap();
    imported.shutdown.cancel();
}
