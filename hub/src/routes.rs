//! The hub's whole HTTP surface in one place: every path, the handler that answers it and the
//! state it is given, and the layers every answer passes (security headers, request counts).

use std::sync::Arc;

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use tunnel::{Acceptor, Registry};

use crate::{
    agents, api, dashboard, health, metrics, model, proxy, registration, replicas, store, websec,
};

/// What the routes are served from.
#[derive(Debug)]
pub(crate) struct Parts {
    pub api: api::state::Api,
    pub health: Arc<health::Health>,
    /// The agents' tunnel.
    pub acceptor: Acceptor,
    pub registry: Registry,
    pub replicas: Arc<replicas::Replicas>,
    /// The client credentials replicas present to each other (`None`: no replicas).
    pub peers: Option<Arc<rustls::ClientConfig>>,
    pub ca_pem: Arc<str>,
    pub downloads: registration::Downloads,
}

/// Every route of the hub.
pub(crate) fn router(parts: Parts) -> Front {
    let Parts {
        api,
        health,
        acceptor,
        registry,
        replicas,
        peers,
        ca_pem,
        downloads,
    } = parts;
    let agent_binaries = downloads;
    // Shared, not cloned per request: the proxy's hot path.
    let proxy_state = Arc::new(proxy::ProxyState {
        api: api.clone(),
        registry: registry.clone(),
        pools: proxy::Pools::default(),
        replicas: replicas.clone(),
        peers,
    });
    let app = plain(AppState {
        ca_pem,
        acceptor,
        health: health.clone(),
        replicas: replicas.clone(),
    })
    .merge(api::router(api.clone()))
    .merge(api::kube::router(api.clone()))
    .merge(dashboard::router(dashboard::Dash {
        api: api.clone(),
        health: health.clone(),
    }))
    .merge(
        Router::new()
            .route("/v3/register", axum::routing::post(agents::register))
            .route("/v3/import/{file}", get(registration::import_manifest))
            .with_state(api.clone()),
    )
    .merge(
        Router::new()
            .route("/v1/events", get(health::api::events))
            .route("/v1/hosts/{host}/usage", get(health::api::host_usage))
            .route("/v1/clusters/{cluster}/nodes", get(health::api::nodes))
            .route(
                "/v1/clusters/{cluster}/nodes/{node}/usage",
                get(health::api::node_usage),
            )
            .with_state(health::api::HealthApi {
                api: api.clone(),
                health: health.clone(),
            }),
    )
    .merge(
        Router::new()
            .route(
                "/system-agent-install.sh",
                get(registration::install_script),
            )
            .route(
                "/v3/system-agent/{arch}",
                get(registration::system_agent_binary),
            )
            .route(
                "/v3/artifacts/{version}/{file}",
                get(registration::artifact),
            )
            .with_state(agent_binaries),
    )
    .merge(
        Router::new()
            .route(PROXY_ROUTE, any(proxy::handle))
            .route(
                "/v3/relay/{kind}/{cluster}/{service}/{*rest}",
                any(proxy::relay),
            )
            .route("/v1/clusters/{cluster}/cache/{resource}", get(proxy::cache))
            .route("/v1/clusters/{cluster}/overview", get(proxy::overview))
            .route(
                "/v1/clusters/{cluster}/nodes/{node}/drain",
                axum::routing::post(proxy::drain),
            )
            .with_state(proxy_state.clone()),
    );
    let edge = Edge {
        audit: api.audit.clone(),
        proxy: proxy_state,
    };
    Front {
        router: app.layer(axum::middleware::from_fn_with_state(edge.clone(), routed)),
        edge,
    }
}

/// The authentication proxy's route.
const PROXY_ROUTE: &str = "/k8s/clusters/{cluster}/{*rest}";

/// The hub's HTTP service: the router, but with the authentication proxy's requests sent to
/// the proxy directly. Those are most of what the hub answers, and the router's match (and the
/// parameters it copies out of every path) cost their hot path more than they tell it.
#[derive(Clone, Debug)]
pub(crate) struct Front {
    router: Router,
    edge: Edge,
}

