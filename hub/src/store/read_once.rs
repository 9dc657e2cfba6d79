//! A store as one request sees it: each object read at most once. A request that checks the
//! objects it names and then stamps their uids on what it creates (`refs::stamp_all`) would
//! otherwise read each of them twice — a Host with its facts is the larger part of creating a
//! plan.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::{BoxFuture, LabelSelector, Object, Op, Store, StoreError, WatchStream};

/// Reads through to `inner` once per object (what it found, or that it was missing); writes,
/// lists and watches go straight to it.
#[derive(Debug)]
pub struct ReadOnce {
    inner: Arc<dyn Store>,
    read: Mutex<HashMap<(String, String), Result<Object, StoreError>>>,
}

impl ReadOnce {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            read: Mutex::default(),
        }
    }

    /// Reads those of `names` of `kind` not read yet, in one trip to the store: what a request
    /// that names many objects (a list's items) does before checking each.
    pub async fn prefetch(&self, kind: &str, names: Vec<String>) -> Result<(), StoreError> {
        let mut unread: Vec<String> = {
            let read = self.read();
            names
                .into_iter()
                .filter(|n| !read.contains_key(&(kind.to_owned(), n.clone())))
                .collect()
        };
        unread.sort();
        unread.dedup();
        if unread.is_empty() {
            return Ok(());
        }
        let found = self.inner.get_many(kind, unread.clone()).await?;
        let mut read = self.read();
        for (name, object) in unread.into_iter().zip(found) {
            let answer = object.ok_or_else(|| StoreError::NotFound {
                kind: kind.to_owned(),
                name: name.clone(),
            });
            read.insert((kind.to_owned(), name), answer);
        }
        Ok(())
    }

    fn read(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), Result<Object, StoreError>>> {
        self.read.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for ReadOnce {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        let key = (kind.to_owned(), name.to_owned());
        Box::pin(async move {
            if let Some(found) = self.read().get(&key) {
                return found.clone();
            }
            let found = self.inner.get(&key.0, &key.1).await;
            // Only an answer is kept: a failure to read is not one.
            if matches!(found, Ok(_) | Err(StoreError::NotFound { .. })) {
                self.read().insert(key, found.clone());
            }
            found
        })
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        self.inner.list(kind, selector)
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        self.inner.transact(ops)
    }

    fn watch(
        &self,
        kind: Option<&str>,
        from: Option<u64>,
    ) -> BoxFuture<'_, Result<WatchStream, StoreError>> {
        self.inner.watch(kind, from)
    }

    fn revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.inner.revision()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::sqlite::SqliteStore;

    #[tokio::test]
    async fn each_object_is_read_from_the_store_once_and_writes_go_through() {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(std::path::Path::new(":memory:")).unwrap());
        store
            .create(Object::new("Host", "h-one", json!({"cluster": "edge"})))
            .await
            .unwrap();
        let reads = ReadOnce::new(store.clone());
        let first = reads.get("Host", "h-one").await.unwrap();
        assert!(matches!(
            reads.get("Host", "h-two").await,
            Err(StoreError::NotFound { .. })
        ));
        // Changed behind its back, the view still answers what it read first.
        store.delete("Host", "h-one", None).await.unwrap();
        store
            .create(Object::new("Host", "h-two", json!({})))
            .await
            .unwrap();
        assert_eq!(reads.get("Host", "h-one").await.unwrap(), first);
        assert!(matches!(
            reads.get("Host", "h-two").await,
            Err(StoreError::NotFound { .. })
        ));
        // Writes are the store's own; a new view reads afresh.
        let written = reads
            .transact(vec![Op::Create(Object::new("Host", "h-three", json!({})))])
            .await
            .unwrap();
        assert_eq!(store.get("Host", "h-three").await.unwrap(), written[0]);
        let fresh = ReadOnce::new(store);
        assert!(fresh.get("Host", "h-one").await.is_err());
        assert!(fresh.get("Host", "h-two").await.is_ok());
    }

    #[tokio::test]
    async fn objects_read_ahead_answer_as_read_then() {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(std::path::Path::new(":memory:")).unwrap());
        let two = store
            .create(Object::new("Host", "h-two", json!({"cluster": "edge"})))
            .await
            .unwrap();
        let reads = ReadOnce::new(store.clone());
        reads
            .prefetch("Host", vec!["h-two".into(), "h-one".into(), "h-two".into()])
            .await
            .unwrap();
        // Changed behind its back after the read ahead: it answers what was there then, the
        // missing one as missing.
        store.delete("Host", "h-two", None).await.unwrap();
        store
            .create(Object::new("Host", "h-one", json!({})))
            .await
            .unwrap();
        assert_eq!(reads.get("Host", "h-two").await.unwrap(), two);
        assert!(matches!(
            reads.get("Host", "h-one").await,
            Err(StoreError::NotFound { name, .. }) if name == "h-one"
        ));
    }
}
