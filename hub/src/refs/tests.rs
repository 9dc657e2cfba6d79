//! References by uid, on a real SQLite store.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::store::sqlite::SqliteStore;

fn store() -> (Arc<dyn Store>, std::path::PathBuf) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-refs-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap());
    (store, dir)
}

#[tokio::test]
async fn objects_created_together_name_each_other_by_the_uid_they_are_stored_with() {
    let (store, dir) = store();
    let mut ops = vec![
        Op::Create(Object::new("Cluster", "alpha", json!({"type": "imported"}))),
        Op::Create(Object::new(
            "RegistrationToken",
            "drr-1",
            json!({"cluster": "alpha"}),
        )),
    ];
    stamp_all(store.as_ref(), &mut ops).await.unwrap();
    let written = store.transact(ops).await.unwrap();
    assert_eq!(
        written[1].metadata.owner_references,
        vec![OwnerReference {
            kind: "Cluster".into(),
            name: "alpha".into(),
            uid: written[0].metadata.uid.clone(),
        }]
    );
    assert!(
        Liveness::new(store.as_ref())
            .live(&written[1])
            .await
            .unwrap()
    );

    // Naming what does not exist says which field to fix.
    let mut orphan = vec![Op::Create(Object::new(
        "Project",
        "p",
        json!({"cluster": "zulu"}),
    ))];
    let err = stamp_all(store.as_ref(), &mut orphan).await.unwrap_err();
    assert!(err.to_string().contains("spec.cluster"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn references_never_change_once_recorded() {
    let (store, dir) = store();
    store
        .create(Object::new("Cluster", "alpha", json!({"type": "imported"})))
        .await
        .unwrap();
    let token = create(
        store.as_ref(),
        Object::new("RegistrationToken", "drr-1", json!({"cluster": "alpha"})),
    )
    .await
    .unwrap();
    let mut forged = token.clone();
    forged.metadata.owner_references[0].uid = "someone-else".into();
    let kept = store.update(forged).await.unwrap();
    assert_eq!(
        kept.metadata.owner_references,
        token.metadata.owner_references
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn older_objects_get_their_references_once_and_orphans_are_collected() {
    let (store, dir) = store();
    store
        .create(Object::new("Cluster", "alpha", json!({"type": "imported"})))
        .await
        .unwrap();
    // As stored by a hub that recorded no references: one for a cluster that exists, one for
    // a cluster long gone (with a finalizer, as hosts have).
    store
        .create(Object::new("Project", "p", json!({"cluster": "alpha"})))
        .await
        .unwrap();
    let mut host = Object::new("Host", "h-1", json!({"cluster": "gone"}));
    host.metadata.finalizers = vec!["drover.io/planner".into()];
    store.create(host).await.unwrap();
    assert_eq!(backfill(store.as_ref()).await.unwrap(), 1);
    assert_eq!(backfill(store.as_ref()).await.unwrap(), 0, "once only");
    let project = store.get("Project", "p").await.unwrap();
    assert!(Liveness::new(store.as_ref()).live(&project).await.unwrap());

    assert_eq!(collect(store.as_ref()).await.unwrap(), 1);
    assert!(store.get("Host", "h-1").await.is_err());
    assert!(store.get("Project", "p").await.is_ok());

    // A cluster deleted and made again: what the first one had goes, nothing of the second.
    store.delete("Cluster", "alpha", None).await.unwrap();
    store
        .create(Object::new("Cluster", "alpha", json!({"type": "imported"})))
        .await
        .unwrap();
    let fresh = create(
        store.as_ref(),
        Object::new("Project", "q", json!({"cluster": "alpha"})),
    )
    .await
    .unwrap();
    assert_eq!(collect(store.as_ref()).await.unwrap(), 1);
    assert!(store.get("Project", "p").await.is_err());
    assert_eq!(
        store.get("Project", "q").await.unwrap().metadata.uid,
        fresh.metadata.uid
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_machine_of_a_deleted_cluster_keeps_its_finalizer_for_its_controller() {
    let (store, dir) = store();
    store
        .create(Object::new("Cluster", "edge", json!({"type": "custom"})))
        .await
        .unwrap();
    let mut machine = Object::new(
        "Machine",
        "edge-w-abcde",
        json!({"cluster": "edge", "pool": "w", "template": "t"}),
    );
    machine.metadata.finalizers = vec![crate::model::MACHINE_FINALIZER.into()];
    create(store.as_ref(), machine).await.unwrap();
    store.delete("Cluster", "edge", None).await.unwrap();

    // Its deletion is asked for; the finalizer stays until the machine controller has
    // destroyed the cloud's machine, whatever the collector does meanwhile.
    collect(store.as_ref()).await.unwrap();
    collect(store.as_ref()).await.unwrap();
    let kept = store.get("Machine", "edge-w-abcde").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert_eq!(kept.metadata.finalizers, [crate::model::MACHINE_FINALIZER]);
    std::fs::remove_dir_all(dir).unwrap();
}
