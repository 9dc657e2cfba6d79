//! The cluster explorer: a cluster's own objects (any kind its discovery lists, CRDs too), one
//! object's summary, YAML and actions, a pod's logs and a shell in it.
//!
//! The hub renders only each page's frame, after checking that the caller may see the
//! cluster. Everything about the cluster's objects is read and written by `explorer.js`
//! through the authentication proxy (`/k8s/clusters/{name}/…`) with the browser's session, so
//! every request acts as the signed-in user and the cluster's RBAC decides; the controls a page
//! shows are those `SelfSubjectAccessReview`s allow. The frame carries the names the script
//! needs as `data-` attributes, never as script.

use axum::{
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::Response,
};

use super::{Dash, escape, page_with, readable};
use crate::model::Kind;

pub(super) const JS: &str = include_str!("explorer.js");
pub(super) const XTERM_JS: &str = include_str!("vendor/xterm/xterm.js");
pub(super) const XTERM_CSS: &str = include_str!("vendor/xterm/xterm.css");
pub(super) const XTERM_FIT_JS: &str = include_str!("vendor/xterm/addon-fit.js");

const EXPLORER_JS: &str = r#"<script src="/assets/explorer.js" defer></script>"#;
const XTERM: &str = r#"<link rel="stylesheet" href="/assets/xterm/xterm.css">
<script src="/assets/xterm/xterm.js" defer></script>
<script src="/assets/xterm/addon-fit.js" defer></script>"#;

/// The head of a page that draws a terminal (xterm's assets, and a style nonce fresh for this
/// response, which app.js gives the style elements xterm makes), and the nonce.
pub(super) fn terminal_head() -> (String, String) {
    let nonce = crate::auth::secret::random_text::<16>();
    (
        format!(
            r#"{XTERM}
<meta name="style-nonce" content="{nonce}">"#
        ),
        nonce,
    )
}

/// `response` with the policy of a page that draws a terminal ([`terminal_head`]'s nonce).
pub(super) fn with_style_nonce(mut response: Response, nonce: &str) -> Response {
    if let Ok(policy) = HeaderValue::from_str(&crate::websec::policy_with_style_nonce(nonce)) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    response
}

/// Whether a path segment can name a resource (`pods`, `deployments.apps`), a namespace or an
/// object (`system:controller:x` is a ClusterRole's name) as Kubernetes spells them.
fn well_formed(segment: &str) -> bool {
    !segment.is_empty()
        && segment.len() <= 253
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':' | b'@'))
}

/// Where a caller without a session comes back to after logging in: this page with its query
/// (the list's filters live there).
pub(super) fn here(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), ToString::to_string)
}

/// The caller, if they may see `cluster`, and the page for it; else the page that says why.
/// The kinds the cluster-agent caches, as the explorer names them (`pods`, `deployments.apps`).
fn cached_kinds() -> String {
    proto::CACHED_RESOURCES
        .map(|r| {
            if r.group.is_empty() {
                r.name.to_owned()
            } else {
                format!("{}.{}", r.name, r.group)
            }
        })
        .join(" ")
}

pub(super) async fn explorer_page(
    dash: &Dash,
    headers: &HeaderMap,
    cluster: &str,
    here: &str,
    title: &str,
    content: impl FnOnce(&str, &crate::store::Object) -> String,
    head: &str,
) -> Response {
    let (principal, object) =
        match readable(dash, headers, Kind::Cluster, cluster, Some(here)).await {
            Ok(found) => found,
            Err(response) => return response,
        };
    let cluster = escape(cluster);
    let crumbs = format!(
        r#"<nav class="crumbs" aria-label="Breadcrumb"><a href="/clusters/{cluster}">Cluster {cluster}</a> › <a href="/clusters/{cluster}/explorer">Explorer</a></nav>"#
    );
    let content = content(&cluster, &object);
    // Every explorer page has the kinds beside it, drawn by the script.
    let body = format!(
        r#"{crumbs}
<div id="explorer" class="explorer-layout" data-cluster="{cluster}" data-cached="{}">
<nav id="kinds-nav" class="kinds-nav" aria-label="Kinds"></nav><div class="explorer-main">
{content}
</div>
</div>"#,
        cached_kinds(),
    );
    page_with(
        title,
        Some(&principal),
        "clusters",
        &body,
        &format!("{EXPLORER_JS}\n{head}"),
    )
}

