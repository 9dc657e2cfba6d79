//! Role templates and global roles through the API: what validation says, what a custom
//! template lets its holders do to the hub's objects, and what cannot be granted or deleted.

use super::*;

fn template(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": spec})
}

fn bind(name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name}, "spec": spec})
}

async fn refused(t: &TestApi, token: &str, plural: &str, body: Value) -> (StatusCode, String) {
    let (status, value) = t
        .call(
            Method::POST,
            &format!("/v1/{plural}"),
            Some(token),
            Some(body),
        )
        .await;
    (
        status,
        value["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Cluster alpha with its project shop.
async fn alpha_with_shop(t: &TestApi) {
    t.create(&t.admin, "clusters", imported("alpha")).await;
    t.create(
        &t.admin,
        "projects",
        json!({"metadata": {"name": "shop"}, "spec": {"cluster": "alpha"}}),
    )
    .await;
}

/// A user who never logs in here (no token made for them).
async fn plain_user(t: &TestApi, name: &str) {
    t.create(
        &t.admin,
        "users",
        json!({"metadata": {"name": name}, "spec": {"password": "a long enough password"}}),
    )
    .await;
}

#[tokio::test]
async fn bad_templates_are_refused_naming_the_field() {
    let t = setup().await;
    t.create(
        &t.admin,
        "roletemplates",
        template("deployer", json!({"context": "project", "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list", "watch", "patch"]}]})),
    )
    .await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "ops",
            json!({"context": "cluster", "inherits": ["read-only"], "rules": []}),
        ),
    )
    .await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "senior",
            json!({"context": "project", "inherits": ["deployer"], "rules": []}),
        ),
    )
    .await;
    let cases = [
        (
            json!({"context": "cluster", "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["fly"]}]}),
            "spec.rules[0].verbs",
        ),
        (
            json!({"context": "cluster", "rules": [{"resources": ["pods"], "verbs": ["get"]}]}),
            "spec.rules[0].apiGroups",
        ),
        (
            json!({"context": "cluster", "rules": [{"apiGroups": [""], "resources": ["pods"], "nonResourceURLs": ["/x"], "verbs": ["get"]}]}),
            "spec.rules[0]",
        ),
        (json!({"context": "region"}), "spec"),
        (
            json!({"context": "cluster", "inherits": ["nope"]}),
            "spec.inherits[0]",
        ),
        // A project template cannot inherit a cluster one, nor a cluster template a project
        // one: 422 naming both.
        (
            json!({"context": "project", "inherits": ["ops"]}),
            "\"ops\"",
        ),
        (
            json!({"context": "cluster", "inherits": ["deployer"]}),
            "\"deployer\"",
        ),
        (
            json!({"context": "cluster", "builtin": true}),
            "spec.builtin",
        ),
    ];
    for (spec, named) in cases {
        let (status, message) =
            refused(&t, &t.admin, "roletemplates", template("bad", spec.clone())).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{spec}: {message}"
        );
        assert!(
            message.contains(named),
            "{spec}: {message:?} should name {named}"
        );
    }
    let (_, message) = refused(
        &t,
        &t.admin,
        "roletemplates",
        template("bad", json!({"context": "project", "inherits": ["ops"]})),
    )
    .await;
    assert!(message.contains("\"bad\""), "{message}");
    // deployer cannot come to inherit senior, which inherits it.
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/roletemplates/deployer",
            Some(&t.admin),
            Some(json!({"spec": {"inherits": ["senior"]}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("cycle"),
        "{body}"
    );
    // The builtin ones are the hub's.
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/roletemplates/read-only",
            Some(&t.admin),
            Some(json!({"spec": {"rules": []}})),
        )
        .await;
    assert!(
        status == StatusCode::UNPROCESSABLE_ENTITY || status == StatusCode::NOT_FOUND,
        "{status} {body}"
    );
}

#[tokio::test]
async fn a_template_in_use_is_not_deleted_and_the_refusal_names_the_bindings() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "auditor",
            json!({"context": "cluster", "rules": [
            {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]}),
        ),
    )
    .await;
    plain_user(&t, "ann").await;
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "ann-audits",
            json!({"user": "ann", "roleTemplate": "auditor", "cluster": "alpha"}),
        ),
    )
    .await;
    let (status, body) = t
        .call(
            Method::DELETE,
            "/v1/roletemplates/auditor",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"ann-audits\""),
        "{body}"
    );
    t.call(
        Method::DELETE,
        "/v1/rolebindings/ann-audits",
        Some(&t.admin),
        None,
    )
    .await;
    let (status, body) = t
        .call(
            Method::DELETE,
            "/v1/roletemplates/auditor",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn bindings_name_templates_of_their_scope_that_are_not_locked() {
    let t = setup().await;
    alpha_with_shop(&t).await;
    plain_user(&t, "ann").await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "old",
            json!({"context": "cluster", "locked": true, "rules": []}),
        ),
    )
    .await;
    let cases = [
        (
            json!({"user": "ann", "roleTemplate": "nope", "cluster": "alpha"}),
            "does not exist",
        ),
        (
            json!({"user": "ann", "roleTemplate": "cluster-member", "cluster": "alpha", "project": "shop"}),
            "is a cluster template",
        ),
        (
            json!({"user": "ann", "roleTemplate": "project-member", "cluster": "alpha"}),
            "is a project template",
        ),
        (
            json!({"user": "ann", "roleTemplate": "old", "cluster": "alpha"}),
            "locked",
        ),
        (
            json!({"user": "ann", "roleTemplate": "read-only", "role": "read-only", "cluster": "alpha"}),
            "exactly one",
        ),
        (
            json!({"user": "ann", "globalRole": "admin", "cluster": "alpha"}),
            "spec.cluster",
        ),
    ];
    for (spec, says) in cases {
        let (status, message) =
            refused(&t, &t.admin, "rolebindings", bind("b", spec.clone())).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{spec}: {message}"
        );
        assert!(message.contains(says), "{spec}: {message:?}");
    }
}

