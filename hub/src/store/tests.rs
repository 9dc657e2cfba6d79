//! The store's contract, checked against each backend: SQLite in a fresh file per test, and
//! etcd as a real `etcd` process per test (Debian's `etcd-server`; the test fails if it is
//! missing, as the HA mode needs it). Revisions are compared relative to where a fresh store
//! starts, since a fresh etcd starts at revision 1 and SQLite at 0.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use futures::StreamExt;
use serde_json::json;

use super::{
    etcd::EtcdStore,
    sqlite::{DEFAULT_RETAIN, SqliteStore},
    *,
};

#[derive(Debug, Clone, Copy)]
enum Backend {
    Sqlite,
    Etcd,
}

struct TempStore {
    store: Arc<dyn Store>,
    backend: Backend,
    /// The revision the store was at when the test began.
    base: u64,
    etcd: Option<super::local_etcd::LocalEtcd>,
    dir: PathBuf,
}

impl Drop for TempStore {
    fn drop(&mut self) {
        self.etcd.take();
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

impl Backend {
    async fn open(self, retain: u64) -> TempStore {
        let dir = temp_dir();
        let (store, etcd): (Arc<dyn Store>, _) = match self {
            Backend::Sqlite => (
                Arc::new(SqliteStore::open_with_retention(&dir.join("state.db"), retain).unwrap()),
                None,
            ),
            Backend::Etcd => {
                let etcd = super::local_etcd::LocalEtcd::start(&dir).unwrap();
                let store = EtcdStore::connect_with_retention(&etcd.store_url(), retain)
                    .await
                    .unwrap();
                (Arc::new(store), Some(etcd))
            }
        };
        let base = store.revision().await.unwrap();
        TempStore {
            store,
            backend: self,
            base,
            etcd,
            dir,
        }
    }
}

impl TempStore {
    /// The same state opened anew: the SQLite file reopened, or etcd killed, restarted and
    /// connected to again.
    async fn reopen(&mut self) -> Arc<dyn Store> {
        match self.backend {
            Backend::Sqlite => Arc::new(SqliteStore::open(&self.dir.join("state.db")).unwrap()),
            Backend::Etcd => {
                let etcd = self.etcd.as_mut().unwrap();
                etcd.kill();
                etcd.restart().unwrap();
                Arc::new(EtcdStore::connect(&etcd.store_url()).await.unwrap())
            }
        }
    }
}

/// Each test once per backend, as `<test>::sqlite` and `<test>::etcd`.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        $(
            mod $test {
                #[tokio::test]
                async fn sqlite() {
                    super::$test(super::Backend::Sqlite).await;
                }

                #[tokio::test]
                async fn etcd() {
                    super::$test(super::Backend::Etcd).await;
                }
            }
        )*
    };
}

on_both_backends!(
    create_sets_identity_and_get_and_list_return_it,
    names_are_unique_per_kind_and_missing_objects_are_not_found,
    many_objects_are_read_at_once_in_the_order_named,
    a_uid_is_read_as_stored_and_a_name_given_again_has_another,
    many_uids_are_read_at_once_in_the_order_named,
    a_stale_resource_version_is_a_conflict_and_changes_nothing,
    generation_counts_spec_changes_only,
    deletion_waits_for_finalizers,
    a_transaction_applies_all_of_its_steps_or_none,
    label_selectors_filter_lists,
    a_watch_from_a_list_sees_every_later_change_in_order_with_no_gaps,
    a_watch_without_a_revision_starts_with_the_current_objects,
    a_compacted_revision_is_gone,
    everything_acknowledged_survives_reopening,
    concurrent_writers_to_one_object_each_win_or_conflict,
    writers_committed_together_each_get_their_own_outcome,
    a_modification_changes_the_object_as_stored_and_one_that_changes_nothing_writes_nothing,
);

fn cluster(name: &str) -> Object {
    Object::new("Cluster", name, json!({"distribution": "k3s"}))
}

async fn create_sets_identity_and_get_and_list_return_it(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    let created = t.store.create(cluster("a")).await.unwrap();
    let m = &created.metadata;
    assert_eq!(m.uid.len(), 36);
    assert_eq!(m.generation, 1);
    assert_eq!(created.revision(), t.base + 1);
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
    assert_eq!((items, rv), (vec![created], t.base + 1));
}

