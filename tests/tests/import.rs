//! Importing a (simulated) cluster end to end, with the real kubectl: the hub's manifest is
//! applied, the cluster-agent starts with its values, and users reach the cluster through the
//! hub's authentication proxy as themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Stdio, time::Duration};

use sim::cluster::SimConfig;
use tests::{
    imported::{
        AGENT_USER, Imported, check_import_manifest, kubectl, kubectl_ok, until_allowed,
        user_kubeconfig,
    },
    wait_for_event,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_cluster_is_reached_through_the_hub_as_each_user() {
    // The downstream cluster, and the hub's manifest applied to it with kubectl.
    let imported = Imported::start(
        "import",
        SimConfig {
            nodes: 2,
            pods: 10,
            ..SimConfig::default()
        },
    )
    .await;
    assert!(
        imported
            .applied
            .contains("deployment.apps/drover-cluster-agent created"),
        "{}",
        imported.applied
    );
    let (_, manifest) = tests::https_get(
        imported.hub.addr,
        &format!("/v3/import/{}.yaml", imported.registration),
    )
    .await;
    check_import_manifest(
        std::str::from_utf8(&manifest).unwrap(),
        "prod",
        &imported.registration,
    );
    // The cluster-agent starts with the values the manifest gives its pod.
    let env = imported.agent_env("drover-cluster-agent-0").await;
    assert_eq!(env["DROVER_TOKEN"], imported.registration);
    assert_eq!(env["DROVER_CLUSTER"], "prod");
    let Imported {
        dir,
        hub,
        admin,
        sim,
        sim_admin,
        shutdown,
        ..
    } = imported;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let connected = tokio::spawn({
        let (addr, admin) = (hub.addr, admin.clone());
        async move {
            wait_for_event(
                addr,
                "/v1/clusters?watch=true",
                &admin,
                Duration::from_secs(30),
                // Connected, and the agent's first facts report has arrived.
                |e| {
                    let status = &e["object"]["status"];
                    status["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Connected" && c["status"] == "True")
                    }) && status["nodes"]["total"].as_u64() == Some(2)
                },
            )
            .await
        }
    });
    let agent = tokio::spawn(cluster_agent::run(config, shutdown.clone()));
    let cluster = connected.await.unwrap();
    let status = &cluster["object"]["status"];
    assert_eq!(status["nodes"]["ready"].as_u64(), Some(2), "{cluster:#}");
    assert!(
        status["kubernetesVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.")),
        "{cluster:#}"
    );
    assert!(
        status["capacity"]["cpuMillicores"].as_u64() > Some(0),
        "{cluster:#}"
    );

    // A cluster-member works with the cluster through the hub, as themselves.
    let member = user_kubeconfig(&hub, &admin, &dir, "mia", Some("cluster-member")).await;
    // The cluster-agent writes mia's role into the cluster's RBAC.
    until_allowed(&member, &["create", "configmaps", "-n", "default"]).await;
    let pods = kubectl_ok(&member, &["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 10, "{pods}");
    let app = dir.join("app.yaml");
    std::fs::write(&app, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {k: v}\n").unwrap();
    assert!(
        kubectl_ok(&member, &["apply", "-f", app.to_str().unwrap()])
            .await
            .contains("created")
    );
    // kubectl's typed clients send protobuf; it passes the proxy both ways unchanged.
    kubectl_ok(
        &member,
        &[
            "create",
            "configmap",
            "typed",
            "-n",
            "default",
            "--from-literal=k=v",
        ],
    )
    .await;
    kubectl_ok(
        &member,
        &[
            "create",
            "secret",
            "generic",
            "typed",
            "-n",
            "default",
            "--from-literal=p=s3cret",
        ],
    )
    .await;
    for args in [
        &[
            "create",
            "deployment",
            "shop",
            "-n",
            "default",
            "--image=nginx:1.27",
        ][..],
        &[
            "scale",
            "deployment",
            "shop",
            "-n",
            "default",
            "--replicas=3",
        ],
        &["label", "deployment", "shop", "-n", "default", "tier=web"],
        &[
            "annotate",
            "deployment",
            "shop",
            "-n",
            "default",
            "owner=mia",
        ],
    ] {
        kubectl_ok(&member, args).await;
    }
    let shop = kubectl_ok(
        &member,
        &["describe", "deployment", "shop", "-n", "default"],
    )
    .await;
    for line in [
        "Replicas:               3 desired",
        "tier=web",
        "owner: mia",
    ] {
        assert!(shop.contains(line), "{line:?} in {shop}");
    }
    assert!(
        kubectl_ok(&member, &["describe", "namespace", "default"])
            .await
            .contains("No resource quota.")
    );
    kubectl_ok(&member, &["delete", "deployment", "shop", "-n", "default"]).await;
    let described = kubectl_ok(&member, &["describe", "secret", "typed", "-n", "default"]).await;
    assert!(described.contains("p:  6 bytes"), "{described}");
    // exec, cp and attach stream through the hub and the tunnel as the member.
    let echoed = kubectl_ok(
        &member,
        &[
            "exec",
            "pod-0",
            "-n",
            "load-0",
            "--",
            "sh",
            "-c",
            "echo $HOSTNAME",
        ],
    )
    .await;
    assert_eq!(echoed, "pod-0\n");
    let local = dir.join("cp.txt");
    std::fs::write(&local, "through the hub\n").unwrap();
    kubectl_ok(
        &member,
        &["cp", local.to_str().unwrap(), "load-0/pod-0:/tmp/cp.txt"],
    )
    .await;
    let copied = kubectl_ok(
        &member,
        &["exec", "pod-0", "-n", "load-0", "--", "cat", "/tmp/cp.txt"],
    )
    .await;
    assert_eq!(copied, "through the hub\n");
    assert!(
        sim.audit()
            .iter()
            .any(|e| e.user == "mia" && e.path.ends_with("/pods/pod-0/exec")),
        "the cluster saw the exec as mia"
    );
    let echoed =
        tests::imported::port_forward(&member, "load-0", "pod-0", 80, &["via the hub\n"]).await;
    assert_eq!(echoed, ["via the hub\n"]);
    let attached = tests::imported::attach_first_line(&member, "load-0", "pod-0").await;
    assert!(attached.ends_with(" from pod-0/main"), "{attached}");
    let logs = kubectl_ok(&member, &["logs", "pod-0", "-n", "load-0", "--tail=3"]).await;
    assert_eq!(logs.lines().count(), 3, "{logs}");
    assert!(
        kubectl_ok(&member, &["delete", "cm", "app", "-n", "default"])
            .await
            .contains("deleted")
    );
    // Watches stream through the proxy: a change made straight on the cluster shows up.
    let mut watch = tokio::process::Command::new("kubectl")
        .args([
            "get",
            "pods",
            "-n",
            "load-0",
            "-w",
            "--show-labels",
            "--request-timeout=30s",
        ])
        .env("KUBECONFIG", &member)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    let header = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(header.starts_with("NAME"), "{header}");
    kubectl_ok(
        &sim_admin,
        &["label", "pod", "pod-0", "-n", "load-0", "seen=through-hub"],
    )
    .await;
    let row = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap().expect("watch ended");
            if line.contains("seen=through-hub") {
                return line;
            }
        }
    })
    .await
    .unwrap();
    assert!(row.starts_with("pod-0"), "{row}");
    drop(watch);

    let acted_as_mia = sim
        .audit()
        .into_iter()
        .filter(|e| e.user == "mia")
        .collect::<Vec<_>>();
    assert!(acted_as_mia.len() >= 4, "{acted_as_mia:?}");
    assert!(
        acted_as_mia
            .iter()
            .all(|e| e.impersonated_by.as_deref() == Some(AGENT_USER))
    );
    assert!(
        acted_as_mia
            .iter()
            .all(|e| e.groups.iter().any(|g| g == "drover:authenticated"))
    );

    // A forged Impersonate-User from the caller is dropped: the request still acts as mia.
    kubectl_ok(
        &member,
        &["get", "ns", "default", "--as", "kubernetes-admin"],
    )
    .await;
    assert!(
        !sim.audit()
            .iter()
            .any(|e| e.user == "kubernetes-admin" && e.impersonated_by.is_some())
    );

    // A user without a role on the cluster is refused by the hub; nothing reaches the cluster.
    let outsider = user_kubeconfig(&hub, &admin, &dir, "otto", None).await;
    let before = sim.audit().len();
    let (ok, _, stderr) = kubectl(&outsider, &["get", "pods", "-A"]).await;
    assert!(
        !ok && (stderr.contains("Forbidden") || stderr.contains("forbidden")),
        "{stderr}"
    );
    // Nothing acted as otto, nor on anyone's behalf while the refused request ran (the
    // agent's own requests, such as its lease renewals, go on meanwhile).
    let meanwhile = sim.audit().split_off(before);
    assert!(
        meanwhile.iter().all(|e| e.impersonated_by.is_none()),
        "the refused request never reached the cluster: {meanwhile:?}"
    );
    assert!(!sim.audit().iter().any(|e| e.user == "otto"));
    // And learns nothing about which clusters exist: a missing one answers the same.
    let otto = tests::imported::kubeconfig_token(&outsider);
    let (exists, a) =
        tests::api(hub.addr, "GET", "/k8s/clusters/prod/api", Some(&otto), None).await;
    let (missing, b) =
        tests::api(hub.addr, "GET", "/k8s/clusters/zulu/api", Some(&otto), None).await;
    assert_eq!((exists, missing), (403, 403));
    assert_eq!(
        a["message"].as_str().unwrap().replace("prod", "X"),
        b["message"].as_str().unwrap().replace("zulu", "X")
    );

    // A read-only user reads, and the hub refuses their writes before the cluster sees them.
    let reader = user_kubeconfig(&hub, &admin, &dir, "rita", Some("read-only")).await;
    until_allowed(&reader, &["list", "pods", "-n", "load-0"]).await;
    kubectl_ok(&reader, &["get", "pods", "-n", "load-0"]).await;
    let (ok, _, stderr) = kubectl(&reader, &["delete", "pod", "pod-0", "-n", "load-0"]).await;
    assert!(!ok && stderr.contains("read-only"), "{stderr}");
    for denied in [
        &["exec", "pod-0", "-n", "load-0", "--", "true"][..],
        &["attach", "pod-0", "-n", "load-0"],
        &["cp", "load-0/pod-0:/etc/hostname", "/dev/null"],
        &[
            "port-forward",
            "pod/pod-0",
            "-n",
            "load-0",
            "--address",
            "127.0.0.1",
            ":80",
        ],
    ] {
        let (ok, _, stderr) = kubectl(&reader, denied).await;
        assert!(!ok && stderr.contains("read-only"), "{denied:?}: {stderr}");
    }
    let rita = sim.audit().into_iter().filter(|e| e.user == "rita");
    assert!(rita.clone().count() > 0 && rita.clone().all(|e| e.method != "DELETE"));
    let rita_token = tests::imported::kubeconfig_token(&reader);
    // exec without an Upgrade header, and a proxy to a pod, a service or a node, are writes
    // too whatever the method: the hub refuses them, the cluster never sees them. (`kubectl
    // get --raw` would drop the kubeconfig's /k8s/clusters/prod: sent to the proxy as is.)
    for raw in [
        "/api/v1/namespaces/load-0/pods/pod-0/exec?command=true",
        "/api/v1/namespaces/load-0/pods/pod-0/proxy",
        "/api/v1/namespaces/load-0/services/web/proxy/metrics",
        "/api/v1/nodes/sim-node-0/proxy/configz",
    ] {
        for method in ["GET", "HEAD"] {
            let path = format!("/k8s/clusters/prod{raw}");
            let (status, answer) =
                tests::api(hub.addr, method, &path, Some(&rita_token), None).await;
            assert_eq!(status, 403, "{method} {raw}: {answer}");
            if method == "GET" {
                assert!(
                    answer["message"].as_str().unwrap().contains("read-only"),
                    "{answer}"
                );
            }
        }
    }
    let reached = |e: &&sim::cluster::AuditEntry| {
        e.user == "rita" && (e.path.contains("/exec") || e.path.contains("/proxy"))
    };
    assert_eq!(
        sim.audit().iter().filter(reached).count(),
        0,
        "a read-only user's exec or proxy reached the cluster"
    );
    // A write spelled as a read (decoded it is a self-review, which read-only users may
    // POST; the API server would clean it into a configmap write) is refused as ambiguous.
    let sneaky = "/k8s/clusters/prod/apis/authorization.k8s.io/../../api/v1/namespaces/load-0/configmaps%3F/selfsubjectaccessreviews";
    let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sneaked"}});
    let (status, answer) =
        tests::api(hub.addr, "POST", sneaky, Some(&rita_token), Some(body)).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("ambiguous"),
        "{answer}"
    );
    let (found, _, _) = kubectl(&sim_admin, &["get", "configmap", "sneaked", "-n", "load-0"]).await;
    assert!(!found, "nothing was written downstream");
    assert!(
        sim.audit()
            .iter()
            .all(|e| !(e.user == "rita" && e.method == "POST" && !e.path.contains("selfsubject")))
    );
    // The cluster's own RBAC (as the cluster-agent wrote it) says the same: kubectl auth
    // can-i asks the cluster, and the cluster refuses rita's delete when it gets one.
    let (_, answer, _) = kubectl(
        &reader,
        &["auth", "can-i", "delete", "pods", "-n", "load-0"],
    )
    .await;
    assert_eq!(answer.trim(), "no");
    let (ok, _, stderr) = kubectl(
        &sim_admin,
        &["delete", "pod", "pod-0", "-n", "load-0", "--as", "rita"],
    )
    .await;
    assert!(
        !ok && stderr.contains("User \"rita\" cannot delete resource \"pods\""),
        "{stderr}"
    );
    kubectl_ok(&sim_admin, &["get", "pod", "pod-0", "-n", "load-0"]).await;

    // A revoked token is refused by the proxy from the very next request (it was served
    // from the hub's memory a moment before).
    let rita = tests::imported::kubeconfig_token(&reader);
    let pod = "/k8s/clusters/prod/api/v1/namespaces/load-0/pods/pod-0";
    let (code, _) = tests::api(hub.addr, "GET", pod, Some(&rita), None).await;
    assert_eq!(code, 200);
    let name = rita
        .strip_prefix("drt_")
        .and_then(|t| t.split_once('.'))
        .map(|(n, _)| n.to_owned())
        .unwrap();
    let (code, body) = tests::api(
        hub.addr,
        "DELETE",
        &format!("/v1/tokens/{name}"),
        Some(&admin),
        None,
    )
    .await;
    assert!((200..300).contains(&code), "{code} {body}");
    let (code, body) = tests::api(hub.addr, "GET", pod, Some(&rita), None).await;
    assert_eq!(code, 401, "{body}");

    shutdown.cancel();
    let _ = agent.await;
    // With the agent gone, the proxy says so, naming the cluster.
    let (ok, _, stderr) = kubectl(&member, &["get", "ns"]).await;
    assert!(!ok && stderr.contains("not connected"), "{stderr}");
    assert!(hub.terminate().await);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_another_clusters_token_stops_saying_which_cluster_it_belongs_to() {
    let imported = Imported::start("import-mismatch", SimConfig::default()).await;
    // prod's manifest, with the cluster's name changed by hand.
    let mut env = imported.agent_env("drover-cluster-agent-0").await;
    env.insert("DROVER_CLUSTER".into(), "staging".into());
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let state = config.hub.state_dir.clone();
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        cluster_agent::run(config, imported.shutdown.clone()),
    )
    .await
    .expect("the agent stops")
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("belongs to cluster \"prod\", not DROVER_CLUSTER=\"staging\""),
        "{err}"
    );
    assert!(!state.join("registration.json").exists(), "nothing is kept");
    imported.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leading_cluster_agent_replica_holds_a_hub_session() {
    let imported = Imported::start("import-leader", SimConfig::default()).await;
    // Two replicas, as the Deployment runs them. The second has a service account of its own
    // (bound as the first is), so the cluster's audit log tells its requests apart.
    let second_user = "system:serviceaccount:drover-system:drover-agent-b";
    let binding = imported.dir.join("agent-b.yaml");
    std::fs::write(
        &binding,
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: drover-agent-b, namespace: drover-system}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {name: drover-agent-b}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n\
         subjects: [{kind: ServiceAccount, name: drover-agent-b, namespace: drover-system}]\n",
    )
    .unwrap();
    kubectl_ok(
        &imported.sim_admin,
        &["apply", "-f", binding.to_str().unwrap()],
    )
    .await;
    let second_token = kubectl_ok(
        &imported.sim_admin,
        &["create", "token", "drover-agent-b", "-n", "drover-system"],
    )
    .await;
    let mut first = imported.agent_env("drover-cluster-agent-0").await;
    let mut second = imported.agent_env("drover-cluster-agent-1").await;
    let second_kubeconfig = imported.dir.join("agent-b.kubeconfig");
    std::fs::write(
        &second_kubeconfig,
        imported.sim.kubeconfig(second_token.trim()),
    )
    .unwrap();
    second.insert("KUBECONFIG".into(), second_kubeconfig.display().to_string());
    for env in [&mut first, &mut second] {
        env.insert("DROVER_LEASE_SECONDS".into(), "3".into());
    }
    let (hub, admin) = (imported.hub.addr, imported.admin.clone());
    let connected = |replica: &'static str| replica_connections(hub, admin.clone(), replica);

    // The first leads and connects.
    let first_stop = CancellationToken::new();
    let first_agent = tokio::spawn(cluster_agent::run(
        cluster_agent::Config::from_env(&first).unwrap(),
        first_stop.clone(),
    ));
    wait_for_event(
        hub,
        "/v1/clusters?watch=true",
        &imported.admin,
        Duration::from_secs(30),
        |e| {
            e["object"]["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "Connected" && c["status"] == "True")
                })
        },
    )
    .await;
    // The second starts and stands by: it reads the lease (again and again) and connects to
    // nothing while the first holds it.
    let second_stop = CancellationToken::new();
    let second_agent = tokio::spawn(cluster_agent::run(
        cluster_agent::Config::from_env(&second).unwrap(),
        second_stop.clone(),
    ));
    let lease_reads = || {
        imported
            .sim
            .audit()
            .iter()
            .filter(|e| e.user == second_user && e.path.contains("/leases/drover-cluster-agent"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lease_reads() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second replica never read the lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(connected("drover-cluster-agent-0").await, 1);
    assert_eq!(
        connected("drover-cluster-agent-1").await,
        0,
        "a standing-by replica holds no session"
    );
    // The first stops (and gives the lease up): the second takes over and connects.
    first_stop.cancel();
    first_agent.await.unwrap().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while connected("drover-cluster-agent-1").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second replica never took over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    second_stop.cancel();
    second_agent.await.unwrap().unwrap();
    imported.shutdown.cancel();
}

/// How many times cluster-agent replica `replica` of prod connected, from the hub's events.
async fn replica_connections(hub: std::net::SocketAddr, admin: String, replica: &str) -> usize {
    let (_, events) = tests::api(hub, "GET", "/v1/events?cluster=prod", Some(&admin), None).await;
    let id = format!("cluster/prod/{replica} ");
    events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == "AgentConnected"
                && e["message"].as_str().is_some_and(|m| m.contains(&id))
        })
        .count()
}

