//! For tests: a store that runs a hook before it passes each transaction on, to count the
//! writes or to let another writer get in first (a controller racing a user's edit, a host's
//! report landing while the planner writes its plan).

use std::{fmt, sync::Arc};

use super::{BoxFuture, LabelSelector, Object, Op, Store, StoreError, WatchStream};

/// What runs before each transaction: given the store underneath and the transaction's ops.
type Hook = Box<
    dyn for<'a> Fn(&'a dyn Store, &'a [Op]) -> BoxFuture<'a, Result<(), StoreError>> + Send + Sync,
>;

pub struct BeforeWrites {
    inner: Arc<dyn Store>,
    hook: Hook,
}

impl BeforeWrites {
    pub fn new(
        inner: Arc<dyn Store>,
        hook: impl for<'a> Fn(&'a dyn Store, &'a [Op]) -> BoxFuture<'a, Result<(), StoreError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            inner,
            hook: Box::new(hook),
        }
    }
}

impl fmt::Debug for BeforeWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeforeWrites")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Store for BeforeWrites {
    fn get(&self, kind: &str, name: &str) -> BoxFuture<'_, Result<Object, StoreError>> {
        self.inner.get(kind, name)
    }

    fn list(
        &self,
        kind: &str,
        selector: &LabelSelector,
    ) -> BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
        self.inner.list(kind, selector)
    }

    fn transact(&self, ops: Vec<Op>) -> BoxFuture<'_, Result<Vec<Object>, StoreError>> {
        Box::pin(async move {
            (self.hook)(self.inner.as_ref(), &ops).await?;
            self.inner.transact(ops).await
        })
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
