//! Watches over Server-Sent Events: `GET /v1/{plural}?watch=true[&resourceVersion=N]`. Each
//! change is one event whose name is its type (`ADDED`, `MODIFIED`, `DELETED`) and whose data
//! is `{"type", "object"}`; a watch that falls too far behind ends with an `ERROR` event
//! carrying a 410 Status, after which the client lists again.

use std::time::Duration;

use axum::{
    body::Body,
    http::header,
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;

use super::{Api, ApiError, allow, present};
use crate::{
    auth::{Principal, Verb},
    model::Kind,
    store::{LabelSelector, WatchStream},
};

/// A comment line every so often keeps proxies from closing an idle watch and tells the hub
/// when the client has gone.
const KEEPALIVE: Duration = Duration::from_secs(15);

fn frame(event: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

pub(super) async fn serve(
    api: Api,
    principal: Principal,
    kind: Kind,
    selector: LabelSelector,
    from: Option<u64>,
) -> Result<Response, ApiError> {
    let held = api.streams.open(&principal.user)?;
    let events = api.store.watch(Some(kind.name()), from).await?;
    struct State {
        events: WatchStream,
        ticks: tokio::time::Interval,
        done: bool,
        /// Counted against the user's streams while the watch lasts.
        _held: crate::auth::streams::StreamGuard,
    }
    let mut ticks = tokio::time::interval(KEEPALIVE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let state = State {
        events,
        ticks,
        done: false,
        _held: held,
    };
    let body = futures::stream::unfold(state, move |mut s| {
        let principal = principal.clone();
        let selector = selector.clone();
        async move {
            if s.done {
                return None;
            }
            loop {
                tokio::select! {
                    next = s.events.next() => match next {
                        None => return None,
                        Some(Ok(event)) => {
                            let object = &event.object;
                            if !selector.matches(&object.metadata.labels)
                                || allow(&principal, Verb::Watch, kind, object).is_err()
                            {
                                continue;
                            }
                            let name = serde_json::to_value(event.kind).unwrap_or_default();
                            let name = name.as_str().unwrap_or("MODIFIED").to_owned();
                            let data = json!({"type": name, "object": present(kind, event.object)});
                            return Some((Ok::<_, std::convert::Infallible>(frame(&name, &data)), s));
                        }
                        Some(Err(e)) => {
                            s.done = true;
                            let status = ApiError::from(e).body();
                            let data = json!({"type": "ERROR", "object": status});
                            return Some((Ok(frame("ERROR", &data)), s));
                        }
                    },
                    _ = s.ticks.tick() => return Some((Ok(Bytes::from_static(b": keepalive\n\n")), s)),
                }
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}
