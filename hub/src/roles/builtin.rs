//! The hub's own role templates and global roles: today's six roles, as rules. In a cluster
//! the builtin templates bind Kubernetes' own ClusterRoles (`cluster-admin`, `admin`, `edit`,
//! `view`; see the cluster-agent's `access` module), which every cluster already has; the
//! rules here describe those for the hub's own checks and for the templates that inherit a
//! builtin one (whose ClusterRole then holds these rules).

use std::sync::{Arc, LazyLock};

use crate::model::{
    GlobalRoleSpec, HUB_GROUP, PROJECT_READ_ONLY, PolicyRule, RoleTemplateSpec, TemplateContext,
};

/// The global role every signed-in user holds, with no binding.
pub const EVERYONE: &str = "user-base";
/// The global role of the hub's administrators.
pub const ADMIN: &str = "admin";

/// A rule on `resources` of `groups` with `verbs`.
pub(crate) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |s: &[&str]| s.iter().map(|v| (*v).to_owned()).collect();
    PolicyRule {
        api_groups: strings(groups),
        resources: strings(resources),
        resource_names: Vec::new(),
        verbs: strings(verbs),
        non_resource_urls: Vec::new(),
    }
}

fn everything() -> Vec<PolicyRule> {
    vec![
        rule(&["*"], &["*"], &["*"]),
        PolicyRule {
            api_groups: Vec::new(),
            resources: Vec::new(),
            resource_names: Vec::new(),
            verbs: vec!["*".into()],
            non_resource_urls: vec!["*".into()],
        },
    ]
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// Kubernetes' `view`: everything in a namespace but Secrets, to read.
fn view() -> Vec<PolicyRule> {
    vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "events",
                "limitranges",
                "persistentvolumeclaims",
                "pods",
                "pods/log",
                "pods/status",
                "replicationcontrollers",
                "resourcequotas",
                "serviceaccounts",
                "services",
            ],
            READ,
        ),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/scale",
                "replicasets",
                "statefulsets",
            ],
            READ,
        ),
        rule(&["batch"], &["cronjobs", "jobs"], READ),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
            READ,
        ),
        rule(&["policy"], &["poddisruptionbudgets"], READ),
    ]
}

/// Kubernetes' `edit` adds: writing those, Secrets, and exec, attach and port-forward.
fn edit() -> Vec<PolicyRule> {
    vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "pods",
                "replicationcontrollers",
                "secrets",
                "serviceaccounts",
                "services",
            ],
            WRITE,
        ),
        rule(&[""], &["secrets"], READ),
        rule(
            &[""],
            &["pods/attach", "pods/exec", "pods/portforward"],
            &["create", "get"],
        ),
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/scale",
                "replicasets",
                "statefulsets",
            ],
            WRITE,
        ),
        rule(&["batch"], &["cronjobs", "jobs"], WRITE),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
            WRITE,
        ),
        rule(&["policy"], &["poddisruptionbudgets"], WRITE),
    ]
}

/// Kubernetes' `admin` adds the namespace's own RBAC.
fn admin() -> Vec<PolicyRule> {
    vec![rule(
        &["rbac.authorization.k8s.io"],
        &["roles", "rolebindings"],
        &["*"],
    )]
}

/// What a cluster's members and readers see of it on the hub and cluster-wide.
fn cluster_reader() -> Vec<PolicyRule> {
    vec![
        rule(
            &[HUB_GROUP],
            &[
                "clusters",
                "hosts",
                "machines",
                "rolebindings",
                "projects",
                "etcdsnapshots",
            ],
            READ,
        ),
        rule(&[""], &["nodes", "namespaces"], READ),
    ]
}

fn template(
    display: &str,
    description: &str,
    context: TemplateContext,
    rules: Vec<Vec<PolicyRule>>,
) -> RoleTemplateSpec {
    RoleTemplateSpec {
        display_name: display.into(),
        description: description.into(),
        context,
        rules: rules.concat(),
        inherits: Vec::new(),
        locked: false,
        builtin: true,
    }
}

/// The builtin role templates, by name: made once, shared by every catalog (one is made for
/// every request).
pub fn templates() -> &'static [(String, Arc<RoleTemplateSpec>)] {
    static TEMPLATES: LazyLock<Vec<(String, Arc<RoleTemplateSpec>)>> = LazyLock::new(|| {
        make_templates()
            .into_iter()
            .map(|(name, spec)| (name, Arc::new(spec)))
            .collect()
    });
    &TEMPLATES
}