impl<B> tower::Service<http::Request<B>> for Front
where
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The router is always ready, and so is the proxy.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let request = request.map(Body::new);
        if !proxied(request.uri().path()) {
            return Box::pin(tower::Service::call(&mut self.router, request));
        }
        let Edge { audit, proxy } = self.edge.clone();
        Box::pin(async move {
            Ok(edge(&audit, request, Some(PROXY_ROUTE), |request| {
                proxy::handle(State(proxy), request)
            })
            .await)
        })
    }
}

/// Whether the router would send `path` to [`PROXY_ROUTE`]: a cluster segment and something
/// after it.
fn proxied(path: &str) -> bool {
    path.strip_prefix("/k8s/clusters/")
        .and_then(|after| after.split_once('/'))
        .is_some_and(|(cluster, rest)| !cluster.is_empty() && !rest.is_empty())
}

/// What [`edge`] needs: the audit log, and the proxy's state for the requests [`Front`] sends
/// to the proxy itself.
#[derive(Clone, Debug)]
struct Edge {
    audit: Arc<crate::audit::Audit>,
    proxy: Arc<proxy::ProxyState>,
}

/// [`edge`] as the router's one layer, for every request it routes.
async fn routed(
    State(Edge { audit, .. }): State<Edge>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .cloned();
    edge(
        &audit,
        request,
        route.as_ref().map(axum::extract::MatchedPath::as_str),
        |request| next.run(request),
    )
    .await
}

/// What every request passes through, as one step (each layer boxes the request's whole
/// future again, and the proxy's path is hot): a cookie-authenticated write from another site
/// is refused; the rest is audited and answered by `next`, its answer recorded; every answer
/// gets the browser's security headers and is counted by `route`.
async fn edge<F, A>(
    audit: &crate::audit::Audit,
    request: axum::extract::Request,
    route: Option<&str>,
    next: F,
) -> Response
where
    F: FnOnce(axum::extract::Request) -> A,
    A: std::future::Future<Output = Response>,
{
    let mut response = match websec::refusal(&request) {
        Some(refused) => refused,
        None => crate::audit::around(audit, request, next).await,
    };
    websec::secure(&mut response);
    metrics::count(route, response.status().as_u16());
    response
}

/// What request handlers share.
#[derive(Clone, Debug)]
struct AppState {
    ca_pem: Arc<str>,
    acceptor: Acceptor,
    health: Arc<health::Health>,
    replicas: Arc<replicas::Replicas>,
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    let mut plan_states = std::collections::BTreeMap::new();
    let agent_states = state.health.agent_states();
    if let Ok((plans, _)) = state
        .health
        .store()
        .list(
            model::Kind::Plan.name(),
            &store::LabelSelector::everything(),
        )
        .await
    {
        for plan in plans {
            let state = plan.status["state"].as_str().filter(|s| !s.is_empty());
            *plan_states
                .entry(state.unwrap_or("pending").to_owned())
                .or_insert(0) += 1;
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(&metrics::Scrape {
            registry: state.acceptor.registry(),
            agent_states,
            plan_states,
            leader: state.replicas.leading().borrow().is_some(),
        }),
    )
        .into_response()
}

/// The routes that are the hub's own, not an API's: health, the CA, the agents' tunnel,
/// metrics.
fn plain(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/cacerts", get(cacerts))
        .route("/v3/connect", any(connect))
        .route("/metrics", get(metrics_text))
        .with_state(state)
}

/// How long the store has to answer before the hub says it is not ready.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Ready when the store answers: a load balancer in front of replicas then sends requests only
/// to one that can serve them (an etcd hub whose etcd is down, or SQLite that cannot be read,
/// is alive but not ready). 503 says why.
async fn readyz(State(state): State<AppState>) -> Response {
    let reason = match tokio::time::timeout(READY_WITHIN, state.health.store().revision()).await {
        Ok(Ok(_)) => return "ok\n".into_response(),
        Ok(Err(e)) => format!("the store does not answer ({e})"),
        Err(_) => format!(
            "the store did not answer within {} s",
            READY_WITHIN.as_secs()
        ),
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {reason}\n"),
    )
        .into_response()
}

async fn cacerts(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/x-pem-file")],
        state.ca_pem.to_string(),
    )
        .into_response()
}

async fn connect(State(state): State<AppState>, request: Request) -> Response {
    state.acceptor.handle(request).await.map(Body::new)
}

#[cfg(test)]
mod tests;
