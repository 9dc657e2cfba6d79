//! Who may do what: users, tokens, roles and role bindings, projects and their secrets, and
//! the hub's settings.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A person (or a script) who logs in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    #[serde(default)]
    pub disabled: bool,
    /// Only on create or to change it; never returned. At least 12 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 12))]
    pub password: Option<String>,
    /// The KDF's output (argon2id, PHC string). Never returned by the API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(skip)]
    pub password_hash: String,
    /// Groups the user is in: role bindings of a group apply to its members, on the hub and
    /// (as Kubernetes RBAC groups) in every cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The provider identity of a user who signs in with a directory (only the hub sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub principal: Option<super::PrincipalRef>,
    /// The directory's groups of such a user, prefixed with the provider's name
    /// (`corp:ops`), as of `groupsRefreshedAt`: refreshed at each login and on a schedule, and
    /// only by the hub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(skip)]
    pub provider_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub groups_refreshed_at: Option<String>,
}

/// Which agent a credential belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRef {
    /// `cluster-agent`, `node-agent` or `system-agent`.
    pub kind: String,
    /// The agent's identity in the tunnel registry.
    pub id: String,
    pub cluster: String,
}

/// A bearer credential: a user's API token, a login session, or an agent's credential. Only
/// its hash is stored; the value is shown once, when it is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenSpec {
    /// The user this token acts as (absent for agent credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRef>,
    /// A user's token for one cluster (a kubeconfig's): besides the hub, it opens that
    /// cluster's authorized endpoint, whose API servers check it against the hashed copy the
    /// cluster-agent keeps there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// A login session (dashboard cookie) rather than an API token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session: bool,
    /// RFC 3339; none means it does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The client a login came from (the CLI's own id): a new login of the same user from the
    /// same client replaces this token rather than leaving both valid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(skip)]
    pub secret_hash: String,
}

/// Roles: `admin` is global; `cluster-owner`, `cluster-member` and `read-only` apply to one
/// cluster; `project-owner`, `project-member` and `read-only` (with a project) to the
/// namespaces of one project.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Admin,
    ClusterOwner,
    ClusterMember,
    ReadOnly,
    ProjectOwner,
    ProjectMember,
}

impl Role {
    /// The name in the API and in the cluster's RBAC labels.
    pub fn label(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ClusterOwner => "cluster-owner",
            Role::ClusterMember => "cluster-member",
            Role::ReadOnly => "read-only",
            Role::ProjectOwner => "project-owner",
            Role::ProjectMember => "project-member",
        }
    }
}

/// Grants a role template to a user (or a group) on one cluster or on one project of a
/// cluster, or a global role on the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleBindingSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// One of the builtin roles by its old name: an alias of the builtin template (or, for
    /// `admin`, global role) of that name; `read-only` with a project is the template
    /// `project-read-only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The RoleTemplate granted on `cluster` (a cluster template) or `project` (a project
    /// template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_template: Option<String>,
    /// The GlobalRole granted on the hub (no cluster, no project).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_role: Option<String>,
    /// Required for cluster and project roles (a project's own cluster); absent for `admin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// For project roles: the project (of `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// What a binding grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Granted {
    /// A role template, on the binding's cluster or project.
    Template(String),
    /// A global role.
    Global(String),
}

/// The builtin template `read-only` is for clusters; with a project its alias means this one.
pub const PROJECT_READ_ONLY: &str = "project-read-only";

impl RoleBindingSpec {
    /// What the binding grants, its `role` alias resolved; `None` when it names none, or
    /// more than one, of `role`, `roleTemplate` and `globalRole`.
    pub fn granted(&self) -> Option<Granted> {
        match (self.role, &self.role_template, &self.global_role) {
            (Some(Role::Admin), None, None) => Some(Granted::Global("admin".into())),
            (Some(Role::ReadOnly), None, None) if self.project.is_some() => {
                Some(Granted::Template(PROJECT_READ_ONLY.into()))
            }
            (Some(role), None, None) => Some(Granted::Template(role.label().into())),
            (None, Some(template), None) => Some(Granted::Template(template.clone())),
            (None, None, Some(global)) => Some(Granted::Global(global.clone())),
            _ => None,
        }
    }

    /// The template granted, if the binding grants one.
    pub fn template(&self) -> Option<String> {
        match self.granted() {
            Some(Granted::Template(t)) => Some(t),
            _ => None,
        }
    }
}

/// A project: namespaces of one cluster grouped under one set of members and secrets, as in
/// Rancher. A namespace is in the project when it carries the label `drover.io/project` with
/// the project's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectSpec {
    pub cluster: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// A secret defined once for a project and kept in every namespace of it (created, updated and
/// deleted there as it is here). The object's name is the Secret's name in those namespaces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectSecretSpec {
    pub cluster: String,
    pub project: String,
    /// The Kubernetes Secret type; `Opaque` when absent.
    #[serde(default, skip_serializing_if = "String::is_empty", rename = "type")]
    pub secret_type: String,
    /// Values in base64, as in a Kubernetes Secret's `data`.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
}

/// A hub-wide setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingSpec {
    pub value: String,
}