/// The builtin global roles, by name, as [`templates`].
pub fn globals() -> &'static [(String, Arc<GlobalRoleSpec>)] {
    static GLOBALS: LazyLock<Vec<(String, Arc<GlobalRoleSpec>)>> = LazyLock::new(|| {
        make_globals()
            .into_iter()
            .map(|(name, spec)| (name, Arc::new(spec)))
            .collect()
    });
    &GLOBALS
}

fn make_templates() -> Vec<(String, RoleTemplateSpec)> {
    use TemplateContext::{Cluster, Project};
    vec![
        (
            "cluster-owner".into(),
            template(
                "Cluster Owner",
                "Everything in the cluster (cluster-admin), and the cluster's hub objects: its hosts, tokens, members, projects and snapshots.",
                Cluster,
                vec![everything()],
            ),
        ),
        (
            "cluster-member".into(),
            template(
                "Cluster Member",
                "Reads the whole cluster but Secrets, and writes workloads in every namespace (edit).",
                Cluster,
                vec![cluster_reader(), view(), edit()],
            ),
        ),
        (
            "read-only".into(),
            template(
                "Read Only",
                "Reads the whole cluster but Secrets (view).",
                Cluster,
                vec![cluster_reader(), view()],
            ),
        ),
        (
            "project-owner".into(),
            template(
                "Project Owner",
                "Everything in the project's namespaces (admin), its members and its secrets.",
                Project,
                vec![
                    vec![
                        rule(&[HUB_GROUP], &["projects"], READ),
                        rule(&[HUB_GROUP], &["rolebindings", "projectsecrets"], &["*"]),
                    ],
                    view(),
                    edit(),
                    admin(),
                ],
            ),
        ),
        (
            "project-member".into(),
            template(
                "Project Member",
                "Writes workloads in the project's namespaces (edit).",
                Project,
                vec![
                    vec![rule(&[HUB_GROUP], &["projects"], READ)],
                    view(),
                    edit(),
                ],
            ),
        ),
        (
            PROJECT_READ_ONLY.into(),
            template(
                "Project Read Only",
                "Reads the project's namespaces but Secrets (view).",
                Project,
                vec![vec![rule(&[HUB_GROUP], &["projects"], READ)], view()],
            ),
        ),
    ]
}

fn make_globals() -> Vec<(String, GlobalRoleSpec)> {
    let global = |display: &str, description: &str, rules, inherited: &[&str]| GlobalRoleSpec {
        display_name: display.into(),
        description: description.into(),
        rules,
        inherited_cluster_roles: inherited.iter().map(|s| (*s).to_owned()).collect(),
        builtin: true,
    };
    vec![
        (
            ADMIN.into(),
            global(
                "Administrator",
                "Everything, on the hub and in every cluster.",
                everything(),
                &[],
            ),
        ),
        (
            EVERYONE.into(),
            global(
                "Signed-in user",
                "What everyone signed in may do: read the hub's settings and machine templates (their own user and tokens are theirs too). Held without a binding.",
                vec![rule(&[HUB_GROUP], &["settings", "machinetemplates"], READ)],
                &[],
            ),
        ),
        (
            "clusters-create".into(),
            global(
                "Create clusters",
                "Creates clusters, and owns each one created.",
                vec![rule(&[HUB_GROUP], &["clusters"], &["create"])],
                &[],
            ),
        ),
        (
            "clusters-view".into(),
            global(
                "View every cluster",
                "read-only on every cluster, present and future.",
                Vec::new(),
                &["read-only"],
            ),
        ),
        (
            "audit-read".into(),
            global(
                "Read the audit log",
                "Reads the hub's audit log.",
                vec![rule(&[HUB_GROUP], &["audit"], &["get"])],
                &[],
            ),
        ),
        (
            "users-manage".into(),
            global(
                "Manage users",
                "Creates, changes and deletes users who hold no more than the manager holds (roles are granted by bindings, which this does not give).",
                vec![rule(&[HUB_GROUP], &["users"], &["*"])],
                &[],
            ),
        ),
        (
            "authn-manage".into(),
            global(
                "Manage sign-in",
                "Configures the directories and identity providers users sign in with.",
                vec![rule(&[HUB_GROUP], &["authproviders"], &["*"])],
                &[],
            ),
        ),
        (
            "credentials-use".into(),
            global(
                "Use every cloud credential",
                "Names any CloudCredential on a cluster or a machine template (their secrets stay unreadable).",
                vec![rule(&[HUB_GROUP], &["cloudcredentials"], &["use"])],
                &[],
            ),
        ),
    ]
}
