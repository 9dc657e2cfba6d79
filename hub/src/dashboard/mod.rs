//! The operator dashboard at `/`: pages rendered here as HTML, with one small hand-written
//! script and stylesheet compiled into the binary (no Node build step). The pages read the
//! store with the caller's rights, exactly as the API does; everything they change goes through
//! the API (`/v1/…`) from the script, so the dashboard can do nothing the API would refuse.
//!
//! Live: the script follows the API's watch of the listed kind (server-sent events) and, on a
//! change, fetches this page's rows again, rendered here; so rows are drawn in one place.
//!
//! A caller without a session is sent to `/login`.

use std::{fmt::Write as _, sync::Arc};

use axum::{
    Router,
    extract::Query,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::get,
};
use serde::Deserialize;

use crate::{api::state::Api, auth::Principal, health::Health};

mod charts;
mod clusters;
mod delivery;
mod device;
mod explorer;
mod fleet;
mod hosted;
mod machines;
mod overview;
mod people;
mod pools;
mod recordings;
mod roles;

const CSS: &str = include_str!("app.css");
const JS: &str = include_str!("app.js");
const FAVICON: &str = include_str!("favicon.svg");

/// What the pages read: the store through the API's rules, and the hub's health.
#[derive(Clone, Debug)]
pub struct Dash {
    pub api: Api,
    pub health: Arc<Health>,
}