/// A cluster whose agents' images come from a private registry: the import manifest pulls them
/// from there with a pull secret made from the registry credential, and gives the agents the
/// cluster's `agentEnv` (a proxy) from a Secret; kubectl applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_manifest_pulls_the_agents_from_a_private_registry() {
    let dir = tests::temp_dir("import-registry");
    let hub = tests::HubProcess::start(&dir.join("hub")).await;
    let admin = tests::login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let registry = "registry.corp.example:5000";
    let (code, cluster) = tests::api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(serde_json::json!({"metadata": {"name": "corp"}, "spec": {"type": "imported",
            "agentImages": {"registry": registry, "pullPolicy": "Always", "pullCredential": "corp-pull"},
            "agentEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.corp.example:3128"},
                         {"name": "NO_PROXY", "value": ".svc,10.0.0.0/8"}]}})),
    )
    .await;
    assert_eq!(code, 201, "{cluster}");
    let registration = cluster["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    // Without its credential the manifest cannot be made, and the answer says why.
    let (code, body) = tests::https_get(hub.addr, &format!("/v3/import/{registration}.yaml")).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("CloudCredential corp-pull does not exist"),
        "{body}"
    );
    let (code, body) = tests::api(
        hub.addr,
        "POST",
        "/v1/cloudcredentials",
        Some(&admin),
        Some(
            serde_json::json!({"metadata": {"name": "corp-pull"}, "spec": {"driver": "registry",
            "registry": {"username": "puller", "password": "pull s3cret"}}}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");

    let imported = Imported::attach(dir, hub, admin, registration, SimConfig::default()).await;
    assert!(
        imported.applied.contains("secret/drover-registry created"),
        "{}",
        imported.applied
    );
    let get = |kind: &'static str, name: &'static str| {
        let kubeconfig = imported.sim_admin.clone();
        async move {
            let json = kubectl_ok(
                &kubeconfig,
                &["get", kind, name, "-n", "drover-system", "-o", "json"],
            )
            .await;
            serde_json::from_str::<serde_json::Value>(&json).unwrap()
        }
    };
    let secret = get("secret", "drover-registry").await;
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    use base64::Engine as _;
    let config: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(secret["data"][".dockerconfigjson"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let login = &config["auths"][registry];
    assert_eq!(
        (login["username"].as_str(), login["password"].as_str()),
        (Some("puller"), Some("pull s3cret"))
    );
    assert_eq!(
        login["auth"],
        base64::engine::general_purpose::STANDARD.encode("puller:pull s3cret")
    );
    let version = env!("CARGO_PKG_VERSION");
    for (kind, name, image) in [
        ("deployment", "drover-cluster-agent", "cluster-agent"),
        ("daemonset", "drover-node-agent", "node-agent"),
    ] {
        let pod = &get(kind, name).await["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["image"],
            format!("{registry}/drover/{image}:{version}"),
            "{kind}"
        );
        assert_eq!(pod["containers"][0]["imagePullPolicy"], "Always", "{kind}");
        assert_eq!(
            pod["imagePullSecrets"],
            serde_json::json!([{"name": "drover-registry"}]),
            "{kind}"
        );
    }
    // The agents get the cluster's environment, as Kubernetes builds it from the Secret.
    let env = imported.agent_env("drover-cluster-agent-0").await;
    assert_eq!(env["HTTPS_PROXY"], "http://proxy.corp.example:3128");
    assert_eq!(env["NO_PROXY"], ".svc,10.0.0.0/8");
    let env = imported.node_agent_env("node-1").await;
    assert_eq!(env["HTTPS_PROXY"], "http://proxy.corp.example:3128");
    imported.shutdown.cancel();
}
