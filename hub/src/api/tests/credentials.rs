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
    t.create(&admin, "clusters", imported("prod")).await;
    t.create(
        &admin,
        "clusters",
        json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s",
               "version": "v1.33.4+k3s1"}}),
    )
    .await;
    let owner = t.user("owner", Some(("cluster-owner", "prod"))).await;
    t.create(&admin, "rolebindings",
        json!({"metadata": {"name": "owner-edge"}, "spec": {"user": "owner", "role": "cluster-owner", "cluster": "edge"}}))
        .await;

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