pub fn router(dash: Dash) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/clusters") }))
        .route("/login", get(login).post(form_login))
        .route(
            crate::api::device::VERIFICATION_PATH,
            get(device::form).post(device::code),
        )
        .route(
            "/login/device/confirm",
            axum::routing::post(device::confirm),
        )
        .route("/assets/app.css", get(|| async { asset("text/css", CSS) }))
        // Linked from every page; `/favicon.ico` too, for what asks without reading the page.
        .route(
            "/assets/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON) }),
        )
        .route(
            "/favicon.ico",
            get(|| async { asset("image/svg+xml", FAVICON) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript", JS) }),
        )
        .route("/clusters", get(clusters::list))
        .route("/clusters/new", get(clusters::create))
        .route("/clusters/{name}", get(clusters::one))
        .route("/clusters/{name}/machines", get(clusters::machines))
        .route("/clusters/{name}/snapshots", get(clusters::snapshots))
        .route("/clusters/{name}/pools", get(pools::pools))
        .route("/clusters/{name}/pool-machines", get(pools::machines))
        .route("/clusters/{name}/hosted", get(hosted::rows))
        .route("/clusters/{name}/conditions", get(clusters::conditions))
        .route("/clusters/{name}/nodes/{node}", get(machines::node))
        .route("/clusters/{name}/explorer", get(overview::page))
        .route("/clusters/{name}/explorer/{resource}", get(explorer::list))
        .route(
            "/clusters/{name}/explorer/{resource}/{object}",
            get(explorer::cluster_object),
        )
        .route(
            "/clusters/{name}/explorer/{resource}/{namespace}/{object}",
            get(explorer::object),
        )
        .route(
            "/clusters/{name}/explorer/{resource}/{namespace}/{object}/{view}",
            get(explorer::pod_view),
        )
        .route(
            "/assets/explorer.js",
            get(|| async { asset("text/javascript", explorer::JS) }),
        )
        .route(
            "/assets/xterm/xterm.js",
            get(|| async { asset("text/javascript", explorer::XTERM_JS) }),
        )
        .route(
            "/assets/xterm/xterm.css",
            get(|| async { asset("text/css", explorer::XTERM_CSS) }),
        )
        .route(
            "/assets/xterm/addon-fit.js",
            get(|| async { asset("text/javascript", explorer::XTERM_FIT_JS) }),
        )
        .route("/hosts", get(machines::hosts))
        .route("/hosts/{name}", get(machines::host))
        .route("/users", get(people::users))
        .route("/roles", get(roles::roles))
        .route("/delivery", get(delivery::delivery))
        .route("/clusters/{name}/bundles", get(clusters::bundles))
        .route("/tokens", get(people::tokens))
        .route("/recordings", get(recordings::list))
        .route("/recordings/{id}", get(recordings::one))
        .route(
            "/assets/replay.js",
            get(|| async { asset("text/javascript", recordings::JS) }),
        )
        .with_state(dash)
}

/// A fragment of a page (rows for a live table), never cached.
fn fragment(html: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        html,
    )
        .into_response()
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

/// A JSON string's text; empty for anything else.
fn text(v: &serde_json::Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
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

/// The caller and object `name` of `kind`, if the caller may read it; otherwise the response
/// that says why. For a page (`here` is its path) a caller without a session is sent to log
/// in; for a fragment the API's error is the answer.
async fn readable(
    dash: &Dash,
    headers: &HeaderMap,
    kind: crate::model::Kind,
    name: &str,
    here: Option<&str>,
) -> Result<(Principal, crate::store::Object), Response> {
    let principal = match here {
        Some(here) => caller(&dash.api, headers, here).await?,
        None => dash
            .api
            .principal(headers)
            .await
            .map_err(IntoResponse::into_response)?,
    };
    let object = match crate::api::readable(&dash.api, &principal, kind, name).await {
        Ok(object) => object,
        Err(e) if here.is_some() => return Err(error_page(&principal, &e)),
        Err(e) => return Err(e.into_response()),
    };
    Ok((principal, object))
}

/// A page that says why another could not be shown (not found, not allowed, …), with the
/// API's status code and message, and the way back.
fn error_page(principal: &Principal, e: &crate::api::ApiError) -> Response {
    let title = match e.code {
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::FORBIDDEN => "Not allowed",
        _ => "Cannot show this page",
    };
    let content = format!(
        r#"<h1>{title}</h1>
<p class="error" role="alert">{}</p>
<p><a href="/clusters">Back to the clusters</a></p>"#,
        escape(&e.message)
    );
    let mut response = page(title, Some(principal), "", &content);
    *response.status_mut() = e.code;
    response
}

/// A whole page: the header with navigation, then `content`.
fn page(title: &str, principal: Option<&Principal>, name: &str, content: &str) -> Response {
    page_with(title, principal, name, content, "")
}

/// [`page`] with more of the hub's own assets in its head (`<script>` and `<link>` tags of
/// `/assets/…`: the CSP allows nothing else).
fn page_with(
    title: &str,
    principal: Option<&Principal>,
    name: &str,
    content: &str,
    head: &str,
) -> Response {
    let mut nav = String::new();
    if let Some(p) = principal {
        let mut links = vec![
            ("clusters", "/clusters", "Clusters"),
            ("hosts", "/hosts", "Hosts"),
        ];
        if p.may_globally("list", crate::model::Kind::User, None) {
            links.push(("users", "/users", "Users"));
        }
        if p.may_globally("list", crate::model::Kind::Bundle, None) {
            links.push(("delivery", "/delivery", "Continuous Delivery"));
        }
        if p.may_hub("get", "recordings") {
            links.push(("recordings", "/recordings", "Recordings"));
        }
        links.push(("roles", "/roles", "Roles"));
        links.push(("tokens", "/tokens", "API tokens"));
        let links: String = links
            .into_iter()
            .map(|(id, href, label)| {
                let current = if id == name {
                    r#" aria-current="page""#
                } else {
                    ""
                };
                format!(r#"<a href="{href}"{current}>{label}</a>"#)
            })
            .collect();
        let _ = write!(
            nav,
            r#"<nav aria-label="Main">{links}</nav>
<span class="who" title="Signed in as {user}">{user}{admin}</span>
<button type="button" class="quiet" id="logout">Log out</button>"#,
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
<link rel="icon" href="/assets/favicon.svg" type="image/svg+xml">
<script src="/assets/app.js" defer></script>
{head}
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
    /// Why signing in at a provider failed (its callback sends the browser here).
    #[serde(default)]
    error: Option<String>,
}

/// The login form sent by the browser itself (its script did not run): see
/// [`crate::api::form_login`].
async fn form_login(
    axum::extract::State(dash): axum::extract::State<Dash>,
    remote: Option<axum::Extension<tunnel::listener::RemoteAddr>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let addr = remote.map(|r| r.0.0.ip());
    crate::api::form_login(&dash.api, addr, &headers, &body).await
}

async fn login(
    axum::extract::State(dash): axum::extract::State<Dash>,
    Query(query): Query<LoginQuery>,
) -> Response {
    // Only a path on this hub: never an address elsewhere. The page's script goes where
    // `data-next` says, so this is the check that keeps it here.
    let next = crate::api::next_path(query.next.as_deref());
    // Each enabled provider is offered; with none, the hub's own users need no choice. A store
    // that cannot be read still lets the hub's own users in.
    let offered = crate::auth::providers::offered(dash.api.store.as_ref())
        .await
        .unwrap_or_default();
    let (redirecting, password): (Vec<_>, Vec<_>) = offered.iter().partition(|o| o.redirects);
    let buttons: String = redirecting
        .iter()
        .map(|o| {
            let start = format!(
                "/v1/login/{}/start?{}",
                o.name,
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("next", &next)
                    .finish()
            );
            format!(
                r#"<p><a class="button" data-provider="{}" href="{}">Sign in with {}</a></p>"#,
                escape(&o.name),
                escape(&start),
                escape(&o.display_name)
            )
        })
        .collect();
    let error = query.error.as_deref().map(escape).unwrap_or_default();
    let choice = if password.len() > 1 {
        let options: String = password
            .iter()
            .map(|o| {
                format!(
                    r#"<option value="{}">{}</option>"#,
                    escape(&o.name),
                    escape(&o.display_name)
                )
            })
            .collect();
        format!(
            r#"<label for="provider">Sign in with</label>
<select id="provider" name="provider">{options}</select>
"#
        )
    } else {
        String::new()
    };
    let content = format!(
        r#"<section class="card narrow">
<h1>Log in</h1>
<form id="login" method="post" action="/login" data-next="{next}">
<input type="hidden" name="next" value="{next}">
{choice}<label for="username">User name</label>
<input id="username" name="username" autocomplete="username" required>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<p class="error" role="alert" id="login-error">{error}</p>
<button type="submit">Log in</button>
</form>
{buttons}</section>"#,
        next = escape(&next)
    );
    page("Log in", None, "login", &content)
}

/// A state badge and its message.
/// Whether the caller may manage the cluster `name` (change and delete it): what its owners
/// may (an admin may), as the caller's roles' rules say.
fn owns(principal: &Principal, name: &str) -> bool {
    principal.admin
        || principal
            .on_cluster(name)
            .allows_hub("update", crate::model::Kind::Cluster, Some(name))
}

pub(super) fn state_cell(state: &str, message: &str) -> String {
    format!(
        r#"<span class="badge state-{state}">{state}</span> <span class="message">{message}</span>"#,
        state = escape(state),
        message = escape(message),
    )
}

/// "3.1 / 16.0 GiB".
pub(super) fn gib(used: u64, total: u64) -> String {
    let g = |b: u64| b as f64 / (1u64 << 30) as f64;
    format!("{:.1} / {:.1} GiB", g(used), g(total))
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
}
