//! Regression tests for the authorization holes a hostile probe found (issue 26), each named
//! after the hole it pins, through the API's router.

use super::*;

/// Removes `kind/name` from the store as the holes did: without the hub's clean-up (its
/// finalizers dropped first), so whatever named it is left behind.
async fn vanish(t: &TestApi, kind: Kind, name: &str) {
    let mut object = t.store.get(kind.name(), name).await.unwrap();
    object.metadata.finalizers.clear();
    t.store.update(object).await.unwrap();
    let _ = t.store.delete(kind.name(), name, None).await;
    assert!(t.store.get(kind.name(), name).await.is_err());
}

async fn status_of(t: &TestApi, method: Method, path: &str, token: &str) -> StatusCode {
    t.call(method, path, Some(token), None).await.0
}

#[tokio::test]
async fn a_cluster_owner_cannot_strip_the_finalizers_that_guard_its_clean_up() {
    let t = setup().await;
    let created = t.create(&t.admin, "clusters", imported("alpha")).await;
    // The finalizer comes with the cluster, in the same write: no window to delete it bare.
    assert_eq!(
        created["metadata"]["finalizers"],
        json!([crate::model::CLEANUP_FINALIZER])
    );
    let owner = t.user("owner", Some(("cluster-owner", "alpha"))).await;
    for (method, body) in [
        (Method::PATCH, json!({"metadata": {"finalizers": []}})),
        (
            Method::PUT,
            json!({"metadata": {"name": "alpha", "finalizers": []}, "spec": {"type": "imported"}}),
        ),
        (Method::PATCH, json!({"metadata": {"finalizers": ["mine"]}})),
        (
            Method::PATCH,
            json!({"metadata": {"ownerReferences": [{"kind": "Cluster", "name": "x", "uid": "y"}]}}),
        ),
    ] {
        let (status, body) = t
            .call(method, "/v1/clusters/alpha", Some(&owner), Some(body))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("the hub's"),
            "{body}"
        );
    }
    // Sending them back as read is fine (kubectl-style read-modify-write).
    let (_, read) = t
        .call(Method::GET, "/v1/clusters/alpha", Some(&owner), None)
        .await;
    let mut edited = read.clone();
    edited["spec"]["description"] = json!("ours");
    let (status, body) = t
        .call(
            Method::PUT,
            "/v1/clusters/alpha",
            Some(&owner),
            Some(edited),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["metadata"]["finalizers"],
        json!([crate::model::CLEANUP_FINALIZER])
    );
    // Deleting it only marks it: the clean-up (the planner's) still has to run.
    let (status, body) = t
        .call(Method::DELETE, "/v1/clusters/alpha", Some(&owner), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"]["state"], "removing");
}

