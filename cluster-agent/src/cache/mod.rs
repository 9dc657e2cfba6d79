//! Watch-driven caches of the cluster's nodes, namespaces, pods, deployments, services and
//! events, and the `cluster-cache` service that answers the hub's queries from them (lists, or
//! the API server's own Table columns, filtered, sorted and paged), so that browsing a big
//! cluster costs its API server nothing.

mod cells;
mod overview;
mod page;
mod reflect;

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube::Client;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tunnel::TunnelStream;

pub use page::{Query, Sort};
use reflect::{Kind, Reflected};

/// How long a query waits for a cache's first full list, or for the revision it asks for,
/// before answering 503 / 504 (the API server's watch cache waits 3 s for a revision).
const SYNC_WAIT: Duration = Duration::from_secs(5);
const REVISION_WAIT: Duration = Duration::from_secs(3);

/// Where the API server serves each cached kind (`proto::CACHED_RESOURCES` names them).
static KINDS: [Kind; 6] = [
    kind(0, "/api/v1/nodes", "Node", "v1"),
    kind(1, "/api/v1/namespaces", "Namespace", "v1"),
    kind(2, "/api/v1/pods", "Pod", "v1"),
    kind(3, "/apis/apps/v1/deployments", "Deployment", "apps/v1"),
    kind(4, "/api/v1/services", "Service", "v1"),
    kind(5, "/api/v1/events", "Event", "v1"),
];

const fn kind(
    index: usize,
    path: &'static str,
    kind: &'static str,
    api_version: &'static str,
) -> Kind {
    Kind {
        resource: proto::CACHED_RESOURCES[index],
        path,
        kind,
        api_version,
    }
}

/// One cache per cached kind; cheap to clone (the caches are shared).
#[derive(Clone, Debug)]
pub struct Caches {
    kinds: Arc<[Arc<Reflected>]>,
}

impl Caches {
    /// Starts listing and watching; the caches fill in the background and stop with `stop`.
    pub fn start(client: &Client, stop: &CancellationToken) -> Self {
        let kinds: Arc<[Arc<Reflected>]> = KINDS
            .iter()
            .map(|kind| Arc::new(Reflected::new(kind)))
            .collect();
        for reflected in kinds.iter() {
            tokio::spawn(reflect::run(
                client.clone(),
                Arc::clone(reflected),
                stop.clone(),
            ));
        }
        Self { kinds }
    }

    fn find(&self, resource: &str) -> Result<&Reflected, CacheError> {
        self.kinds
            .iter()
            .find(|r| r.kind.resource.name == resource)
            .map(|r| &**r)
            .ok_or_else(|| {
                CacheError::NotFound(format!(
                    "{resource:?} is not cached; the cached resources are {}",
                    proto::CACHED_RESOURCES.map(|r| r.name).join(", ")
                ))
            })
    }

    /// Answers one query: a Kubernetes List (`PodList`, …), or with `table` the API server's
    /// Table of the same objects (its columns, each row with the object's metadata).
    pub async fn list(
        &self,
        resource: &str,
        query: &Query,
        table: bool,
    ) -> Result<Vec<u8>, CacheError> {
        let reflected = self.find(resource)?;
        ready(reflected, query.fresh_as).await?;
        let kind = reflected.kind;
        let (page, columns, names, revision) = reflected.read(|snapshot| {
            let names: Vec<String> = snapshot
                .columns
                .iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect();
            page::select(&snapshot.objects, &names, kind.resource.namespaced, query).map(|page| {
                (
                    page,
                    Arc::clone(&snapshot.columns),
                    names.clone(),
                    snapshot.revision.clone(),
                )
            })
        })?;
        let mut meta = serde_json::json!({"resourceVersion": revision});
        if let Some(next) = &page.next {
            meta["continue"] = next.clone().into();
            meta["remainingItemCount"] = page.remaining.into();
        }
        if table {
            encode_table(&page, &columns, &names, &meta)
        } else {
            encode_list(kind, &page, &meta)
        }
    }

    /// The cluster at a glance, summed from the nodes, pods, deployments and events cached, once
    /// each cache has its first full list.
    pub async fn overview(&self) -> Result<proto::overview::Overview, CacheError> {
        let mut held: Vec<Vec<Arc<page::Entry>>> = Vec::new();
        for resource in ["nodes", "pods", "deployments", "events"] {
            let reflected = self.find(resource)?;
            ready(reflected, None).await?;
            // The entries are shared: taken under the lock, read after it is let go.
            held.push(reflected.read(|s| s.objects.values().cloned().collect()));
        }
        // Reading every pod's JSON takes a while on a big cluster: off the async workers.
        tokio::task::spawn_blocking(move || {
            let texts: Vec<Vec<&str>> = held
                .iter()
                .map(|entries| entries.iter().map(|e| &*e.json).collect())
                .collect();
            overview::summarize(&texts[0], &texts[1], &texts[2], &texts[3])
        })
        .await
        .map_err(|e| CacheError::NotReady(format!("summing the overview failed: {e}")))
    }

