//! The clusters list, creating a cluster, and a cluster's page (its machines, conditions,
//! projects and their members, events, kubeconfig and registration commands).

use std::fmt::Write as _;

use axum::{
    extract::{Path, Query, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{
    Dash, caller, charts, escape,
    fleet::{self, FleetQuery},
    fragment, gib, machines, page, readable, state_cell, text,
};
use crate::{
    api::{ApiError, allow, present},
    auth::{Principal, Verb},
    health::ClusterSummary,
    model::Kind,
    store::LabelSelector,
};

/// A cluster as a table row of the clusters page.
fn cluster_row(object: &Value, summary: ClusterSummary) -> String {
    let name = text(&object["metadata"]["name"]);
    let state = text(&object["state"]["state"]);
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
    let agents = summary.agents;
    let usage = match summary.cpu_percent() {
        Some(cpu) => format!(
            "CPU {cpu:.0}%, memory {}",
            gib(summary.memory_used, summary.memory_total)
        ),
        None => "–".to_owned(),
    };
    let created = text(&object["metadata"]["creationTimestamp"]);
    format!(
        r#"<tr data-name="{name}" data-state="{state_attr}">
<td data-label="Name"><a href="/clusters/{name}">{name}</a></td>
<td data-label="State">{state}</td>
<td data-label="Type">{kind}</td>
<td data-label="Kubernetes">{version}</td>
<td data-label="Nodes ready">{nodes}</td>
<td data-label="Use">{usage}</td>
<td data-label="Agents">{agents}</td>
<td data-label="Age"><time datetime="{created}">{created}</time></td>
</tr>"#,
        name = escape(&name),
        state_attr = escape(&state),
        state = state_cell(
            &state,
            object["state"]["message"].as_str().unwrap_or_default()
        ),
        kind = escape(&kind),
        version = escape(if version.is_empty() { "–" } else { &version }),
        usage = escape(&usage),
        created = escape(&created),
    )
}

/// The clusters page: a view of every cluster the caller may see, 50 rows at a time.
pub(super) async fn list(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Query(query): Query<FleetQuery>,
) -> Response {
    let here = format!("/clusters?{}", query.link(None, None));
    let principal = match caller(&dash.api, &headers, &here).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let reads = fleet::Reads {
        version: |o| text(&o.status["kubernetesVersion"]),
        also: |_| String::new(),
    };
    let (selection, error) =
        match fleet::view(&dash, &principal, Kind::Cluster, &query, reads).await {
            Ok(view) => view,
            Err(e) => return e.into_response(),
        };
    let summaries = dash.health.cluster_summaries();
    let rows: String = selection
        .shown
        .iter()
        .map(|e| {
            let shown = present(Kind::Cluster, e.object.clone());
            let summary = summaries.get(&e.object.metadata.name).copied();
            cluster_row(&shown, summary.unwrap_or_default())
        })
        .collect();
    let section = format!(
        r#"{error}{pager}
<table class="list" id="clusters">
<thead><tr>
{name}
{state}
<th scope="col">Type</th>
{version}
<th scope="col">Nodes ready</th>
<th scope="col">Use</th>
<th scope="col">Agents</th>
{age}
</tr></thead>
<tbody>{rows}</tbody>
</table>
{empty}"#,
        pager = fleet::pager(&query, &selection, "clusters"),
        name = fleet::heading(&query, "name", "Name"),
        state = fleet::heading(&query, "state", "State"),
        version = fleet::heading(&query, "version", "Kubernetes"),
        age = fleet::heading(&query, "age", "Age"),
        empty = fleet::empty("/clusters", &query, &selection, "No clusters yet."),
    );
    if query.rows() {
        return fragment(section);
    }
    let create = if principal.may_globally("create", Kind::Cluster, None) {
        r#"<a class="button" href="/clusters/new">Create cluster</a>"#
    } else {
        ""
    };
    let content = format!(
        r#"<div class="bar">
<h1>Clusters</h1>
{create}
<button type="button" id="hub-kubeconfig" title="kubectl then manages the hub's own objects: kubectl get clusters">Download the hub's kubeconfig</button>
</div>
<p class="error" role="alert" id="hub-kubeconfig-error"></p>
{filters}
<section id="fleet" data-watch="/v1/clusters?watch=true" data-rows="/clusters?part=rows&amp;{view}" data-poll="15">
{section}
</section>"#,
        filters = fleet::filters(
            "/clusters",
            &query,
            &selection,
            ("Name contains", "Kubernetes")
        ),
        view = escape(&query.link(None, None)),
    );
    page("Clusters", Some(&principal), "clusters", &content)
}

pub(super) async fn create(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let principal = match caller(&dash.api, &headers, "/clusters/new").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    if !principal.may_globally("create", Kind::Cluster, None) {
        return page(
            "Create cluster",
            Some(&principal),
            "clusters",
            r#"<section class="card"><h1>Create cluster</h1><p>Only admins, and those a global role lets (clusters-create), create clusters.</p></section>"#,
        );
    }
    // Pools need a template to make their machines from; without one the page says how to add one.
    let options = match super::pools::template_options(&dash).await {
        Ok(options) => options,
        Err(e) => return super::error_page(&principal, &e),
    };
    let pools = if options.is_empty() {
        r#"<p class="help" id="no-templates">No machine templates yet: create one (<code>POST /v1/machinetemplates</code>) for the hub to make machines; until then, run the host command on hosts of your own.</p>"#.to_owned()
    } else {
        format!(
            r#"<fieldset id="new-pools" aria-describedby="pools-help">
<legend>Machine pools</legend>
<p class="help" id="pools-help">Machines the hub makes from a template; leave the name empty for none.</p>
<div class="pool-row">
<label>Pool name <input name="pool-name" pattern="[a-z0-9]([a-z0-9\-]*[a-z0-9])?" maxlength="20"></label>
<label>Template <select name="pool-template">{options}</select></label>
<label>Machines <input name="pool-quantity" type="number" min="0" max="1000" value="1"></label>
<label class="check"><input type="checkbox" name="pool-etcd" checked> etcd</label>
<label class="check"><input type="checkbox" name="pool-controlPlane" checked> control plane</label>
<label class="check"><input type="checkbox" name="pool-worker" checked> worker</label>
</div>
<button type="button" id="another-pool">Add another pool</button>
</fieldset>"#
        )
    };
    let content = format!(
        r#"<section class="card">
<h1>Create cluster</h1>
<form id="create-cluster">
<label for="name">Name</label>
<input id="name" name="name" required pattern="[a-z0-9]([a-z0-9\-]*[a-z0-9])?" maxlength="63" aria-describedby="name-help">
<p class="help" id="name-help">Lower-case letters, digits and '-'.</p>
<fieldset>
<legend>Type</legend>
<label><input type="radio" name="type" value="imported" checked> Import an existing cluster</label>
<label><input type="radio" name="type" value="custom"> Install K3s or RKE2 on my hosts</label>
<label><input type="radio" name="type" value="hosted"> Have Amazon EKS run it (hosted)</label>
</fieldset>
<div id="hosted-fields" hidden>
<label for="hosted-credential">Credential (an AWS access key)</label>
<input id="hosted-credential" name="credential" aria-describedby="hosted-credential-help">
<p class="help" id="hosted-credential-help">The name of a CloudCredential of driver amazonec2 you may use.</p>
<label for="hosted-region">Region</label>
<input id="hosted-region" name="region" placeholder="eu-west-1">
<label for="hosted-kubernetes">Kubernetes version</label>
<input id="hosted-kubernetes" name="kubernetesVersion" value="1.31">
<label for="hosted-role">Cluster role ARN</label>
<input id="hosted-role" name="roleArn" placeholder="arn:aws:iam::ACCOUNT:role/NAME">
<label for="hosted-node-role">Node role ARN</label>
<input id="hosted-node-role" name="nodeRole" placeholder="arn:aws:iam::ACCOUNT:role/NAME">
<label for="hosted-subnets">Subnets</label>
<input id="hosted-subnets" name="subnets" placeholder="subnet-0a…, subnet-0b…" aria-describedby="hosted-subnets-help">
<p class="help" id="hosted-subnets-help">Separated by commas.</p>
<label for="hosted-endpoint">EKS endpoint (optional)</label>
<input id="hosted-endpoint" name="endpoint" placeholder="default: AWS's for the region">
<label for="hosted-endpoint-ca">The endpoint's CA, PEM (optional)</label>
<textarea id="hosted-endpoint-ca" name="endpointCA" rows="3"></textarea>
<fieldset id="new-groups">
<legend>Node groups</legend>
<div class="group-row">
<label>Name <input name="group-name" value="main"></label>
<label>Instance type <input name="group-instanceType" value="t3.large"></label>
<label>Machines <input name="group-desiredSize" type="number" min="0" value="2"></label>
<label>At least <input name="group-minSize" type="number" min="0" value="1"></label>
<label>At most <input name="group-maxSize" type="number" min="1" value="5"></label>
</div>
<button type="button" id="another-group">Add another node group</button>
</fieldset>
</div>
<div id="custom-fields" hidden>
<label for="distribution">Distribution</label>
<select id="distribution" name="distribution"><option value="k3s">K3s</option><option value="rke2">RKE2</option></select>
<label for="version">Version</label>
<input id="version" name="version" value="v1.33.4+k3s1">
<label for="cp-concurrency">Control planes upgraded at once</label>
<input id="cp-concurrency" name="controlPlaneConcurrency" value="1">
<label for="worker-concurrency">Workers upgraded at once</label>
<input id="worker-concurrency" name="workerConcurrency" value="10%">
{pools}
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
</section>"#
    );
    page("Create cluster", Some(&principal), "clusters", &content)
}

/// A cluster's conditions as table rows.
fn condition_rows(shown: &Value) -> String {
    let mut rows = String::new();
    for c in shown["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let _ = write!(
            rows,
            r#"<tr data-name="{kind}"><td data-label="Condition">{kind}</td><td data-label="Status">{}</td><td data-label="Reason">{}</td><td data-label="Message">{}</td></tr>"#,
            escape(&text(&c["status"])),
            escape(&text(&c["reason"])),
            escape(&text(&c["message"])),
            kind = escape(&text(&c["type"])),
        );
    }
    rows
}

/// `/clusters/{name}/conditions`: the live rows of the cluster page's conditions.
pub(super) async fn conditions(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let (_, object) = match readable(&dash, &headers, Kind::Cluster, &name, None).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    fragment(condition_rows(&present(Kind::Cluster, object)))
}

/// The rows of a cluster's machines: its hosts (custom) or its node-agents' nodes (imported).
async fn machine_rows(dash: &Dash, principal: &Principal, name: &str) -> Result<String, ApiError> {
    let now = charts::now_minute();
    let mut rows = String::new();
    let (hosts, _) = dash
        .api
        .store
        .list(Kind::Host.name(), &LabelSelector::everything())
        .await?;
    let plans = machines::readable_plans(dash, principal).await?;
    for host in hosts
        .into_iter()
        .filter(|h| h.spec["cluster"].as_str() == Some(name))
    {
        let plan = plans.get(&host.metadata.name);
        rows.push_str(&machines::host_row(
            &present(Kind::Host, host),
            plan,
            &dash.health,
            now,
        ));
    }
    for node in dash.health.nodes(name) {
        rows.push_str(&machines::node_row(name, &node, &dash.health, now));
    }
    Ok(rows)
}

/// The cluster's projects the caller may see, each with its members (user or group, and role)
/// and the label that puts a namespace in it.
async fn project_rows(
    dash: &Dash,
    principal: &Principal,
    name: &str,
    owner: bool,
) -> Result<String, ApiError> {
    let everything = LabelSelector::everything();
    let (projects, _) = dash
        .api
        .store
        .list(Kind::Project.name(), &everything)
        .await?;
    let (bindings, _) = dash
        .api
        .store
        .list(Kind::RoleBinding.name(), &everything)
        .await?;
    let mut rows = String::new();
    for project in projects.into_iter().filter(|p| {
        p.spec["cluster"].as_str() == Some(name)
            && allow(principal, Verb::Get, Kind::Project, p).is_ok()
    }) {
        let project_name = &project.metadata.name;
        let members: Vec<String> = bindings
            .iter()
            .filter(|b| b.spec["project"].as_str() == Some(project_name))
            .map(|b| {
                let who = match (b.spec["user"].as_str(), b.spec["group"].as_str()) {
                    (Some(user), _) => escape(user),
                    (None, Some(group)) => format!("group {}", escape(group)),
                    _ => String::new(),
                };
                let remove = if owner {
                    format!(
                        r#" <button type="button" class="danger delete" data-path="/v1/rolebindings/{binding}" aria-label="Remove {who} from {project}">Remove</button>"#,
                        binding = escape(&b.metadata.name),
                        project = escape(project_name),
                    )
                } else {
                    String::new()
                };
                format!(
                    "<span class=\"member\">{who} ({}){remove}</span>",
                    escape(&super::people::role_of(&b.spec))
                )
            })
            .collect();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td><code>drover.io/project={}</code></td><td>{}</td></tr>",
            escape(project_name),
            escape(project.spec["displayName"].as_str().unwrap_or("")),
            escape(project_name),
            if members.is_empty() {
                "none".to_owned()
            } else {
                members.join(", ")
            },
        ));
    }
    Ok(rows)
}

