//! Watches at `management.drover.io/v1` as a Kubernetes client resumes them: from a listed
//! revision, changes made since are modifications (or, out of the selector, deletions) of what
//! it listed; a watch with a deadline gets a bookmark before it ends.

use super::*;

/// Every line a watch at `query` streams until it ends, as JSON.
async fn watched(t: &TestApi, query: &str) -> Vec<Value> {
    let request = Request::get(format!("/apis/management.drover.io/v1/clusters?{query}"))
        .header("authorization", format!("Bearer {}", t.admin))
        .body(Body::empty())
        .unwrap();
    let response = crate::api::kube::router(t.api.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "application/json;stream=watch"
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The revision a list of clusters is current at, as a client reads it before watching.
async fn listed_at(t: &TestApi) -> String {
    let (_, list) = t
        .call(Method::GET, "/v1/clusters", Some(&t.admin), None)
        .await;
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn labelled(name: &str, env: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"env": env}}, "spec": {"type": "imported"}})
}

async fn relabel(t: &TestApi, name: &str, env: &str) {
    let (status, body) = t
        .call(
            Method::PATCH,
            &format!("/v1/clusters/{name}"),
            Some(&t.admin),
            Some(json!({"metadata": {"labels": {"env": env}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_watch_resumed_from_a_list_sees_later_changes_as_changes_of_what_it_listed() {
    let t = setup().await;
    for name in ["a", "b"] {
        t.create(&t.admin, "clusters", labelled(name, "x")).await;
    }
    let listed = listed_at(&t).await;
    // Changed after the list and before the watch opens: `a` stays in the selector, `b`
    // leaves it, `c` is new.
    t.call(
        Method::PATCH,
        "/v1/clusters/a",
        Some(&t.admin),
        Some(json!({"spec": {"description": "changed"}})),
    )
    .await;
    relabel(&t, "b", "y").await;
    t.create(&t.admin, "clusters", labelled("c", "x")).await;
    let events = watched(
        &t,
        &format!("watch=1&labelSelector=env%3Dx&resourceVersion={listed}&timeoutSeconds=1"),
    )
    .await;
    let said: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(said, [("MODIFIED", "a"), ("DELETED", "b"), ("ADDED", "c")]);
}

#[tokio::test]
async fn a_watch_with_a_deadline_gets_a_bookmark_of_the_latest_revision_before_it_ends() {
    let t = setup().await;
    t.create(&t.admin, "clusters", labelled("a", "x")).await;
    let listed = listed_at(&t).await;
    t.create(&t.admin, "clusters", labelled("b", "x")).await;
    let (_, b) = t
        .call(Method::GET, "/v1/clusters/b", Some(&t.admin), None)
        .await;
    // Ends after 3 s, its bookmark 2 s before (kube-apiserver's timing); none unasked.
    for (bookmarks, expected) in [(true, vec!["ADDED", "BOOKMARK"]), (false, vec!["ADDED"])] {
        let events = watched(
            &t,
            &format!(
                "watch=1&resourceVersion={listed}&timeoutSeconds=3&allowWatchBookmarks={bookmarks}"
            ),
        )
        .await;
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, expected, "{events:#?}");
        if bookmarks {
            assert_eq!(
                events[1]["object"]["metadata"]["resourceVersion"],
                b["metadata"]["resourceVersion"],
                "the bookmark is at the last change seen"
            );
        }
    }
}
