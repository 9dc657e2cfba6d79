//! Continuous delivery to a fleet of three simulated clusters, judged by the real kubectl in
//! each: a bundle targeting a cluster group applies to the two clusters in it, a change reaches
//! both, a dropped object is pruned, a cluster relabelled later is picked up, an edit in one
//! cluster shows as `Modified` and is undone when drift correction is on, and removing the
//! bundle removes what it applied. The dashboard (a real headless Chromium) shows the drift on
//! the Continuous Delivery page and the cluster's page, and the row turning Ready live.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use sim::cluster::SimConfig;
use tests::{
    HubProcess, api,
    browser::{Driver, check_and_save_as},
    delivery::{found, image, manifests, until},
    hub_cli,
    imported::{Imported, kubectl_ok},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_reaches_the_clusters_it_targets_follows_changes_and_reports_drift() {
    let imported = Imported::start("delivery", SimConfig::default()).await;
    let (hub, admin) = (&imported.hub, imported.admin.as_str());
    let env = imported.agent_env("drover-cluster-agent-0").await;
    // Each agent stops with its own token (west's goes offline for a while).
    let agent = |env: &std::collections::HashMap<String, String>| {
        let mut env = env.clone();
        env.insert("DROVER_DRIFT_SECONDS".into(), "1".into());
        let config = cluster_agent::Config::from_env(&env).unwrap();
        let stop = imported.shutdown.child_token();
        (tokio::spawn(cluster_agent::run(config, stop.clone())), stop)
    };
    let west = imported.another("west").await;
    let lab = imported.another("lab").await;
    let mut agents = vec![agent(&env), agent(&west.env), agent(&lab.env)];
    let label = async |cluster: &str, labels: Value| {
        let (status, body) = api(
            hub.addr,
            "PATCH",
            &format!("/v1/clusters/{cluster}"),
            Some(admin),
            Some(json!({"metadata": {"labels": labels}})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    };
    label("prod", json!({"env": "prod", "region": "eu"})).await;
    label("west", json!({"env": "prod", "region": "us"})).await;
    label("lab", json!({"env": "dev", "region": "eu"})).await;
    // The group and bundle of docs/delivery.md, applied as it says.
    let cli = imported.cli_login();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/delivery.md"))
        .unwrap();
    let yaml = doc
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    assert!(yaml.contains("${cluster.labels.region}"), "{yaml}");
    let file = imported.dir.join("shop.yaml");
    std::fs::write(&file, yaml).unwrap();
    let applied = hub_cli(&cli, &["apply", "-f", file.to_str().unwrap()], "");
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert_eq!(
        applied.stdout,
        "clustergroup/production created\nbundle/shop created\n"
    );
    let bundle = async || {
        api(hub.addr, "GET", "/v1/bundles/shop", Some(admin), None)
            .await
            .1
    };
    let ready = |summary: &'static str| move |b: &Value| b["status"]["summary"] == summary;
    let status = until(
        "the bundle ready in both prod clusters",
        bundle,
        ready("2 of 2 clusters ready"),
    )
    .await;
    assert_eq!(status["status"]["targets"][0]["name"], "production");
    // As docs/delivery.md shows it.
    let listed = hub_cli(&cli, &["bundle", "list"], "").stdout;
    let words: Vec<&str> = listed
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        words[..7],
        ["shop", "2", "2", "of", "2", "clusters", "ready"],
        "{listed}"
    );
    assert!(words[7].starts_with("sha256-"), "{listed}");
    let listed = hub_cli(&cli, &["bundle", "list", "--cluster", "west"], "").stdout;
    let words: Vec<&str> = listed
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(words, ["shop", "west", "production", "Ready"], "{listed}");
    // The bundle's content is stored once, not its objects in its spec.
    assert!(status["spec"].get("manifests").is_none(), "{status}");
    assert_eq!(status["spec"]["content"]["objects"], 2);

    let (prod_k, west_k, lab_k) = (&imported.sim_admin, &west.sim_admin, &lab.sim_admin);
    let web = found(prod_k, "deployment", "web").await;
    assert_eq!(image(&web), "nginx:1.27");
    assert_eq!(
        web["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
        "prod in eu"
    );
    let managers: Vec<&str> = web["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert!(managers.contains(&"drover"), "{managers:?}");
    let west_web = found(west_k, "deployment", "web").await;
    assert_eq!(west_web["metadata"]["labels"]["tier"], "edge");
    assert_eq!(
        west_web["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"],
        "west in us"
    );
    assert!(!found(west_k, "configmap", "settings").await.is_null());
    assert!(
        found(lab_k, "deployment", "web").await.is_null(),
        "lab is not prod"
    );
    // Applied as the namespace's executor, not as the agent.
    let sa = kubectl_ok(
        prod_k,
        &[
            "get",
            "serviceaccount",
            "drover-bundle",
            "-n",
            "shop",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(sa.trim(), "serviceaccount/drover-bundle");

    // A new commit of sorts: another image, the ConfigMap dropped.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/bundles/shop",
        Some(admin),
        Some(json!({"spec": {"manifests": manifests("nginx:1.28", false)}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for k in [prod_k, west_k] {
        until(
            "the new image and the ConfigMap pruned",
            async || {
                json!([
                    image(&found(k, "deployment", "web").await),
                    found(k, "configmap", "settings").await
                ])
            },
            |v| v == &json!(["nginx:1.28", null]),
        )
        .await;
    }

    // lab joins production.
    label("lab", json!({"env": "prod", "region": "eu"})).await;
    until(
        "lab given the bundle",
        bundle,
        ready("3 of 3 clusters ready"),
    )
    .await;
    assert_eq!(
        image(&found(lab_k, "deployment", "web").await),
        "nginx:1.28"
    );

    // west's agent is offline while a change goes out; it catches up when it is back.
    let (west_agent, west_stop) = agents.remove(1);
    west_stop.cancel();
    west_agent.await.unwrap().unwrap();
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/bundles/shop",
        Some(admin),
        Some(json!({"spec": {"manifests": manifests("nginx:1.29", false)}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    until(
        "the others ready, west not",
        bundle,
        ready("2 of 3 clusters ready"),
    )
    .await;
    assert_eq!(
        image(&found(west_k, "deployment", "web").await),
        "nginx:1.28"
    );
    agents.push(agent(&west.env));
    until("west caught up", bundle, ready("3 of 3 clusters ready")).await;
    assert_eq!(
        image(&found(west_k, "deployment", "web").await),
        "nginx:1.29"
    );

    // Someone changes the image by hand in west: the hub hears which field drifted.
    kubectl_ok(
        west_k,
        &[
            "set",
            "image",
            "deployment/web",
            "web=nginx:hotfix",
            "-n",
            "shop",
        ],
    )
    .await;
    let deployment = async || {
        api(
            hub.addr,
            "GET",
            "/v1/bundledeployments/shop.west",
            Some(admin),
            None,
        )
        .await
        .1
    };
    let drifted = until("west's drift reported", deployment, |d| {
        d["status"]["state"] == "Modified"
    })
    .await;
    assert_eq!(
        drifted["status"]["message"],
        "Deployment shop/web: changed in the cluster: .spec.template.spec.containers[name=\"web\"].image",
        "{drifted:#}"
    );
    until("the bundle names the drifted cluster", bundle, |b| {
        b["status"]["problems"][0]["cluster"] == "west"
            && b["status"]["summary"] == "2 of 3 clusters ready"
    })
    .await;
    // The command line says the same.
    let listed = hub_cli(&cli, &["bundle", "list", "--cluster", "west"], "");
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let row = listed
        .stdout
        .lines()
        .find(|l| l.starts_with("shop"))
        .unwrap_or_default();
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        words[..4],
        ["shop", "west", "production", "Modified"],
        "{}",
        listed.stdout
    );
    assert!(row.contains("containers[name=\"web\"].image"), "{row}");
    let listed = hub_cli(&cli, &["bundle", "list"], "");
    assert!(
        listed.stdout.contains("2 of 3 clusters ready"),
        "{}",
        listed.stdout
    );
    assert!(
        listed
            .stdout
            .contains("west: Deployment shop/web: changed in the cluster"),
        "{}",
        listed.stdout
    );
    // The dashboard says the same: the Continuous Delivery page names west and the field,
    // west's page lists the bundle as Modified, and that row turns Ready without a reload
    // once correction is on.
    let driver = Driver::start(&imported.dir).await;
    let browser = driver.browser("admin", 1280, 900).await;
    let base = hub.url();
    browser.goto(&format!("{base}/delivery")).await;
    browser.find("form#login").await;
    browser.type_into("#username", "admin").await;
    browser
        .type_into("#password", hub.admin_password.as_deref().unwrap())
        .await;
    browser.click("form#login button[type=submit]").await;
    browser.find("table#bundles tr[data-name=shop]").await;
    let shown = browser.text("table#bundles tr[data-name=shop]").await;
    assert!(
        shown.contains("2 of 3 clusters ready")
            && shown.contains("west Modified Deployment shop/web: changed in the cluster: .spec.template.spec.containers[name=\"web\"].image"),
        "{shown}"
    );
    check_and_save_as(&browser, "delivery").await;
    browser.goto(&format!("{base}/clusters/west")).await;
    let row = "table#bundles tr[data-name=shop]";
    assert!(
        browser.text(row).await.contains("Modified"),
        "{}",
        browser.text(row).await
    );
    check_and_save_as(&browser, "delivery-cluster").await;

    // With correction on, the agent takes the field back.
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/bundles/shop",
        Some(admin),
        Some(json!({"spec": {"correctDrift": true}})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    until(
        "west's image restored",
        async || json!(image(&found(west_k, "deployment", "web").await)),
        |v| v == "nginx:1.29",
    )
    .await;
    until("all ready again", bundle, ready("3 of 3 clusters ready")).await;
    browser
        .until(
            "west's bundle row Ready on its page, without a reload",
            std::time::Duration::from_secs(30),
            "const row = document.querySelector('table#bundles tr[data-name=shop]'); return row !== null && row.dataset.state === 'Ready';",
        )
        .await;
    browser.close().await;

    // The bundle removed: what it applied goes from every cluster.
    let (status, body) = api(hub.addr, "DELETE", "/v1/bundles/shop", Some(admin), None).await;
    assert_eq!(status, 200, "{body}");
    for k in [prod_k, west_k, lab_k] {
        until(
            "the bundle's objects removed",
            async || found(k, "deployment", "web").await,
            Value::is_null,
        )
        .await;
    }
    imported.shutdown.cancel();
    for (agent, _) in agents {
        agent.await.unwrap().unwrap();
    }
}

/// The hub's answer to GET `path` as the admin.
async fn get(hub: &HubProcess, admin: &str, path: &str) -> Value {
    api(hub.addr, "GET", path, Some(admin), None).await.1
}

async fn patch_bundle(hub: &HubProcess, admin: &str, spec: Value) {
    let (status, body) = api(
        hub.addr,
        "PATCH",
        "/v1/bundles/web",
        Some(admin),
        Some(json!({"spec": spec})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_change_stops_after_the_first_partition_and_a_restarted_hub_resumes_the_rollout() {
    let listen = format!("127.0.0.1:{}", tests::free_port());
    let mut imported = Imported::start_with(
        "delivery-rollout",
        SimConfig::default(),
        &["--listen", &listen],
    )
    .await;
    let admin = imported.admin.clone();
    let env = imported.agent_env("drover-cluster-agent-0").await;
    let west = imported.another("west").await;
    let lab = imported.another("lab").await;
    let mut agents = Vec::new();
    for env in [&env, &west.env, &lab.env] {
        let mut env = env.clone();
        env.insert("DROVER_DRIFT_SECONDS".into(), "1".into());
        let config = cluster_agent::Config::from_env(&env).unwrap();
        agents.push(tokio::spawn(cluster_agent::run(
            config,
            imported.shutdown.clone(),
        )));
    }
    let kubeconfigs = [
        ("prod", imported.sim_admin.clone()),
        ("west", west.sim_admin.clone()),
        ("lab", lab.sim_admin.clone()),
    ];
    for (cluster, _) in &kubeconfigs {
        let (status, body) = api(
            imported.hub.addr,
            "PATCH",
            &format!("/v1/clusters/{cluster}"),
            Some(&admin),
            Some(json!({"metadata": {"labels": {"env": "prod", "region": "eu"}}})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // The canary first, then the rest one cluster at a time.
    tests::create(
        &imported.hub,
        &admin,
        "bundles",
        json!({"metadata": {"name": "web"}, "spec": {
            "defaultNamespace": "shop",
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            "rollout": {"maxUnavailable": "1", "partitions": [{"name": "canary", "clusterName": "prod"}]},
            "manifests": manifests("nginx:1.27", false),
        }}),
    )
    .await;
    let hub = &imported.hub;
    until(
        "all three ready",
        async || get(hub, &admin, "/v1/bundles/web").await,
        |b| b["status"]["summary"] == "3 of 3 clusters ready",
    )
    .await;

    // A bad change: a ClusterRole, which a namespace's executor may not make.
    let mut bad = manifests("nginx:1.28", false);
    bad.push_str("---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: shop-reader}\nrules: []\n");
    patch_bundle(hub, &admin, json!({"manifests": bad})).await;
    let canary = until(
        "the canary refuses the change",
        async || get(hub, &admin, "/v1/bundledeployments/web.prod").await,
        |d| {
            d["status"]["state"] == "ErrApplied" && d["status"]["revision"] == d["spec"]["revision"]
        },
    )
    .await;
    let message = canary["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("ClusterRole shop-reader: ") && message.contains("forbidden"),
        "{message}"
    );
    until(
        "the rollout waiting on the canary",
        async || get(hub, &admin, "/v1/bundles/web").await,
        |b| {
            b["status"]["problems"][0]["cluster"] == "prod"
                && b["status"]["rollout"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("rolling out partition 1 of 2 (canary)"))
        },
    )
    .await;
    // The decision that held the rest back was made with the canary's report in: they keep
    // the last revision.
    for cluster in ["west", "lab"] {
        let d = get(hub, &admin, &format!("/v1/bundledeployments/web.{cluster}")).await;
        assert_eq!(d["status"]["revision"], d["spec"]["revision"], "{d:#}");
        assert_eq!(d["status"]["state"], "Ready", "{d:#}");
    }
    for (_, k) in &kubeconfigs[1..] {
        assert_eq!(image(&found(k, "deployment", "web").await), "nginx:1.27");
    }

    // The fix goes everywhere; each cluster's Deployment is written once for it.
    let generations = async || {
        let mut out = Vec::new();
        for (_, k) in &kubeconfigs {
            out.push(
                found(k, "deployment", "web").await["metadata"]["generation"]
                    .as_u64()
                    .unwrap(),
            );
        }
        out
    };
    let before = generations().await;
    patch_bundle(
        hub,
        &admin,
        json!({"manifests": manifests("nginx:1.28", false)}),
    )
    .await;
    until(
        "the fix everywhere",
        async || get(hub, &admin, "/v1/bundles/web").await,
        |b| b["status"]["summary"] == "3 of 3 clusters ready" && b["status"]["rollout"] == "",
    )
    .await;
    let after = generations().await;
    // prod had 1.28 already (only the ClusterRole failed): unchanged; the others once.
    assert_eq!(
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        [0, 1, 1]
    );

    // Paused, a change waits; the hub is killed and started again; resumed, the rollout goes
    // on from where it was, and nothing is applied twice.
    patch_bundle(
        hub,
        &admin,
        json!({"paused": true, "manifests": manifests("nginx:1.29", false)}),
    )
    .await;
    until(
        "paused",
        async || get(hub, &admin, "/v1/bundles/web").await,
        |b| b["status"]["rollout"] == "paused: 3 cluster(s) wait for the current revision",
    )
    .await;
    patch_bundle(&imported.hub, &admin, json!({"paused": false})).await;
    let change =
        get(&imported.hub, &admin, "/v1/bundles/web").await["spec"]["content"]["digest"].clone();
    until(
        "the canary given the change",
        async || get(&imported.hub, &admin, "/v1/bundledeployments/web.prod").await,
        |d| {
            d["spec"]["content"]["digest"] == change
                && d["status"]["revision"] == d["spec"]["revision"]
        },
    )
    .await;
    imported.hub.crash().await;
    imported.hub = HubProcess::start_with(&imported.dir.join("hub"), &["--listen", &listen]).await;
    let hub = &imported.hub;
    until(
        "the rollout finished after the restart",
        async || get(hub, &admin, "/v1/bundles/web").await,
        |b| b["status"]["summary"] == "3 of 3 clusters ready" && b["status"]["rollout"] == "",
    )
    .await;
    for (_, k) in &kubeconfigs {
        assert_eq!(image(&found(k, "deployment", "web").await), "nginx:1.29");
    }
    let last = generations().await;
    assert_eq!(
        last.iter()
            .zip(&after)
            .map(|(a, b)| a - b)
            .collect::<Vec<_>>(),
        [1, 1, 1],
        "each Deployment written once for the change"
    );
    imported.shutdown.cancel();
    for agent in agents {
        agent.await.unwrap().unwrap();
    }
}