/// The cluster's etcd snapshots, newest first; for owners with Restore and Delete buttons.
async fn snapshot_rows(dash: &Dash, principal: &Principal, name: &str) -> Result<String, ApiError> {
    let (mut snapshots, _) = dash
        .api
        .store
        .list(Kind::EtcdSnapshot.name(), &LabelSelector::everything())
        .await?;
    snapshots.retain(|s| {
        s.spec["cluster"].as_str() == Some(name)
            && allow(principal, Verb::Get, Kind::EtcdSnapshot, s).is_ok()
    });
    snapshots.sort_by(|a, b| {
        (&b.metadata.creation_timestamp, &b.metadata.name)
            .cmp(&(&a.metadata.creation_timestamp, &a.metadata.name))
    });
    let owner = super::owns(principal, name);
    let generation = match dash.api.store.get(Kind::Cluster.name(), name).await {
        Ok(c) => c.spec["restore"]["generation"].as_u64().unwrap_or(0) + 1,
        Err(_) => 1,
    };
    let mut rows = String::new();
    for snapshot in snapshots {
        let shown = present(Kind::EtcdSnapshot, snapshot);
        let snap = escape(shown["metadata"]["name"].as_str().unwrap_or(""));
        let status = &shown["status"];
        let actions = if owner {
            let restore = if shown["state"]["state"] == "active" {
                format!(
                    r#"<button type="button" class="snapshot-restore" data-cluster="{cluster}" data-snapshot="{snap}" data-generation="{generation}" aria-label="Restore the cluster from {snap}">Restore</button> "#,
                    cluster = escape(name),
                )
            } else {
                String::new()
            };
            format!(
                r#"{restore}<button type="button" class="danger snapshot-delete" data-path="/v1/etcdsnapshots/{snap}" aria-label="Delete snapshot {snap}">Delete</button>"#
            )
        } else {
            String::new()
        };
        let size = status["size"]
            .as_u64()
            .map(|b| format!("{:.1} KiB", b as f64 / 1024.0))
            .unwrap_or_default();
        let _ = write!(
            rows,
            "<tr data-name=\"{snap}\"><td>{snap}{scheduled}</td><td>{state}</td><td>{host}</td><td>{size}</td><td>{created}</td><td>{version}</td><td><code>{sha}</code></td><td>{actions}</td></tr>",
            scheduled = if shown["spec"]["scheduled"] == true {
                " <small>(scheduled)</small>"
            } else {
                ""
            },
            state = state_cell(
                shown["state"]["state"].as_str().unwrap_or(""),
                shown["state"]["message"].as_str().unwrap_or("")
            ),
            host = escape(&text(&status["host"])),
            created = escape(&text(&status["createdAt"])),
            version = escape(&text(&status["version"])),
            sha = escape(&text(&status["sha256"]).chars().take(12).collect::<String>()),
        );
    }
    Ok(rows)
}

