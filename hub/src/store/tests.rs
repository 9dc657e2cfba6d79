//! The store's contract, checked against the SQLite backend in a fresh file per test.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use futures::StreamExt;
use serde_json::json;

use super::{
    sqlite::{DEFAULT_RETAIN, SqliteStore},
    *,
};

struct TempStore {
    store: Arc<dyn Store>,
    dir: PathBuf,
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-store-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open(retain: u64) -> TempStore {
    let dir = temp_dir();
    let store = SqliteStore::open_with_retention(&dir.join("state.db"), retain).unwrap();
    TempStore {
        store: Arc::new(store),
        dir,
    }
}

fn cluster(name: &str) -> Object {
    Object::new("Cluster", name, json!({"distribution": "k3s"}))
}

#[tokio::test]
async fn create_sets_identity_and_get_and_list_return_it() {
    let t = open(DEFAULT_RETAIN);
    let created = t.store.create(cluster("a")).await.unwrap();
    let m = &created.metadata;
    assert_eq!(m.uid.len(), 36);
    assert_eq!(m.generation, 1);
    assert_eq!(created.revision(), 1);
    assert!(
        m.creation_timestamp.ends_with('Z'),
        "{}",
        m.creation_timestamp
    );
    assert_eq!(t.store.get("Cluster", "a").await.unwrap(), created);
    let (items, rv) = t
        .store
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    assert_eq!((items, rv), (vec![created], 1));
}

#[tokio::test]
async fn names_are_unique_per_kind_and_missing_objects_are_not_found() {
    let t = open(DEFAULT_RETAIN);
    t.store.create(cluster("a")).await.unwrap();
    let err = t.store.create(cluster("a")).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    // The same name in another kind is another object.
    t.store
        .create(Object::new("Host", "a", json!({})))
        .await
        .unwrap();
    let err = t.store.get("Cluster", "b").await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict_and_changes_nothing() {
    let t = open(DEFAULT_RETAIN);
    let first = t.store.create(cluster("a")).await.unwrap();
    let mut mine = first.clone();
    let mut theirs = first.clone();
    theirs.spec = json!({"distribution": "rke2"});
    let theirs = t.store.update(theirs).await.unwrap();
    mine.spec = json!({"distribution": "k3s", "version": "v1.33"});
    let err = t.store.update(mine).await.unwrap_err();
    match &err {
        StoreError::Conflict { sent, current, .. } => {
            assert_eq!(sent, &first.metadata.resource_version);
            assert_eq!(current, &theirs.metadata.resource_version);
        }
        other => panic!("expected a conflict, got {other}"),
    }
    assert!(err.to_string().contains("retry"));
    assert_eq!(t.store.get("Cluster", "a").await.unwrap(), theirs);
}

#[tokio::test]
async fn generation_counts_spec_changes_only() {
    let t = open(DEFAULT_RETAIN);
    let mut obj = t.store.create(cluster("a")).await.unwrap();
    obj.status = json!({"conditions": []});
    let obj = t.store.update(obj).await.unwrap();
    assert_eq!(
        obj.metadata.generation, 1,
        "a status change is not a new generation"
    );
    let mut obj2 = obj.clone();
    obj2.spec = json!({"distribution": "rke2"});
    obj2.metadata.uid = "forged".into();
    let obj2 = t.store.update(obj2).await.unwrap();
    assert_eq!(obj2.metadata.generation, 2);
    assert_eq!(
        obj2.metadata.uid, obj.metadata.uid,
        "the uid cannot be changed"
    );
}

#[tokio::test]
async fn deletion_waits_for_finalizers() {
    let t = open(DEFAULT_RETAIN);
    let mut obj = cluster("a");
    obj.metadata.finalizers = vec!["drover.io/cleanup".into()];
    t.store.create(obj).await.unwrap();
    let marked = t.store.delete("Cluster", "a", None).await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let mut still_there = t.store.get("Cluster", "a").await.unwrap();
    assert_eq!(still_there, marked);
    still_there.metadata.finalizers.clear();
    t.store.update(still_there).await.unwrap();
    assert!(matches!(
        t.store.get("Cluster", "a").await,
        Err(StoreError::NotFound { .. })
    ));
}

#[tokio::test]
async fn a_transaction_applies_all_of_its_steps_or_none() {
    let t = open(DEFAULT_RETAIN);
    t.store.create(cluster("b")).await.unwrap();
    let err = t
        .store
        .transact(vec![Op::Create(cluster("a")), Op::Create(cluster("b"))])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }));
    assert!(matches!(
        t.store.get("Cluster", "a").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        t.store.revision().await.unwrap(),
        1,
        "a failed transaction takes no revision"
    );

    let written = t
        .store
        .transact(vec![
            Op::Create(cluster("a")),
            Op::Delete {
                kind: "Cluster".into(),
                name: "b".into(),
                resource_version: Some(1),
            },
        ])
        .await
        .unwrap();
    assert_eq!(written.len(), 2);
    assert!(
        written.iter().all(|o| o.revision() == 2),
        "one transaction, one revision"
    );
}