#[tokio::test]
async fn a_custom_template_decides_what_its_holders_do_to_the_hubs_objects() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    t.create(&t.admin, "clusters", imported("bravo")).await;
    // Snapshots of alpha, nothing else of the hub's.
    t.create(
        &t.admin,
        "roletemplates",
        template("snapshotter", json!({"context": "cluster", "rules": [
            {"apiGroups": ["management.drover.io"], "resources": ["clusters", "hosts"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["management.drover.io"], "resources": ["registrationtokens"], "verbs": ["create", "get", "list"]}]})),
    )
    .await;
    let sam = t.user("sam", None).await;
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "sam-snaps",
            json!({"user": "sam", "roleTemplate": "snapshotter", "cluster": "alpha"}),
        ),
    )
    .await;
    let status = |m: Method, path: &str, body: Option<Value>| {
        let sam = sam.clone();
        let path = path.to_owned();
        let t = &t;
        async move { t.call(m, &path, Some(&sam), body).await.0 }
    };
    assert_eq!(
        status(Method::GET, "/v1/clusters/alpha", None).await,
        StatusCode::OK
    );
    // Another cluster is missing to them, not forbidden.
    assert_eq!(
        status(Method::GET, "/v1/clusters/bravo", None).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status(
            Method::PATCH,
            "/v1/clusters/alpha",
            Some(json!({"metadata": {"labels": {"a": "b"}}}))
        )
        .await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        status(
            Method::POST,
            "/v1/registrationtokens",
            Some(json!({"metadata": {"name": "x"}, "spec": {"cluster": "alpha"}}))
        )
        .await,
        StatusCode::CREATED
    );
    assert_eq!(
        status(
            Method::POST,
            "/v1/registrationtokens",
            Some(json!({"metadata": {"name": "x"}, "spec": {"cluster": "bravo"}}))
        )
        .await,
        StatusCode::FORBIDDEN
    );
    // Their rules name no role bindings: they see none, and make none.
    let (_, list) = t
        .call(Method::GET, "/v1/rolebindings", Some(&sam), None)
        .await;
    assert_eq!(list["items"], json!([]), "{list}");
    let (code, _) = refused(
        &t,
        &sam,
        "rolebindings",
        bind(
            "more",
            json!({"user": "sam", "role": "read-only", "cluster": "alpha"}),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (_, me) = t.call(Method::GET, "/v1/me", Some(&sam), None).await;
    assert_eq!(me["clusters"], json!({"alpha": ["snapshotter"]}), "{me}");
}

#[tokio::test]
async fn no_one_grants_more_than_they_hold() {
    let t = setup().await;
    alpha_with_shop(&t).await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "secret-reader",
            json!({"context": "project", "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}),
        ),
    )
    .await;
    t.create(
        &t.admin,
        "roletemplates",
        template(
            "pod-reader",
            json!({"context": "project", "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
        ),
    )
    .await;
    // A project owner holds edit's rules (secrets too) but may grant only what they hold.
    let pat = t.user("pat", None).await;
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "pat-owns",
            json!({"user": "pat", "role": "project-owner", "cluster": "alpha", "project": "shop"}),
        ),
    )
    .await;
    plain_user(&t, "ann").await;
    t.create(
        &pat,
        "rolebindings",
        bind("ann-pods", json!({"user": "ann", "roleTemplate": "pod-reader", "cluster": "alpha", "project": "shop"})),
    )
    .await;
    t.create(
        &pat,
        "rolebindings",
        bind("ann-secrets", json!({"user": "ann", "roleTemplate": "secret-reader", "cluster": "alpha", "project": "shop"})),
    )
    .await;
    // Not the cluster's owner role, nor a global one.
    let (status, message) = refused(
        &t,
        &pat,
        "rolebindings",
        bind(
            "up",
            json!({"user": "pat", "role": "cluster-owner", "cluster": "alpha"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{message}");
    let (status, message) = refused(
        &t,
        &pat,
        "rolebindings",
        bind("up", json!({"user": "pat", "globalRole": "admin"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{message}");
}

#[tokio::test]
async fn a_global_role_lets_its_holders_create_clusters_they_then_own() {
    let t = setup().await;
    let cat = t.user("cat", None).await;
    let (status, _) = refused(&t, &cat, "clusters", imported("mine")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "cat-creates",
            json!({"user": "cat", "globalRole": "clusters-create"}),
        ),
    )
    .await;
    t.create(&cat, "clusters", imported("mine")).await;
    let (_, me) = t.call(Method::GET, "/v1/me", Some(&cat), None).await;
    assert_eq!(me["clusters"], json!({"mine": ["cluster-owner"]}), "{me}");
    let (status, _) = t
        .call(Method::DELETE, "/v1/clusters/mine", Some(&cat), None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_global_roles_cluster_templates_reach_clusters_made_after_it() {
    let t = setup().await;
    let vic = t.user("vic", None).await;
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "vic-views",
            json!({"user": "vic", "globalRole": "clusters-view"}),
        ),
    )
    .await;
    t.create(&t.admin, "clusters", imported("later")).await;
    let (status, _) = t
        .call(Method::GET, "/v1/clusters/later", Some(&vic), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, me) = t.call(Method::GET, "/v1/me", Some(&vic), None).await;
    assert_eq!(me["everyCluster"], json!(["read-only"]), "{me}");
    // A project template is no global role's to grant everywhere.
    t.create(
        &t.admin,
        "roletemplates",
        template("ns-reader", json!({"context": "project", "rules": []})),
    )
    .await;
    let (status, message) = refused(
        &t,
        &t.admin,
        "globalroles",
        json!({"metadata": {"name": "everywhere"}, "spec": {"inheritedClusterRoles": ["ns-reader"]}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{message}");
    assert!(
        message.contains("spec.inheritedClusterRoles[0]"),
        "{message}"
    );
}

#[tokio::test]
async fn a_user_manager_manages_users_who_hold_no_more_than_they_do() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    let uma = t.user("uma", None).await;
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "uma-users",
            json!({"user": "uma", "globalRole": "users-manage"}),
        ),
    )
    .await;
    // A plain user: made, listed, their password set, deleted.
    t.create(
        &uma,
        "users",
        json!({"metadata": {"name": "new"}, "spec": {"password": "a long enough password"}}),
    )
    .await;
    let (status, list) = t.call(Method::GET, "/v1/users", Some(&uma), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/users/new",
            Some(&uma),
            Some(json!({"spec": {"password": "another long password"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Not the admin's password, nor a user into a group bound to a role uma lacks.
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/users/admin",
            Some(&uma),
            Some(json!({"spec": {"password": "taken over, surely"}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"admin\""),
        "{body}"
    );
    t.create(
        &t.admin,
        "rolebindings",
        bind(
            "owners",
            json!({"group": "owners", "role": "cluster-owner", "cluster": "alpha"}),
        ),
    )
    .await;
    let (status, body) = t
        .call(
            Method::PATCH,
            "/v1/users/new",
            Some(&uma),
            Some(json!({"spec": {"groups": ["owners"]}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cluster \"alpha\""),
        "{body}"
    );
    let (status, _) = t
        .call(Method::DELETE, "/v1/users/admin", Some(&uma), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = t
        .call(Method::DELETE, "/v1/users/new", Some(&uma), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    // Nor may they grant a role: that is a binding.
    let (status, _) = refused(
        &t,
        &uma,
        "rolebindings",
        bind(
            "x",
            json!({"user": "uma", "role": "read-only", "cluster": "alpha"}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}
