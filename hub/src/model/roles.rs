//! Definable roles: role templates (what a binding grants on a cluster or a project, in
//! Kubernetes PolicyRules) and global roles (what a binding grants on the hub itself, and
//! which templates it grants on every cluster). How they resolve and what they allow is
//! `crate::roles`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the hub's own objects in rules: a rule on `management.drover.io`
/// `clusters` is about the hub's Cluster objects, one on `apps` `deployments` about the
/// cluster's Deployments.
pub const HUB_GROUP: &str = "management.drover.io";

/// A Kubernetes PolicyRule, as in a ClusterRole.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    pub verbs: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        rename = "nonResourceURLs"
    )]
    pub non_resource_urls: Vec<String>,
}

/// Where a template applies: a whole cluster, or the namespaces of one project.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TemplateContext {
    Cluster,
    Project,
}

impl TemplateContext {
    pub fn label(self) -> &'static str {
        match self {
            TemplateContext::Cluster => "cluster",
            TemplateContext::Project => "project",
        }
    }
}

/// A role that bindings grant on a cluster or on a project: its own rules and those of the
/// templates it inherits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleTemplateSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub context: TemplateContext,
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    /// Other templates of the same context whose rules this one holds too: a project
    /// template's rules never reach a whole cluster, nor a cluster template's a project.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherits: Vec<String>,
    /// No new binding may name a locked template (those already made stay).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub locked: bool,
    /// One of the hub's own templates: read-only, kept by the hub.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub builtin: bool,
}

/// A role on the hub itself: its rules on the hub's objects (`management.drover.io`), and
/// the cluster templates its holders hold on every cluster, present and future.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalRoleSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited_cluster_roles: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub builtin: bool,
}

/// The verbs a rule may name: Kubernetes' (and `use` for the hub's credentials and
/// templates, `escalate`/`bind` for roles), or `*`.
const VERBS: [&str; 14] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "use",
    "bind",
    "escalate",
    "impersonate",
    "proxy",
    "*",
];

/// Checks each rule as kube-apiserver checks a ClusterRole's, naming the bad field
/// (`spec.rules[2].verbs`).
pub fn validate_rules(rules: &[PolicyRule]) -> Result<(), String> {
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("spec.rules[{i}]");
        if rule.verbs.is_empty() {
            return Err(format!(
                "{at}.verbs: name at least one verb (get, list, watch, create, update, patch, delete, or *)"
            ));
        }
        if let Some(verb) = rule.verbs.iter().find(|v| !VERBS.contains(&v.as_str())) {
            return Err(format!(
                "{at}.verbs: {verb:?} is not a verb; use {}",
                VERBS.join(", ")
            ));
        }
        let resourceful = !rule.resources.is_empty() || !rule.api_groups.is_empty();
        match (resourceful, rule.non_resource_urls.is_empty()) {
            (true, false) => {
                return Err(format!(
                    "{at}: a rule is about resources (apiGroups, resources) or about nonResourceURLs, not both"
                ));
            }
            (false, true) => {
                return Err(format!(
                    "{at}.resources: name the resources (with apiGroups; \"\" is the core group) or nonResourceURLs"
                ));
            }
            (true, true) if rule.resources.is_empty() => {
                return Err(format!(
                    "{at}.resources: name the resources of apiGroups {:?} (or \"*\")",
                    rule.api_groups
                ));
            }
            (true, true) if rule.api_groups.is_empty() => {
                return Err(format!(
                    "{at}.apiGroups: name the API groups of the resources (\"\" for pods, secrets and the rest of the core group; \"apps\" for deployments; \"*\" for all)"
                ));
            }
            _ => {}
        }
        if let Some(bad) = rule
            .resources
            .iter()
            .find(|r| r.is_empty() || r.contains(char::is_whitespace))
        {
            return Err(format!(
                "{at}.resources: {bad:?} is not a resource name (e.g. pods, pods/log, deployments)"
            ));
        }
        if let Some(bad) = rule
            .non_resource_urls
            .iter()
            .find(|u| !u.starts_with('/') && *u != "*")
        {
            return Err(format!(
                "{at}.nonResourceURLs: {bad:?} must be a path starting with / (a trailing * matches below it)"
            ));
        }
        if !rule.resource_names.is_empty() && rule.resources.is_empty() {
            return Err(format!("{at}.resourceNames: names need resources"));
        }
    }
    Ok(())
}
