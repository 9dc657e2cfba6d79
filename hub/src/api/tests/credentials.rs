//! Naming a credential is a permission (issue 57): a cluster's owner cannot make the hub
//! spend a credential or template an admin keeps, and a refusal reads exactly as a name that
//! does not exist.

use super::*;

/// The refusal's message with the name asked for taken out: a refused name and a missing
/// one must read the same.
fn refusal(body: &Value, name: &str) -> String {
    body["message"].as_str().unwrap().replace(name, "NAME")
}

/// `PATCH path` with `body` as the holder of `token`: the status.
async fn patch(t: &TestApi, token: &str, path: &str, body: Value) -> StatusCode {
    t.call(Method::PATCH, path, Some(token), Some(body)).await.0
}

/// Clusters `prod` (imported) and `edge` (custom), both owned by user `owner`: their token.
async fn owners_clusters(t: &TestApi) -> String {
    let admin = &t.admin;
    t.create(admin, "clusters", imported("prod")).await;
    t.create(
        admin,
        "clusters",
        json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s",
               "version": "v1.33.4+k3s1"}}),
    )
    .await;
    let owner = t.user("owner", Some(("cluster-owner", "prod"))).await;
    t.create(admin, "rolebindings",
        json!({"metadata": {"name": "owner-edge"}, "spec": {"user": "owner", "role": "cluster-owner", "cluster": "edge"}}))
        .await;
    owner
}

