//! Keeps one kind's cache in step with the API server: a chunked list, then a watch from its
//! revision, both asked as Tables with the whole object in each row (`includeObject=Object`),
//! so the cache holds the columns the server prints beside each object; a watch that ends is
//! resumed, one too old (410 Gone) lists again.

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::TryStreamExt;
use http::{Request, header};
use kube::{Client, core::WatchEvent};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::page::{Entry, Key};

/// What the cache asks the API server for: Tables, JSON.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
/// Objects per list request (kubectl's and client-go's reflectors' chunk size).
const LIST_CHUNK: u32 = 500;
/// How long one watch runs before it is resumed (client-go picks 5–10 minutes).
const WATCH_SECONDS: u32 = 290;
/// Waits between failed attempts: doubling from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));

/// One kind the cache holds, and where the API server serves it.
#[derive(Debug)]
pub(crate) struct Kind {
    pub(crate) resource: proto::CachedResource,
    pub(crate) path: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) api_version: &'static str,
}

/// What the cache holds of one kind at one revision.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The Table's column definitions, as the API server gave them.
    pub(crate) columns: Arc<Vec<Value>>,
    pub(crate) objects: BTreeMap<Key, Arc<Entry>>,
    /// The revision of the last list or event applied.
    pub(crate) revision: String,
}

/// One kind's cache, shared by its reflector and the queries.
#[derive(Debug)]
pub(crate) struct Reflected {
    pub(crate) kind: &'static Kind,
    state: RwLock<Snapshot>,
    /// The revision reached (0 until the first list ends), for readers that wait for one.
    reached: tokio::sync::watch::Sender<u64>,
}

