//! A custom cluster's machine pools on its page: each pool with its template, roles and how
//! many of its machines run (owners scale it there), its machines with their phase and the step
//! that fails, and for owners a form that adds a pool.

use std::fmt::Write as _;

use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{Dash, escape, fragment, readable, text};
use crate::{
    api::{ApiError, present},
    model::Kind,
    store::{LabelSelector, Object},
};

/// The cluster's machines, oldest first, as the API shows them.
async fn machines_of(dash: &Dash, cluster: &str) -> Result<Vec<Value>, ApiError> {
    let (mut machines, _) = dash
        .api
        .store
        .list(Kind::Machine.name(), &LabelSelector::everything())
        .await?;
    machines.retain(|m| m.spec["cluster"].as_str() == Some(cluster));
    machines.sort_by(|a, b| {
        (&a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
    });
    Ok(machines
        .into_iter()
        .map(|m| present(Kind::Machine, m))
        .collect())
}

fn roles_of(pool: &Value) -> String {
    let roles = &pool["roles"];
    [
        ("etcd", "etcd"),
        ("controlPlane", "control plane"),
        ("worker", "worker"),
    ]
    .iter()
    .filter(|(k, _)| roles[*k] == true)
    .map(|(_, label)| *label)
    .collect::<Vec<_>>()
    .join(", ")
}

/// One row per pool: its template, roles, machines running of its quantity, and (owners) the
/// buttons that scale it by one.
pub(super) fn pool_rows(cluster: &Object, machines: &[Value], owner: bool) -> String {
    let mut rows = String::new();
    let name = &cluster.metadata.name;
    for pool in cluster.spec["machinePools"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let pool_name = text(&pool["name"]);
        let quantity = pool["quantity"].as_u64().unwrap_or_default();
        let mine: Vec<&Value> = machines
            .iter()
            .filter(|m| m["spec"]["pool"] == pool["name"])
            .collect();
        let running = mine
            .iter()
            .filter(|m| {
                m["status"]["phase"] == "Running" && m["metadata"]["deletionTimestamp"].is_null()
            })
            .count();
        let scale = if owner {
            format!(
                r#"<button type="button" class="scale" data-cluster="{c}" data-pool="{p}" data-by="-1" aria-label="Remove a machine from {p}"{off}>−</button> <button type="button" class="scale" data-cluster="{c}" data-pool="{p}" data-by="1" aria-label="Add a machine to {p}">+</button>"#,
                c = escape(name),
                p = escape(&pool_name),
                off = if quantity == 0 { " disabled" } else { "" },
            )
        } else {
            String::new()
        };
        let _ = write!(
            rows,
            r#"<tr data-name="{p}"><td data-label="Pool">{p}</td><td data-label="Template">{t}</td><td data-label="Roles">{r}</td><td data-label="Machines" class="count">{running}/{quantity}</td><td data-label="Scale">{scale}</td></tr>"#,
            p = escape(&pool_name),
            t = escape(&text(&pool["template"])),
            r = escape(&roles_of(pool)),
        );
    }
    rows
}

/// One row per machine: its pool, phase, address, host, template and the failing step.
pub(super) fn machine_rows(machines: &[Value]) -> String {
    let mut rows = String::new();
    for m in machines {
        let phase = text(&m["status"]["phase"]);
        let _ = write!(
            rows,
            r#"<tr data-name="{n}"><td data-label="Machine">{n}</td><td data-label="Pool">{pool}</td><td data-label="Phase"><span class="badge phase-{phase_class}">{phase}</span></td><td data-label="Address">{address}</td><td data-label="Host">{host}</td><td data-label="Template">{template}</td><td data-label="Message"><span class="message">{message}</span></td></tr>"#,
            n = escape(&text(&m["metadata"]["name"])),
            pool = escape(&text(&m["spec"]["pool"])),
            phase_class = escape(&phase.to_lowercase()),
            phase = escape(&phase),
            address = escape(&text(&m["status"]["addresses"][0])),
            host = escape(&text(&m["status"]["host"])),
            template = escape(&text(&m["spec"]["template"])),
            message = escape(&text(&m["status"]["message"])),
        );
    }
    rows
}

/// The machine templates as a select's options ("name (driver)").
pub(super) async fn template_options(dash: &Dash) -> Result<String, ApiError> {
    let (templates, _) = dash
        .api
        .store
        .list(Kind::MachineTemplate.name(), &LabelSelector::everything())
        .await?;
    Ok(templates
        .iter()
        .map(|t| {
            format!(
                r#"<option value="{n}">{n} ({d})</option>"#,
                n = escape(&t.metadata.name),
                d = escape(&text(&t.spec["driver"]))
            )
        })
        .collect())
}

/// The section of the cluster page, for a custom cluster.
pub(super) async fn section(
    dash: &Dash,
    cluster: &Object,
    owner: bool,
) -> Result<String, ApiError> {
    let name = escape(&cluster.metadata.name);
    let machines = machines_of(dash, &cluster.metadata.name).await?;
    let pools = pool_rows(cluster, &machines, owner);
    let rows = machine_rows(&machines);
    let add = if owner {
        let options = template_options(dash).await?;
        format!(
            r#"<form id="add-pool" data-cluster="{name}" aria-label="Add a machine pool">
<label for="pool-name">New pool</label>
<input id="pool-name" name="name" required pattern="[a-z0-9]([a-z0-9\-]*[a-z0-9])?" maxlength="20" placeholder="name">
<label for="pool-template">Template</label>
<select id="pool-template" name="template" required>{options}</select>
<label for="pool-quantity">Machines</label>
<input id="pool-quantity" name="quantity" type="number" min="0" max="1000" value="1" required>
<fieldset><legend>Roles</legend>
<label><input type="checkbox" name="etcd"> etcd</label>
<label><input type="checkbox" name="controlPlane"> control plane</label>
<label><input type="checkbox" name="worker" checked> worker</label>
</fieldset>
<button type="submit">Add pool</button>
</form>"#
        )
    } else {
        String::new()
    };
    if pools.is_empty() && add.is_empty() {
        return Ok(String::new());
    }
    Ok(format!(
        r#"<h2>Machine pools</h2>
<table class="list" id="pools" data-watch="/v1/machines?watch=true" data-rows="/clusters/{name}/pools?part=rows" data-poll="10">
<thead><tr><th scope="col">Pool</th><th scope="col">Template</th><th scope="col">Roles</th><th scope="col">Running</th><th scope="col"><span class="visually-hidden">Scale</span></th></tr></thead>
<tbody>{pools}</tbody></table>
<table class="list" id="pool-machines" data-watch="/v1/machines?watch=true" data-rows="/clusters/{name}/pool-machines?part=rows" data-poll="10">
<thead><tr><th scope="col">Machine</th><th scope="col">Pool</th><th scope="col">Phase</th><th scope="col">Address</th><th scope="col">Host</th><th scope="col">Template</th><th scope="col">Message</th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="error" role="alert" id="pool-error"></p>
{add}"#
    ))
}

/// `/clusters/{name}/pools?part=rows`: the pools' live rows.
pub(super) async fn pools(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let (principal, cluster) = match readable(&dash, &headers, Kind::Cluster, &name, None).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let owner = super::owns(&principal, &name);
    match machines_of(&dash, &name).await {
        Ok(machines) => fragment(pool_rows(&cluster, &machines, owner)),
        Err(e) => e.into_response(),
    }
}

/// `/clusters/{name}/pool-machines?part=rows`: the machines' live rows.
pub(super) async fn machines(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    if let Err(response) = readable(&dash, &headers, Kind::Cluster, &name, None).await {
        return response;
    }
    match machines_of(&dash, &name).await {
        Ok(machines) => fragment(machine_rows(&machines)),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn pools_show_running_of_quantity_and_only_owners_get_scale_buttons() {
        let cluster = Object::new(
            "Cluster",
            "edge",
            json!({"type": "custom", "machinePools": [
                {"name": "workers", "quantity": 2, "template": "cloud-<v1>", "roles": {"worker": true}},
                {"name": "main", "quantity": 0, "template": "cloud", "roles": {"etcd": true, "controlPlane": true}}]}),
        );
        let machines = [
            json!({"metadata": {"name": "edge-workers-a"}, "spec": {"pool": "workers"},
                   "status": {"phase": "Running"}}),
            json!({"metadata": {"name": "edge-workers-b"}, "spec": {"pool": "workers"},
                   "status": {"phase": "Bootstrapping"}}),
        ];
        let owner = pool_rows(&cluster, &machines, true);
        assert!(
            owner.contains(r#"data-label="Machines" class="count">1/2<"#),
            "{owner}"
        );
        assert!(owner.contains("cloud-&lt;v1&gt;"), "{owner}");
        assert!(owner.contains("etcd, control plane"), "{owner}");
        assert!(
            owner.contains(r#"data-pool="workers" data-by="1""#),
            "{owner}"
        );
        // A pool at 0 cannot go lower.
        assert!(
            owner.contains(
                r#"data-pool="main" data-by="-1" aria-label="Remove a machine from main" disabled"#
            ),
            "{owner}"
        );
        let reader = pool_rows(&cluster, &machines, false);
        assert!(!reader.contains("button"), "{reader}");
    }
}
