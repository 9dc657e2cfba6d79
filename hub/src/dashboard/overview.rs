//! `/clusters/{name}/explorer`: the cluster's dashboard, as Rancher's cluster explorer opens
//! on one. What the cluster holds (capacity, the health of nodes, pods and deployments, the
//! latest warnings) is drawn by `explorer.js` from `/v1/clusters/{name}/overview`, which the
//! cluster-agent sums from its caches as the caller may see it; what the hub knows itself (its
//! agents, their versions and connections) is written here. The kinds the cluster serves are
//! beside it, with counts, as on every explorer page.

use axum::{
    extract::{Path, State},
    http::{HeaderMap, Uri},
    response::Response,
};
use serde_json::Value;

use super::{Dash, escape};
use crate::{model::Status, store::Object};

/// The agents table: the cluster-agent (its connection, as the `Connected` condition says,
/// and the version it reports) and each node's node-agent (as its heartbeats say).
fn agents(cluster: &Object, nodes: &[Value]) -> String {
    let status = Status::of(cluster);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut rows = String::new();
    let (state, message, since) = match status.condition("Connected") {
        Some(c) if c.status == "True" => {
            ("connected", String::new(), c.last_transition_time.clone())
        }
        Some(c) => (
            "disconnected",
            c.message.clone(),
            c.last_transition_time.clone(),
        ),
        None => ("never connected", String::new(), String::new()),
    };
    let version = status
        .extra
        .get("agentVersion")
        .map(text)
        .unwrap_or_default();
    rows.push_str(&row("cluster-agent", "", state, &message, &version, &since));
    for node in nodes {
        let state = match node["state"].as_str() {
            Some("active") => "connected",
            _ => "disconnected",
        };
        rows.push_str(&row(
            "node-agent",
            &text(&node["name"]),
            state,
            &text(&node["message"]),
            &text(&node["facts"]["agentVersion"]),
            &text(&node["lastHeartbeat"]),
        ));
    }
    format!(
        r#"<section aria-labelledby="agents-title"><h2 id="agents-title">Agents</h2>
<table class="list" id="agents"><thead><tr><th scope="col">Agent</th><th scope="col">Node</th><th scope="col">Connection</th><th scope="col">Version</th><th scope="col">Since or last heartbeat</th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="help">No node-agent row means none reports from this cluster: deploy the node-agent DaemonSet to see each node's health and usage.</p></section>"#
    )
}

fn row(agent: &str, node: &str, state: &str, message: &str, version: &str, when: &str) -> String {
    let detail = if message.is_empty() {
        String::new()
    } else {
        format!(r#"<br><span class="message">{}</span>"#, escape(message))
    };
    format!(
        r#"<tr data-agent="{agent}" data-node="{node}"><td>{agent}</td><td>{node_shown}</td><td><span class="state state-{class}">{state}</span>{detail}</td><td>{version}</td><td>{when}</td></tr>"#,
        agent = escape(agent),
        node = escape(node),
        node_shown = if node.is_empty() {
            "–".to_owned()
        } else {
            escape(node)
        },
        class = if state == "connected" {
            "active"
        } else {
            "error"
        },
        state = escape(state),
        version = if version.is_empty() {
            "–".to_owned()
        } else {
            escape(version)
        },
        when = escape(when),
    )
}

pub(super) async fn page(
    State(dash): State<Dash>,
    headers: HeaderMap,
    uri: Uri,
    Path(name): Path<String>,
) -> Response {
    super::explorer::explorer_page(
        &dash,
        &headers,
        &name,
        &super::explorer::here(&uri),
        &format!("{name}: cluster dashboard"),
        |cluster, object| {
            format!(
                r#"<div class="bar"><h1>Cluster dashboard: {cluster}</h1>
<a class="button" href="/clusters/{cluster}/explorer/events">Events</a></div>
<section id="overview" data-view="overview" aria-labelledby="capacity-title">
<h2 id="capacity-title">Capacity</h2>
<p id="overview-status" role="status" aria-live="polite">Reading the cluster…</p>
<p class="error" role="alert" id="overview-error"></p>
<div class="gauges" id="gauges"></div>
<h2>Health</h2>
<dl class="facts" id="health"></dl>
<h2 id="warnings-title">Latest warnings</h2>
<table class="list" id="warnings" aria-labelledby="warnings-title"><thead><tr><th scope="col">Last seen</th><th scope="col">Namespace</th><th scope="col">Object</th><th scope="col">Reason</th><th scope="col">Message</th><th scope="col">Count</th></tr></thead><tbody></tbody></table>
</section>
{agents}"#,
                // Read only once the caller is known to see the cluster.
                agents = agents(object, &dash.health.nodes(&name)),
            )
        },
        "",
    )
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cluster(status: Value) -> Object {
        serde_json::from_value(json!({
            "apiVersion": "management.drover.io/v1", "kind": "Cluster",
            "metadata": {"name": "prod"}, "spec": {}, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_agents_table_says_who_is_connected_since_when_and_at_what_version() {
        let connected = cluster(json!({
            "agentVersion": "0.9.1",
            "conditions": [{"type": "Connected", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
        }));
        let nodes = [
            json!({"name": "node-0", "state": "active", "message": "", "lastHeartbeat": "2026-12-01T10:05:00Z", "facts": {"agentVersion": "0.9.0"}}),
            json!({"name": "node-<1>", "state": "disconnected", "message": "node-agent missed 3 heartbeats", "lastHeartbeat": "2026-12-01T09:00:00Z", "facts": null}),
        ];
        let html = agents(&connected, &nodes);
        assert!(html.contains(r#"<tr data-agent="cluster-agent" data-node=""><td>cluster-agent</td><td>–</td><td><span class="state state-active">connected</span></td><td>0.9.1</td><td>2026-12-01T10:00:00Z</td></tr>"#), "{html}");
        assert!(html.contains(r#"<td>node-0</td><td><span class="state state-active">connected</span></td><td>0.9.0</td><td>2026-12-01T10:05:00Z</td>"#), "{html}");
        // What a node is called is escaped; why an agent is gone is shown.
        assert!(html.contains(r#"<td>node-&lt;1&gt;</td><td><span class="state state-error">disconnected</span><br><span class="message">node-agent missed 3 heartbeats</span></td><td>–</td>"#), "{html}");

        let gone = cluster(
            json!({"conditions": [{"type": "Connected", "status": "False", "message": "cluster-agent disconnected: its session ended", "lastTransitionTime": "2026-12-01T11:00:00Z"}]}),
        );
        let html = agents(&gone, &[]);
        assert!(html.contains("disconnected</span><br><span class=\"message\">cluster-agent disconnected: its session ended</span></td><td>–</td><td>2026-12-01T11:00:00Z"), "{html}");
        assert!(agents(&cluster(json!({})), &[]).contains("never connected"));
    }
}
