//! The operator dashboard at `/`: pages rendered here as HTML, with one small hand-written
//! script and stylesheet compiled into the binary (no Node build step). The pages read the
//! store with the caller's rights, exactly as the API does; everything they change goes through
//! the API (`/v1/…`) from the script, so the dashboard can do nothing the API would refuse.
//!
//! Live: the script follows the API's watch of the listed kind (server-sent events) and, on a
//! change, fetches this page's rows again, rendered here; so rows are drawn in one place.
//!
//! A caller without a session is sent to `/login`.

use std::fmt::Write as _;

use axum::{
    Router,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    api::{Api, ApiError, allow, present},
    auth::{Principal, Verb},
    model::Kind,
    store::LabelSelector,
};

const CSS: &str = include_str!("app.css");
const JS: &str = include_str!("app.js");

pub fn router(api: Api) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/clusters") }))
        .route("/login", get(login))
        .route("/clusters", get(clusters))
        .route("/clusters/new", get(new_cluster))
        .route("/assets/app.css", get(|| async { asset("text/css", CSS) }))
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript", JS) }),
        )
        .route("/clusters/{name}", get(cluster))
        .with_state(api)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The caller, or the way to the login page (coming back here afterwards).
async fn caller(api: &Api, headers: &HeaderMap, here: &str) -> Result<Principal, Response> {
    match api.principal(headers).await {
        Ok(principal) => Ok(principal),
        Err(e) if e.code == StatusCode::UNAUTHORIZED => {
            let next: String = form_urlencoded::byte_serialize(here.as_bytes()).collect();
            Err(Redirect::to(&format!("/login?next={next}")).into_response())
        }
        Err(e) => Err(e.into_response()),
    }
}

/// A whole page: the header with navigation, then `content`.
fn page(title: &str, principal: Option<&Principal>, name: &str, content: &str) -> Response {
    let mut nav = String::new();
    if let Some(p) = principal {
        let _ = write!(
            nav,
            r#"<nav aria-label="Main"><a href="/clusters"{}>Clusters</a></nav>
<span class="who" title="Signed in as {user}">{user}{admin}</span>
<button type="button" class="quiet" id="logout">Log out</button>"#,
            if name == "clusters" {
                r#" aria-current="page""#
            } else {
                ""
            },
            user = escape(&p.user),
            admin = if p.admin { " (admin)" } else { "" },
        );
    }
    let html = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Drover</title>
<link rel="stylesheet" href="/assets/app.css">
<script src="/assets/app.js" defer></script>
</head>
<body data-page="{name}">
<header class="top"><a class="brand" href="/clusters">Drover</a>{nav}</header>
<main id="main">
{content}
</main>
</body>
</html>
"#,
        title = escape(title),
    );
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: Option<String>,
}

async fn login(Query(query): Query<LoginQuery>) -> Response {
    // Only a path on this hub: never an address elsewhere.
    let next = query
        .next
        .filter(|n| n.starts_with('/') && !n.starts_with("//"))
        .unwrap_or_else(|| "/clusters".into());
    let content = format!(
        r#"<section class="card narrow">
<h1>Log in</h1>
<form id="login" data-next="{next}">
<label for="username">User name</label>
<input id="username" name="username" autocomplete="username" required>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<p class="error" role="alert" id="login-error"></p>
<button type="submit">Log in</button>
</form>
</section>"#,
        next = escape(&next)
    );
    page("Log in", None, "login", &content)
}

/// A cluster as a table row of the clusters page.
fn cluster_row(object: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let name = text(&object["metadata"]["name"]);
    let state = text(&object["state"]["state"]);
    let message = text(&object["state"]["message"]);
    let spec = &object["spec"];
    let status = &object["status"];
    let kind = match text(&spec["type"]).as_str() {
        "custom" => format!(
            "{} {}",
            text(&spec["distribution"]).to_uppercase(),
            text(&spec["version"])
        ),
        _ => "imported".to_owned(),
    };
    let version = text(&status["kubernetesVersion"]);
    let nodes = match (
        status["nodes"]["ready"].as_u64(),
        status["nodes"]["total"].as_u64(),
    ) {
        (Some(ready), Some(total)) => format!("{ready}/{total}"),
        _ => "–".to_owned(),
    };
    let capacity = match (
        status["capacity"]["cpuMillicores"].as_u64(),
        status["capacity"]["memoryBytes"].as_u64(),
    ) {
        (Some(cpu), Some(memory)) => format!(
            "{} CPU, {:.1} GiB",
            cpu / 1000,
            memory as f64 / (1u64 << 30) as f64
        ),
        _ => "–".to_owned(),
    };
    let created = text(&object["metadata"]["creationTimestamp"]);
    format!(
        r#"<tr data-name="{name}" data-state="{state}">
<td data-label="Name"><a href="/clusters/{name}">{name}</a></td>
<td data-label="State"><span class="badge state-{state}">{state}</span> <span class="message">{message}</span></td>
<td data-label="Type">{kind}</td>
<td data-label="Kubernetes">{version}</td>
<td data-label="Nodes ready">{nodes}</td>
<td data-label="Capacity">{capacity}</td>
<td data-label="Age"><time datetime="{created}">{created}</time></td>
</tr>"#,
        name = escape(&name),
        state = escape(&state),
        message = escape(&message),
        kind = escape(&kind),
        version = escape(if version.is_empty() { "–" } else { &version }),
        created = escape(&created),
    )
}

#[derive(Debug, Deserialize)]
struct RowsQuery {
    /// `rows`: only the table's body, for the script's live updates.
    #[serde(default)]
    part: Option<String>,
}