#[tokio::test]
async fn a_recreated_cluster_does_not_inherit_the_old_clusters_owner_or_tokens() {
    let t = setup().await;
    let created = t.create(&t.admin, "clusters", imported("alpha")).await;
    let old_registration = created["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let owner = t.user("owner", Some(("cluster-owner", "alpha"))).await;
    assert_eq!(
        status_of(&t, Method::GET, "/v1/clusters/alpha", &owner).await,
        StatusCode::OK
    );
    vanish(&t, Kind::Cluster, "alpha").await;

    t.create(&t.admin, "clusters", imported("alpha")).await;
    // The binding is still stored, but names the old cluster's uid: it grants nothing.
    assert_eq!(
        status_of(&t, Method::GET, "/v1/clusters/alpha", &owner).await,
        StatusCode::NOT_FOUND
    );
    let (_, me) = t.call(Method::GET, "/v1/me", Some(&owner), None).await;
    assert_eq!(me["clusters"], json!({}), "{me}");
    let (status, _) = t
        .call(
            Method::POST,
            "/v1/clusters/alpha/kubeconfig",
            Some(&owner),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The old cluster's registration token registers nothing to the new one.
    let err = crate::registration::verify(&t.api, &old_registration)
        .await
        .unwrap_err();
    assert_eq!(err.code, StatusCode::UNAUTHORIZED);

    // The collector removes what was left behind.
    assert!(crate::refs::collect(t.store.as_ref()).await.unwrap() >= 2);
    assert!(
        t.store
            .get(Kind::RoleBinding.name(), "owner-cluster-owner")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_project_role_left_behind_does_not_reach_a_new_project_of_that_name_on_another_cluster() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    t.create(&t.admin, "clusters", imported("bravo")).await;
    t.create(
        &t.admin,
        "projects",
        json!({"metadata": {"name": "acme"}, "spec": {"cluster": "alpha"}}),
    )
    .await;
    let user = t.user("dev", None).await;
    t.create(
        &t.admin,
        "rolebindings",
        json!({"metadata": {"name": "dev-acme"}, "spec": {"user": "dev", "role": "project-owner", "cluster": "alpha", "project": "acme"}}),
    )
    .await;
    let (status, _) = t
        .call(Method::DELETE, "/v1/projects/acme", Some(&t.admin), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    t.create(
        &t.admin,
        "projects",
        json!({"metadata": {"name": "acme"}, "spec": {"cluster": "bravo"}}),
    )
    .await;
    t.create(
        &t.admin,
        "projectsecrets",
        json!({"metadata": {"name": "registry"}, "spec": {"cluster": "bravo", "project": "acme", "data": {"k": "djE="}}}),
    )
    .await;

    let (_, me) = t.call(Method::GET, "/v1/me", Some(&user), None).await;
    assert_eq!(me["clusters"], json!({}), "{me}");
    assert_eq!(
        status_of(&t, Method::GET, "/v1/projectsecrets/registry", &user).await,
        StatusCode::NOT_FOUND
    );
    let (status, body) = t
        .call(
            Method::POST,
            "/v1/rolebindings",
            Some(&user),
            Some(json!({"metadata": {"name": "friend"}, "spec": {"user": "dev", "role": "project-owner", "cluster": "bravo", "project": "acme"}})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = t
        .call(
            Method::POST,
            "/v1/clusters/bravo/kubeconfig",
            Some(&user),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Deleting the project takes its bindings (and secrets) with it.
    crate::refs::collect(t.store.as_ref()).await.unwrap();
    assert!(
        t.store
            .get(Kind::RoleBinding.name(), "dev-acme")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn deleting_a_user_revokes_its_tokens_and_bindings_even_if_the_name_returns() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    let old = t.user("pat", Some(("cluster-owner", "alpha"))).await;
    let (status, _) = t
        .call(Method::DELETE, "/v1/users/pat", Some(&t.admin), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        t.call(Method::GET, "/v1/me", Some(&old), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    // Someone else gets the name: the old token is not theirs, the old binding not theirs.
    let new = t.user("pat", None).await;
    assert_eq!(
        t.call(Method::GET, "/v1/me", Some(&old), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (_, me) = t.call(Method::GET, "/v1/me", Some(&new), None).await;
    assert_eq!(me["clusters"], json!({}), "{me}");
    crate::refs::collect(t.store.as_ref()).await.unwrap();
    let (_, tokens) = t
        .call(Method::GET, "/v1/tokens", Some(&t.admin), None)
        .await;
    let of_pat = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["spec"]["user"] == "pat")
        .count();
    assert_eq!(
        of_pat, 1,
        "only the new user's login token is left: {tokens}"
    );
    assert!(
        t.store
            .get(Kind::RoleBinding.name(), "pat-cluster-owner")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_caller_without_rights_learns_nothing_about_which_objects_exist() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("alpha")).await;
    let nobody = t.user("nobody", None).await;
    // Existing and missing clusters answer alike.
    let (exists, a) = t
        .call(Method::GET, "/v1/clusters/alpha", Some(&nobody), None)
        .await;
    let (missing, b) = t
        .call(Method::GET, "/v1/clusters/zulu", Some(&nobody), None)
        .await;
    assert_eq!(
        (exists, missing),
        (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
    );
    assert_eq!(
        a["message"].as_str().unwrap().replace("alpha", "X"),
        b["message"].as_str().unwrap().replace("zulu", "X")
    );
    for method in [Method::DELETE, Method::PATCH, Method::PUT] {
        let body = Some(json!({"metadata": {"name": "alpha"}, "spec": {"type": "imported"}}));
        let (status, _) = t
            .call(method.clone(), "/v1/clusters/alpha", Some(&nobody), body)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    // Creating for a cluster the caller has no role on is refused before anything is looked
    // up: the same 403 whether the cluster exists or not.
    for cluster in ["alpha", "zulu"] {
        let (status, body) = t
            .call(
                Method::POST,
                "/v1/rolebindings",
                Some(&nobody),
                Some(json!({"metadata": {"name": format!("b-{cluster}")}, "spec": {"user": "nobody", "role": "cluster-owner", "cluster": cluster}})),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{cluster}: {body}");
    }
}

#[tokio::test]
async fn a_cookie_never_authenticates_a_request_that_sent_an_authorization_header() {
    let t = setup().await;
    let password = "a long enough password";
    t.create(
        &t.admin,
        "users",
        json!({"metadata": {"name": "sam"}, "spec": {"password": password}}),
    )
    .await;
    t.create(
        &t.admin,
        "rolebindings",
        json!({"metadata": {"name": "sam-admin"}, "spec": {"user": "sam", "role": "admin"}}),
    )
    .await;
    let (status, session) = t
        .call(
            Method::POST,
            "/v1/login",
            None,
            Some(json!({"username": "sam", "password": password, "session": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let cookie = format!("drover_session={}", session["token"].as_str().unwrap());
    // The browser's CSRF check lets requests with an Authorization header through (scripts
    // send one); a forged page can add a non-bearer one while the browser adds the cookie.
    for authorization in ["Basic c2FtOnNhbQ==", "Bearer", "Negotiate x"] {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/v1/clusters")
            .header("cookie", &cookie)
            .header("authorization", authorization)
            .header("content-type", "application/json")
            .body(Body::from(imported("forged").to_string()))
            .unwrap();
        let response = t.router.clone().oneshot(request).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{authorization}"
        );
    }
    assert!(t.store.get(Kind::Cluster.name(), "forged").await.is_err());
    // The cookie alone still works (the CSRF check then applies, in `websec`).
    t.me_by_cookie(&cookie).await;
}

#[tokio::test]
async fn one_user_cannot_hold_watches_without_bound() {
    // The test API allows 3 per user (the hub's default is --max-streams-per-user 256).
    let t = setup().await;
    let reader = t.user("reader", None).await;
    let watch = |token: String| {
        let router = t.router.clone();
        async move {
            let request = Request::builder()
                .uri("/v1/clusters?watch=true")
                .header("authorization", format!("Bearer {token}"))
                .body(Body::empty())
                .unwrap();
            router.oneshot(request).await.unwrap()
        }
    };
    let mut open = Vec::new();
    for _ in 0..3 {
        let response = watch(reader.clone()).await;
        assert_eq!(response.status(), StatusCode::OK);
        open.push(response);
    }
    let refused = watch(reader.clone()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("--max-streams-per-user"),
        "{body:?}"
    );
    // Others are not held back by one user's watches.
    assert_eq!(watch(t.admin.clone()).await.status(), StatusCode::OK);
    // A watch that ends frees its place.
    open.pop();
    assert_eq!(watch(reader.clone()).await.status(), StatusCode::OK);
}