/// One Table page or watch event as the API server sends it.
#[derive(Debug, Clone, Deserialize)]
struct Table {
    #[serde(default)]
    metadata: TableMeta,
    #[serde(default, rename = "columnDefinitions")]
    columns: Option<Vec<Value>>,
    #[serde(default)]
    rows: Option<Vec<Row>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct TableMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    next: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Row {
    #[serde(default)]
    cells: Vec<Value>,
    #[serde(default)]
    object: Value,
}

/// How a watch ended.
enum Watched {
    /// The server closed it (its timeout): resume from the last revision.
    Ended,
    /// The revision is too old (compacted): list again.
    Gone,
}

impl Reflected {
    pub(crate) fn new(kind: &'static Kind) -> Self {
        Self {
            kind,
            state: RwLock::new(Snapshot::default()),
            reached: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Reads the current snapshot.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> T {
        f(&self.state.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Waits until the cache has listed and seen at least `revision` (any, when `None`);
    /// false if that did not happen within `wait`.
    pub(crate) async fn wait_for(&self, revision: Option<u64>, wait: Duration) -> bool {
        let wanted = revision.unwrap_or(1).max(1);
        let mut reached = self.reached.subscribe();
        tokio::time::timeout(wait, reached.wait_for(|r| *r >= wanted))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Replaces everything with a fresh list.
    fn replace(&self, columns: Vec<Value>, objects: BTreeMap<Key, Arc<Entry>>, revision: String) {
        let reached = revision.parse().unwrap_or(1).max(1);
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = Snapshot {
            columns: Arc::new(columns),
            objects,
            revision,
        };
        self.reached.send_replace(reached);
    }

    /// Applies one watch event's rows.
    fn apply(&self, deleted: bool, rows: Vec<Row>) {
        let mut revision = None;
        {
            let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
            for row in rows {
                match entry(self.kind, row) {
                    Ok((key, entry, rv)) => {
                        if deleted {
                            state.objects.remove(&key);
                        } else {
                            state.objects.insert(key, Arc::new(entry));
                        }
                        if let Some(rv) = rv {
                            state.revision.clone_from(&rv);
                            revision = Some(rv);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(kind = self.kind.kind, error = %e, "skipped a watch event")
                    }
                }
            }
        }
        if let Some(reached) = revision.and_then(|r| r.parse().ok()) {
            self.reached.send_replace(reached);
        }
    }

    fn revision(&self) -> String {
        self.read(|s| s.revision.clone())
    }
}

/// One row as a cache entry: its key, the entry and the object's resourceVersion.
fn entry(kind: &Kind, row: Row) -> Result<(Key, Entry, Option<String>), String> {
    let Value::Object(mut object) = row.object else {
        return Err("a row without its object (the server ignored includeObject=Object)".into());
    };
    // Items of a list come without their kind: every cached object carries it, as
    // `kubectl get -o json` shows them.
    object.insert("kind".into(), kind.kind.into());
    object.insert("apiVersion".into(), kind.api_version.into());
    let meta = object.get("metadata").cloned().unwrap_or_default();
    let text = |field: &str| meta.get(field).and_then(Value::as_str).map(str::to_owned);
    let name = text("name").ok_or("an object without a name")?;
    let labels = meta
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let json = serde_json::to_string(&object).map_err(|e| e.to_string())?;
    Ok((
        (text("namespace").unwrap_or_default(), name),
        Entry {
            labels,
            created: text("creationTimestamp").unwrap_or_default(),
            cells: row.cells,
            json: json.into_boxed_str(),
        },
        text("resourceVersion"),
    ))
}

/// Keeps `reflected` in step until `stop`.
pub(crate) async fn run(client: Client, reflected: Arc<Reflected>, stop: CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = reflect(&client, &reflected) => {}
    }
}

async fn reflect(client: &Client, reflected: &Reflected) {
    let plural = reflected.kind.resource.name;
    let mut wait = BACKOFF.0;
    loop {
        if let Err(e) = list(client, reflected).await {
            tracing::warn!(resource = plural, error = %e, "cache list failed; retrying");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(BACKOFF.1);
            continue;
        }
        wait = BACKOFF.0;
        loop {
            match watch(client, reflected).await {
                Ok(Watched::Ended) => wait = BACKOFF.0,
                Ok(Watched::Gone) => break,
                Err(e) => {
                    tracing::warn!(resource = plural, error = %e, "cache watch failed; resuming");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(BACKOFF.1);
                }
            }
        }
    }
}

fn request(uri: &str) -> Result<Request<Vec<u8>>, kube::Error> {
    Request::get(uri)
        .header(header::ACCEPT, TABLE)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)
}

/// Lists every object, a chunk at a time, and replaces the cache with them.
async fn list(client: &Client, reflected: &Reflected) -> Result<(), kube::Error> {
    let kind = reflected.kind;
    let mut columns = Vec::new();
    let mut objects = BTreeMap::new();
    let mut token: Option<String> = None;
    loop {
        let mut uri = format!("{}?limit={LIST_CHUNK}&includeObject=Object", kind.path);
        if let Some(t) = &token {
            uri.push_str("&continue=");
            uri.extend(form_urlencoded::byte_serialize(t.as_bytes()));
        }
        let page: Table = client.request(request(&uri)?).await?;
        if columns.is_empty() {
            columns = page.columns.unwrap_or_default();
        }
        for row in page.rows.unwrap_or_default() {
            match entry(kind, row) {
                Ok((key, entry, _)) => {
                    objects.insert(key, Arc::new(entry));
                }
                Err(e) => tracing::warn!(kind = kind.kind, error = %e, "skipped a listed row"),
            }
        }
        match page.metadata.next.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => {
                let revision = page.metadata.resource_version.unwrap_or_default();
                reflected.replace(columns, objects, revision);
                return Ok(());
            }
        }
    }
}

/// Applies the events of one watch from the cache's revision until it ends.
async fn watch(client: &Client, reflected: &Reflected) -> Result<Watched, kube::Error> {
    let uri = format!(
        "{}?watch=true&resourceVersion={}&timeoutSeconds={WATCH_SECONDS}&includeObject=Object",
        reflected.kind.path,
        reflected.revision()
    );
    let events = match client.request_events::<Table>(request(&uri)?).await {
        Ok(events) => events,
        Err(kube::Error::Api(status)) if status.code == 410 => return Ok(Watched::Gone),
        Err(e) => return Err(e),
    };
    let mut events = std::pin::pin!(events);
    loop {
        let event = match events.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(Watched::Ended),
            Err(kube::Error::Api(status)) if status.code == 410 => return Ok(Watched::Gone),
            Err(e) => return Err(e),
        };
        match event {
            WatchEvent::Added(t) | WatchEvent::Modified(t) => {
                reflected.apply(false, t.rows.unwrap_or_default());
            }
            WatchEvent::Deleted(t) => reflected.apply(true, t.rows.unwrap_or_default()),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(status) if status.code == 410 => return Ok(Watched::Gone),
            WatchEvent::Error(status) => return Err(kube::Error::Api(status)),
        }
    }
}