/// A path the explorer has no page for.
fn not_found(what: &str) -> Response {
    let mut response = super::page(
        "Not found",
        None,
        "",
        &format!(
            r#"<h1>Not found</h1><p class="error" role="alert">{}</p><p><a href="/clusters">Back to the clusters</a></p>"#,
            escape(what)
        ),
    );
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// `/clusters/{name}/explorer/{resource}`: the objects of one kind, as the API server's
/// Table shows them, a page at a time, kept current by a watch.
pub(super) async fn list(
    State(dash): State<Dash>,
    headers: HeaderMap,
    uri: Uri,
    Path((name, resource)): Path<(String, String)>,
) -> Response {
    if !well_formed(&resource) {
        return not_found(&format!("{resource:?} is not a resource name"));
    }
    explorer_page(
        &dash,
        &headers,
        &name,
        &here(&uri),
        &format!("{resource} · {name}"),
        |_, _| {
            format!(
                r#"<div class="bar"><h1 id="list-title">{resource}</h1>
<button type="button" id="create-open" hidden>Create from YAML</button></div>
<div id="list" data-view="list" data-resource="{resource}">
<form id="list-filters" class="filters" role="search" aria-label="Filter the list">
<div id="namespace-field"><label for="namespace">Namespace</label>
<select id="namespace" name="namespace"><option value="">All namespaces</option></select></div>
<div><label for="selector">Label selector</label>
<input id="selector" name="labelSelector" placeholder="app=web,tier!=db" autocomplete="off"></div>
<div><label for="name-filter">Name contains</label>
<input id="name-filter" name="name" autocomplete="off"></div>
<div id="object-field" hidden><label for="object-filter">About object (name)</label>
<input id="object-filter" name="object" autocomplete="off"></div>
<div><button type="submit">Show</button></div>
</form>
<section id="create" class="card" hidden aria-labelledby="create-title">
<h2 id="create-title">Create from YAML</h2>
<label for="create-yaml">YAML of the new object</label>
<textarea id="create-yaml" rows="14" spellcheck="false"></textarea>
<button type="button" id="create-submit">Create</button>
<p class="error" role="alert" id="create-error"></p>
</section>
<div class="pager"><button type="button" id="prev" disabled>Previous page</button>
<span id="page-info"></span>
<button type="button" id="next" disabled>Next page</button>
<span id="list-status" role="status" aria-live="polite"></span>
<button type="button" id="delete-selected" hidden disabled>Delete selected</button></div>
<p class="error" role="alert" id="list-error"></p>
<div class="scroll"><table class="list" id="objects"><thead></thead><tbody></tbody></table></div>
</div>"#,
                resource = escape(&resource),
            )
        },
        "",
    )
    .await
}

/// `/clusters/{name}/explorer/{resource}/{object}`: a cluster-scoped object.
pub(super) async fn cluster_object(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path((name, resource, object)): Path<(String, String, String)>,
) -> Response {
    one(&dash, &headers, &name, &resource, None, &object).await
}

/// `/clusters/{name}/explorer/{resource}/{namespace}/{object}`: a namespaced object.
pub(super) async fn object(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path((name, resource, namespace, object)): Path<(String, String, String, String)>,
) -> Response {
    one(&dash, &headers, &name, &resource, Some(&namespace), &object).await
}

/// One object: its summary, its YAML (edited in place by those who may update it) and the
/// actions its kind has.
async fn one(
    dash: &Dash,
    headers: &HeaderMap,
    cluster: &str,
    resource: &str,
    namespace: Option<&str>,
    object: &str,
) -> Response {
    if ![resource, object, namespace.unwrap_or("x")]
        .iter()
        .all(|s| well_formed(s))
    {
        return not_found("not an object's path");
    }
    let here = match namespace {
        Some(ns) => format!("/clusters/{cluster}/explorer/{resource}/{ns}/{object}"),
        None => format!("/clusters/{cluster}/explorer/{resource}/{object}"),
    };
    let title = match namespace {
        Some(ns) => format!("{resource} {ns}/{object}"),
        None => format!("{resource} {object}"),
    };
    explorer_page(
        dash,
        headers,
        cluster,
        &here,
        &format!("{title} · {cluster}"),
        |_, _| {
            format!(
                r#"<div id="one" data-view="object" data-resource="{resource}" data-namespace="{namespace}" data-name="{object}">
<div class="bar"><h1>{title}</h1><div id="actions" class="actions"></div></div>
<p class="error" role="alert" id="object-error"></p>
<p id="action-status" role="status" aria-live="polite"></p>
<section aria-labelledby="summary-title"><h2 id="summary-title">Summary</h2>
<dl class="facts" id="facts"></dl>
<h3>Conditions</h3>
<table class="list" id="conditions"><thead><tr><th scope="col">Condition</th><th scope="col">Status</th><th scope="col">Reason</th><th scope="col">Message</th></tr></thead><tbody></tbody></table>
<h3>Owned by</h3><ul id="owners"></ul>
<h3 id="owned-title">Owns</h3><ul id="owned"></ul>
<h3>Events</h3>
<table class="list" id="object-events"><thead><tr><th scope="col">Type</th><th scope="col">Reason</th><th scope="col">Message</th><th scope="col">Last seen</th></tr></thead><tbody></tbody></table>
</section>
<section aria-labelledby="yaml-title"><h2 id="yaml-title">YAML</h2>
<label for="yaml" class="visually-hidden">The object as YAML</label>
<textarea id="yaml" rows="24" readonly spellcheck="false"></textarea>
<div class="actions"><button type="button" id="edit" hidden>Edit YAML</button>
<button type="button" id="save" hidden>Save</button>
<button type="button" id="cancel" hidden>Cancel</button></div>
<div id="yaml-confirm" hidden><h3 id="diff-title">What saving changes</h3>
<pre id="yaml-diff" class="diff" tabindex="0" aria-labelledby="diff-title"></pre>
<div class="actions"><button type="button" id="save-confirm">Save these changes</button>
<button type="button" id="save-back">Back to editing</button></div></div>
<p class="error" role="alert" id="yaml-error"></p>
<p id="yaml-status" role="status" aria-live="polite"></p>
</section>
</div>"#,
                resource = escape(resource),
                namespace = escape(namespace.unwrap_or_default()),
                object = escape(object),
                title = escape(&title),
            )
        },
        "",
    )
    .await
}

/// `/clusters/{name}/explorer/pods/{namespace}/{pod}/logs` and `…/shell`.
pub(super) async fn pod_view(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path((name, resource, namespace, pod, view)): Path<(String, String, String, String, String)>,
) -> Response {
    if resource != "pods" || !well_formed(&namespace) || !well_formed(&pod) {
        return not_found("logs and shells are a pod's");
    }
    let here = format!("/clusters/{name}/explorer/pods/{namespace}/{pod}/{view}");
    let data = format!(
        r#"data-namespace="{}" data-name="{}""#,
        escape(&namespace),
        escape(&pod)
    );
    let container = r#"<div><label for="container">Container</label><select id="container" name="container"></select></div>"#;
    match view.as_str() {
        "logs" => {
            explorer_page(
                &dash,
                &headers,
                &name,
                &here,
                &format!("Logs of {namespace}/{pod} · {name}"),
                |_, _| {
                    format!(
                        r#"<h1>Logs: {namespace}/{pod}</h1>
<div id="logs" data-view="logs" {data}>
<form id="log-options" class="filters" aria-label="Log options">
{container}
<div><label for="tail">Last lines</label><input id="tail" name="tailLines" type="number" min="1" value="500"></div>
<div><label class="check"><input type="checkbox" id="follow" checked> Follow</label>
<label class="check"><input type="checkbox" id="previous"> Previous container</label>
<label class="check"><input type="checkbox" id="timestamps"> Timestamps</label></div>
<div><button type="submit">Show</button>
<button type="button" id="download">Download</button></div>
</form>
<p id="log-status" role="status" aria-live="polite"></p>
<p class="error" role="alert" id="log-error"></p>
<pre id="log" class="log" tabindex="0" aria-label="Log lines"></pre>
</div>"#,
                        namespace = escape(&namespace),
                        pod = escape(&pod),
                    )
                },
                "",
            )
            .await
        }
        "shell" => {
            let (head, nonce) = terminal_head();
            let response = explorer_page(
                &dash,
                &headers,
                &name,
                &here,
                &format!("Shell in {namespace}/{pod} · {name}"),
                |_, _| {
                    format!(
                        r#"<h1>Shell: {namespace}/{pod}</h1>
<div id="shell" data-view="shell" {data}>
<form id="shell-options" class="filters" aria-label="Shell options">
{container}
<div><label for="command">Command</label><input id="command" value="sh" autocomplete="off"></div>
<div><button type="submit">Connect</button></div>
</form>
<p id="shell-status" role="status" aria-live="polite"></p>
<p class="error" role="alert" id="shell-error"></p>
<div id="terminal" class="terminal" aria-label="Terminal"></div>
</div>"#,
                        namespace = escape(&namespace),
                        pod = escape(&pod),
                    )
                },
                &head,
            )
            .await;
            with_style_nonce(response, &nonce)
        }
        _ => not_found("a pod has logs and a shell"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_kubernetes_names_or_refused() {
        for ok in [
            "pods",
            "deployments.apps",
            "helmcharts.helm.cattle.io",
            "system:controller:job-controller",
            "kube-system",
        ] {
            assert!(well_formed(ok), "{ok}");
        }
        for bad in ["", "a/b", "<script>", "a b", "..%2f", &"x".repeat(254)] {
            assert!(!well_formed(bad), "{bad}");
        }
    }
}
