//! Machines: the hosts list, a host's page and a node's page (facts and usage charts), and the
//! machine rows the cluster page shows.

use std::fmt::Write as _;

use axum::{
    extract::{Path, Query, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{
    Dash, caller,
    charts::{self, Series},
    escape,
    fleet::{self, Entry, FleetQuery},
    fragment, gib, page, readable, state_cell, text,
};
use crate::{
    api::{ApiError, allow, present},
    health::Health,
    model::Kind,
    store::{LabelSelector, Object, StoreError},
};

/// The sparkline and memory cells of a machine.
fn usage_cells(health: &Health, peer_id: &str, now: u32) -> String {
    let (points, usage) = health.last_hour(peer_id).unwrap_or_default();
    let memory = usage.map_or_else(
        || "–".to_owned(),
        |u| gib(u.memory_used_bytes, u.memory_total_bytes),
    );
    format!(
        r#"<td data-label="CPU, last hour">{}</td><td data-label="Memory">{}</td>"#,
        charts::sparkline(&points, now),
        escape(&memory)
    )
}

/// How far a host's plan has got; on a failure, the failing instruction and its output.
fn provisioning(host: &Value, plan: Option<&Object>) -> String {
    let Some(plan) = plan else {
        // Plans are for the cluster's owners; others see the Host's condition.
        let condition = host["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Provisioned"));
        return condition.map_or_else(
            || "–".to_owned(),
            |c| escape(&format!("{} {}", text(&c["reason"]), text(&c["message"]))),
        );
    };
    let status = &plan.status;
    let state = text(&status["state"]);
    if state.is_empty() {
        return "waiting for the system-agent".to_owned();
    }
    let ran = status["results"].as_array().map_or(0, Vec::len);
    let mut out = format!(
        r#"<span class="badge plan-{state}">{state}</span> {ran} instruction{s} run"#,
        state = escape(&state),
        s = if ran == 1 { "" } else { "s" },
    );
    // The step running now, since when, and its latest output, open: what `kubectl logs -f`
    // would show (the rows are redrawn as the host's reports arrive).
    let current = &status["current"];
    if current.is_object() {
        let _ = write!(
            out,
            r#"<div class="step">step <strong>{name}</strong> running since <time datetime="{since}">{since}</time></div><details class="output live" open><summary>{name} output</summary><pre>{output}</pre></details>"#,
            name = escape(&text(&current["name"])),
            since = escape(&text(&current["startedAt"])),
            output = escape(&text(&current["output"])),
        );
    }
    if state == "failed" {
        let _ = write!(
            out,
            r#" <span class="message">{}</span>"#,
            escape(&text(&status["message"]))
        );
        let failing = status["results"]
            .as_array()
            .and_then(|r| r.iter().rev().find(|i| i["exitCode"].as_i64() != Some(0)));
        if let Some(failing) = failing {
            let output = format!("{}{}", text(&failing["stdout"]), text(&failing["stderr"]));
            let _ = write!(
                out,
                r#"<details class="output"><summary>{} exited {}</summary><pre>{}</pre></details>"#,
                escape(&text(&failing["name"])),
                failing["exitCode"].as_i64().unwrap_or(-1),
                escape(&output),
            );
        }
    }
    out
}

/// A host as a row: on the cluster page (`with_cluster` false) or the hosts list.
fn row(
    host: &Value,
    plan: Option<&Object>,
    health: &Health,
    now: u32,
    with_cluster: bool,
) -> String {
    let name = text(&host["metadata"]["name"]);
    let roles = &host["spec"]["roles"];
    let roles: Vec<&str> = [
        ("etcd", "etcd"),
        ("controlPlane", "control plane"),
        ("worker", "worker"),
    ]
    .into_iter()
    .filter(|(key, _)| roles[*key] == true)
    .map(|(_, label)| label)
    .collect();
    let cluster = if with_cluster {
        let c = escape(&text(&host["spec"]["cluster"]));
        format!(r#"<td data-label="Cluster"><a href="/clusters/{c}">{c}</a></td>"#)
    } else {
        String::new()
    };
    // People know a machine by its node name; the host's id (a hash) is kept to tell two
    // machines of one name apart.
    let node = text(&host["spec"]["nodeName"]);
    let shown = if node.is_empty() {
        escape(&name)
    } else {
        format!(
            r#"{} <span class="id">{}</span>"#,
            escape(&node),
            escape(&name)
        )
    };
    format!(
        r#"<tr data-name="{name}" data-state="{state_attr}"><td data-label="Name"><a href="/hosts/{name}">{shown}</a></td>{cluster}<td data-label="State">{state}</td><td data-label="Roles">{roles}</td><td data-label="Provisioning">{provisioning}</td>{usage}</tr>"#,
        name = escape(&name),
        state_attr = escape(&text(&host["state"]["state"])),
        state = state_cell(
            &text(&host["state"]["state"]),
            &text(&host["state"]["message"])
        ),
        roles = escape(&roles.join(", ")),
        provisioning = provisioning(host, plan),
        usage = usage_cells(health, &format!("host/{name}"), now),
    )
}

/// The hosts' plans the caller may read, by host: one list, not a read per host.
pub(super) async fn readable_plans(
    dash: &Dash,
    principal: &crate::auth::Principal,
) -> Result<std::collections::HashMap<String, Object>, ApiError> {
    let (plans, _) = dash
        .api
        .store
        .list(Kind::Plan.name(), &LabelSelector::everything())
        .await?;
    Ok(plans
        .into_iter()
        .filter(|p| allow(principal, crate::auth::Verb::Get, Kind::Plan, p).is_ok())
        .map(|p| (p.metadata.name.clone(), p))
        .collect())
}

pub(super) fn host_row(host: &Value, plan: Option<&Object>, health: &Health, now: u32) -> String {
    row(host, plan, health, now, false)
}

/// A node-agent's node (as [`Health::nodes`] shows it) as a row of its cluster's page.
pub(super) fn node_row(cluster: &str, node: &Value, health: &Health, now: u32) -> String {
    let name = text(&node["name"]);
    format!(
        r#"<tr data-name="{name}" data-state="{state_attr}"><td data-label="Name"><a href="/clusters/{cluster}/nodes/{name}">{name}</a></td><td data-label="State">{state}</td><td data-label="Roles">–</td><td data-label="Provisioning">–</td>{usage}</tr>"#,
        name = escape(&name),
        cluster = escape(cluster),
        state_attr = escape(&text(&node["state"])),
        state = state_cell(&text(&node["state"]), &text(&node["message"])),
        usage = usage_cells(health, &format!("node/{cluster}/{name}"), now),
    )
}

/// The plans of `hosts` the caller may read, by host: a read per host shown, not a list of
/// every plan.
async fn plans_of(
    dash: &Dash,
    principal: &crate::auth::Principal,
    hosts: &[Entry],
) -> Result<std::collections::HashMap<String, Object>, ApiError> {
    let mut plans = std::collections::HashMap::new();
    for host in hosts {
        let name = &host.object.metadata.name;
        match dash.api.store.get(Kind::Plan.name(), name).await {
            Ok(plan) if allow(principal, crate::auth::Verb::Get, Kind::Plan, &plan).is_ok() => {
                plans.insert(name.clone(), plan);
            }
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(plans)
}

/// The hosts page: a view of every host the caller may see, 50 rows at a time.
pub(super) async fn hosts(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<FleetQuery>,
) -> Response {
    let here = format!("/hosts?{}", query.link(None, None));
    let principal = match caller(&dash.api, &headers, &here).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let reads = fleet::Reads {
        version: |o| text(&o.status["facts"]["agentVersion"]),
        // The name people know a machine by, and its cluster's.
        also: |o| format!("{} {}", text(&o.spec["nodeName"]), text(&o.spec["cluster"])),
    };
    let (selection, error) = match fleet::view(&dash, &principal, Kind::Host, &query, reads).await {
        Ok(view) => view,
        Err(e) => return e.into_response(),
    };
    let plans = match plans_of(&dash, &principal, &selection.shown).await {
        Ok(plans) => plans,
        Err(e) => return e.into_response(),
    };
    let now = charts::now_minute();
    let rows: String = selection
        .shown
        .iter()
        .map(|e| {
            let plan = plans.get(&e.object.metadata.name);
            row(
                &present(Kind::Host, e.object.clone()),
                plan,
                &dash.health,
                now,
                true,
            )
        })
        .collect();
    let section = format!(
        r#"{error}{pager}
<table class="list" id="hosts">
<thead><tr>{name}<th scope="col">Cluster</th>{state}<th scope="col">Roles</th><th scope="col">Provisioning</th><th scope="col">CPU, last hour</th><th scope="col">Memory</th></tr></thead>
<tbody>{rows}</tbody>
</table>
{empty}"#,
        pager = fleet::pager(&query, &selection, "hosts"),
        name = fleet::heading(&query, "name", "Name"),
        state = fleet::heading(&query, "state", "State"),
        empty = fleet::empty(
            "/hosts",
            &query,
            &selection,
            "No hosts yet: create a custom cluster and run its command on a host."
        ),
    );
    if query.rows() {
        return fragment(section);
    }
    let content = format!(
        r#"<div class="bar"><h1>Hosts</h1></div>
{filters}
<section id="fleet" data-watch="/v1/hosts?watch=true" data-rows="/hosts?part=rows&amp;{view}" data-poll="10">
{section}
</section>"#,
        filters = fleet::filters(
            "/hosts",
            &query,
            &selection,
            ("Name or cluster contains", "Agent version")
        ),
        view = escape(&query.link(None, None)),
    );
    page("Hosts", Some(&principal), "hosts", &content)
}

/// Facts as a definition list.
fn facts_list(facts: &Value) -> String {
    if !facts.is_object() {
        return r#"<p class="empty">No facts yet: the agent sends them with its first heartbeat.</p>"#.to_owned();
    }
    let disks: Vec<String> = facts["disks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            format!(
                "{} ({}, {:.0} GiB)",
                text(&d["mountPoint"]),
                text(&d["fileSystem"]),
                d["totalBytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64
            )
        })
        .collect();
    let memory = facts["memoryBytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64;
    let items = [
        ("Host name", text(&facts["hostname"])),
        ("OS", text(&facts["os"])),
        ("Kernel", text(&facts["kernel"])),
        ("Architecture", text(&facts["arch"])),
        ("CPUs", facts["cpus"].to_string()),
        ("Memory", format!("{memory:.1} GiB")),
        ("Disks", disks.join(", ")),
        ("Booted", text(&facts["bootTime"])),
        ("Agent version", text(&facts["agentVersion"])),
    ];
    let mut out = String::from(r#"<dl class="facts">"#);
    for (term, value) in items {
        let _ = write!(out, "<dt>{term}</dt><dd>{}</dd>", escape(&value));
    }
    out.push_str("</dl>");
    out
}

/// The four charts of a machine: CPU and memory, over the last hour and day.
async fn charts_of(health: &Health, peer_id: &str) -> String {
    let (points, usage) = health.history(peer_id).await.unwrap_or_default();
    let total = usage.map_or(0, |u| u.memory_total_bytes);
    let now = charts::now_minute();
    [
        (Series::Cpu, 60, "CPU, last hour"),
        (Series::Memory { total }, 60, "Memory, last hour"),
        (Series::Cpu, 24 * 60, "CPU, last 24 hours"),
        (Series::Memory { total }, 24 * 60, "Memory, last 24 hours"),
    ]
    .into_iter()
    .map(|(series, minutes, title)| charts::chart(&points, series, now, minutes, title))
    .collect()
}

pub(super) async fn host(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let here = format!("/hosts/{name}");
    let (principal, object) = match readable(&dash, &headers, Kind::Host, &name, Some(&here)).await
    {
        Ok(found) => found,
        Err(response) => return response,
    };
    let plan = match dash.api.store.get(Kind::Plan.name(), &name).await {
        Ok(plan) if allow(&principal, crate::auth::Verb::Get, Kind::Plan, &plan).is_ok() => {
            Some(plan)
        }
        _ => None,
    };
    let shown = present(Kind::Host, object);
    let now = charts::now_minute();
    let charts = charts_of(&dash.health, &format!("host/{name}")).await;
    let content = format!(
        r#"<div class="bar"><h1>Host {title}</h1></div>
<table class="list" id="host" data-watch="/v1/hosts?watch=true" data-rows="/hosts?part=rows" data-only="{title}" data-poll="10">
<thead><tr><th scope="col">Name</th><th scope="col">Cluster</th><th scope="col">State</th><th scope="col">Roles</th><th scope="col">Provisioning</th><th scope="col">CPU, last hour</th><th scope="col">Memory</th></tr></thead>
<tbody>{row}</tbody></table>
<h2>Facts</h2>{facts}
<h2>Usage</h2><div class="charts">{charts}</div>"#,
        title = escape(&name),
        row = row(&shown, plan.as_ref(), &dash.health, now, true),
        facts = facts_list(&shown["status"]["facts"]),
    );
    page(&format!("Host {name}"), Some(&principal), "hosts", &content)
}

pub(super) async fn node(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path((cluster, node)): Path<(String, String)>,
) -> Response {
    let here = format!("/clusters/{cluster}/nodes/{node}");
    let principal = match readable(&dash, &headers, Kind::Cluster, &cluster, Some(&here)).await {
        Ok((principal, _)) => principal,
        Err(response) => return response,
    };
    let peer = format!("node/{cluster}/{node}");
    let Some(shown) = dash.health.usage(&peer).await else {
        return ApiError::not_found(format!(
            "no node-agent of cluster {cluster:?} runs on node {node:?}"
        ))
        .into_response();
    };
    let charts = charts_of(&dash.health, &peer).await;
    let content = format!(
        r#"<div class="bar"><h1>Node {title} of <a href="/clusters/{c}">{c}</a></h1>
<a class="button" id="node-explorer" href="/clusters/{c}/explorer/nodes/{title}">Labels, taints, pods; cordon and drain</a></div>
<p>{state}</p>
<h2>Facts</h2>{facts}
<h2>Usage</h2><div class="charts">{charts}</div>"#,
        title = escape(&node),
        c = escape(&cluster),
        state = state_cell(&text(&shown["state"]), &text(&shown["message"])),
        facts = facts_list(&shown["facts"]),
    );
    page(
        &format!("Node {node}"),
        Some(&principal),
        "clusters",
        &content,
    )
}