    /// Every node, as JSON, once the cache has its first full list.
    pub(crate) async fn nodes(&self) -> Result<Vec<Value>, CacheError> {
        let reflected = self.find("nodes")?;
        ready(reflected, None).await?;
        Ok(reflected.read(|s| {
            s.objects
                .values()
                .filter_map(|n| serde_json::from_str(&n.json).ok())
                .collect()
        }))
    }
}

/// Waits (a while) for a cache's first full list and for the revision asked for.
async fn ready(reflected: &Reflected, revision: Option<u64>) -> Result<(), CacheError> {
    let plural = reflected.kind.resource.name;
    if !reflected.wait_for(None, SYNC_WAIT).await {
        return Err(CacheError::NotReady(format!(
            "the cache of {plural} has not finished its first list yet; try again shortly"
        )));
    }
    if revision.is_some() && !reflected.wait_for(revision, REVISION_WAIT).await {
        return Err(CacheError::Behind(format!(
            "the cache of {plural} has not yet seen resourceVersion {} (it is at {}); try again \
             shortly",
            revision.unwrap_or_default(),
            reflected.read(|s| s.revision.clone())
        )));
    }
    Ok(())
}

/// A List of the page's objects, written by concatenating their JSON.
fn encode_list(kind: &Kind, page: &page::Page, meta: &Value) -> Result<Vec<u8>, CacheError> {
    let size = page
        .items
        .iter()
        .map(|(_, e)| e.json.len() + 1)
        .sum::<usize>();
    let mut out = Vec::with_capacity(128 + size);
    out.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut out, &format!("{}List", kind.kind)).map_err(internal)?;
    out.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut out, kind.api_version).map_err(internal)?;
    out.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut out, meta).map_err(internal)?;
    out.extend_from_slice(b",\"items\":[");
    for (i, (_, entry)) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(entry.json.as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// A Table as the API server answers `Accept: application/json;as=Table`: its columns, and a
/// row per object with the object's metadata (`includeObject=Metadata`, the default).
fn encode_table(
    page: &page::Page,
    columns: &[Value],
    names: &[String],
    meta: &Value,
) -> Result<Vec<u8>, CacheError> {
    let now = time::OffsetDateTime::now_utc();
    let rows: Vec<Value> = page
        .items
        .iter()
        .map(|(_, entry)| {
            let object = serde_json::from_str::<Value>(&entry.json).unwrap_or_default();
            let cells = cells::refresh(names, &entry.cells, &object, now);
            let mut metadata = object.get("metadata").cloned().unwrap_or_default();
            if let Value::Object(m) = &mut metadata {
                m.remove("managedFields");
            }
            serde_json::json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": metadata,
                },
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    }))
    .map_err(internal)
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}")]
    Behind(String),
}

impl CacheError {
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
            // The API server's answer to a list at a revision its watch cache has not reached.
            Self::Behind(_) => (StatusCode::GATEWAY_TIMEOUT, "Timeout"),
        }
    }
}

fn internal(e: serde_json::Error) -> CacheError {
    // Serialising a typed object cannot fail; if it ever does, say so rather than panic.
    CacheError::NotReady(format!("cannot encode the list: {e}"))
}

/// Serves one tunnel stream of the `cluster-cache` service.
pub(crate) async fn serve(stream: TunnelStream, caches: Caches) {
    let service = hyper::service::service_fn(move |request| answer(caches.clone(), request));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(error = %e, "cluster-cache stream ended");
    }
}

async fn answer(
    caches: Caches,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resource = request.uri().path().trim_start_matches('/').to_owned();
    let result = if request.method() != http::Method::GET {
        Err(CacheError::BadRequest(
            "the cache answers GET only".to_owned(),
        ))
    } else {
        // Tables when asked for them, as the API server answers.
        let table = request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("as=Table"));
        if request.uri().path() == proto::overview::PATH {
            caches
                .overview()
                .await
                .and_then(|o| serde_json::to_vec(&o).map_err(internal))
        } else {
            match Query::parse(request.uri().query().unwrap_or_default()) {
                Ok(query) => caches.list(&resource, &query, table).await,
                Err(e) => Err(e),
            }
        }
    };
    let (status, body) = match result {
        Ok(body) => (StatusCode::OK, body),
        Err(e) => {
            let (status, reason) = e.status();
            let body = kubeshape::status::failure(status.as_u16(), reason, &e.to_string());
            (status, body.into_bytes())
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cached_kind_has_its_place_on_the_api_server() {
        // The table above and `proto::CACHED_RESOURCES` (what the hub offers) agree.
        for (kind, resource) in KINDS.iter().zip(proto::CACHED_RESOURCES) {
            assert_eq!(kind.resource.name, resource.name);
            let group = if resource.group.is_empty() {
                "/api/v1/".to_owned()
            } else {
                format!("/apis/{}/v1/", resource.group)
            };
            assert_eq!(kind.path, format!("{group}{}", resource.name));
        }
    }
}
