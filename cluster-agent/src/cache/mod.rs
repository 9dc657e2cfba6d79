//! Watch-driven caches of the cluster's nodes, namespaces, pods, deployments, services and
//! events (kube-runtime reflectors), and the `cluster-cache` service that answers the hub's
//! list queries from them, so that listing a big cluster costs the API server nothing.

use std::{
    borrow::Cow, convert::Infallible, fmt::Debug, marker::PhantomData, sync::Arc, time::Duration,
};

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Event, Namespace, Node, Pod, Service},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use kubeshape::LabelSelector;
use serde::{Deserialize, Deserializer};
use tokio_util::sync::CancellationToken;
use tunnel::TunnelStream;

/// How long a query waits for a cache's first full list before answering 503.
const SYNC_WAIT: Duration = Duration::from_secs(5);

/// One reflector per resource; cheap to clone (the stores are shared).
#[derive(Clone)]
pub struct Caches {
    nodes: Store<Cached<Node>>,
    namespaces: Store<Cached<Namespace>>,
    pods: Store<Cached<Pod>>,
    deployments: Store<Cached<Deployment>>,
    services: Store<Cached<Service>>,
    events: Store<Cached<Event>>,
}

/// One cached object: its metadata, for filtering and sorting, and its JSON as the API server
/// sent it. Keeping the text rather than the typed object (`K` only names the resource) costs
/// a tenth of the memory (30,000 typed pods held over 300 MiB) and lets a list be written by
/// concatenation.
pub struct Cached<K> {
    meta: ObjectMeta,
    json: Box<str>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cached<K> {
    fn clone(&self) -> Self {
        Self {
            meta: self.meta.clone(),
            json: self.json.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Debug for Cached<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("namespace", &self.meta.namespace)
            .field("name", &self.meta.name)
            .finish_non_exhaustive()
    }
}

impl<'de, K: Resource<DynamicType = ()>> Deserialize<'de> for Cached<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Through a `Value`, not a `RawValue`: watch events arrive inside a tagged enum, which
        // may hand the object over already parsed.
        let mut value = serde_json::Value::deserialize(deserializer)?;
        // Items of a list come without their kind, objects of a watch event with it: every
        // cached object carries it, as `kubectl get -o json` shows them.
        if let Some(object) = value.as_object_mut() {
            object.insert("kind".into(), K::kind(&()).into_owned().into());
            object.insert("apiVersion".into(), K::api_version(&()).into_owned().into());
        }
        let meta: ObjectMeta = match value.get("metadata") {
            Some(meta) => ObjectMeta::deserialize(meta).map_err(serde::de::Error::custom)?,
            None => ObjectMeta::default(),
        };
        let json = serde_json::to_string(&value).map_err(serde::de::Error::custom)?;
        Ok(Self {
            meta,
            json: json.into_boxed_str(),
            kind: PhantomData,
        })
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Cached<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind((): &()) -> Cow<'_, str> {
        K::kind(&())
    }

    fn group((): &()) -> Cow<'_, str> {
        K::group(&())
    }

    fn version((): &()) -> Cow<'_, str> {
        K::version(&())
    }

    fn plural((): &()) -> Cow<'_, str> {
        K::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

impl Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("pods", &self.pods.len())
            .finish_non_exhaustive()
    }
}

/// Starts a reflector for `K`, running until `stop`; its errors are retried with backoff.
fn reflect<K>(client: &Client, stop: &CancellationToken) -> Store<Cached<K>>
where
    K: Resource<DynamicType = ()> + 'static,
{
    let (reader, writer) = reflector::store();
    let api = Api::<Cached<K>>::all(client.clone());
    let stream = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    let stop = stop.clone();
    tokio::spawn(async move {
        let drive = stream.for_each(|event| {
            if let Err(e) = event {
                tracing::warn!(resource = %K::plural(&()), error = %e, "cache watch failed; retrying");
            }
            std::future::ready(())
        });
        tokio::select! {
            () = stop.cancelled() => {}
            () = drive => {}
        }
    });
    reader
}

impl Caches {
    /// Starts watching; the caches fill in the background and stop with `stop`.
    pub fn start(client: &Client, stop: &CancellationToken) -> Self {
        Self {
            nodes: reflect(client, stop),
            namespaces: reflect(client, stop),
            pods: reflect(client, stop),
            deployments: reflect(client, stop),
            services: reflect(client, stop),
            events: reflect(client, stop),
        }
    }

    /// Answers one query: a Kubernetes List (`PodList`, …) of the matching objects, sorted by
    /// namespace and name.
    pub async fn list(&self, resource: &str, query: &Query) -> Result<Vec<u8>, CacheError> {
        match resource {
            "nodes" => list(&self.nodes, false, query).await,
            "namespaces" => list(&self.namespaces, false, query).await,
            "pods" => list(&self.pods, true, query).await,
            "deployments" => list(&self.deployments, true, query).await,
            "services" => list(&self.services, true, query).await,
            "events" => list(&self.events, true, query).await,
            other => Err(CacheError::NotFound(format!(
                "{other:?} is not cached; the cached resources are {}",
                proto::CACHED_RESOURCES.map(|r| r.name).join(", ")
            ))),
        }
    }
}

