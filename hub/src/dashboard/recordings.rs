//! Shell recordings: the sessions recorded through the hub (`/recordings`), and one replayed
//! in a terminal (`/recordings/{id}`), for admins or a global role that allows
//! `get recordings`. The replay page's script (`replay.js`) reads the asciicast from the API.

use std::fmt::Write as _;

use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::Response,
};

use super::{Dash, caller, error_page, escape, explorer, page, page_with};
use crate::{api::ApiError, auth::Principal, recording::Session};

pub(super) const JS: &str = include_str!("replay.js");

async fn reader(dash: &Dash, headers: &HeaderMap, here: &str) -> Result<Principal, Response> {
    let principal = caller(&dash.api, headers, here).await?;
    if let Err(e) = crate::api::recordings::may_read(&principal) {
        return Err(error_page(&principal, &e));
    }
    Ok(principal)
}

fn duration(session: &Session) -> String {
    let parse = |t: &str| crate::model::parse_time(t);
    match (
        parse(&session.started_at),
        session.ended_at.as_deref().and_then(parse),
    ) {
        (Some(start), Some(end)) => {
            let seconds = (end - start).whole_seconds().max(0);
            format!("{}m {:02}s", seconds / 60, seconds % 60)
        }
        _ => "going on".to_owned(),
    }
}

fn row(session: &Session) -> String {
    let what = if session.not_recorded.is_empty() {
        format!(
            r#"<a href="/recordings/{id}">Replay</a>"#,
            id = escape(&session.id)
        )
    } else {
        format!(
            r#"<span class="message">{}</span>"#,
            escape(&session.not_recorded)
        )
    };
    format!(
        r#"<tr data-name="{id}"><td data-label="Started"><time datetime="{started}">{started}</time></td><td data-label="User">{user}</td><td data-label="Cluster">{cluster}</td><td data-label="Pod">{namespace}/{pod}</td><td data-label="Container">{container}</td><td data-label="Command"><code>{command}</code></td><td data-label="Length">{length}</td><td data-label="Size">{size}</td><td data-label="Input">{input}</td><td data-label="Recording">{what}</td></tr>"#,
        id = escape(&session.id),
        started = escape(&session.started_at),
        user = escape(&session.user),
        cluster = escape(&session.cluster),
        namespace = escape(&session.namespace),
        pod = escape(&session.pod),
        container = escape(&session.container),
        command = escape(&session.command.join(" ")),
        length = duration(session),
        size = if session.truncated {
            format!("{} B (stopped at its limit)", session.bytes)
        } else {
            format!("{} B", session.bytes)
        },
        input = if session.input_recorded {
            "recorded"
        } else {
            "not recorded"
        },
    )
}

pub(super) async fn list(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let principal = match reader(&dash, &headers, "/recordings").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let sessions = match dash.api.recordings.list().await {
        Ok(sessions) => sessions,
        Err(e) => {
            let e = ApiError::internal(format!("reading the recordings: {e}"));
            return error_page(&principal, &e);
        }
    };
    let rows: String = sessions.iter().map(row).collect();
    let empty = if sessions.is_empty() {
        r#"<p class="empty" id="no-rows">No shell sessions yet: every exec or attach through the hub (the dashboard's shell, kubectl exec) is recorded here.</p>"#
    } else {
        ""
    };
    let content = format!(
        r#"<div class="bar"><h1>Shell recordings</h1></div>
<p class="help">Every exec and attach through the hub, newest first: what the container wrote, and what was typed only when the setting <code>session-recording-input</code> is <code>on</code>.</p>
<div class="scroll"><table class="list" id="recordings">
<thead><tr><th scope="col">Started</th><th scope="col">User</th><th scope="col">Cluster</th><th scope="col">Pod</th><th scope="col">Container</th><th scope="col">Command</th><th scope="col">Length</th><th scope="col">Size</th><th scope="col">Input</th><th scope="col">Recording</th></tr></thead>
<tbody>{rows}</tbody>
</table></div>
{empty}"#
    );
    page("Shell recordings", Some(&principal), "recordings", &content)
}

pub(super) async fn one(
    State(dash): State<Dash>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let here = format!("/recordings/{id}");
    let principal = match reader(&dash, &headers, &here).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let session = match dash.api.recordings.get(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => {
            let e = ApiError::not_found(format!("no recording {id:?}"));
            return error_page(&principal, &e);
        }
        Err(e) => {
            let e = ApiError::internal(format!("reading the recordings: {e}"));
            return error_page(&principal, &e);
        }
    };
    let mut facts = String::new();
    for (term, value) in [
        ("User", session.user.clone()),
        ("Groups", session.groups.join(", ")),
        ("Cluster", session.cluster.clone()),
        ("Pod", format!("{}/{}", session.namespace, session.pod)),
        ("Container", session.container.clone()),
        ("Command", session.command.join(" ")),
        ("Started", session.started_at.clone()),
        (
            "Ended",
            session
                .ended_at
                .clone()
                .unwrap_or_else(|| "going on".into()),
        ),
        ("Audit record", session.audit_id.clone()),
        (
            "Input",
            if session.input_recorded {
                "recorded"
            } else {
                "not recorded"
            }
            .to_owned(),
        ),
    ] {
        let _ = write!(facts, "<dt>{term}</dt><dd>{}</dd>", escape(&value));
    }
    let (head, nonce) = explorer::terminal_head();
    let content = format!(
        r#"<nav class="crumbs" aria-label="Breadcrumb"><a href="/recordings">Shell recordings</a></nav>
<h1>Session {id}</h1>
<dl class="facts">{facts}</dl>
<div id="replay" data-id="{id}">
<form id="replay-options" class="filters" aria-label="Replay">
<div><label for="speed">Speed</label><select id="speed"><option value="1">1×</option><option value="2">2×</option><option value="4">4×</option><option value="0">all at once</option></select></div>
<div><button type="button" id="play">Play</button> <button type="button" id="pause" disabled>Pause</button> <a class="button" id="download" href="/v1/recordings/{id}/cast" download="{id}.cast">Download (asciicast)</a></div>
</form>
<p id="replay-status" role="status" aria-live="polite"></p>
<p class="error" role="alert" id="replay-error"></p>
<div id="terminal" class="terminal" aria-label="The session, replayed"></div>
</div>"#,
        id = escape(&session.id),
    );
    let response = page_with(
        "Shell recording",
        Some(&principal),
        "recordings",
        &content,
        &format!(
            r#"{head}
<script src="/assets/replay.js" defer></script>"#
        ),
    );
    explorer::with_style_nonce(response, &nonce)
}