/// The live parts of a cluster's page.
enum Part {
    Machines,
    Snapshots,
    Bundles,
}

/// A cluster page's live rows, for whoever may read the cluster.
async fn part(dash: &Dash, headers: &HeaderMap, name: &str, which: Part) -> Response {
    let (principal, _) = match readable(dash, headers, Kind::Cluster, name, None).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let rows = match which {
        Part::Machines => machine_rows(dash, &principal, name).await,
        Part::Snapshots => snapshot_rows(dash, &principal, name).await,
        Part::Bundles => super::delivery::cluster_bundle_rows(dash, &principal, name).await,
    };
    match rows {
        Ok(rows) => fragment(rows),
        Err(e) => e.into_response(),
    }
}

/// `/clusters/{name}/snapshots?part=rows`: the live rows of the cluster page's snapshots.
pub(super) async fn snapshots(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    part(&dash, &headers, &name, Part::Snapshots).await
}

/// `/clusters/{name}/bundles`: the live rows of the cluster page's bundles.
pub(super) async fn bundles(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    part(&dash, &headers, &name, Part::Bundles).await
}

/// `/clusters/{name}/machines?part=rows`: the live rows of the cluster page's machines.
pub(super) async fn machines(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    part(&dash, &headers, &name, Part::Machines).await
}