impl Caches {
    /// Every node, as JSON, once the cache has its first full list.
    pub(crate) async fn nodes(&self) -> Result<Vec<serde_json::Value>, CacheError> {
        ready(&self.nodes).await?;
        Ok(self
            .nodes
            .state()
            .iter()
            .filter_map(|n| serde_json::from_str(&n.json).ok())
            .collect())
    }
}

/// Waits (a while) for a cache's first full list.
async fn ready<K>(store: &Store<Cached<K>>) -> Result<(), CacheError>
where
    K: Resource<DynamicType = ()> + 'static,
{
    if tokio::time::timeout(SYNC_WAIT, store.wait_until_ready())
        .await
        .map_or(true, |r| r.is_err())
    {
        return Err(CacheError::NotReady(format!(
            "the cache of {} has not finished its first list yet; try again shortly",
            K::plural(&())
        )));
    }
    Ok(())
}

/// What a list query asks for.
#[derive(Debug, Default)]
pub struct Query {
    pub namespace: Option<String>,
    pub selector: Option<LabelSelector>,
}

impl Query {
    /// Parses `namespace=` and `labelSelector=`; anything else is refused, so a misspelt
    /// parameter is not silently ignored.
    pub fn parse(query: &str) -> Result<Self, CacheError> {
        let mut parsed = Self::default();
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match key.as_ref() {
                "namespace" if !value.is_empty() => parsed.namespace = Some(value.into_owned()),
                "namespace" => {}
                "labelSelector" => {
                    parsed.selector = Some(LabelSelector::parse(&value).map_err(|e| {
                        CacheError::BadRequest(format!("labelSelector {value:?}: {e}"))
                    })?);
                }
                other => {
                    return Err(CacheError::BadRequest(format!(
                        "unknown query parameter {other:?}; use namespace= and labelSelector="
                    )));
                }
            }
        }
        Ok(parsed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotReady(String),
}

impl CacheError {
    fn status(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "NotFound"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        }
    }
}

async fn list<K>(
    store: &Store<Cached<K>>,
    namespaced: bool,
    query: &Query,
) -> Result<Vec<u8>, CacheError>
where
    K: Resource<DynamicType = ()> + 'static,
{
    let plural = K::plural(&());
    if query.namespace.is_some() && !namespaced {
        return Err(CacheError::BadRequest(format!(
            "{plural} are cluster-scoped; leave out namespace="
        )));
    }
    ready(store).await?;
    let mut items: Vec<Arc<Cached<K>>> = store.state_filter(|o| {
        query
            .namespace
            .as_ref()
            .is_none_or(|ns| o.meta().namespace.as_ref() == Some(ns))
            && query
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(o.labels()))
    });
    items.sort_by(|a, b| {
        (a.meta().namespace.as_deref(), a.meta().name.as_deref())
            .cmp(&(b.meta().namespace.as_deref(), b.meta().name.as_deref()))
    });
    let kind = format!("{}List", K::kind(&()));
    let api_version = K::api_version(&());
    let mut out = Vec::with_capacity(64 + items.iter().map(|o| o.json.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut out, &kind).map_err(internal)?;
    out.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut out, &api_version).map_err(internal)?;
    out.extend_from_slice(b",\"metadata\":{},\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.json.as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(out)
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
        match Query::parse(request.uri().query().unwrap_or_default()) {
            Ok(query) => caches.list(&resource, &query).await,
            Err(e) => Err(e),
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
    fn a_cached_object_keeps_its_json_and_names_its_kind() {
        let item = r#"{"metadata":{"name":"web-1","namespace":"shop","labels":{"app":"web"},"resourceVersion":"7"},"spec":{"nodeName":"n1","unknownField":[1,2]}}"#;
        let cached: Cached<Pod> = serde_json::from_str(item).unwrap();
        assert_eq!(cached.meta.name.as_deref(), Some("web-1"));
        assert_eq!(cached.labels().get("app").map(String::as_str), Some("web"));
        let back: serde_json::Value = serde_json::from_str(&cached.json).unwrap();
        assert_eq!(back["kind"], "Pod");
        assert_eq!(back["apiVersion"], "v1");
        // Fields the typed Pod does not know survive: the cache returns what the server sent.
        assert_eq!(back["spec"]["unknownField"], serde_json::json!([1, 2]));
        assert_eq!(back["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn queries_say_what_is_wrong_with_them() {
        let q = Query::parse("namespace=load-1&labelSelector=app%3Dweb%2Ctier%21%3Ddb").unwrap();
        assert_eq!(q.namespace.as_deref(), Some("load-1"));
        assert!(q.selector.is_some());
        let e = Query::parse("labelSelectr=app").unwrap_err().to_string();
        assert!(e.contains("labelSelectr"), "{e}");
        let e = Query::parse("labelSelector=a%3D%3D%3Db")
            .unwrap_err()
            .to_string();
        assert!(e.contains("labelSelector"), "{e}");
    }
}
