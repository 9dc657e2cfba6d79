//! The hub on etcd (`--store etcd://…`), with a real etcd (Debian's `etcd-server`) per test:
//! one hub killed and started again, and etcd itself under it; three replicas on one etcd,
//! the leader killed: another leads, the agents move, kubectl through any survivor works, no
//! plan runs twice and no registration is lost; the leader's controllers reach a cluster whose
//! agent is connected to another replica; three replicas on a three-member etcd lose no request
//! and no leader when a member dies, and serve again within seconds of a full etcd outage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use hub::store::local_etcd::LocalEtcd;
use serde_json::json;
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api,
    ha::{Replicas, imported_on, leader_of, leads, via},
    https_get, hub_command,
    imported::{
        IMPORT_OBJECTS, Imported, kubectl, kubectl_ok, remove_cluster, until_allowed,
        user_kubeconfig,
    },
    logs_in, printed_password,
    system_agent::{Host, applied, counted, create_paused_edge, put_plan, runs, until},
    temp_dir,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_on_etcd_keeps_its_clusters_across_its_own_and_etcds_restarts() {
    let mut etcd = LocalEtcd::start(&temp_dir("ha-etcd")).unwrap();
    let store = etcd.store_url();
    let flags = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let imported = imported_on("ha-one", &flags).await;
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let Imported {
        dir,
        mut hub,
        admin,
        shutdown,
        ..
    } = imported;
    let member = user_kubeconfig(&hub, &admin, &dir, "mia", Some("cluster-member")).await;
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    let pods = kubectl_ok(&member, &["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 3, "{pods}");

    // The hub dies and comes back on the same port: everything it knew was in etcd.
    let port = hub.addr.port().to_string();
    hub.crash().await;
    let listen = format!("127.0.0.1:{port}");
    let flags = ["--listen", listen.as_str(), "--store", store.as_str()];
    let hub = HubProcess::start_with(&dir.join("hub"), &flags).await;
    assert!(hub.admin_password.is_none(), "the admin was kept in etcd");
    let (status, cluster) = api(hub.addr, "GET", "/v1/clusters/prod", Some(&admin), None).await;
    assert_eq!(
        status, 200,
        "the admin's token and the cluster survive: {cluster}"
    );
    // A new admin password goes to etcd, where the running hub reads it (the data directory
    // given holds nothing).
    let r = hub_command(
        &[
            "reset-admin-password",
            "--store",
            &store,
            "--data-dir",
            temp_dir("ha-reset").to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(logs_in(hub.addr, "admin", &printed_password(&r.stdout)).await);
    // The agent reconnects by itself; mia's kubeconfig works as before.
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    let app = dir.join("app.yaml");
    std::fs::write(
        &app,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: after-hub-restart, namespace: default}\n",
    )
    .unwrap();
    kubectl_ok(&member, &["apply", "-f", app.to_str().unwrap()]).await;

    // etcd dies under the running hub and comes back: the hub carries on, watches included
    // (a new user's role reaches the cluster, which takes the hub's watch of role bindings).
    etcd.kill();
    // Alive but not ready while etcd is down (a load balancer sends it nothing), ready again
    // once etcd is back.
    let killed = Instant::now();
    let (status, body) = readiness(&hub, 503).await;
    eprintln!(
        "/readyz answered 503 {:?} after etcd was killed",
        killed.elapsed()
    );
    assert!(body.contains("the store"), "{status}: {body}");
    assert_eq!(https_get(hub.addr, "/healthz").await.0, 200);
    etcd.restart().unwrap();
    readiness(&hub, 200).await;
    let late = user_kubeconfig(&hub, &admin, &dir, "lou", Some("cluster-member")).await;
    until_allowed(&late, &["create", "configmaps", "-n", "default"]).await;
    let names = kubectl_ok(&late, &["get", "configmaps", "-n", "default", "-o", "name"]).await;
    assert!(names.contains("configmap/after-hub-restart"), "{names}");

    shutdown.cancel();
    let _ = agent.await;
}

/// Polls the hub's `/readyz` until it answers `wanted` (within 30 s); the answer.
async fn readiness(hub: &HubProcess, wanted: u16) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = https_get(hub.addr, "/readyz").await;
        let body = String::from_utf8_lossy(&body).into_owned();
        if status == wanted {
            return (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still answers {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_etcd_survive_the_loss_of_the_leader() {
    let etcd = LocalEtcd::start(&temp_dir("ha-etcd")).unwrap();
    let store = etcd.store_url();
    let flags = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    // The first replica imports the cluster; two more join on the same etcd.
    let imported = imported_on("ha-three", &flags).await;
    let dir = imported.dir.clone();
    let second = HubProcess::start_with(&dir.join("hub-2"), &flags).await;
    let third = HubProcess::start_with(&dir.join("hub-3"), &flags).await;
    for other in [&second, &third] {
        assert_eq!(
            other.ca_checksum, imported.hub.ca_checksum,
            "one CA for all replicas"
        );
        assert!(other.admin_password.is_none(), "one admin for all replicas");
    }
    let servers = [&imported.hub, &second, &third]
        .map(HubProcess::url)
        .join(",");

    // The cluster-agent knows all three; it connects to the first.
    let mut env = imported.agent_env("drover-cluster-agent-0").await;
    env.insert("DROVER_SERVER".into(), servers.clone());
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    let Imported {
        hub: first,
        admin,
        shutdown,
        ..
    } = imported;
    let member = user_kubeconfig(&first, &admin, &dir, "mia", Some("cluster-member")).await;
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    // Every replica reaches the cluster: the other two forward to the agent's replica.
    for (hub, label) in [(&second, "mia-2"), (&third, "mia-3")] {
        let kubeconfig = via(&member, &first, hub, label);
        let pods = kubectl_ok(&kubeconfig, &["get", "pods", "-A", "--no-headers"]).await;
        assert_eq!(pods.lines().count(), 3, "through {label}: {pods}");
    }

    // Only a replica (with its client certificate) may use the relay, not even the admin.
    let (status, refused) = api(
        second.addr,
        "GET",
        "/v3/relay/cluster-agent/prod/kube-api/api/v1/pods",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 403, "{refused}");

    // A host registers (through whichever replica is up) and gets a plan, applied once.
    let registration = create_paused_edge(second.addr, &admin).await;
    std::fs::create_dir_all(dir.join("host")).unwrap();
    let mut host = Host::with_servers(
        &servers,
        &first.ca_checksum,
        registration["token"].as_str().unwrap(),
        &dir.join("host"),
    );
    host.start();
    let hosts = until(&third, &admin, "/v1/hosts", Duration::from_secs(30), |v| {
        v["items"].as_array().is_some_and(|items| items.len() == 1)
    })
    .await;
    let name = hosts["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let ran = dir.join("host").join("ran");
    put_plan(
        &second,
        &admin,
        &name,
        json!({"instructions": [counted("once", &ran, "true")]}),
    )
    .await;
    until(
        &third,
        &admin,
        &format!("/v1/plans/{name}"),
        Duration::from_secs(30),
        applied,
    )
    .await;
    assert_eq!(runs(&ran), 1);

    // Kill the leader (started first, it leads: the agents are on it too).
    let hubs = [&first, &second, &third];
    let leader = leader_of(&hubs, Duration::from_secs(15)).await;
    assert_eq!(leader, 0, "the first replica took the lead");
    let (mut first, second, third) = (first, second, third);
    let killed = Instant::now();
    first.crash().await;
    let next = leader_of(&[&second, &third], Duration::from_secs(15)).await;
    eprintln!("a new leader after {:?}", killed.elapsed());
    let (leader, follower) = if next == 0 {
        (&second, &third)
    } else {
        (&third, &second)
    };

    // The agents move to the survivors; kubectl through either keeps working.
    for (hub, label) in [(leader, "mia-leader"), (follower, "mia-follower")] {
        let kubeconfig = via(&member, &first, hub, label);
        until_allowed(&kubeconfig, &["create", "configmaps", "-n", "default"]).await;
        let pods = kubectl_ok(&kubeconfig, &["get", "pods", "-A", "--no-headers"]).await;
        assert_eq!(pods.lines().count(), 3, "through {label}: {pods}");
    }
    // The registration was kept; the plan was not applied again; a new plan reaches the host.
    let (status, _) = api(
        follower.addr,
        "GET",
        &format!("/v1/hosts/{name}"),
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, 200);
    put_plan(
        follower,
        &admin,
        &name,
        json!({"instructions": [counted("next", &ran, "true")]}),
    )
    .await;
    until(
        leader,
        &admin,
        &format!("/v1/plans/{name}"),
        Duration::from_secs(30),
        applied,
    )
    .await;
    assert_eq!(runs(&ran), 2, "the first plan ran once, the second once");

    host.kill().await;
    shutdown.cancel();
    let _ = agent.await;
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reaches_a_cluster_whose_agent_is_on_another_replica() {
    let etcd = LocalEtcd::start(&temp_dir("ha-reach-etcd")).unwrap();
    let store = etcd.store_url();
    let flags = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let imported = Imported::start_with("ha-reach", SimConfig::default(), &flags).await;
    let second = HubProcess::start_with(&imported.dir.join("hub-2"), &flags).await;
    // The first replica leads; the cluster-agent knows only the second.
    let leader = leader_of(&[&imported.hub, &second], Duration::from_secs(15)).await;
    assert_eq!(leader, 0, "the first replica took the lead");
    let mut env = imported.agent_env("drover-cluster-agent-0").await;
    env.insert("DROVER_SERVER".into(), second.url());
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let agent = tokio::spawn(cluster_agent::run(config, imported.shutdown.clone()));
    until(
        &imported.hub,
        &imported.admin,
        "/v1/clusters/prod",
        Duration::from_secs(30),
        |c| c["state"]["state"] == "active",
    )
    .await;

    // Removing the cluster: the leader's controller cleans it up through the agent's replica.
    remove_cluster(&imported.hub, &imported.admin, "prod").await;
    for object in IMPORT_OBJECTS {
        let (ok, _, _) = kubectl(&imported.sim_admin, &["get", object]).await;
        assert!(!ok, "{object} is gone: cleaned through the other replica");
    }
    imported.shutdown.cancel();
    let _ = agent.await;
    drop(etcd);
}

/// Three replicas on a three-member etcd, each member SIGKILLed in turn for longer than a
/// replica's lease lasts (quorum kept), while a client writes and reads through every replica
/// in turn and kubectl runs through each: no request fails beyond the one in flight at a kill,
/// and some replica leads throughout — the leader's lease is renewed through the members that
/// stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_an_etcd_member_costs_no_request_and_no_leader() {
    let dir = temp_dir("ha-members");
    let mut cluster = LocalEtcd::start_cluster(&dir, 3).unwrap();
    let replicas = Replicas::start("ha-members", &LocalEtcd::cluster_url(&cluster)).await;
    let hubs: Vec<&HubProcess> = replicas.hubs.iter().collect();
    leader_of(&hubs, Duration::from_secs(30)).await;
    for (m, member) in cluster.iter_mut().enumerate() {
        let window = replicas
            .load_while(&format!("m{m}"), async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                member.kill();
                // Longer than a replica's lease (10 s).
                tokio::time::sleep(Duration::from_secs(12)).await;
                tokio::task::block_in_place(|| member.restart()).unwrap();
                tokio::time::sleep(Duration::from_secs(2)).await;
            })
            .await;
        eprintln!(
            "etcd member {} killed for 12 s: {} writes through 3 replicas, {} failed; {} \
             kubectl requests, {} failed; no leader for at most {:?}",
            m + 1,
            window.writes,
            window.failed.len(),
            window.kubectl,
            window.kubectl_failed.len(),
            window.leaderless
        );
        // At most the one in flight at the kill.
        assert!(window.failed.len() <= 1, "{:#?}", window.failed);
        assert!(
            window.kubectl_failed.len() <= 1,
            "{:#?}",
            window.kubectl_failed
        );
        assert!(
            window.leaderless < Duration::from_secs(10),
            "member {}: no replica led for {:?}",
            m + 1,
            window.leaderless
        );
    }
    leader_of(&hubs, Duration::from_secs(10)).await;
    replicas.stop().await;
}

/// What every replica's log says after a store outage (each line has all of its parts).
const REBUILT: [&[&str]; 4] = [
    &["rebuilt from a fresh read of the store", "plan dispatch"],
    &[
        "rebuilt from a fresh read of the store",
        "the sign-in cache",
    ],
    &[
        "rebuilt from a fresh read of the store",
        "credential revocations",
    ],
    &["rewrote this replica's address and where its agents are connected"],
];

/// A full etcd outage (its one member killed for 20 s, longer than every replica's lease) and
/// back: every replica's API, a leader, and kubectl through every replica (two of them
/// forwarding to the agent's) serve again within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_full_etcd_outage_every_replica_serves_again() {
    let mut etcd = LocalEtcd::start(&temp_dir("ha-outage")).unwrap();
    let replicas = Replicas::start("ha-outage", &etcd.store_url()).await;
    let (hubs, admin, kubeconfigs) = (&replicas.hubs, &replicas.admin, &replicas.kubeconfigs);

    etcd.kill();
    // Longer than a replica's lease (10 s): every lease, and the lead, may be gone.
    tokio::time::sleep(Duration::from_secs(20)).await;
    etcd.restart().unwrap();
    let back = Instant::now();
    let mut waiting: Vec<String> = Vec::new();
    let mut ready = None;
    while back.elapsed() < Duration::from_secs(60) {
        waiting.clear();
        for (i, hub) in hubs.iter().enumerate() {
            let (code, _) = api(hub.addr, "GET", "/v1/clusters/prod", Some(admin), None).await;
            if code != 200 {
                waiting.push(format!("the API of replica {}: {code}", i + 1));
            }
        }
        let mut leading = 0;
        for hub in hubs {
            leading += usize::from(leads(hub).await);
        }
        if leading != 1 {
            waiting.push(format!("{leading} replicas lead"));
        }
        for (i, kubeconfig) in kubeconfigs.iter().enumerate() {
            let (ok, _, err) = kubectl(kubeconfig, &["get", "pods", "-A", "--no-headers"]).await;
            if !ok {
                waiting.push(format!("kubectl through replica {}: {}", i + 1, err.trim()));
            }
        }
        // Each replica says what it rebuilt: what it reads of the store, and its records for
        // its peers (its lease outlived by the outage).
        for (i, hub) in hubs.iter().enumerate() {
            let log = hub.log.lock().unwrap().join("\n");
            for said in REBUILT {
                if !log
                    .lines()
                    .any(|line| said.iter().all(|s| line.contains(s)))
                {
                    waiting.push(format!("replica {}'s log to say {said:?}", i + 1));
                }
            }
        }
        if waiting.is_empty() {
            ready = Some(back.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, hub) in hubs.iter().enumerate() {
        for line in hub.log.lock().unwrap().iter() {
            if ["store watch ended", "rebuilt", "lease", "rewrote"]
                .iter()
                .any(|s| line.contains(s))
            {
                eprintln!("replica {}: {line}", i + 1);
            }
        }
    }
    let Some(ready) = ready else {
        panic!("60 s after etcd came back, still waiting for: {waiting:#?}");
    };
    eprintln!(
        "after a 20 s etcd outage: every replica's API, one leader and kubectl through every replica in {ready:?}"
    );
    // Not a lease's TTL (10 s): no replica waits for a lease given up to expire.
    assert!(ready < Duration::from_secs(10), "back only after {ready:?}");
    replicas.stop().await;
}

/// A write etcd applied whose answer never came back (a proxy in front of etcd closes the
/// connection instead of passing the answer on): the client is told the change may have been
/// applied, never that nothing changed, and the object is there when read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_lost_is_said_to_be_maybe_applied() {
    let etcd = LocalEtcd::start(&temp_dir("ha-lost")).unwrap();
    let proxy = tests::etcd_proxy::LossyProxy::start(etcd.client_addr()).await;
    let store = format!("etcd://{}", proxy.addr());
    let flags = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let hub = HubProcess::start_with(&temp_dir("ha-lost-hub"), &flags).await;
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_ref().unwrap()).await;

    // The marker is in the object written (a label), not in the read before the write.
    proxy.lose_answer_to(b"lose-this-answer");
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({
            "metadata": {"name": "edge", "labels": {"marker": "lose-this-answer"}},
            "spec": {"type": "imported"},
        })),
    )
    .await;
    assert_eq!(proxy.lost(), 1, "the proxy lost an answer: {code} {body}");
    assert!(
        code == 503 || code == 504,
        "an unknown outcome is a 503 or 504: {code} {body}"
    );
    let message = body.to_string();
    assert!(
        message.contains("may have been applied") && !message.contains("nothing was changed"),
        "{message}"
    );
    // It was applied: read back (through the member the hub moved to), it is there.
    let (code, cluster) = api(hub.addr, "GET", "/v1/clusters/edge", Some(&admin), None).await;
    assert_eq!(code, 200, "{cluster}");
    assert_eq!(cluster["metadata"]["labels"]["marker"], "lose-this-answer");
    // And the hub carries on writing.
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "next"}, "spec": {"type": "imported"}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}
