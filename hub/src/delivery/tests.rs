#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::*;
use crate::model::ContentRef;

fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterFacts {
    ClusterFacts {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn bundle(spec: serde_json::Value) -> BundleSpec {
    let mut spec: BundleSpec = serde_json::from_value(spec).unwrap();
    spec.content = Some(ContentRef {
        digest: "sha256-c".into(),
        chunks: vec!["sha256-c".into()],
        objects: 1,
        bytes: 10,
    });
    spec
}

fn fleet() -> Vec<ClusterFacts> {
    vec![
        cluster("east", &[("env", "prod"), ("region", "eu")]),
        cluster("west", &[("env", "prod"), ("region", "us")]),
        cluster("lab", &[("env", "dev")]),
    ]
}

#[test]
fn targets_pick_clusters_by_name_labels_and_group() {
    let mut groups = BTreeMap::new();
    groups.insert(
        "europe".to_string(),
        LabelSelector::parse("region=eu").unwrap(),
    );
    // (targets, the clusters that get the bundle, and under which target)
    let cases = [
        (
            json!([{"clusterSelector": {"matchLabels": {"env": "prod"}}}]),
            vec![("east", "target-0"), ("west", "target-0")],
        ),
        (
            json!([{"clusterName": "lab", "name": "the-lab"}]),
            vec![("lab", "the-lab")],
        ),
        (
            json!([{"clusterGroup": "europe"}]),
            vec![("east", "target-0")],
        ),
        (json!([{"clusterGroup": "nowhere"}]), vec![]),
        // Several ways in one target must all hold; the first matching target names it.
        (
            json!([{"clusterGroup": "europe", "clusterName": "west"},
                   {"name": "dev", "clusterSelector": {"matchLabels": {"env": "dev"}}},
                   {"name": "all", "clusterSelector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]}}]),
            vec![("east", "all"), ("lab", "dev"), ("west", "all")],
        ),
    ];
    for (targets, expected) in cases {
        let mut bundles = BTreeMap::new();
        bundles.insert("app".to_string(), bundle(json!({"targets": targets})));
        let (got, _) = desired(&bundles, &fleet(), &groups, &BTreeMap::new());
        let got: Vec<(&str, &str)> = got
            .values()
            .map(|d| (d.cluster.as_str(), d.target.as_str()))
            .collect();
        assert_eq!(got, expected, "targets {targets}");
    }
}

#[test]
fn every_matching_customisation_applies_in_order() {
    let spec = bundle(json!({
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        "customizations": [
            {"clusterSelector": {"matchLabels": {"env": "prod"}}, "namespace": "shop",
             "labels": {"tier": "prod", "team": "a"}, "images": {"nginx": "mirror/nginx"}},
            {"clusterName": "west", "namespace": "shop-us", "labels": {"team": "b"}},
            {"clusterName": "lab", "namespace": "never"},
        ],
    }));
    let groups = BTreeMap::new();
    let east = deployment_for("app", &spec, &fleet()[0], &groups).unwrap();
    let west = deployment_for("app", &spec, &fleet()[1], &groups).unwrap();
    assert!(deployment_for("app", &spec, &fleet()[2], &groups).is_none());
    assert_eq!(east.namespace, "shop");
    assert_eq!(west.namespace, "shop-us");
    assert_eq!(west.labels["tier"], "prod");
    assert_eq!(west.labels["team"], "b");
    assert_eq!(west.images["nginx"], "mirror/nginx");
    assert_eq!(west.vars["cluster.name"], "west");
    assert_eq!(west.vars["cluster.labels.region"], "us");
    assert_ne!(east.revision, west.revision);
    assert_eq!(east.revision, revision(&east));
}

#[test]
fn a_bundle_waits_for_what_it_depends_on_to_be_ready_in_that_cluster() {
    let groups = BTreeMap::new();
    let mut bundles = BTreeMap::new();
    let all = json!([{"clusterSelector": {"matchLabels": {"env": "prod"}}}]);
    bundles.insert("base".to_string(), bundle(json!({"targets": all})));
    bundles.insert(
        "app".to_string(),
        bundle(json!({"targets": all, "dependsOn": ["base"]})),
    );
    let (first, _) = desired(&bundles, &fleet(), &groups, &BTreeMap::new());
    assert_eq!(
        first.keys().collect::<Vec<_>>(),
        ["base.east", "base.west"],
        "nothing of app before base is ready"
    );
    // base is ready in east only.
    let mut existing: BTreeMap<String, (BundleDeploymentSpec, Reported)> = first
        .iter()
        .map(|(n, s)| (n.clone(), (s.clone(), Reported::default())))
        .collect();
    let east = existing.get_mut("base.east").unwrap();
    east.1 = Reported {
        revision: east.0.revision.clone(),
        state: "Ready".into(),
    };
    let west = existing.get_mut("base.west").unwrap();
    west.1 = Reported {
        revision: west.0.revision.clone(),
        state: "NotReady".into(),
    };
    let (next, _) = desired(&bundles, &fleet(), &groups, &existing);
    assert_eq!(
        next.keys().collect::<Vec<_>>(),
        ["app.east", "base.east", "base.west"]
    );
}

#[test]
fn a_bundles_status_counts_ready_clusters_per_target_and_names_the_broken() {
    let spec = |cluster: &str, target: &str| BundleDeploymentSpec {
        bundle: "app".into(),
        cluster: cluster.into(),
        target: target.into(),
        revision: "r2".into(),
        ..BundleDeploymentSpec::default()
    };
    let (a, b, c) = (
        spec("east", "prod"),
        spec("west", "prod"),
        spec("lab", "dev"),
    );
    let ready = json!({"revision": "r2", "state": "Ready"});
    let broken = json!({"revision": "r2", "state": "ErrApplied", "message": "Deployment shop/web: forbidden"});
    let old = json!({"revision": "r1", "state": "Ready"});
    let status = summarize(&[(&a, &ready), (&b, &broken), (&c, &old)]);
    assert_eq!(status["summary"], "1 of 3 clusters ready");
    assert_eq!(
        status["targets"],
        json!([
            {"name": "dev", "ready": 0, "clusters": 1, "summary": "0 of 1 clusters ready"},
            {"name": "prod", "ready": 1, "clusters": 2, "summary": "1 of 2 clusters ready"},
        ])
    );
    assert_eq!(
        status["problems"],
        json!([{"cluster": "west", "state": "ErrApplied", "message": "Deployment shop/web: forbidden"}])
    );
}

#[tokio::test]
async fn a_cluster_reads_and_reports_only_what_was_delivered_to_it() {
    use crate::store::sqlite::SqliteStore;
    let dir = std::env::temp_dir().join(format!("drover-delivery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(&dir.join("state.db")).unwrap();
    let store: &dyn Store = &store;
    for (name, env) in [("east", "prod"), ("west", "prod"), ("lab", "dev")] {
        let mut cluster = Object::new(Kind::Cluster.name(), name, json!({"type": "imported"}));
        cluster.metadata.labels.insert("env".into(), env.into());
        store.create(cluster).await.unwrap();
    }
    let objects = vec![json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})];
    let stored = content::store_objects(store, &objects).await.unwrap();
    // The same content again is the same chunks, not new ones.
    assert_eq!(
        content::store_objects(store, &objects).await.unwrap(),
        stored
    );
    let spec = json!({"targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
                      "content": stored});
    store
        .create(Object::new(Kind::Bundle.name(), "app", spec))
        .await
        .unwrap();
    let delivered = async || {
        pass(store).await.unwrap();
        let (deployments, _) = store
            .list(Kind::BundleDeployment.name(), &LabelSelector::everything())
            .await
            .unwrap();
        deployments
            .into_iter()
            .map(|d| d.metadata.name)
            .collect::<Vec<_>>()
    };
    assert_eq!(delivered().await, ["app.east", "app.west"]);
    let (chunks, _) = store
        .list(crate::model::CHUNK_KIND, &LabelSelector::everything())
        .await
        .unwrap();
    assert_eq!(chunks.len(), 1, "stored once for both clusters");

    let chunk = &stored.chunks[0];
    let index = super::index::Index::default();
    let (all, _) = store
        .list(Kind::BundleDeployment.name(), &LabelSelector::everything())
        .await
        .unwrap();
    index.replace_all(&all);
    assert!(follow::chunk(store, &index, "east", chunk).await.is_ok());
    let refused = follow::chunk(store, &index, "lab", chunk)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    assert_eq!(
        follow::chunk(store, &index, "lab", "sha256-nothing")
            .await
            .unwrap_err()
            .message(),
        "no chunk sha256-nothing for this cluster",
        "refused exactly as missing"
    );
    let report = |name: &str| proto::cluster::v1::BundleReport {
        name: name.into(),
        revision: "r".into(),
        ..Default::default()
    };
    let refused = follow::report(store, "lab", report("app.east"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound);
    follow::report(store, "east", report("app.east"))
        .await
        .unwrap();

    // lab relabelled: picked up; west's label gone: its deployment goes.
    let mut lab = store.get(Kind::Cluster.name(), "lab").await.unwrap();
    lab.metadata.labels.insert("env".into(), "prod".into());
    store.update(lab).await.unwrap();
    let mut west = store.get(Kind::Cluster.name(), "west").await.unwrap();
    west.metadata.labels.clear();
    store.update(west).await.unwrap();
    assert_eq!(delivered().await, ["app.east", "app.lab"]);
    // Content still named is never swept, however old.
    assert_eq!(sweep_chunks(store).await.unwrap(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_change_goes_partition_by_partition_and_a_bad_one_stops_in_the_first() {
    let groups = BTreeMap::new();
    let fleet: Vec<ClusterFacts> = ["c1", "c2", "c3", "c4"]
        .iter()
        .map(|n| cluster(n, &[("env", "prod")]))
        .collect();
    let spec = |image: &str, paused: bool| {
        let mut b = bundle(json!({
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            "rollout": {"maxUnavailable": "1", "partitions": [{"name": "canary", "clusterName": "c1"}]},
            "paused": paused,
        }));
        b.content.as_mut().unwrap().digest = image.into();
        b
    };
    // Every cluster has `v1` and is ready with it; each case says which clusters have `v2`
    // and how they stand, and expects who is given v2 now and what the rollout says.
    let old = spec("v1", false);
    let at = |c: &ClusterFacts, b: &BundleSpec| deployment_for("app", b, c, &groups).unwrap();
    type Case<'a> = (
        &'a str,
        bool,
        &'a [(&'a str, &'a str)],
        &'a [&'a str],
        &'a str,
    );
    let cases: [Case<'_>; 5] = [
        (
            "v2",
            false,
            &[],
            &["c1"],
            "rolling out partition 1 of 2 (canary): waiting for c1 to be ready with the current revision",
        ),
        (
            "v2",
            false,
            &[("c1", "Ready")],
            &["c1", "c2"],
            "rolling out partition 2 of 2 (the rest): waiting for c2, c3, c4 to be ready with the current revision",
        ),
        (
            "v2",
            false,
            &[("c1", "ErrApplied")],
            &["c1"],
            "rolling out partition 1 of 2 (canary): waiting for c1 to be ready with the current revision",
        ),
        (
            "v2",
            false,
            &[("c1", "Ready"), ("c2", "Ready"), ("c3", "NotReady")],
            &["c1", "c2", "c3"],
            "rolling out partition 2 of 2 (the rest): waiting for c3, c4 to be ready with the current revision",
        ),
        (
            "v2",
            true,
            &[("c1", "Ready")],
            &["c1"],
            "paused: 3 cluster(s) wait for the current revision",
        ),
    ];
    for (image, paused, given, expected, message) in cases {
        let new = spec(image, paused);
        let existing: BTreeMap<String, (BundleDeploymentSpec, Reported)> = fleet
            .iter()
            .map(|c| {
                let state = given.iter().find(|(n, _)| *n == c.name).map(|(_, s)| *s);
                let spec = at(c, if state.is_some() { &new } else { &old });
                let reported = Reported {
                    revision: spec.revision.clone(),
                    state: state.unwrap_or("Ready").into(),
                };
                (deployment_name("app", &c.name), (spec, reported))
            })
            .collect();
        let mut bundles = BTreeMap::new();
        bundles.insert("app".to_string(), new.clone());
        let (out, waiting) = desired(&bundles, &fleet, &groups, &existing);
        let on_new: Vec<&str> = out
            .values()
            .filter(|d| d.content.digest == image)
            .map(|d| d.cluster.as_str())
            .collect();
        assert_eq!(on_new, expected, "given {given:?}, paused {paused}");
        assert_eq!(out.len(), 4, "every cluster keeps a deployment");
        assert_eq!(waiting["app"], message);
    }
    // A cluster new to the bundle gets the current revision at once, even while the first
    // partition holds the rest back.
    let mut with_new = fleet.clone();
    with_new.push(cluster("c5", &[("env", "prod")]));
    let existing: BTreeMap<String, (BundleDeploymentSpec, Reported)> = fleet
        .iter()
        .map(|c| {
            let spec = at(c, &old);
            let reported = Reported {
                revision: spec.revision.clone(),
                state: "Ready".into(),
            };
            (deployment_name("app", &c.name), (spec, reported))
        })
        .collect();
    let mut bundles = BTreeMap::new();
    bundles.insert("app".to_string(), spec("v2", false));
    let (out, _) = desired(&bundles, &with_new, &groups, &existing);
    assert_eq!(out["app.c5"].content.digest, "v2");
    assert_eq!(out["app.c3"].content.digest, "v1");
}

#[test]
fn a_gitrepos_cluster_is_ready_when_every_bundle_of_it_is_ready_there() {
    let spec = |bundle: &str, cluster: &str| BundleDeploymentSpec {
        bundle: bundle.into(),
        cluster: cluster.into(),
        target: "prod".into(),
        revision: "r".into(),
        ..BundleDeploymentSpec::default()
    };
    let (a1, b1, a2, b2) = (
        spec("a", "east"),
        spec("b", "east"),
        spec("a", "west"),
        spec("b", "west"),
    );
    let ready = json!({"revision": "r", "state": "Ready"});
    let drifted = json!({"revision": "r", "state": "Modified"});
    let status =
        summarize_clusters(&[(&a1, &ready), (&b1, &ready), (&a2, &ready), (&b2, &drifted)]);
    assert_eq!(status["summary"], "1 of 2 clusters ready");
    assert_eq!(
        status["targets"],
        json!([{"name": "prod", "ready": 1, "clusters": 2, "summary": "1 of 2 clusters ready"}])
    );
}

#[test]
fn a_status_counts_every_object_and_names_only_some_of_those_not_ready() {
    let object = |i: usize, state: &str| proto::cluster::v1::ObjectState {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
        name: format!("c-{i}"),
        state: state.into(),
        message: if state == "Ready" {
            String::new()
        } else {
            "changed in the cluster: .data.a".into()
        },
    };
    let healthy = proto::cluster::v1::BundleReport {
        name: "app.east".into(),
        revision: "r".into(),
        objects: (0..1000).map(|i| object(i, "Ready")).collect(),
        error: String::new(),
    };
    let status = follow::status_of(&healthy);
    assert_eq!(status["state"], "Ready");
    assert_eq!(status["counts"], json!({"Ready": 1000}));
    assert_eq!(
        status["objects"],
        json!([]),
        "a thousand Ready objects are a count"
    );

    let mut drifted = healthy.clone();
    for o in drifted.objects.iter_mut().skip(100).take(30) {
        o.state = "Modified".into();
        o.message = "changed in the cluster: .data.a".into();
    }
    let status = follow::status_of(&drifted);
    assert_eq!(status["state"], "Modified");
    assert_eq!(
        status["message"],
        "ConfigMap shop/c-100: changed in the cluster: .data.a"
    );
    assert_eq!(status["counts"], json!({"Modified": 30, "Ready": 970}));
    let listed = status["objects"].as_array().unwrap();
    assert_eq!(listed.len(), 20, "the first 20 of the 30 not ready");
    assert_eq!(listed[0]["name"], "c-100");
}

#[test]
fn a_clusters_facts_call_for_no_pass_but_its_labels_do() {
    use crate::store::{EventType, WatchEvent};
    let event = |kind: EventType, object: &Object| WatchEvent {
        kind,
        object: object.clone(),
    };
    let mut changes = Changes::default();
    let mut west = Object::new(Kind::Cluster.name(), "west", json!({"type": "imported"}));
    west.metadata.labels.insert("env".into(), "prod".into());
    // (what happened, whether a pass follows)
    let mut seen = Vec::new();
    seen.push((
        "west first seen",
        changes.relevant(&event(EventType::Added, &west)),
    ));
    west.status = json!({"nodes": {"total": 3, "ready": 3}});
    seen.push((
        "west's facts",
        changes.relevant(&event(EventType::Modified, &west)),
    ));
    west.metadata.labels.insert("env".into(), "staging".into());
    seen.push((
        "west relabelled",
        changes.relevant(&event(EventType::Modified, &west)),
    ));
    seen.push((
        "west deleted",
        changes.relevant(&event(EventType::Deleted, &west)),
    ));
    let report = Object::new(Kind::BundleDeployment.name(), "app.west", json!({}));
    seen.push((
        "a report",
        changes.relevant(&event(EventType::Modified, &report)),
    ));
    let user = Object::new(Kind::User.name(), "ann", json!({}));
    seen.push((
        "a user",
        changes.relevant(&event(EventType::Modified, &user)),
    ));
    assert_eq!(
        seen,
        [
            ("west first seen", true),
            ("west's facts", false),
            ("west relabelled", true),
            ("west deleted", true),
            ("a report", true),
            ("a user", false),
        ]
    );
}