async fn names_are_unique_per_kind_and_missing_objects_are_not_found(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn many_objects_are_read_at_once_in_the_order_named(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    let a = t.store.create(cluster("a")).await.unwrap();
    let c = t.store.create(cluster("c")).await.unwrap();
    // A Host named as a Cluster is not one.
    t.store
        .create(Object::new("Host", "b", json!({})))
        .await
        .unwrap();
    let names = ["c", "b", "a", "c"].map(String::from).to_vec();
    let found = t.store.get_many("Cluster", names).await.unwrap();
    assert_eq!(found, vec![Some(c.clone()), None, Some(a), Some(c)]);
    assert!(
        t.store
            .get_many("Cluster", Vec::new())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_uid_is_read_as_stored_and_a_name_given_again_has_another(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    let first = t.store.create(cluster("a")).await.unwrap();
    let host = t
        .store
        .create(Object::new("Host", "a", json!({"facts": {"cpus": 4}})))
        .await
        .unwrap();
    assert_eq!(
        t.store.uid("Cluster", "a").await.unwrap(),
        Some(first.metadata.uid.clone())
    );
    assert_eq!(
        t.store.uid("Host", "a").await.unwrap(),
        Some(host.metadata.uid)
    );
    assert_eq!(t.store.uid("Cluster", "b").await.unwrap(), None);
    t.store.delete("Cluster", "a", None).await.unwrap();
    assert_eq!(t.store.uid("Cluster", "a").await.unwrap(), None);
    let second = t.store.create(cluster("a")).await.unwrap();
    assert_ne!(second.metadata.uid, first.metadata.uid);
    assert_eq!(
        t.store.uid("Cluster", "a").await.unwrap(),
        Some(second.metadata.uid)
    );
}

async fn many_uids_are_read_at_once_in_the_order_named(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    let cluster_a = t.store.create(cluster("a")).await.unwrap();
    let host_a = t
        .store
        .create(Object::new("Host", "a", json!({})))
        .await
        .unwrap();
    let key = |kind: &str, name: &str| (kind.to_owned(), name.to_owned());
    let keys = vec![
        key("Host", "a"),
        key("Cluster", "b"),
        key("Cluster", "a"),
        key("Token", "a"),
    ];
    assert_eq!(
        t.store.uids(keys).await.unwrap(),
        vec![
            Some(host_a.metadata.uid),
            None,
            Some(cluster_a.metadata.uid),
            None
        ]
    );
    assert!(t.store.uids(Vec::new()).await.unwrap().is_empty());
}

async fn a_stale_resource_version_is_a_conflict_and_changes_nothing(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn generation_counts_spec_changes_only(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn deletion_waits_for_finalizers(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn a_transaction_applies_all_of_its_steps_or_none(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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
        t.base + 1,
        "a failed transaction takes no revision"
    );

    let written = t
        .store
        .transact(vec![
            Op::Create(cluster("a")),
            Op::Delete {
                kind: "Cluster".into(),
                name: "b".into(),
                resource_version: Some(t.base + 1),
            },
        ])
        .await
        .unwrap();
    assert_eq!(written.len(), 2);
    assert!(
        written.iter().all(|o| o.revision() == t.base + 2),
        "one transaction, one revision"
    );
}

async fn label_selectors_filter_lists(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn a_watch_from_a_list_sees_every_later_change_in_order_with_no_gaps(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn a_watch_without_a_revision_starts_with_the_current_objects(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
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

async fn a_compacted_revision_is_gone(backend: Backend) {
    let t = backend.open(4).await;
    for i in 0..20 {
        t.store.create(cluster(&format!("c{i}"))).await.unwrap();
    }
    let err = t
        .store
        .watch(Some("Cluster"), Some(t.base + 1))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::Gone { .. }), "{err}");
    assert!(err.to_string().contains("list again"));
    // Recent revisions still resume.
    let mut recent = t
        .store
        .watch(Some("Cluster"), Some(t.base + 18))
        .await
        .unwrap();
    assert_eq!(
        recent.next().await.unwrap().unwrap().object.revision(),
        t.base + 19
    );
}

async fn everything_acknowledged_survives_reopening(backend: Backend) {
    let mut t = backend.open(DEFAULT_RETAIN).await;
    for i in 0..10 {
        t.store.create(cluster(&format!("c{i}"))).await.unwrap();
    }
    let reopened = t.reopen().await;
    let (items, rv) = reopened
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    assert_eq!((items.len(), rv), (10, t.base + 10));
    // And it goes on from there.
    let next = reopened.create(cluster("after")).await.unwrap();
    assert_eq!(next.revision(), t.base + 11);
}

async fn concurrent_writers_to_one_object_each_win_or_conflict(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    t.store
        .create(Object::new("Counter", "n", json!({"value": 0})))
        .await
        .unwrap();
    // Eight writers add one each, 10 times, by read-modify-write with the resourceVersion
    // they read; a conflict means read again. No increment may be lost.
    let mut writers = Vec::new();
    for _ in 0..8 {
        let store = t.store.clone();
        writers.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..10 {
                loop {
                    let mut counter = store.get("Counter", "n").await.unwrap();
                    let value = counter.spec["value"].as_u64().unwrap();
                    counter.spec = json!({"value": value + 1});
                    match store.update(counter).await {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => conflicts += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for w in writers {
        conflicts += w.await.unwrap();
    }
    let counter = t.store.get("Counter", "n").await.unwrap();
    assert_eq!(counter.spec["value"], 80, "after {conflicts} conflicts");
    assert_eq!(counter.metadata.generation, 81);
}

/// The primitives hub replicas coordinate with: a key only one holder can create, writes
/// fenced by it, and a lease whose end takes its keys along.
#[tokio::test]
async fn etcd_leadership_keys_fence_writes_and_expire_with_their_lease() {
    let t = Backend::Etcd.open(DEFAULT_RETAIN).await;
    let url = t.etcd.as_ref().unwrap().store_url();
    let etcd = EtcdStore::connect(&url).await.unwrap();
    let key = etcd.meta_key("leader");
    let mine = etcd.grant(5).await.unwrap();
    let theirs = etcd.grant(5).await.unwrap();
    let revision = etcd
        .create_raw(&key, "me", mine)
        .await
        .unwrap()
        .expect("first holder");
    assert_eq!(etcd.create_raw(&key, "them", theirs).await.unwrap(), None);
    assert_eq!(
        etcd.get_raw(&key).await.unwrap(),
        Some(("me".into(), revision))
    );

    // Fenced writes land while the key is the one created then.
    let fenced: Arc<dyn Store> = Arc::new(etcd.fenced(super::etcd::Fence {
        key: key.clone(),
        revision,
    }));
    fenced.create(cluster("while-leading")).await.unwrap();
    // The lease goes (as when the holder dies): so does the key, and someone else takes it.
    etcd.revoke(mine).await;
    assert_eq!(etcd.get_raw(&key).await.unwrap(), None);
    etcd.create_raw(&key, "them", theirs)
        .await
        .unwrap()
        .expect("second holder");
    let err = fenced.create(cluster("after")).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced(_)), "{err}");
    assert!(matches!(
        t.store.get("Cluster", "after").await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn writers_committed_together_each_get_their_own_outcome(backend: Backend) {
    let t = backend.open(DEFAULT_RETAIN).await;
    // 60 writers at once (SQLite commits such bursts together): each name is asked for twice,
    // so one of each pair fails; its failure must not touch the others' writes.
    let mut writers = Vec::new();
    for i in 0..60 {
        let store = t.store.clone();
        writers.push(tokio::spawn(async move {
            let name = format!("c{}", i / 2);
            store
                .transact(vec![
                    Op::Create(cluster(&name)),
                    Op::Create(Object::new("Host", &format!("h{i}"), json!({}))),
                ])
                .await
        }));
    }
    let mut revisions = Vec::new();
    let mut failed = 0;
    for w in writers {
        match w.await.unwrap() {
            Ok(written) => {
                assert!(
                    written
                        .iter()
                        .all(|o| o.revision() == written[0].revision())
                );
                revisions.push(written[0].revision());
            }
            Err(StoreError::AlreadyExists { .. }) => failed += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((revisions.len(), failed), (30, 30));
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(
        revisions.len(),
        30,
        "a revision for each writer that succeeded"
    );
    let everything = LabelSelector::everything();
    let (clusters, _) = t.store.list("Cluster", &everything).await.unwrap();
    let (hosts, rv) = t.store.list("Host", &everything).await.unwrap();
    // A failed writer's host was not created with it.
    assert_eq!((clusters.len(), hosts.len()), (30, 30));
    assert_eq!(rv, *revisions.last().unwrap());
}

/// `Op::Modify` with the counter of the test above: the change runs on the object as stored,
/// so concurrent writers need no retry and lose nothing.
fn add_one() -> Op {
    Op::Modify {
        kind: "Counter".into(),
        name: "n".into(),
        change: Modifier::new(|o| {
            let value = o.spec["value"].as_u64().unwrap_or(0);
            o.spec = json!({"value": value + 1});
        }),
    }
}

async fn a_modification_changes_the_object_as_stored_and_one_that_changes_nothing_writes_nothing(
    backend: Backend,
) {
    let t = backend.open(DEFAULT_RETAIN).await;
    let missing = t.store.transact(vec![add_one()]).await;
    assert!(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "{missing:?}"
    );
    let created = t
        .store
        .create(Object::new("Counter", "n", json!({"value": 0})))
        .await
        .unwrap();
    let mut watch = t
        .store
        .watch(Some("Counter"), Some(created.revision()))
        .await
        .unwrap();
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let store = t.store.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    store.transact(vec![add_one()]).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let counter = t.store.get("Counter", "n").await.unwrap();
    assert_eq!(counter.spec["value"], 80);
    assert_eq!(counter.metadata.generation, 81);
    assert_eq!(counter.metadata.uid, created.metadata.uid);
    for expected in 1..=80 {
        let event = watch.next().await.unwrap().unwrap();
        assert_eq!(event.kind, EventType::Modified);
        assert_eq!(event.object.spec["value"], expected);
    }

    // A change that leaves the object as it was: the stored object back, no new revision,
    // no event; beside a real write in one transaction, only that one is written.
    let before = t.store.revision().await.unwrap();
    let unchanged = Op::Modify {
        kind: "Counter".into(),
        name: "n".into(),
        change: Modifier::new(|o| o.spec["value"] = json!(80)),
    };
    let written = t.store.transact(vec![unchanged.clone()]).await.unwrap();
    assert_eq!(written, std::slice::from_ref(&counter));
    assert_eq!(t.store.revision().await.unwrap(), before);
    let written = t
        .store
        .transact(vec![unchanged, Op::Create(cluster("beside"))])
        .await
        .unwrap();
    assert_eq!(written[0], counter);
    let created = t.store.get("Cluster", "beside").await.unwrap();
    assert!(created.revision() > before);
    // The counter's watch was shown nothing for them: its next change is a later write.
    t.store.transact(vec![add_one()]).await.unwrap();
    let event = watch.next().await.unwrap().unwrap();
    assert_eq!(event.object.spec["value"], 81);
}

/// One committer at a time commits SQLite's queued writes: should a commit panic (here a
/// change that panics as the transaction applies it), its writer is told so, nothing of it is
/// stored, and later writes are still committed (were the committer gone while the store
/// believed one was running, every later write would wait for ever; were the writers queued
/// meanwhile failed with the batch, the next write could fail too).
#[tokio::test]
async fn sqlite_writes_go_on_after_a_commit_panicked() {
    let t = Backend::Sqlite.open(DEFAULT_RETAIN).await;
    t.store.create(cluster("before")).await.unwrap();
    let panicking = Op::Modify {
        kind: "Cluster".into(),
        name: "before".into(),
        change: Modifier::new(|_| panic!("a change that panics (expected in this test)")),
    };
    let failed = t
        .store
        .transact(vec![panicking, Op::Create(cluster("with-it"))])
        .await;
    assert!(matches!(failed, Err(StoreError::Backend(_))), "{failed:?}");
    let after = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        t.store.create(cluster("after")),
    )
    .await
    .expect("a write after the panic was committed");
    after.unwrap();
    assert!(matches!(
        t.store.get("Cluster", "with-it").await,
        Err(StoreError::NotFound { .. })
    ));
    let (clusters, _) = t
        .store
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    let names: Vec<_> = clusters.iter().map(|c| c.metadata.name.as_str()).collect();
    assert_eq!(names, ["after", "before"]);
}

/// A writer that queues while a commit is panicking is committed, not failed with the batch
/// that panicked (the change below waits, mid-commit, until the other write is queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_write_queued_while_a_commit_panics_is_committed() {
    let sqlite =
        Arc::new(super::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap());
    let store: Arc<dyn Store> = sqlite.clone();
    store.create(cluster("before")).await.unwrap();
    let runtime = tokio::runtime::Handle::current();
    let (queued_tx, queued_rx) = std::sync::mpsc::channel();
    let panicking = {
        let (store, sqlite) = (store.clone(), sqlite.clone());
        Op::Modify {
            kind: "Cluster".into(),
            name: "before".into(),
            change: Modifier::new(move |_| {
                let store = store.clone();
                let meanwhile =
                    runtime.spawn(async move { store.create(cluster("meanwhile")).await });
                // Only this writer runs a commit, so the other one can only queue.
                while sqlite.queued_writers() == 0 {
                    std::thread::yield_now();
                }
                let _ = queued_tx.send(meanwhile);
                panic!("a change that panics (expected in this test)")
            }),
        }
    };
    let failed = store.transact(vec![panicking]).await;
    assert!(matches!(failed, Err(StoreError::Backend(_))), "{failed:?}");
    let meanwhile = queued_rx.recv().unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), meanwhile)
        .await
        .expect("the write queued meanwhile was committed within 30 s")
        .unwrap()
        .unwrap();
    store.get("Cluster", "meanwhile").await.unwrap();
}