#[tokio::test]
async fn label_selectors_filter_lists() {
    let t = open(DEFAULT_RETAIN);
    for (name, env) in [("a", "prod"), ("b", "dev"), ("c", "prod")] {
        let mut obj = cluster(name);
        obj.metadata.labels = BTreeMap::from([("env".to_owned(), env.to_owned())]);
        t.store.create(obj).await.unwrap();
    }
    let selector = LabelSelector::parse("env=prod").unwrap();
    let (items, _) = t.store.list("Cluster", &selector).await.unwrap();
    let names: Vec<_> = items.iter().map(|o| o.metadata.name.as_str()).collect();
    assert_eq!(names, ["a", "c"]);
}

#[tokio::test]
async fn a_watch_from_a_list_sees_every_later_change_in_order_with_no_gaps() {
    let t = open(DEFAULT_RETAIN);
    t.store.create(cluster("before")).await.unwrap();
    let (_, rv) = t
        .store
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    let mut watch = t.store.watch(Some("Cluster"), Some(rv)).await.unwrap();

    // Writers race while the watch is open; another kind is filtered out.
    let mut writers = Vec::new();
    for w in 0..4 {
        let store = t.store.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..25 {
                store.create(cluster(&format!("w{w}-{i}"))).await.unwrap();
                store
                    .create(Object::new("Host", &format!("h{w}-{i}"), json!({})))
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let mut revisions = Vec::new();
    while revisions.len() < 100 {
        let event = watch.next().await.unwrap().unwrap();
        assert_eq!(event.kind, EventType::Added);
        assert_eq!(event.object.kind, "Cluster");
        revisions.push(event.object.revision());
    }
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "events out of order: {revisions:?}"
    );
    assert!(revisions[0] > rv);

    // Resuming from the middle replays exactly the rest, from the log.
    let middle = revisions[49];
    let mut resumed = t.store.watch(Some("Cluster"), Some(middle)).await.unwrap();
    for expected in &revisions[50..] {
        assert_eq!(
            resumed.next().await.unwrap().unwrap().object.revision(),
            *expected
        );
    }
}

#[tokio::test]
async fn a_watch_without_a_revision_starts_with_the_current_objects() {
    let t = open(DEFAULT_RETAIN);
    t.store.create(cluster("a")).await.unwrap();
    let mut watch = t.store.watch(Some("Cluster"), None).await.unwrap();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(
        (first.kind, first.object.metadata.name.as_str()),
        (EventType::Added, "a")
    );
    t.store.delete("Cluster", "a", None).await.unwrap();
    let gone = watch.next().await.unwrap().unwrap();
    assert_eq!(
        (gone.kind, gone.object.metadata.name.as_str()),
        (EventType::Deleted, "a")
    );
}

#[tokio::test]
async fn a_compacted_revision_is_gone() {
    let t = open(4);
    for i in 0..20 {
        t.store.create(cluster(&format!("c{i}"))).await.unwrap();
    }
    let err = t.store.watch(Some("Cluster"), Some(1)).await.err().unwrap();
    assert!(matches!(err, StoreError::Gone { .. }), "{err}");
    assert!(err.to_string().contains("list again"));
    // Recent revisions still resume.
    let mut recent = t.store.watch(Some("Cluster"), Some(18)).await.unwrap();
    assert_eq!(recent.next().await.unwrap().unwrap().object.revision(), 19);
}

#[tokio::test]
async fn everything_acknowledged_survives_reopening_the_file() {
    let t = open(DEFAULT_RETAIN);
    for i in 0..10 {
        t.store.create(cluster(&format!("c{i}"))).await.unwrap();
    }
    let path = t.dir.join("state.db");
    let reopened = SqliteStore::open(&path).unwrap();
    let (items, rv) = reopened
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    assert_eq!((items.len(), rv), (10, 10));
}