pub(super) async fn one(
    State(dash): State<Dash>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let here = format!("/clusters/{name}");
    let (principal, object) =
        match readable(&dash, &headers, Kind::Cluster, &name, Some(&here)).await {
            Ok(found) => found,
            Err(response) => return response,
        };
    let owner = super::owns(&principal, &name);
    let custom = object.spec["type"] == "custom";
    let pools = if custom {
        match super::pools::section(&dash, &object, owner).await {
            Ok(section) => section,
            Err(e) => return e.into_response(),
        }
    } else if object.spec["type"] == "hosted" {
        super::hosted::section(&object, owner)
    } else {
        String::new()
    };
    let shown = present(Kind::Cluster, object);
    let conditions = condition_rows(&shown);
    let machines = match machine_rows(&dash, &principal, &name).await {
        Ok(rows) => rows,
        Err(e) => return e.into_response(),
    };
    let rows = match project_rows(&dash, &principal, &name, owner).await {
        Ok(rows) => rows,
        Err(e) => return e.into_response(),
    };
    let has_projects = !rows.is_empty();
    let bundles = match super::delivery::cluster_bundle_rows(&dash, &principal, &name).await {
        Ok(rows) => rows,
        Err(e) => return e.into_response(),
    };
    let mut projects = if has_projects {
        format!(
            r#"<table class="list" id="projects"><thead><tr><th scope="col">Project</th><th scope="col">Display name</th><th scope="col">Namespaces labelled</th><th scope="col">Members</th></tr></thead><tbody>{rows}</tbody></table>"#
        )
    } else {
        "<p>No projects. A project groups namespaces under one set of members and secrets.</p>"
            .to_owned()
    };
    if owner {
        // Owners make projects and give people roles on them (the API checks again).
        let _ = write!(
            projects,
            r#"<form id="create-project" data-cluster="{cluster}" aria-label="New project">
<label for="project-name">New project</label>
<input id="project-name" name="name" required pattern="[a-z]([a-z0-9\-]*[a-z0-9])?" maxlength="63" placeholder="name">
<label for="project-display">Display name</label>
<input id="project-display" name="displayName">
<button type="submit">Create project</button>
<p class="error" role="alert" id="project-error"></p>
</form>"#,
            cluster = escape(&name),
        );
    }
    if owner && has_projects {
        let catalog = match crate::roles::Catalog::read(dash.api.store.as_ref()).await {
            Ok(c) => c,
            Err(e) => return ApiError::from(e).into_response(),
        };
        // Members are given to a project that exists.
        let _ = write!(
            projects,
            r#"<form id="create-project-member" data-cluster="{cluster}" aria-label="Add a project member">
<label for="member-project">Project</label>
<input id="member-project" name="project" required pattern="[a-z]([a-z0-9\-]*[a-z0-9])?">
<label for="member-user">User</label>
<input id="member-user" name="user" required>
<label for="member-role">Role</label>
<select id="member-role" name="role">{options}</select>
<button type="submit">Add member</button>
<p class="error" role="alert" id="member-error"></p>
</form>"#,
            cluster = escape(&name),
            options =
                super::roles::template_options(&catalog, crate::model::TemplateContext::Project),
        );
    }
    let snapshots = if custom {
        let rows = match snapshot_rows(&dash, &principal, &name).await {
            Ok(rows) => rows,
            Err(e) => return e.into_response(),
        };
        let take = if owner {
            format!(
                r#"<form id="create-snapshot" data-cluster="{cluster}">
<label for="snapshot-name">Snapshot name</label>
<input id="snapshot-name" name="name" pattern="[a-z]([a-z0-9\-]*[a-z0-9])?" maxlength="63" placeholder="optional">
<label><input type="checkbox" name="copyToHub" id="snapshot-copy"> Keep a copy on the hub</label>
<button type="submit">Take snapshot</button>
<p class="error" role="alert" id="snapshot-error"></p>
</form>"#,
                cluster = escape(&name)
            )
        } else {
            String::new()
        };
        format!(
            r#"<h2>etcd snapshots</h2>
<table class="list" id="snapshots" data-watch="/v1/etcdsnapshots?watch=true" data-rows="/clusters/{title}/snapshots?part=rows" data-poll="15">
<thead><tr><th scope="col">Name</th><th scope="col">State</th><th scope="col">Host</th><th scope="col">Size</th><th scope="col">Taken</th><th scope="col">Version</th><th scope="col">sha256</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="error" role="alert" id="snapshot-action-error"></p>
{take}"#,
            title = escape(&name)
        )
    } else {
        String::new()
    };
    let register = if owner {
        let what = if custom {
            "Run it on each host (as root), with --etcd, --controlplane or --worker for its roles."
        } else {
            "Run it where kubectl reaches the cluster."
        };
        format!(
            r#"<button type="button" id="new-registration" data-cluster="{name}">New registration command</button>
<div id="registration" hidden><p>{what}</p><div class="command"><code id="registration-command"></code><button type="button" class="copy" data-copy="registration-command" aria-label="Copy the registration command">Copy</button></div></div>
<p class="error" role="alert" id="registration-error"></p>"#,
            name = escape(&name),
        )
    } else {
        String::new()
    };
    // A custom cluster's owner pauses and resumes the planner here (what the paused state's
    // message asks for).
    let pause = if owner && custom {
        let paused = shown["spec"]["paused"] == true;
        format!(
            r#"<button type="button" id="pause" data-cluster="{name}" data-paused="{paused}">{label}</button>
<p class="error" role="alert" id="pause-error"></p>"#,
            name = escape(&name),
            label = if paused {
                "Resume provisioning"
            } else {
                "Pause provisioning"
            },
        )
    } else {
        String::new()
    };
    let remove = if owner {
        match removal(&dash, &shown, &name).await {
            Ok(section) => section,
            Err(e) => return e.into_response(),
        }
    } else {
        String::new()
    };
    let summary = dash
        .health
        .cluster_summaries()
        .remove(&name)
        .unwrap_or_default();
    let events_url = format!(
        "/v1/events?cluster={}&watch=true",
        form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
    );
    let content = format!(
        r#"<div class="bar"><h1>{title}</h1>
<a class="button" id="explore" href="/clusters/{title}/explorer">Explore its workloads</a>
<button type="button" id="kubeconfig" data-cluster="{title}">Download kubeconfig</button></div>
<table class="list" id="cluster" data-watch="/v1/clusters?watch=true" data-rows="/clusters?part=rows" data-only="{title}" data-poll="15">
<thead><tr><th scope="col">Name</th><th scope="col">State</th><th scope="col">Type</th><th scope="col">Kubernetes</th><th scope="col">Nodes ready</th><th scope="col">Use</th><th scope="col">Agents</th><th scope="col">Age</th></tr></thead>
<tbody>{row}</tbody></table>
<p class="error" role="alert" id="kubeconfig-error"></p>
{pause}
{register}
{remove}
<h2>{machines_title}</h2>
<table class="list" id="machines" data-watch="/v1/hosts?watch=true" data-rows="/clusters/{title}/machines?part=rows" data-poll="10">
<thead><tr><th scope="col">Name</th><th scope="col">State</th><th scope="col">Roles</th><th scope="col">Provisioning</th><th scope="col">CPU, last hour</th><th scope="col">Memory</th></tr></thead>
<tbody>{machines}</tbody>
</table>
{pools}
{snapshots}
<h2>Bundles</h2>
<table class="list" id="bundles" data-watch="/v1/bundledeployments?watch=true" data-rows="/clusters/{title}/bundles">
<thead><tr><th scope="col">Bundle</th><th scope="col">State</th><th scope="col">Objects</th></tr></thead>
<tbody>{bundles}</tbody></table>
<h2>Projects</h2>
{projects}
<h2>Conditions</h2>
<table class="list" id="conditions" data-watch="/v1/clusters?watch=true" data-rows="/clusters/{title}/conditions"><thead><tr><th scope="col">Condition</th><th scope="col">Status</th><th scope="col">Reason</th><th scope="col">Message</th></tr></thead><tbody>{conditions}</tbody></table>
<h2>Events</h2>
<ol class="events" id="events" data-events="{events}" aria-live="polite"></ol>"#,
        title = escape(&name),
        row = cluster_row(&shown, summary),
        machines_title = if custom { "Hosts" } else { "Nodes" },
        events = escape(&events_url),
    );
    page(&name, Some(&principal), "clusters", &content)
}