#[tokio::test]
async fn a_cluster_owner_names_only_the_credentials_and_templates_granted_to_them() {
    let t = setup().await;
    let admin = t.admin.clone();
    t.create(
        &admin,
        "cloudcredentials",
        json!({"metadata": {"name": "corp-pull"}, "spec": {"driver": "registry",
               "registry": {"username": "puller", "password": "the admins' registry password"}}}),
    )
    .await;
    t.create(&admin, "cloudcredentials",
        json!({"metadata": {"name": "lab"}, "spec": {"driver": "ssh", "ssh": {"privateKey": TEST_KEY}}}))
        .await;
    t.create(
        &admin,
        "machinetemplates",
        json!({"metadata": {"name": "lab-v1"}, "spec": {"driver": "ssh", "credential": "lab",
               "ssh": {"addresses": ["10.0.0.1", "10.0.0.2"]}}}),
    )
    .await;
    let owner = owners_clusters(&t).await;

    // Each way of making the hub spend a credential, with an admin's name and with one that
    // does not exist: both refused, in the same words.
    let attempts = |name: &str| {
        [
            (
                "prod",
                json!({"spec": {"agentImages": {"registry": "registry.owner.example",
                                                     "pullCredential": name}}}),
            ),
            (
                "edge",
                json!({"spec": {"registries": {"configs": {"registry.owner.example": {"credential": name}}}}}),
            ),
            (
                "edge",
                json!({"spec": {"machinePools": [{"name": "pool", "quantity": 1,
                "roles": {"etcd": true, "controlPlane": true, "worker": true}, "template": name}]}}),
            ),
        ]
    };
    let (kept, missing) = (attempts("corp-pull"), attempts("no-such"));
    let kept_template = attempts("lab-v1");
    for (i, ((cluster, body), (_, absent))) in kept.iter().zip(missing.iter()).enumerate() {
        let (body, name) = if i == 2 {
            (&kept_template[2].1, "lab-v1")
        } else {
            (body, "corp-pull")
        };
        let path = format!("/v1/clusters/{cluster}");
        let (status, refused) = t
            .call(Method::PATCH, &path, Some(&owner), Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        let (status, nothing) = t
            .call(Method::PATCH, &path, Some(&owner), Some(absent.clone()))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{nothing}");
        assert_eq!(refusal(&refused, name), refusal(&nothing, "no-such"));
    }
    let (_, prod) = t
        .call(Method::GET, "/v1/clusters/prod", Some(&owner), None)
        .await;
    assert!(prod["spec"].get("agentImages").is_none(), "{prod}");

    // An admin grants the owner the pull credential and the template's credential: now they
    // may name them (and the pools stay theirs to scale).
    for name in ["corp-pull", "lab"] {
        let (status, body) = t
            .call(
                Method::PATCH,
                &format!("/v1/cloudcredentials/{name}"),
                Some(&admin),
                Some(json!({"spec": {"allowed": {"users": ["owner"]}}})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for (cluster, body) in &kept[..2] {
        let (status, answer) = t
            .call(
                Method::PATCH,
                &format!("/v1/clusters/{cluster}"),
                Some(&owner),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (status, answer) = t
        .call(
            Method::PATCH,
            "/v1/clusters/edge",
            Some(&owner),
            Some(kept_template[2].1.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // Granted to someone else, it is not another owner's to name; granted to a group, its
    // members may.
    let other = t.user("other", Some(("cluster-owner", "prod"))).await;
    let pull = json!({"spec": {"agentImages": {"registry": "registry.owner.example", "pullCredential": "corp-pull"}}});
    assert_eq!(
        patch(
            &t,
            &other,
            "/v1/clusters/prod",
            json!({"spec": {"agentImages": null}})
        )
        .await,
        StatusCode::OK
    );
    assert_eq!(
        patch(&t, &other, "/v1/clusters/prod", pull.clone()).await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let ops = json!({"spec": {"groups": ["ops"]}});
    assert_eq!(
        patch(&t, &admin, "/v1/users/other", ops).await,
        StatusCode::OK
    );
    let grant = json!({"spec": {"allowed": {"users": [], "groups": ["ops"]}}});
    assert_eq!(
        patch(&t, &admin, "/v1/cloudcredentials/corp-pull", grant.clone()).await,
        StatusCode::OK
    );
    let other = t.login("other", "a long enough password").await;
    assert_eq!(
        patch(&t, &other, "/v1/clusters/prod", pull).await,
        StatusCode::OK
    );
    // What a cluster already names stays: with the owner's grant gone, edits that keep the
    // pool's template pass.
    assert_eq!(
        patch(&t, &admin, "/v1/cloudcredentials/lab", grant).await,
        StatusCode::OK
    );
    let (status, answer) = t
        .call(
            Method::PATCH,
            "/v1/clusters/edge",
            Some(&owner),
            Some(json!({"spec": {"description": "x"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // And admins still name anything, also what does not exist yet.
    let (status, answer) = t
        .call(Method::PATCH, "/v1/clusters/prod", Some(&admin),
            Some(json!({"spec": {"agentImages": {"registry": "r.example", "pullCredential": "later"}}})))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// What the hub makes of an admin's credential for a cluster (its agents' pull secret, its
/// hosts' `registries.yaml` and client key) is in nothing a cluster owner may read: the
/// manifest is not made for a cluster whose owners are not granted the credential, and a
/// plan's secret files are left out of every read and watch (and kept on an update).
#[tokio::test]
async fn no_object_or_manifest_a_cluster_owner_reads_holds_an_admins_secret() {
    use base64::Engine as _;
    let t = setup().await;
    let admin = t.admin.clone();
    let password = "the admins' registry password";
    t.create(
        &admin,
        "cloudcredentials",
        json!({"metadata": {"name": "corp-pull"}, "spec": {"driver": "registry",
               "registry": {"username": "puller", "password": password}}}),
    )
    .await;
    let owner = owners_clusters(&t).await;
    // An admin names the credential on the owner's cluster (admins may).
    assert_eq!(
        patch(
            &t,
            &admin,
            "/v1/clusters/prod",
            json!({"spec": {"agentImages": {"registry": "registry.corp.example", "pullCredential": "corp-pull"}}})
        )
        .await,
        StatusCode::OK
    );

    // The import manifest (fetched with a registration token the owner makes) is refused,
    // naming the owner who is not granted the credential.
    let store = t.store.clone();
    let manifest = async || {
        let object = store.get("Cluster", "prod").await.unwrap();
        let spec: crate::model::ClusterSpec = serde_json::from_value(object.spec).unwrap();
        crate::registration::agents_manifest(
            store.as_ref(),
            "https://hub.example:8443",
            "ab",
            "prod",
            &spec,
            "drr_token",
        )
        .await
    };
    match manifest().await {
        Err(crate::store::StoreError::Invalid(why)) => assert!(
            why.contains("is not granted to user \"owner\", an owner of cluster \"prod\""),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }

    // A host's plan as the planner writes it for the owner's custom cluster.
    let registries =
        format!("configs:\n  registry.corp.example:\n    auth:\n      password: {password:?}\n");
    let encoded = base64::engine::general_purpose::STANDARD.encode(&registries);
    crate::refs::create(
        t.store.as_ref(),
        crate::store::Object::new("Host", "h1", json!({"cluster": "edge"})),
    )
    .await
    .unwrap();
    let plan = json!({"files": [
        {"path": "/etc/rancher/k3s/registries.yaml", "content": encoded, "permissions": "0600", "secret": true},
        {"path": "/etc/rancher/k3s/config.yaml", "content": base64::engine::general_purpose::STANDARD.encode("node-name: h1\n")}]});
    crate::refs::create(
        t.store.as_ref(),
        crate::store::Object::new(
            "Plan",
            "h1",
            json!({"host": "h1", "cluster": "edge", "plan": plan.clone()}),
        ),
    )
    .await
    .unwrap();
    let full = crate::model::parse_plan(&plan).unwrap();

    // Everything the owner may read, whole and as watched.
    let leaks = |text: &str| text.contains(password) || text.contains(&encoded);
    let mut read = Vec::new();
    for path in [
        "/v1/plans",
        "/v1/plans/h1",
        "/v1/clusters",
        "/v1/hosts",
        "/v1/cloudcredentials",
        "/v1/cloudcredentials/corp-pull",
        "/v1/machinetemplates",
        "/v1/rolebindings",
    ] {
        let (_, body) = t.call(Method::GET, path, Some(&owner), None).await;
        read.push((path, body.to_string()));
    }
    let request = Request::get("/v1/plans?watch=true")
        .header("authorization", format!("Bearer {owner}"))
        .body(Body::empty())
        .unwrap();
    let mut body = t.router.clone().oneshot(request).await.unwrap().into_body();
    let watched = loop {
        let frame = body.frame().await.unwrap().unwrap();
        let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
        if text.contains("data: ") {
            break text;
        }
    };
    read.push(("/v1/plans?watch=true", watched));
    for (path, text) in &read {
        assert!(!leaks(text), "{path}: {text}");
    }
    // The plan as shown: the secret file without its content, the rest as written, and the
    // checksum of the plan as the host has it.
    let (_, shown) = t
        .call(Method::GET, "/v1/plans/h1", Some(&owner), None)
        .await;
    let files = shown["spec"]["plan"]["files"].as_array().unwrap();
    assert!(files[0].get("content").is_none(), "{shown}");
    assert_eq!(files[0]["secret"], true);
    assert!(files[1]["content"].is_string());
    assert_eq!(
        shown["status"]["planChecksum"],
        proto::plan::v1::checksum(&full)
    );
    // An admin's update of what they were shown keeps the secret file's content.
    assert_eq!(
        patch(
            &t,
            &admin,
            "/v1/plans/h1",
            json!({"metadata": {"labels": {"looked-at": "yes"}}})
        )
        .await,
        StatusCode::OK
    );
    let stored = t.store.get("Plan", "h1").await.unwrap();
    assert_eq!(stored.spec["plan"]["files"][0]["content"], encoded.as_str());

    // Granted the credential, the owner's cluster gets its pull secret.
    assert_eq!(
        patch(
            &t,
            &admin,
            "/v1/cloudcredentials/corp-pull",
            json!({"spec": {"allowed": {"users": ["owner"]}}})
        )
        .await,
        StatusCode::OK
    );
    let made = manifest().await.unwrap();
    assert!(
        made.contains("kind: Secret") && made.contains("registry.corp.example"),
        "{made}"
    );
}

/// A hosted cluster's cloud account is a credential like any other: its owner may keep the
/// one it has, but naming another they are not granted reads exactly as naming none.
#[tokio::test]
async fn a_hosted_clusters_owner_names_only_a_cloud_account_granted_to_them() {
    let t = setup().await;
    let admin = t.admin.clone();
    for name in ["aws", "aws-billing"] {
        t.create(
            &admin,
            "cloudcredentials",
            json!({"metadata": {"name": name}, "spec": {"driver": "amazonec2",
                   "amazonec2": {"accessKeyId": "AKIDEXAMPLE", "secretAccessKey": "the admins' secret"}}}),
        )
        .await;
    }
    t.create(
        &admin,
        "clusters",
        json!({"metadata": {"name": "cloud"}, "spec": {"type": "hosted", "hosted": {
            "driver": "eks", "credential": "aws", "region": "eu-west-1",
            "kubernetesVersion": "1.31", "roleArn": "arn:aws:iam::123456789012:role/eks",
            "subnets": ["subnet-1"]}}}),
    )
    .await;
    let owner = t.user("owner", Some(("cluster-owner", "cloud"))).await;
    // What the cluster already spends stays usable: an upgrade goes through.
    let upgrade = json!({"spec": {"hosted": {"kubernetesVersion": "1.32"}}});
    assert_eq!(
        patch(&t, &owner, "/v1/clusters/cloud", upgrade).await,
        StatusCode::OK
    );
    let swap = |name: &str| json!({"spec": {"hosted": {"credential": name}}});
    let (status, refused) = t
        .call(
            Method::PATCH,
            "/v1/clusters/cloud",
            Some(&owner),
            Some(swap("aws-billing")),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    let (status, nothing) = t
        .call(
            Method::PATCH,
            "/v1/clusters/cloud",
            Some(&owner),
            Some(swap("no-such")),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{nothing}");
    assert_eq!(
        refusal(&refused, "aws-billing"),
        refusal(&nothing, "no-such")
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("spec.hosted.credential"),
        "{refused}"
    );
    let (_, cloud) = t
        .call(Method::GET, "/v1/clusters/cloud", Some(&owner), None)
        .await;
    assert_eq!(cloud["spec"]["hosted"]["credential"], "aws", "{cloud}");
}
