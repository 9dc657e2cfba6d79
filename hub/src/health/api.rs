//! Health over the API:
//! - `GET /v1/hosts/{host}/usage`: a system-agent host's facts, latest usage and the last 24 h
//!   at one-minute resolution;
//! - `GET /v1/clusters/{cluster}/nodes`: the cluster's nodes as its node-agents report them;
//! - `GET /v1/clusters/{cluster}/nodes/{node}/usage`: one node's, as for a host;
//! - `GET /v1/events[?cluster=&host=&node=&since=SEQ][&watch=true]`: recent events, oldest
//!   first; with `watch=true`, those and then each new one as a Server-Sent Event.
//!
//! Whoever may read a cluster may read its hosts', nodes' and events.

use std::{sync::Arc, time::Duration};

use axum::{
    Json,
    body::Body,
    extract::{Path, Query, State},
    http::{HeaderMap, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::{Event, Health};
use crate::{
    api::{error::ApiError, state::Api},
    auth::Principal,
    model::Kind,
};

#[derive(Clone, Debug)]
pub struct HealthApi {
    pub api: Api,
    pub health: Arc<Health>,
}

async fn readable(api: &Api, headers: &HeaderMap, kind: Kind, name: &str) -> Result<(), ApiError> {
    let principal = api.principal(headers).await?;
    crate::api::readable(api, &principal, kind, name)
        .await
        .map(drop)
}

pub async fn host_usage(
    State(state): State<HealthApi>,
    Path(host): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    readable(&state.api, &headers, Kind::Host, &host).await?;
    state
        .health
        .usage(&format!("host/{host}"))
        .await
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "host {host:?} has sent no heartbeat since the hub started; is its system-agent running?"
            ))
        })
}

pub async fn nodes(
    State(state): State<HealthApi>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    readable(&state.api, &headers, Kind::Cluster, &cluster).await?;
    Ok(Json(json!({"items": state.health.nodes(&cluster)})))
}

pub async fn node_usage(
    State(state): State<HealthApi>,
    Path((cluster, node)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    readable(&state.api, &headers, Kind::Cluster, &cluster).await?;
    state
        .health
        .usage(&format!("node/{cluster}/{node}"))
        .await
        .map(Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no node-agent of cluster {cluster:?} runs on node {node:?}"
            ))
        })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    since: Option<u64>,
    #[serde(default)]
    watch: Option<bool>,
}

impl EventQuery {
    fn keeps(&self, principal: &Principal, e: &Event) -> bool {
        (principal.admin || !principal.on_cluster(&e.cluster).is_empty())
            && self.cluster.as_ref().is_none_or(|c| *c == e.cluster)
            && self.host.as_ref().is_none_or(|h| *h == e.host)
            && self.node.as_ref().is_none_or(|n| *n == e.node)
    }
}

fn frame(event: &Event) -> Bytes {
    let data = serde_json::to_string(event).unwrap_or_default();
    Bytes::from(format!("event: EVENT\nid: {}\ndata: {data}\n\n", event.seq))
}

pub async fn events(
    State(state): State<HealthApi>,
    headers: HeaderMap,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{e}; the parameters are cluster, host, node, since (an event's seq) and watch"
        ))
    })?;
    let principal = state.api.principal(&headers).await?;
    if !query.watch.unwrap_or(false) {
        let items = state
            .health
            .events
            .query(query.since.unwrap_or(0), |e| query.keeps(&principal, e));
        return Ok(Json(json!({"items": items})).into_response());
    }
    // Counted against the user's streams for as long as the body lives.
    let held = state.api.streams.open(&principal.user)?;
    // Following first, so nothing recorded between the query and the follow is missed.
    let follower = state.health.events.follow();
    let backlog = state
        .health
        .events
        .query(query.since.unwrap_or(0), |e| query.keeps(&principal, e));
    let last = backlog.last().map_or(query.since.unwrap_or(0), |e| e.seq);
    let start = futures::stream::iter(
        backlog
            .iter()
            .map(|e| Ok::<_, std::convert::Infallible>(frame(e)))
            .collect::<Vec<_>>(),
    );
    let mut ticks = tokio::time::interval(Duration::from_secs(15));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let live = futures::stream::unfold(
        (follower, ticks, last, false),
        move |(mut follower, mut ticks, last, done)| {
            let principal = principal.clone();
            let query = EventQuery {
                cluster: query.cluster.clone(),
                host: query.host.clone(),
                node: query.node.clone(),
                since: None,
                watch: None,
            };
            async move {
                if done {
                    return None;
                }
                loop {
                    tokio::select! {
                        next = follower.recv() => match next {
                            Ok(e) if e.seq > last && query.keeps(&principal, &e) => {
                                let seq = e.seq;
                                return Some((Ok(frame(&e)), (follower, ticks, seq, false)));
                            }
                            Ok(_) => {}
                            // Too slow a reader: say so, and end; it asks again with since=.
                            Err(RecvError::Lagged(_)) => {
                                let text = format!("event: ERROR\ndata: {}\n\n", json!({"message": format!("fell behind; query again with since={last}")}));
                                return Some((Ok(Bytes::from(text)), (follower, ticks, last, true)));
                            }
                            Err(RecvError::Closed) => return None,
                        },
                        _ = ticks.tick() => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), (follower, ticks, last, false))),
                    }
                }
            }
        },
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(futures::StreamExt::map(
            futures::StreamExt::chain(start, live),
            move |frame| {
                let _ = &held;
                frame
            },
        )),
    )
        .into_response())
}
