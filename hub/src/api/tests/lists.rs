//! Creating many objects with one request: a `{Kind}List` (or `List`) posted to the kind's
//! collection creates every item in one transaction, or none of them, the refusal naming the
//! item; each item is checked as if it came alone (rules, references, the caller's rights).

use super::*;

/// A custom cluster `edge` with hosts `h1`..=`h{hosts}`.
async fn edge_with_hosts(t: &TestApi, hosts: usize) {
    t.create(
        &t.admin,
        "clusters",
        json!({"metadata": {"name": "edge"}, "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"}}),
    )
    .await;
    for i in 1..=hosts {
        t.create(
            &t.admin,
            "hosts",
            json!({"metadata": {"name": format!("h{i}")}, "spec": {"cluster": "edge"}}),
        )
        .await;
    }
}

async fn post(t: &TestApi, token: &str, plural: &str, body: Value) -> (StatusCode, Value) {
    t.call(
        Method::POST,
        &format!("/v1/{plural}"),
        Some(token),
        Some(body),
    )
    .await
}

fn plan_for(host: &str) -> Value {
    json!({"metadata": {"name": host},
           "spec": {"host": host, "cluster": "edge", "plan": {"instructions": [{"name": "noop", "command": "true"}]}}})
}

async fn plan_names(t: &TestApi) -> Vec<String> {
    let (status, list) = t.call(Method::GET, "/v1/plans", Some(&t.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_list_of_plans_is_created_together_in_order() {
    let t = setup().await;
    edge_with_hosts(&t, 3).await;
    let list =
        json!({"kind": "PlanList", "items": [plan_for("h2"), plan_for("h1"), plan_for("h3")]});
    let (status, created) = post(&t, &t.admin, "plans", list).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["kind"], "PlanList");
    let items = created["items"].as_array().unwrap();
    let names: Vec<&str> = items
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["h2", "h1", "h3"], "the items as sent");
    // One write: every plan at the list's resourceVersion, each with its host's reference.
    for item in items {
        assert_eq!(
            item["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
            "{created}"
        );
        let refs = item["metadata"]["ownerReferences"].as_array().unwrap();
        assert!(
            refs.iter()
                .any(|r| r["kind"] == "Host" && r["name"] == item["metadata"]["name"]),
            "{item}"
        );
    }
    let doc = openapi::document();
    let schema = &doc["paths"]["/v1/plans"]["post"]["responses"]["201"]["content"]["application/json"]
        ["schema"];
    openapi::conformance(&doc, schema, &created, "a created list").unwrap();
    let mut stored = plan_names(&t).await;
    stored.sort();
    assert_eq!(stored, ["h1", "h2", "h3"]);
    // Each is the plan its host is sent, as one posted alone would be.
    let (_, h3) = t
        .call(Method::GET, "/v1/plans/h3", Some(&t.admin), None)
        .await;
    assert_eq!(h3["spec"]["plan"]["instructions"][0]["command"], "true");
}

#[tokio::test]
async fn one_bad_item_refuses_the_whole_list_and_says_which() {
    let t = setup().await;
    edge_with_hosts(&t, 2).await;
    // A host that does not exist, third in the list.
    let list =
        json!({"kind": "PlanList", "items": [plan_for("h1"), plan_for("h2"), plan_for("h9")]});
    let (status, body) = post(&t, &t.admin, "plans", list).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("items[2]: ") && message.contains("\"h9\""),
        "{body}"
    );
    assert!(plan_names(&t).await.is_empty(), "nothing was created");
    // A name given twice: the store refuses the second, and so the first.
    let list = json!({"kind": "List", "items": [plan_for("h1"), plan_for("h1")]});
    let (status, body) = post(&t, &t.admin, "plans", list).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(plan_names(&t).await.is_empty(), "nothing was created");
    // An item that is not an object, and a list without items.
    let list = json!({"kind": "PlanList", "items": [plan_for("h1"), "h2"]});
    let (status, body) = post(&t, &t.admin, "plans", list).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("items[1]: "),
        "{body}"
    );
    let (status, body) = post(&t, &t.admin, "plans", json!({"kind": "PlanList"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("items"),
        "{body}"
    );
    // A list of another kind is not taken for this one.
    let list = json!({"kind": "HostList", "items": [plan_for("h1")]});
    let (status, body) = post(&t, &t.admin, "plans", list).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("/v1/hosts"),
        "{body}"
    );
    assert!(plan_names(&t).await.is_empty(), "nothing was created");
}

#[tokio::test]
async fn too_much_in_one_request_is_refused_saying_how_to_send_it() {
    let t = setup().await;
    edge_with_hosts(&t, 1).await;
    // More items than one list may hold; then a body past what the API reads at all.
    let long = "x".repeat(4096);
    let too_many = (0..=objects::MAX_CREATED_AT_ONCE).map(|_| plan_for("h1"));
    let too_large = (0..600).map(|i| {
        json!({"metadata": {"name": format!("h{i}"), "annotations": {"note": long}}, "spec": {}})
    });
    for (items, says) in [
        (too_many.collect::<Vec<Value>>(), "several lists"),
        (too_large.collect(), "fewer items"),
    ] {
        let list = json!({"kind": "PlanList", "items": items});
        let (status, body) = post(&t, &t.admin, "plans", list).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    assert!(plan_names(&t).await.is_empty());
}

#[tokio::test]
async fn each_item_is_checked_against_the_callers_roles() {
    let t = setup().await;
    t.create(&t.admin, "clusters", imported("mine")).await;
    t.create(&t.admin, "clusters", imported("theirs")).await;
    let owner = t.user("owner", Some(("cluster-owner", "mine"))).await;
    let project = |name: &str, cluster: &str| json!({"metadata": {"name": name}, "spec": {"cluster": cluster}});
    // The second item is in a cluster the caller does not own: nothing is made.
    let list = json!({"kind": "ProjectList", "items": [project("apps", "mine"), project("spy", "theirs")]});
    let (status, body) = post(&t, &owner, "projects", list).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("items[1]: "),
        "{body}"
    );
    let (_, listed) = t
        .call(Method::GET, "/v1/projects", Some(&t.admin), None)
        .await;
    assert_eq!(listed["items"], json!([]), "nothing was created");
    // Both in the caller's cluster: both are made.
    let list =
        json!({"kind": "ProjectList", "items": [project("apps", "mine"), project("web", "mine")]});
    let (status, created) = post(&t, &owner, "projects", list).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["items"].as_array().unwrap().len(), 2);
    // An empty list creates nothing.
    let (status, body) = post(
        &t,
        &owner,
        "projects",
        json!({"kind": "ProjectList", "items": []}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["items"], json!([]));
}

/// The names and `metadata` of one page of `/v1/clusters`.
async fn clusters_page(t: &TestApi, token: &str, query: &str) -> (Vec<String>, Value) {
    let (status, list) = t
        .call(
            Method::GET,
            &format!("/v1/clusters?{query}"),
            Some(token),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{query}: {list}");
    let names = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    (names, list["metadata"].clone())
}

#[tokio::test]
async fn lists_come_in_pages_of_limit_with_a_continue_token_as_kubernetes_pages_them() {
    let t = setup().await;
    for name in ["c5", "c1", "c4", "c2", "c3"] {
        t.create(&t.admin, "clusters", imported(name)).await;
    }
    let (first, meta) = clusters_page(&t, &t.admin, "limit=2").await;
    assert_eq!(first, ["c1", "c2"]);
    assert_eq!(meta["remainingItemCount"], 3);
    let revision = meta["resourceVersion"].clone();
    let token = meta["continue"].as_str().unwrap().to_owned();

    // Between pages c6 comes: the next pages read the store as it is then, and answer the
    // first page's revision, so a watch from it tells of c6 too.
    t.create(&t.admin, "clusters", imported("c6")).await;
    let (second, meta) = clusters_page(&t, &t.admin, &format!("limit=2&continue={token}")).await;
    assert_eq!(second, ["c3", "c4"]);
    assert_eq!(meta["resourceVersion"], revision);
    assert_eq!(meta["remainingItemCount"], 2);
    let token = meta["continue"].as_str().unwrap().to_owned();
    let (last, meta) = clusters_page(&t, &t.admin, &format!("limit=2&continue={token}")).await;
    assert_eq!(last, ["c5", "c6"]);
    assert!(meta.get("continue").is_none(), "{meta}");
    assert!(meta.get("remainingItemCount").is_none(), "{meta}");

    // No limit, or 0, is the whole list as before.
    for query in ["", "limit=0"] {
        let (all, meta) = clusters_page(&t, &t.admin, query).await;
        assert_eq!(all, ["c1", "c2", "c3", "c4", "c5", "c6"]);
        assert!(meta.get("continue").is_none(), "{meta}");
    }

    let (status, refused) = t
        .call(
            Method::GET,
            "/v1/clusters?limit=2&continue=not-ours",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("metadata.continue"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_page_counts_only_what_the_caller_may_see() {
    let t = setup().await;
    for name in ["a1", "a2", "a3", "b1", "b2"] {
        t.create(&t.admin, "clusters", imported(name)).await;
    }
    let alice = t.user("alice", Some(("cluster-member", "a2"))).await;
    t.create(
        &t.admin,
        "rolebindings",
        json!({"metadata": {"name": "alice-b2"}, "spec": {"user": "alice", "role": "cluster-member", "cluster": "b2"}}),
    )
    .await;
    let (first, meta) = clusters_page(&t, &alice, "limit=1").await;
    assert_eq!(first, ["a2"]);
    // One more she may see; the three she may not are neither counted nor named.
    assert_eq!(meta["remainingItemCount"], 1, "{meta}");
    let token = meta["continue"].as_str().unwrap();
    let (second, meta) = clusters_page(&t, &alice, &format!("limit=1&continue={token}")).await;
    assert_eq!(second, ["b2"]);
    assert!(meta.get("continue").is_none(), "{meta}");
}
