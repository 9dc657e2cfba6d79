//! The Continuous Delivery page: each GitRepo with the commit it applies, its clusters ready
//! and its error; each bundle with its clusters ready and, per cluster that is not, the state
//! and the agent's message (a drifted object names the fields that changed). And the bundles
//! one cluster was given, on that cluster's page. Both follow the API's watches.

use std::fmt::Write as _;

use axum::{
    extract::{Query, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{Dash, caller, escape, fragment, page, text};
use crate::{
    api::{ApiError, allow, present},
    auth::{Principal, Verb},
    model::Kind,
    store::{LabelSelector, Object},
};

/// `?part=gitrepos|bundles`: one table's rows, for the script's live updates.
#[derive(Debug, serde::Deserialize)]
pub(super) struct DeliveryQuery {
    #[serde(default)]
    part: Option<String>,
}

/// The objects of `kind` the caller may read, by name.
async fn readable_list(
    dash: &Dash,
    principal: &Principal,
    kind: Kind,
    selector: &LabelSelector,
) -> Result<Vec<Object>, ApiError> {
    let (objects, _) = dash.api.store.list(kind.name(), selector).await?;
    Ok(objects
        .into_iter()
        .filter(|o| allow(principal, Verb::Get, kind, o).is_ok())
        .collect())
}

/// "3 of 4 clusters ready" as a badge: `ready` when all are, else `updating`.
fn ready_cell(status: &Value) -> String {
    let summary = text(&status["summary"]);
    if summary.is_empty() {
        return r#"<span class="message">not yet read</span>"#.to_owned();
    }
    // "N of M clusters ready": all ready when N equals M.
    let mut words = summary.split_whitespace();
    let all = matches!((words.next(), words.nth(1)), (Some(n), Some(m)) if n == m);
    format!(
        r#"<span class="badge state-{}">{}</span>"#,
        if all { "active" } else { "updating" },
        escape(&summary)
    )
}

fn gitrepo_row(repo: &Value) -> String {
    let (spec, status) = (&repo["spec"], &repo["status"]);
    let name = text(&repo["metadata"]["name"]);
    let follows = match (text(&spec["revision"]), text(&spec["branch"])) {
        (revision, _) if !revision.is_empty() => format!("revision {revision}"),
        (_, branch) if !branch.is_empty() => format!("branch {branch}"),
        _ => "branch main".to_owned(),
    };
    let commit = text(&status["commit"]);
    let commit_cell = if commit.is_empty() {
        "–".to_owned()
    } else {
        format!(
            r#"<code title="{c}">{short}</code>"#,
            c = escape(&commit),
            short = escape(&commit.chars().take(12).collect::<String>())
        )
    };
    let paused = if spec["paused"] == true {
        r#" <span class="badge">paused</span>"#
    } else {
        ""
    };
    let bundles: Vec<String> = (status["bundles"].as_array().into_iter().flatten())
        .map(|b| escape(&text(b)))
        .collect();
    format!(
        r#"<tr data-name="{n}"><td data-label="GitRepo"><strong>{n}</strong>{paused}<br><span class="message">{b}</span></td><td data-label="Repository"><code>{repo}</code><br><span class="message">{follows}</span></td><td data-label="Commit">{commit_cell}</td><td data-label="Clusters ready">{ready}</td><td data-label="Error" class="error-cell">{error}</td></tr>"#,
        n = escape(&name),
        b = bundles.join(", "),
        repo = escape(&text(&spec["repo"])),
        follows = escape(&follows),
        ready = ready_cell(status),
        error = escape(&text(&status["error"])),
    )
}

/// One line per cluster that is not ready: its state and the agent's message.
fn problems_cell(status: &Value) -> String {
    let items: String = (status["problems"].as_array().into_iter().flatten())
        .map(|p| {
            format!(
                r#"<li data-cluster="{c}"><a href="/clusters/{c}">{c}</a> <span class="badge state-{s}">{s}</span> <span class="message">{m}</span></li>"#,
                c = escape(&text(&p["cluster"])),
                s = escape(&text(&p["state"])),
                m = escape(&text(&p["message"])),
            )
        })
        .collect();
    if items.is_empty() {
        "–".to_owned()
    } else {
        format!(r#"<ul class="problems">{items}</ul>"#)
    }
}

fn bundle_row(bundle: &Value) -> String {
    let name = text(&bundle["metadata"]["name"]);
    let from = text(&bundle["metadata"]["labels"]["drover.io/gitrepo"]);
    let origin = if from.is_empty() {
        "made through the API".to_owned()
    } else {
        format!("from GitRepo {from}")
    };
    let paused = if bundle["spec"]["paused"] == true {
        r#" <span class="badge">paused</span>"#
    } else {
        ""
    };
    format!(
        r#"<tr data-name="{n}"><td data-label="Bundle"><strong>{n}</strong>{paused}<br><span class="message">{origin}</span></td><td data-label="Clusters ready">{ready}</td><td data-label="Not ready">{problems}</td></tr>"#,
        n = escape(&name),
        origin = escape(&origin),
        ready = ready_cell(&bundle["status"]),
        problems = problems_cell(&bundle["status"]),
    )
}

async fn gitrepo_rows(dash: &Dash, principal: &Principal) -> Result<String, ApiError> {
    let repos = readable_list(dash, principal, Kind::GitRepo, &LabelSelector::everything()).await?;
    Ok(repos
        .into_iter()
        .map(|r| gitrepo_row(&present(Kind::GitRepo, r)))
        .collect())
}

async fn bundle_rows(dash: &Dash, principal: &Principal) -> Result<String, ApiError> {
    let bundles =
        readable_list(dash, principal, Kind::Bundle, &LabelSelector::everything()).await?;
    Ok(bundles
        .into_iter()
        .map(|b| bundle_row(&present(Kind::Bundle, b)))
        .collect())
}

/// `/delivery`: GitRepos and bundles.
pub(super) async fn delivery(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<DeliveryQuery>,
) -> Response {
    let principal = match caller(&dash.api, &headers, "/delivery").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    match query.part.as_deref() {
        Some("gitrepos") => return rows(gitrepo_rows(&dash, &principal).await),
        Some("bundles") => return rows(bundle_rows(&dash, &principal).await),
        _ => {}
    }
    let (repos, bundles) = match (
        gitrepo_rows(&dash, &principal).await,
        bundle_rows(&dash, &principal).await,
    ) {
        (Ok(r), Ok(b)) => (r, b),
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
    };
    let content = format!(
        r#"<div class="bar"><h1>Continuous Delivery</h1></div>
<p>A GitRepo turns each of its paths into a bundle; a bundle goes to every cluster its targets match, applied there by the cluster's agent with server-side apply. Create one with <code>drover-hub gitrepo create</code> or <code>drover-hub apply -f</code> (see <code>docs/delivery.md</code>).</p>
<h2>GitRepos</h2>
<table class="list" id="gitrepos" data-watch="/v1/gitrepos?watch=true" data-rows="/delivery?part=gitrepos">
<thead><tr><th scope="col">GitRepo</th><th scope="col">Repository</th><th scope="col">Commit</th><th scope="col">Clusters ready</th><th scope="col">Error</th></tr></thead>
<tbody>{repos}</tbody></table>
<h2>Bundles</h2>
<table class="list" id="bundles" data-watch="/v1/bundles?watch=true" data-rows="/delivery?part=bundles">
<thead><tr><th scope="col">Bundle</th><th scope="col">Clusters ready</th><th scope="col">Not ready</th></tr></thead>
<tbody>{bundles}</tbody></table>"#
    );
    page(
        "Continuous Delivery",
        Some(&principal),
        "delivery",
        &content,
    )
}

fn rows(rows: Result<String, ApiError>) -> Response {
    match rows {
        Ok(rows) => fragment(rows),
        Err(e) => e.into_response(),
    }
}

/// What cluster `cluster` was given of each bundle, as rows of its page: the bundle, how it
/// stands there (the agent's worst object state and message), and its objects by state.
pub(super) async fn cluster_bundle_rows(
    dash: &Dash,
    principal: &Principal,
    cluster: &str,
) -> Result<String, ApiError> {
    let selector = LabelSelector::parse(&format!("{}={cluster}", crate::delivery::CLUSTER_LABEL))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let deployments = readable_list(dash, principal, Kind::BundleDeployment, &selector).await?;
    let mut out = String::new();
    for d in deployments {
        let (spec, status) = (&d.spec, &d.status);
        let applied = status["revision"].is_string() && status["revision"] == spec["revision"];
        let state = match text(&status["state"]) {
            s if s.is_empty() => "Pending".to_owned(),
            s if !applied && s == "Ready" => "Updating".to_owned(),
            s => s,
        };
        let counts: Vec<String> = (status["counts"].as_object().into_iter().flatten())
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        let _ = write!(
            out,
            r#"<tr data-name="{b}" data-state="{s}"><td data-label="Bundle">{b}</td><td data-label="State"><span class="badge state-{s}">{s}</span> <span class="message">{m}</span></td><td data-label="Objects">{c}</td></tr>"#,
            b = escape(&text(&spec["bundle"])),
            s = escape(&state),
            m = escape(&text(&status["message"])),
            c = escape(&counts.join(", ")),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_gitrepo_row_shows_its_commit_count_and_error_escaped() {
        let row = gitrepo_row(&json!({
            "metadata": {"name": "shop"},
            "spec": {"repo": "git://h/shop.git", "revision": "abc", "paused": true},
            "status": {"commit": "0123456789abcdef", "summary": "1 of 2 clusters ready",
                       "bundles": ["shop-web"], "error": "fetching: <denied>"},
        }));
        assert!(
            row.contains(r#"<code title="0123456789abcdef">0123456789ab</code>"#),
            "{row}"
        );
        assert!(
            row.contains("revision abc") && row.contains(">paused<"),
            "{row}"
        );
        assert!(
            row.contains(r#"state-updating">1 of 2 clusters ready"#),
            "{row}"
        );
        assert!(row.contains("fetching: &lt;denied&gt;"), "{row}");
        let ready = ready_cell(&json!({"summary": "2 of 2 clusters ready"}));
        assert!(ready.contains("state-active"), "{ready}");
        assert!(ready_cell(&json!({})).contains("not yet read"));
    }

    #[test]
    fn a_bundle_row_names_each_cluster_not_ready_with_its_message() {
        let row = bundle_row(&json!({
            "metadata": {"name": "shop-web", "labels": {"drover.io/gitrepo": "shop"}},
            "spec": {},
            "status": {"summary": "1 of 2 clusters ready", "problems": [
                {"cluster": "west", "state": "Modified", "message": "Deployment shop/web: changed"}]},
        }));
        assert!(row.contains("from GitRepo shop"), "{row}");
        assert!(
            row.contains(r#"<li data-cluster="west"><a href="/clusters/west">west</a> <span class="badge state-Modified">Modified</span> <span class="message">Deployment shop/web: changed</span></li>"#),
            "{row}"
        );
    }
}
