//! A hosted cluster's cloud on its page: the provider's own status and version, each node
//! group's status, version and size (owners resize it there), and for owners a form that
//! upgrades the Kubernetes version.

use std::fmt::Write as _;

use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::Response,
};
use serde_json::Value;

use super::{Dash, escape, fragment, readable, text};
use crate::{model::Kind, store::Object};

/// One row per node group the spec names, with what the cloud reports of it and (owners) the
/// buttons that resize it by one within its bounds.
pub(super) fn group_rows(cluster: &Object, owner: bool) -> String {
    let name = &cluster.metadata.name;
    let reported = cluster.status["nodeGroups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut rows = String::new();
    for group in cluster.spec["hosted"]["nodeGroups"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let group_name = text(&group["name"]);
        let cloud = reported
            .iter()
            .find(|g| g["name"] == group["name"])
            .cloned()
            .unwrap_or_default();
        let number = |v: &Value| v.as_u64().unwrap_or_default();
        let (desired, min, max) = (
            number(&group["desiredSize"]),
            number(&group["minSize"]),
            number(&group["maxSize"]),
        );
        let status = match text(&cloud["status"]) {
            s if s.is_empty() => "not made yet".to_owned(),
            s => s,
        };
        let scale = if owner {
            format!(
                r#"<button type="button" class="scale-group" data-cluster="{c}" data-group="{g}" data-by="-1" aria-label="Remove a machine from {g}"{down}>−</button> <button type="button" class="scale-group" data-cluster="{c}" data-group="{g}" data-by="1" aria-label="Add a machine to {g}"{up}>+</button>"#,
                c = escape(name),
                g = escape(&group_name),
                down = if desired <= min { " disabled" } else { "" },
                up = if desired >= max { " disabled" } else { "" },
            )
        } else {
            String::new()
        };
        let _ = write!(
            rows,
            r#"<tr data-name="{g}"><td data-label="Node group">{g}</td><td data-label="Status"><span class="badge">{status}</span></td><td data-label="Version">{version}</td><td data-label="Machines" class="count">{cloud_size}</td><td data-label="Wanted">{desired} ({min}–{max})</td><td data-label="Scale">{scale}</td></tr>"#,
            g = escape(&group_name),
            status = escape(&status),
            version = escape(&text(&cloud["version"])),
            cloud_size = cloud["desiredSize"]
                .as_u64()
                .map(|n| n.to_string())
                .unwrap_or_default(),
        );
    }
    rows
}

/// The cloud's own word on the control plane, as a table's one row.
fn provider_row(cluster: &Object) -> String {
    let provider = &cluster.status["provider"];
    let status = match text(&provider["status"]) {
        s if s.is_empty() => "not made yet".to_owned(),
        s => s,
    };
    format!(
        r#"<tr data-name="control-plane"><td data-label="Control plane">{driver} {region}</td><td data-label="Status"><span class="badge">{status}</span></td><td data-label="Version">{version}</td><td data-label="Wanted">{wanted}</td><td data-label="Endpoint">{endpoint}</td></tr>"#,
        driver = escape(&text(&cluster.spec["hosted"]["driver"]).to_uppercase()),
        region = escape(&text(&cluster.spec["hosted"]["region"])),
        status = escape(&status),
        version = escape(&text(&provider["version"])),
        wanted = escape(&text(&cluster.spec["hosted"]["kubernetesVersion"])),
        endpoint = escape(&text(&provider["endpoint"])),
    )
}

/// The section of the cluster page, for a hosted cluster.
pub(super) fn section(cluster: &Object, owner: bool) -> String {
    let name = escape(&cluster.metadata.name);
    let groups = group_rows(cluster, owner);
    let provider = provider_row(cluster);
    let upgrade = if owner {
        let current = text(&cluster.spec["hosted"]["kubernetesVersion"]);
        let next = crate::model::minor_version(&current)
            .map(|(major, minor)| format!("{major}.{}", minor + 1))
            .unwrap_or_default();
        format!(
            r#"<form id="upgrade-hosted" data-cluster="{name}" aria-label="Upgrade the Kubernetes version">
<label for="hosted-version">Kubernetes version</label>
<input id="hosted-version" name="version" required pattern="[0-9]+\.[0-9]+" value="{next}" aria-describedby="hosted-version-help">
<p class="help" id="hosted-version-help">The control plane moves one minor version at a time, then each node group in turn.</p>
<button type="submit">Upgrade</button>
</form>"#,
            next = escape(&next),
        )
    } else {
        String::new()
    };
    format!(
        r#"<h2>Cloud</h2>
<table class="list" id="hosted-provider" data-watch="/v1/clusters?watch=true" data-rows="/clusters/{name}/hosted?part=provider" data-poll="10">
<thead><tr><th scope="col">Control plane</th><th scope="col">Status</th><th scope="col">Version</th><th scope="col">Wanted</th><th scope="col">Endpoint</th></tr></thead>
<tbody>{provider}</tbody></table>
<table class="list" id="node-groups" data-watch="/v1/clusters?watch=true" data-rows="/clusters/{name}/hosted?part=rows" data-poll="10">
<thead><tr><th scope="col">Node group</th><th scope="col">Status</th><th scope="col">Version</th><th scope="col">Machines</th><th scope="col">Wanted</th><th scope="col"><span class="visually-hidden">Scale</span></th></tr></thead>
<tbody>{groups}</tbody></table>
<p class="error" role="alert" id="hosted-error"></p>
{upgrade}"#
    )
}

/// `/clusters/{name}/hosted?part=rows|provider`: the live rows.
pub(super) async fn rows(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let (principal, cluster) = match readable(&dash, &headers, Kind::Cluster, &name, None).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let owner = super::owns(&principal, &name);
    if query.get("part").map(String::as_str) == Some("provider") {
        fragment(provider_row(&cluster))
    } else {
        fragment(group_rows(&cluster, owner))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn groups_show_the_clouds_size_and_owners_resize_within_bounds() {
        let mut cluster = Object::new(
            "Cluster",
            "shop",
            json!({"type": "hosted", "hosted": {"driver": "eks", "region": "eu-west-1",
                   "kubernetesVersion": "1.31", "nodeGroups": [
                {"name": "small", "desiredSize": 1, "minSize": 1, "maxSize": 3},
                {"name": "big<x>", "desiredSize": 3, "minSize": 1, "maxSize": 3}]}}),
        );
        cluster.status = json!({"nodeGroups": [
            {"name": "small", "status": "ACTIVE", "version": "1.31", "desiredSize": 1}]});
        let owner = group_rows(&cluster, true);
        assert!(
            owner.contains(r#"data-label="Machines" class="count">1<"#),
            "{owner}"
        );
        assert!(owner.contains("not made yet"), "{owner}");
        assert!(owner.contains("big&lt;x&gt;"), "{owner}");
        // At its minimum it cannot go lower; at its maximum, not higher.
        assert!(owner.contains(r#"data-group="small" data-by="-1" aria-label="Remove a machine from small" disabled"#), "{owner}");
        assert!(
            owner
                .contains(r#"data-group="small" data-by="1" aria-label="Add a machine to small">"#),
            "{owner}"
        );
        assert!(
            owner.contains(r#"data-by="1" aria-label="Add a machine to big&lt;x&gt;" disabled"#),
            "{owner}"
        );
        let reader = group_rows(&cluster, false);
        assert!(!reader.contains("button"), "{reader}");
        assert!(!section(&cluster, false).contains("upgrade-hosted"));
        assert!(section(&cluster, true).contains(r#"value="1.32""#));
    }
}
