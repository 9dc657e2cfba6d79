//! The Roles page: every role template and global role, what each allows and who holds it;
//! admins create templates there (resources and verbs chosen in a table, or as YAML) and
//! delete those no binding names. And the role choices of the pages that make bindings, from
//! the templates there are.

use std::fmt::Write as _;

use axum::{
    extract::State,
    http::HeaderMap,
    response::{IntoResponse, Response},
};

use super::{Dash, caller, escape, page};
use crate::{
    api::ApiError,
    model::{Granted, Kind, PolicyRule, RoleBindingSpec, TemplateContext},
    roles::Catalog,
    store::LabelSelector,
};

/// The resources the table offers, as kubectl names them (`resource.group`).
const RESOURCES: [&str; 16] = [
    "pods",
    "pods/log",
    "pods/exec",
    "services",
    "configmaps",
    "secrets",
    "events",
    "persistentvolumeclaims",
    "deployments.apps",
    "deployments.apps/scale",
    "statefulsets.apps",
    "daemonsets.apps",
    "jobs.batch",
    "cronjobs.batch",
    "ingresses.networking.k8s.io",
    "namespaces",
];

const VERBS: [&str; 8] = [
    "get", "list", "watch", "create", "update", "patch", "delete", "*",
];

/// The rules as a list, one rule a line; many (a builtin's) folded under a count.
fn rules_cell(rules: &[PolicyRule]) -> String {
    if rules.is_empty() {
        return "none of its own".to_owned();
    }
    let items: String = summary(rules)
        .into_iter()
        .map(|r| format!("<li><code>{}</code></li>", escape(&r)))
        .collect();
    if rules.len() > 4 {
        format!(
            r#"<details><summary>{} rules</summary><ul class="rules-list">{items}</ul></details>"#,
            rules.len()
        )
    } else {
        format!(r#"<ul class="rules-list">{items}</ul>"#)
    }
}

/// "get,list deployments.apps", one per rule.
fn summary(rules: &[PolicyRule]) -> Vec<String> {
    rules
        .iter()
        .map(|r| {
            if !r.non_resource_urls.is_empty() {
                return format!("{} {}", r.verbs.join(","), r.non_resource_urls.join(","));
            }
            let resources: Vec<String> = r
                .api_groups
                .iter()
                .flat_map(|g| {
                    r.resources
                        .iter()
                        .map(move |res| match (g.as_str(), res.split_once('/')) {
                            ("", _) => res.clone(),
                            (g, Some((name, sub))) => format!("{name}.{g}/{sub}"),
                            (g, None) => format!("{res}.{g}"),
                        })
                })
                .collect();
            let names = if r.resource_names.is_empty() {
                String::new()
            } else {
                format!(" named {}", r.resource_names.join(","))
            };
            format!("{} {}{names}", r.verbs.join(","), resources.join(", "))
        })
        .collect()
}

/// Who holds what: per template or global role, "user ann on prod", "group ci on shop".
fn holders(bindings: &[crate::store::Object]) -> Vec<(Granted, String)> {
    bindings
        .iter()
        .filter_map(|b| {
            let spec: RoleBindingSpec = serde_json::from_value(b.spec.clone()).ok()?;
            let granted = spec.granted()?;
            let who = match (&spec.user, &spec.group) {
                (Some(u), _) => format!("user {u}"),
                (None, Some(g)) => format!("group {g}"),
                _ => return None,
            };
            let place = match (&spec.project, &spec.cluster) {
                (Some(p), _) => format!(" on project {p}"),
                (None, Some(c)) => format!(" on {c}"),
                _ => String::new(),
            };
            Some((granted, format!("{who}{place}")))
        })
        .collect()
}

pub(super) async fn roles(State(dash): State<Dash>, headers: HeaderMap) -> Response {
    let principal = match caller(&dash.api, &headers, "/roles").await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let store = dash.api.store.as_ref();
    let catalog = match Catalog::read(store).await {
        Ok(c) => c,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Who holds a role is for those who may read the bindings: admins see them all.
    let bindings = if principal.admin {
        match store
            .list(Kind::RoleBinding.name(), &LabelSelector::everything())
            .await
        {
            Ok((b, _)) => b,
            Err(e) => return ApiError::from(e).into_response(),
        }
    } else {
        Vec::new()
    };
    let held = holders(&bindings);
    let held_by = |granted: &Granted| -> String {
        let who: Vec<String> = held
            .iter()
            .filter(|(g, _)| g == granted)
            .map(|(_, w)| escape(w))
            .collect();
        if who.is_empty() {
            "–".to_owned()
        } else {
            who.join("<br>")
        }
    };
    let mut template_rows = String::new();
    for (name, spec) in catalog.templates() {
        let badges = match (spec.builtin, spec.locked) {
            (true, _) => r#" <span class="badge">builtin</span>"#,
            (false, true) => r#" <span class="badge">locked</span>"#,
            _ => "",
        };
        let delete = if principal.admin && !spec.builtin {
            format!(
                r#"<button type="button" class="danger delete" data-path="/v1/roletemplates/{n}" aria-label="Delete the role template {n}">Delete</button>"#,
                n = escape(name)
            )
        } else {
            String::new()
        };
        let _ = write!(
            template_rows,
            r#"<tr data-name="{n}"><td data-label="Template"><strong>{n}</strong>{badges}<br><span class="message">{d}</span></td><td data-label="Context">{c}</td><td data-label="Inherits">{i}</td><td data-label="Rules">{r}</td><td data-label="Held by">{h}</td><td>{delete}</td></tr>"#,
            n = escape(name),
            d = escape(if spec.description.is_empty() {
                &spec.display_name
            } else {
                &spec.description
            }),
            c = spec.context.label(),
            i = escape(&spec.inherits.join(", ")),
            r = rules_cell(&spec.rules),
            h = held_by(&Granted::Template(name.clone())),
        );
    }
    let mut global_rows = String::new();
    for name in catalog.global_names() {
        let Some(spec) = catalog.global(&name) else {
            continue;
        };
        let _ = write!(
            global_rows,
            r#"<tr data-name="{n}"><td data-label="Global role"><strong>{n}</strong><br><span class="message">{d}</span></td><td data-label="Rules">{r}</td><td data-label="On every cluster">{i}</td><td data-label="Held by">{h}</td></tr>"#,
            n = escape(&name),
            d = escape(&spec.description),
            r = rules_cell(&spec.rules),
            i = escape(&spec.inherited_cluster_roles.join(", ")),
            h = if name == crate::roles::builtin::EVERYONE {
                "everyone signed in".to_owned()
            } else {
                held_by(&Granted::Global(name.clone()))
            },
        );
    }
    let create = if principal.admin {
        new_template_form(&catalog)
    } else {
        String::new()
    };
    let content = format!(
        r#"<div class="bar"><h1>Roles</h1></div>
<p>A role template is what a binding grants on a cluster or on one project, in Kubernetes rules; rules on <code>management.drover.io</code> are about the hub's own objects. A global role is what a binding grants on the hub, and the cluster templates it grants on every cluster.</p>
<h2>Role templates</h2>
<table class="list" id="templates"><thead><tr><th scope="col">Template</th><th scope="col">Context</th><th scope="col">Inherits</th><th scope="col">Rules</th><th scope="col">Held by</th><th scope="col"><span class="visually-hidden">Actions</span></th></tr></thead><tbody>{template_rows}</tbody></table>
<h2>Global roles</h2>
<table class="list" id="globalroles"><thead><tr><th scope="col">Global role</th><th scope="col">Rules</th><th scope="col">On every cluster</th><th scope="col">Held by</th></tr></thead><tbody>{global_rows}</tbody></table>
{create}"#
    );
    page("Roles", Some(&principal), "roles", &content)
}

fn new_template_form(catalog: &Catalog) -> String {
    let head: String = VERBS
        .iter()
        .map(|v| format!(r#"<th scope="col">{v}</th>"#))
        .collect();
    let mut rows = String::new();
    for (r, resource) in RESOURCES.iter().enumerate() {
        let cells: String = VERBS
            .iter()
            .map(|verb| {
                format!(
                    r#"<td><input type="checkbox" name="verb" data-resource="{resource}" value="{verb}" aria-label="{verb} {resource}"></td>"#
                )
            })
            .collect();
        let _ = write!(
            rows,
            r#"<tr data-row="{r}"><th scope="row"><code>{resource}</code></th>{cells}</tr>"#
        );
    }
    let inherits: String = catalog
        .templates()
        .map(|(name, spec)| {
            format!(
                r#"<option value="{n}" data-context="{c}">{n}</option>"#,
                n = escape(name),
                c = spec.context.label()
            )
        })
        .collect();
    format!(
        r#"<section class="card">
<h2>New role template</h2>
<form id="create-template">
<label for="template-name">Name</label><input id="template-name" name="name" required pattern="[a-z]([a-z0-9\-]*[a-z0-9])?" autocomplete="off">
<label for="template-display">Display name</label><input id="template-display" name="displayName" autocomplete="off">
<label for="template-context">Where it applies</label>
<select id="template-context" name="context"><option value="project">a project's namespaces</option><option value="cluster">a whole cluster</option></select>
<label for="template-inherits">Inherits (the rules of)</label>
<select id="template-inherits" name="inherits" multiple size="4">{inherits}</select>
<table class="list rules" id="template-rules"><caption>What it may do</caption><thead><tr><th scope="col">Resource</th>{head}</tr></thead><tbody>{rows}</tbody></table>
<p class="error" role="alert" id="template-error"></p>
<button type="submit">Create template</button>
</form>
</section>
<section class="card">
<h2>Or as YAML</h2>
<form id="create-template-yaml">
<label for="template-yaml">A RoleTemplate</label>
<textarea id="template-yaml" name="yaml" rows="14" spellcheck="false">{example}</textarea>
<p class="error" role="alert" id="template-yaml-error"></p>
<button type="submit">Create from YAML</button>
</form>
</section>"#,
        example = escape(EXAMPLE),
    )
}

const EXAMPLE: &str = "apiVersion: management.drover.io/v1
kind: RoleTemplate
metadata:
  name: deployer
spec:
  displayName: Deployer
  context: project
  rules:
    - apiGroups: [apps]
      resources: [deployments, deployments/scale]
      verbs: [get, list, watch, patch]
    - apiGroups: [\"\"]
      resources: [pods, pods/log]
      verbs: [get, list]
";

/// `<option>`s of the templates of `context` (builtin ones by their old names where they
/// have one), for a form that makes a binding: `data-field` says which field of the binding
/// names it.
pub(super) fn template_options(catalog: &Catalog, context: TemplateContext) -> String {
    // The builtin ones first, by their old names, in the order the forms always offered them
    // (the first is the default); then the templates of the hub's own.
    let builtin: &[(&str, &str)] = match context {
        TemplateContext::Cluster => &[
            ("read-only", "read-only"),
            ("cluster-member", "cluster-member"),
            ("cluster-owner", "cluster-owner"),
        ],
        TemplateContext::Project => &[
            ("project-member", "project-member"),
            ("project-owner", "project-owner"),
            (crate::model::PROJECT_READ_ONLY, "read-only"),
        ],
    };
    let mut options = String::new();
    for (_, value) in builtin {
        let _ = write!(
            options,
            r#"<option value="{value}" data-field="role">{value}</option>"#
        );
    }
    for (name, _) in catalog
        .templates()
        .filter(|(_, t)| t.context == context && !t.builtin)
    {
        let _ = write!(
            options,
            r#"<option value="{v}" data-field="roleTemplate">{v}</option>"#,
            v = escape(name),
        );
    }
    options
}

/// `<option>`s of the global roles (their binding names no cluster).
pub(super) fn global_options(catalog: &Catalog) -> String {
    let mut options = String::new();
    for name in catalog.global_names() {
        if name == crate::roles::builtin::EVERYONE {
            continue;
        }
        let (field, label) = if name == crate::roles::builtin::ADMIN {
            ("role", "admin (global)".to_owned())
        } else {
            ("globalRole", format!("{name} (global)"))
        };
        let _ = write!(
            options,
            r#"<option value="{v}" data-field="{field}" data-global="true">{label}</option>"#,
            v = escape(&name),
            label = escape(&label),
        );
    }
    options
}