async fn clusters(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(query): Query<RowsQuery>,
) -> Response {
    let principal = match caller(&api, &headers, "/clusters").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let objects = match api
        .store
        .list(Kind::Cluster.name(), &LabelSelector::everything())
        .await
    {
        Ok((objects, _)) => objects,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let rows: String = objects
        .into_iter()
        .filter(|o| allow(&principal, Verb::Get, Kind::Cluster, o).is_ok())
        .map(|o| cluster_row(&present(Kind::Cluster, o)))
        .collect();
    if query.part.as_deref() == Some("rows") {
        return (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            rows,
        )
            .into_response();
    }
    let create = if principal.admin {
        r#"<a class="button" href="/clusters/new">Create cluster</a>"#
    } else {
        ""
    };
    let empty = if rows.is_empty() {
        r#"<p class="empty" id="no-clusters">No clusters yet.</p>"#
    } else {
        ""
    };
    let content = format!(
        r#"<div class="bar">
<h1>Clusters</h1>
<label class="filter">Filter <input id="filter" type="search" placeholder="name or state"></label>
{create}
</div>
<table class="list" id="clusters" data-watch="/v1/clusters?watch=true" data-rows="/clusters?part=rows">
<thead><tr>
<th scope="col"><button type="button" class="sort" data-sort="0">Name</button></th>
<th scope="col"><button type="button" class="sort" data-sort="1">State</button></th>
<th scope="col">Type</th>
<th scope="col">Kubernetes</th>
<th scope="col">Nodes ready</th>
<th scope="col">Capacity</th>
<th scope="col"><button type="button" class="sort" data-sort="6">Age</button></th>
</tr></thead>
<tbody>{rows}</tbody>
</table>
{empty}"#
    );
    page("Clusters", Some(&principal), "clusters", &content)
}

async fn new_cluster(State(api): State<Api>, headers: HeaderMap) -> Response {
    let principal = match caller(&api, &headers, "/clusters/new").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    if !principal.admin {
        return page(
            "Create cluster",
            Some(&principal),
            "clusters",
            r#"<section class="card"><h1>Create cluster</h1><p>Only admins create clusters.</p></section>"#,
        );
    }
    let content = r#"<section class="card">
<h1>Create cluster</h1>
<form id="create-cluster">
<label for="name">Name</label>
<input id="name" name="name" required pattern="[a-z0-9]([-a-z0-9]*[a-z0-9])?" maxlength="63" aria-describedby="name-help">
<p class="help" id="name-help">Lower-case letters, digits and '-'.</p>
<fieldset>
<legend>Type</legend>
<label><input type="radio" name="type" value="imported" checked> Import an existing cluster</label>
<label><input type="radio" name="type" value="custom"> Install K3s or RKE2 on my hosts</label>
</fieldset>
<div id="custom-fields" hidden>
<label for="distribution">Distribution</label>
<select id="distribution" name="distribution"><option value="k3s">K3s</option><option value="rke2">RKE2</option></select>
<label for="version">Version</label>
<input id="version" name="version" value="v1.33.4+k3s1">
<label for="cp-concurrency">Control planes upgraded at once</label>
<input id="cp-concurrency" name="controlPlaneConcurrency" value="1">
<label for="worker-concurrency">Workers upgraded at once</label>
<input id="worker-concurrency" name="workerConcurrency" value="10%">
</div>
<p class="error" role="alert" id="create-error"></p>
<button type="submit">Create</button>
</form>
<div id="created" hidden>
<h2>Register it</h2>
<p id="created-help"></p>
<div class="command"><code id="command"></code><button type="button" class="copy" data-copy="command" aria-label="Copy the command">Copy</button></div>
<p><a id="created-link" href="/clusters">See the cluster</a></p>
</div>
</section>"#;
    page("Create cluster", Some(&principal), "clusters", content)
}

async fn cluster(State(api): State<Api>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let here = format!("/clusters/{name}");
    let principal = match caller(&api, &headers, &here).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let object = match api.store.get(Kind::Cluster.name(), &name).await {
        Ok(o) => o,
        Err(e) => return ApiError::from(e).into_response(),
    };
    if let Err(e) = allow(&principal, Verb::Get, Kind::Cluster, &object) {
        return e.into_response();
    }
    let shown = present(Kind::Cluster, object);
    let mut conditions = String::new();
    for c in shown["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let text = |k: &str| escape(c[k].as_str().unwrap_or_default());
        let _ = write!(
            conditions,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            text("type"),
            text("status"),
            text("reason"),
            text("message")
        );
    }
    let content = format!(
        r#"<div class="bar"><h1>{name}</h1></div>
<table class="list" id="cluster" data-watch="/v1/clusters?watch=true" data-rows="/clusters?part=rows"><tbody>{row}</tbody></table>
<h2>Conditions</h2>
<table class="list"><thead><tr><th scope="col">Condition</th><th scope="col">Status</th><th scope="col">Reason</th><th scope="col">Message</th></tr></thead><tbody>{conditions}</tbody></table>"#,
        name = escape(&name),
        row = cluster_row(&shown),
    );
    page(&name, Some(&principal), "cluster", &content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn a_row_shows_state_nodes_and_escapes_what_it_shows() {
        let row = cluster_row(&serde_json::json!({
            "metadata": {"name": "prod", "creationTimestamp": "2026-11-23T10:00:00Z"},
            "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"},
            "status": {"nodes": {"ready": 2, "total": 3}, "kubernetesVersion": "v1.33.4+k3s1"},
            "state": {"state": "unavailable", "message": "NodesReady: <2 of 3>"},
        }));
        assert!(row.contains(r#"data-state="unavailable""#), "{row}");
        assert!(row.contains("2/3"), "{row}");
        assert!(row.contains("K3S v1.33.4+k3s1"), "{row}");
        assert!(row.contains("&lt;2 of 3&gt;"), "{row}");
    }
}
