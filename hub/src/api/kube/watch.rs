//! A watch as Kubernetes streams it (`application/json;stream=watch`): one JSON event per
//! line, `{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": …}`; the object a
//! Table row when the client asked for Tables (`kubectl get -w`). An object that stops
//! matching the selectors is `DELETED` for this watch, one that starts matching `ADDED`.

use std::{collections::HashSet, time::Duration};

use axum::{
    body::Body,
    http::header,
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

use super::table::{Include, table};
use crate::{
    api::{Api, ApiError, FieldSelector, allow, present},
    auth::{Principal, Verb},
    model::Kind,
    store::{EventType, LabelSelector, WatchStream},
};

/// How often a watch that asked for bookmarks is told the revision it has seen up to.
const BOOKMARK_EVERY: Duration = Duration::from_secs(15);

/// A watch that ends by its `timeoutSeconds` gets a last bookmark this long before, as
/// kube-apiserver sends one, so the client watches again from as near now as it can.
const BOOKMARK_BEFORE_END: Duration = Duration::from_secs(2);

pub(super) struct Options {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub from: Option<u64>,
    pub bookmarks: bool,
    /// Seconds after which the watch ends (the client watches again from where it was).
    pub timeout: Option<u64>,
    /// Tables, with what each row carries, when asked for.
    pub table: Option<Include>,
}

fn line(event: &Value) -> Bytes {
    let mut text = event.to_string();
    text.push('\n');
    Bytes::from(text)
}

pub(super) async fn serve(
    api: Api,
    principal: Principal,
    kind: Kind,
    options: Options,
) -> Result<Response, ApiError> {
    let held = api.streams.open(&principal.user)?;
    // A bookmark says the client has every change up to its revision: before any event, that
    // is the revision the watch starts from (read before it opens, so nothing is skipped).
    let start = match options.from {
        Some(from) => from,
        None => api.store.revision().await?,
    };
    let events = api.store.watch(Some(kind.name()), options.from).await?;
    struct State {
        events: WatchStream,
        ticks: tokio::time::Interval,
        deadline: Option<tokio::time::Instant>,
        /// The names this watch has shown as present (so a change out of the selectors is
        /// its deletion here).
        shown: HashSet<String>,
        /// Objects changed after the revision the watch starts from: whether the client's
        /// list had them is unknown until their first change here, which is a modification
        /// (or a deletion) of what it listed unless it is a creation.
        unsettled: HashSet<String>,
        /// When a watch with a deadline gets its last bookmark; `None` once sent.
        last_bookmark: Option<tokio::time::Instant>,
        revision: u64,
        columns_sent: bool,
        done: bool,
        _held: crate::auth::streams::StreamGuard,
    }
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = options
        .timeout
        .filter(|t| *t > 0)
        .map(|t| tokio::time::Instant::now() + Duration::from_secs(t));
    let state = State {
        events,
        ticks,
        deadline,
        shown: HashSet::new(),
        unsettled: HashSet::new(),
        last_bookmark: deadline
            .and_then(|d| d.checked_sub(BOOKMARK_BEFORE_END))
            .filter(|at| *at > tokio::time::Instant::now()),
        revision: start,
        columns_sent: false,
        done: false,
        _held: held,
    };
    let Options {
        labels,
        fields,
        from,
        bookmarks,
        table: as_table,
        ..
    } = options;
    // Objects present when the watch starts from a revision were listed by the client.
    let mut state = state;
    if let Some(from) = from {
        let (objects, _) = api
            .store
            .list(kind.name(), &LabelSelector::default())
            .await?;
        for o in objects {
            if o.revision() > from {
                state.unsettled.insert(o.metadata.name);
            } else if labels.matches(&o.metadata.labels)
                && fields.matches(&o.metadata.name)
                && allow(&principal, Verb::Watch, kind, &o).is_ok()
            {
                state.shown.insert(o.metadata.name);
            }
        }
    }
    let body = futures::stream::unfold(state, move |mut s| {
        let principal = principal.clone();
        let labels = labels.clone();
        let fields = fields.clone();
        async move {
            if s.done {
                return None;
            }
            let deadline = s.deadline;
            let last_bookmark = s.last_bookmark.filter(|_| bookmarks);
            loop {
                tokio::select! {
                    // Events already waiting go out before a bookmark that would claim them.
                    biased;
                    next = s.events.next() => match next {
                        None => return None,
                        Some(Ok(event)) => {
                            let object = event.object;
                            s.revision = s.revision.max(object.revision());
                            let name = object.metadata.name.clone();
                            let matches = labels.matches(&object.metadata.labels)
                                && fields.matches(&name)
                                && allow(&principal, Verb::Watch, kind, &object).is_ok();
                            let unsettled = s.unsettled.remove(&name);
                            let was_shown = s.shown.contains(&name)
                                || (unsettled && event.kind != EventType::Added);
                            let kind_of_event = match (event.kind, matches, was_shown) {
                                // Gone: said to whoever saw it or could have (it may have
                                // changed after the client's list and before it went).
                                (EventType::Deleted, m, shown) if m || shown => "DELETED",
                                (EventType::Deleted, ..) => continue,
                                (_, true, true) => "MODIFIED",
                                (_, true, false) => "ADDED",
                                (_, false, true) => "DELETED",
                                (_, false, false) => continue,
                            };
                            if kind_of_event == "DELETED" {
                                s.shown.remove(&name);
                            } else {
                                s.shown.insert(name);
                            }
                            let shown = present(kind, object);
                            let shown = match as_table {
                                Some(include) => {
                                    let metadata = json!({"resourceVersion": shown["metadata"]["resourceVersion"]});
                                    let with_columns = !s.columns_sent;
                                    s.columns_sent = true;
                                    table(kind, vec![shown], metadata, include, with_columns)
                                }
                                None => shown,
                            };
                            let event = json!({"type": kind_of_event, "object": shown});
                            return Some((Ok::<_, std::convert::Infallible>(line(&event)), s));
                        }
                        Some(Err(e)) => {
                            s.done = true;
                            let status = ApiError::from(e).body();
                            return Some((Ok(line(&json!({"type": "ERROR", "object": status}))), s));
                        }
                    },
                    () = sleep_until(deadline) => return None,
                    () = sleep_until(last_bookmark), if last_bookmark.is_some() => {
                        s.last_bookmark = None;
                        return Some((Ok(bookmark(kind, s.revision)), s));
                    }
                    _ = s.ticks.tick(), if bookmarks => {
                        return Some((Ok(bookmark(kind, s.revision)), s));
                    }
                }
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/json;stream=watch"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// A `BOOKMARK` event: the client has seen every change to `kind` up to `revision`.
fn bookmark(kind: Kind, revision: u64) -> Bytes {
    line(&json!({"type": "BOOKMARK", "object": {
        "kind": kind.name(),
        "apiVersion": crate::api::API_VERSION,
        "metadata": {"resourceVersion": revision.to_string()},
    }}))
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
