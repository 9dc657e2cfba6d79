//! Backups taken while the store is written, restores that bring back exactly the snapshot,
//! and refusals that leave everything as it was.

use std::{os::unix::fs::PermissionsExt, path::PathBuf, sync::Arc};

use serde_json::json;

use super::*;
use crate::store::{LabelSelector, Object, Store, sqlite::SqliteStore};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("drover-backup-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    Dir(dir)
}

fn cluster(name: &str) -> Object {
    Object::new("Cluster", name, json!({"type": "imported"}))
}

async fn names(data_dir: &Path) -> Vec<String> {
    let store = SqliteStore::open(&data_dir.join(STORE_FILE)).unwrap();
    let (items, _) = store
        .list("Cluster", &LabelSelector::everything())
        .await
        .unwrap();
    items.into_iter().map(|o| o.metadata.name).collect()
}

#[tokio::test]
async fn a_backup_restores_the_store_and_ca_as_they_were_and_keeps_what_it_replaced() {
    let dir = temp_dir("roundtrip");
    let data = dir.0.join("data");
    let pki = crate::pki::load_or_create(&data, &["localhost".into()]).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data.join(STORE_FILE)).unwrap());
    store.create(cluster("before")).await.unwrap();

    let file = dir.0.join("hub.backup");
    let summary = backup(&data, &file).unwrap();
    assert_eq!((summary.objects, summary.revision), (1, 1));
    assert_eq!(summary.files, ["tls/ca-key.pem", "tls/ca.pem"]);
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600,
        "it holds the CA key"
    );
    assert_eq!(verify(&file).unwrap(), summary);

    // After the backup: a new object, and the CA lost.
    store.create(cluster("after")).await.unwrap();
    drop(store);
    fs::remove_dir_all(data.join("tls")).unwrap();

    let restored = restore(&data, &file).unwrap();
    assert_eq!(names(&data).await, ["before"]);
    let again = crate::pki::load_or_create(&data, &["localhost".into()]).unwrap();
    assert_eq!(
        again.ca_checksum, pki.ca_checksum,
        "the same CA, so agents trust it"
    );
    let key = data.join("tls").join(CA_KEY);
    assert_eq!(
        fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Nothing was lost: the replaced store is kept aside, "after" and all.
    let previous = restored.previous.unwrap();
    assert_eq!(names(&previous).await, ["after", "before"]);
}

#[tokio::test]
async fn a_backup_taken_during_writes_is_one_consistent_snapshot() {
    let dir = temp_dir("busy");
    let data = dir.0.join("data");
    fs::create_dir_all(&data).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data.join(STORE_FILE)).unwrap());
    store.create(cluster("c0")).await.unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 1..400 {
                // Two objects per revision: a torn copy would show an odd count.
                store
                    .transact(vec![
                        crate::store::Op::Create(cluster(&format!("a{i}"))),
                        crate::store::Op::Create(cluster(&format!("b{i}"))),
                    ])
                    .await
                    .unwrap();
            }
        })
    };
    let mut taken = Vec::new();
    for n in 0..5 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let file = dir.0.join(format!("busy-{n}.backup"));
        let data = data.clone();
        let copy = file.clone();
        let summary = tokio::task::spawn_blocking(move || backup(&data, &copy))
            .await
            .unwrap()
            .unwrap();
        taken.push(summary);
    }
    writer.await.unwrap();
    for summary in &taken {
        assert_eq!(
            summary.objects,
            2 * summary.revision - 1,
            "objects and revision from the same instant: {summary}"
        );
    }
    assert!(
        taken.windows(2).all(|w| w[0].revision <= w[1].revision),
        "{taken:?}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_and_changes_nothing() {
    let dir = temp_dir("refusals");
    let data = dir.0.join("data");
    fs::create_dir_all(&data).unwrap();
    let none = backup(&data, &dir.0.join("x.backup"))
        .unwrap_err()
        .to_string();
    assert!(none.contains("no hub state"), "{none}");

    crate::pki::load_or_create(&data, &["localhost".into()]).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data.join(STORE_FILE)).unwrap());
    store.create(cluster("kept")).await.unwrap();
    drop(store);

    let file = dir.0.join("hub.backup");
    backup(&data, &file).unwrap();
    let twice = backup(&data, &file).unwrap_err().to_string();
    assert!(twice.contains("never overwrites"), "{twice}");

    // Not a backup, and a backup cut short: refused before anything moves.
    let garbage = dir.0.join("garbage.backup");
    fs::write(&garbage, b"not a database at all").unwrap();
    let cut = dir.0.join("cut.backup");
    let whole = fs::read(&file).unwrap();
    fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    for bad in [&garbage, &cut] {
        let err = restore(&data, bad).unwrap_err().to_string();
        assert!(err.contains("not a usable Drover backup"), "{err}");
    }
    // A hub running on the directory.
    let lock = lock_data_dir(&data).unwrap();
    let err = restore(&data, &file).unwrap_err().to_string();
    assert!(err.contains("a hub is running"), "{err}");
    drop(lock);

    assert_eq!(names(&data).await, ["kept"]);
    assert!(
        !fs::read_dir(&data).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("before-restore")),
        "nothing was moved aside"
    );
}

#[test]
fn the_data_directory_admits_one_hub_at_a_time() {
    let dir = temp_dir("lock");
    let first = lock_data_dir(&dir.0).unwrap();
    let err = lock_data_dir(&dir.0).unwrap_err().to_string();
    assert!(err.contains("another drover-hub is using"), "{err}");
    drop(first);
    lock_data_dir(&dir.0).unwrap();
}