/// An owner's way to delete the cluster; once it is being removed and still has hosts, the way
/// to remove it anyway (its hosts gone for good), whose confirmation names the hosts that may
/// keep running.
async fn removal(dash: &Dash, shown: &Value, name: &str) -> Result<String, ApiError> {
    if shown["metadata"]["deletionTimestamp"].is_null() {
        return Ok(format!(
            r#"<button type="button" class="danger" id="delete-cluster" data-cluster="{name}">Delete cluster</button>
<p class="error" role="alert" id="delete-cluster-error"></p>"#,
            name = escape(name)
        ));
    }
    let (hosts, _) = dash
        .api
        .store
        .list(Kind::Host.name(), &LabelSelector::everything())
        .await?;
    let hosts: Vec<String> = hosts
        .iter()
        .filter(|h| h.spec["cluster"].as_str() == Some(name))
        .map(|h| match h.spec["nodeName"].as_str() {
            Some(node) if !node.is_empty() => format!("{node} ({})", h.metadata.name),
            _ => h.metadata.name.clone(),
        })
        .collect();
    if hosts.is_empty() {
        return Ok(String::new());
    }
    Ok(format!(
        r#"<button type="button" class="danger" id="remove-anyway" data-cluster="{name}" data-hosts="{hosts}">Remove anyway</button>
<p class="error" role="alert" id="delete-cluster-error"></p>"#,
        name = escape(name),
        hosts = escape(&hosts.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_shows_state_nodes_use_and_escapes_what_it_shows() {
        let row = cluster_row(
            &serde_json::json!({
                "metadata": {"name": "prod", "creationTimestamp": "2026-11-23T10:00:00Z"},
                "spec": {"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1"},
                "status": {"nodes": {"ready": 2, "total": 3}, "kubernetesVersion": "v1.33.4+k3s1"},
                "state": {"state": "unavailable", "message": "NodesReady: <2 of 3>"},
            }),
            ClusterSummary {
                agents: 4,
                cpu_weighted: 24.8,
                cpus: 2.0,
                memory_used: 2 << 30,
                memory_total: 8 << 30,
            },
        );
        assert!(row.contains(r#"data-state="unavailable""#), "{row}");
        assert!(row.contains("2/3"), "{row}");
        assert!(row.contains("K3S v1.33.4+k3s1"), "{row}");
        assert!(row.contains("&lt;2 of 3&gt;"), "{row}");
        assert!(row.contains("CPU 12%, memory 2.0 / 8.0 GiB"), "{row}");
        assert!(row.contains(r#"data-label="Agents">4<"#), "{row}");
    }
}
