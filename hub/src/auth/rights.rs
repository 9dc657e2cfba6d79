//! What the roles a caller holds allow: the templates and global roles of their bindings,
//! resolved into rules (`Access`, `Roles`), and the check of every request on the hub's own
//! objects against those rules (`authorize`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{AuthError, Principal, Verb};
use crate::{
    model::{Granted, HUB_GROUP, Kind, PolicyRule, RoleBindingSpec},
    roles::{Catalog, builtin},
    store::Object,
};

/// What a user holds in one place (a cluster, a project, or every cluster): the templates
/// and their rules, with what those inherit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    pub templates: BTreeSet<String>,
    pub rules: Vec<PolicyRule>,
}

impl Access {
    fn add(&mut self, catalog: &Catalog, template: &str) {
        if !self.templates.insert(template.to_owned()) {
            return;
        }
        for rule in catalog.rules_of(template) {
            if !self.rules.contains(&rule) {
                self.rules.push(rule);
            }
        }
    }

    fn merge(&mut self, other: &Access) {
        self.templates.extend(other.templates.iter().cloned());
        for rule in &other.rules {
            if !self.rules.contains(rule) {
                self.rules.push(rule.clone());
            }
        }
    }

    /// Whether these rules allow `verb` on the hub's object `name` of `kind`.
    pub fn allows_hub(&self, verb: &str, kind: Kind, name: Option<&str>) -> bool {
        crate::roles::allows(&self.rules, verb, HUB_GROUP, kind.plural(), name)
    }

    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// What a user may do, from the role bindings of the user and of their groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    pub admin: bool,
    pub global: Vec<PolicyRule>,
    pub everywhere: Access,
    pub clusters: BTreeMap<String, Access>,
    /// Project → (its cluster, what is held on it).
    pub projects: BTreeMap<String, (String, Access)>,
}

/// Whether `binding` names `user` or one of `groups`.
pub(super) fn binds(binding: &Object, user: &str, groups: &[String]) -> bool {
    let named = |field: &str| binding.spec.get(field).and_then(Value::as_str);
    named("user") == Some(user) || named("group").is_some_and(|g| groups.iter().any(|m| m == g))
}

/// Whether `rules` allow everything, as the `admin` global role does.
fn all_allowed(rules: &[PolicyRule]) -> bool {
    crate::roles::allows(rules, "*", "*", "*", None) && crate::roles::allows_url(rules, "*", "*")
}

/// The roles `user`, a member of `groups`, holds through `bindings` (live ones: see
/// `crate::refs`), their templates and global roles as `catalog` defines them. A binding to a
/// template or global role that does not exist grants nothing; so does a cluster template
/// bound on a project or a project template bound on a cluster.
pub fn roles_of(bindings: &[Object], catalog: &Catalog, user: &str, groups: &[String]) -> Roles {
    use crate::model::TemplateContext;
    let mut roles = Roles::default();
    let add_global = |roles: &mut Roles, name: &str| {
        let Some(global) = catalog.global(name) else {
            return;
        };
        for rule in &global.rules {
            if !roles.global.contains(rule) {
                roles.global.push(rule.clone());
            }
        }
        for template in &global.inherited_cluster_roles {
            if catalog
                .template(template)
                .is_some_and(|t| t.context == TemplateContext::Cluster)
            {
                roles.everywhere.add(catalog, template);
            }
        }
    };
    add_global(&mut roles, builtin::EVERYONE);
    for binding in bindings {
        if !binds(binding, user, groups) {
            continue;
        }
        let Ok(spec) = serde_json::from_value::<RoleBindingSpec>(binding.spec.clone()) else {
            continue;
        };
        let Some(granted) = spec.granted() else {
            continue;
        };
        let template = match granted {
            Granted::Global(name) => {
                add_global(&mut roles, &name);
                continue;
            }
            Granted::Template(name) => name,
        };
        let Some(context) = catalog.template(&template).map(|t| t.context) else {
            continue;
        };
        match (context, spec.cluster, spec.project) {
            (TemplateContext::Project, Some(cluster), Some(project)) => {
                let entry = roles
                    .projects
                    .entry(project)
                    .or_insert_with(|| (cluster, Access::default()));
                entry.1.add(catalog, &template);
            }
            (TemplateContext::Cluster, Some(cluster), None) => {
                roles
                    .clusters
                    .entry(cluster)
                    .or_default()
                    .add(catalog, &template);
            }
            _ => {}
        }
    }
    roles.admin = all_allowed(&roles.global);
    roles
}

/// Whether what is held reaches `cluster`: admin, a template on every cluster, or any role
/// on it or on one of its projects.
fn reaches(
    admin: bool,
    everywhere: &Access,
    clusters: &BTreeMap<String, Access>,
    projects: &BTreeMap<String, (String, Access)>,
    cluster: &str,
) -> bool {
    admin
        || !everywhere.is_empty()
        || clusters.contains_key(cluster)
        || projects.values().any(|(c, _)| c == cluster)
}

impl Roles {
    /// Whether these roles reach `cluster`: admin, or any role on it or one of its projects.
    pub fn reaches(&self, cluster: &str) -> bool {
        reaches(
            self.admin,
            &self.everywhere,
            &self.clusters,
            &self.projects,
            cluster,
        )
    }
}

impl Principal {
    /// Whether the user holds any role in `cluster`, on it or on one of its projects: what it
    /// takes to reach the cluster through the proxy (its own RBAC decides the rest).
    pub fn reaches(&self, cluster: &str) -> bool {
        reaches(
            self.admin,
            &self.everywhere,
            &self.clusters,
            &self.projects,
            cluster,
        )
    }

    /// What is held on the whole of `cluster`: its own templates and those held everywhere.
    pub fn on_cluster(&self, cluster: &str) -> Access {
        let mut access = self.everywhere.clone();
        if let Some(own) = self.clusters.get(cluster) {
            access.merge(own);
        }
        access
    }

    /// What is held on `project`, if anything.
    pub fn on_project(&self, project: &str) -> Option<&Access> {
        self.projects.get(project).map(|(_, access)| access)
    }

    /// Whether any role held on `cluster`, or on one of its projects, writes to the cluster
    /// (anything but get, list and watch on its resources).
    pub fn writes_in(&self, cluster: &str) -> bool {
        self.admin
            || crate::roles::writes_downstream(&self.on_cluster(cluster).rules)
            || self
                .projects
                .values()
                .any(|(c, a)| c == cluster && crate::roles::writes_downstream(&a.rules))
    }

    /// Whether the global roles held allow `verb` on the hub's objects of `kind` (named
    /// `name`, or all of them).
    pub fn may_globally(&self, verb: &str, kind: Kind, name: Option<&str>) -> bool {
        self.admin || crate::roles::allows(&self.global, verb, HUB_GROUP, kind.plural(), name)
    }

    /// Whether the global roles held allow `verb` on the hub resource `resource` that is no
    /// kind of object (`audit`).
    pub fn may_hub(&self, verb: &str, resource: &str) -> bool {
        self.admin || crate::roles::allows(&self.global, verb, HUB_GROUP, resource, None)
    }
}

#[cfg(test)]
impl Principal {
    /// A caller `user` holding builtin roles: `admin`, on clusters, and `(project, its
    /// cluster, role)` on projects, as bindings by their old names would give.
    pub fn holding(
        user: &str,
        admin: bool,
        clusters: &[(&str, crate::model::Role)],
        projects: &[(&str, &str, crate::model::Role)],
    ) -> Principal {
        let binding = |spec: Value| Object::new(Kind::RoleBinding.name(), "b", spec);
        let mut bindings: Vec<Object> = clusters
            .iter()
            .map(|(c, r)| binding(serde_json::json!({"user": user, "role": r.label(), "cluster": c})))
            .chain(projects.iter().map(|(p, c, r)| {
                binding(serde_json::json!({"user": user, "role": r.label(), "cluster": c, "project": p}))
            }))
            .collect();
        if admin {
            bindings.push(binding(serde_json::json!({"user": user, "role": "admin"})));
        }
        let roles = roles_of(&bindings, &Catalog::new(&[], &[]), user, &[]);
        Principal {
            user: user.into(),
            groups: Vec::new(),
            admin: roles.admin,
            global: roles.global,
            everywhere: roles.everywhere,
            clusters: roles.clusters,
            projects: roles.projects,
            token: "t".into(),
            provider: "local".into(),
            downstream: super::Downstream::default(),
        }
    }
}

fn spec_str<'a>(object: &'a Object, field: &str) -> Option<&'a str> {
    object.spec.get(field).and_then(Value::as_str)
}

/// The cluster an object belongs to, for cluster roles.
fn cluster_of(kind: Kind, object: &Object) -> Option<&str> {
    match kind {
        Kind::Cluster => Some(&object.metadata.name),
        Kind::Host
        | Kind::RegistrationToken
        | Kind::RoleBinding
        | Kind::Plan
        | Kind::Project
        | Kind::ProjectSecret
        | Kind::EtcdSnapshot
        | Kind::Machine
        | Kind::BundleDeployment => spec_str(object, "cluster"),
        Kind::Token => object
            .spec
            .get("agent")
            .and_then(|a| a.get("cluster"))
            .and_then(Value::as_str),
        Kind::User
        | Kind::Setting
        | Kind::AuthProvider
        | Kind::CloudCredential
        | Kind::MachineTemplate
        | Kind::RoleTemplate
        | Kind::GlobalRole
        | Kind::ClusterGroup
        | Kind::Bundle
        | Kind::GitRepo => None,
    }
}

/// The project an object belongs to, for project roles.
fn project_of(kind: Kind, object: &Object) -> Option<&str> {
    match kind {
        Kind::Project => Some(&object.metadata.name),
        Kind::RoleBinding | Kind::ProjectSecret => spec_str(object, "project"),
        _ => None,
    }
}

/// May `principal` do `verb` to `object` of `kind`? For `List`/`Watch`, call per item and keep
/// the allowed ones; for `Create`, pass the object to be created.
///
/// The rules of the roles held decide, on `management.drover.io` and the kind's plural: the
/// global roles' on every object, the templates held on an object's cluster (or project) on
/// the objects of that cluster (or project). Some things no role grants but `admin`, as the
/// hub makes them itself (hosts, machines, plans, a snapshot's contents) or as they could
/// grant more than their author holds (roles); a user's own tokens and user are theirs.
pub fn authorize(
    principal: &Principal,
    verb: Verb,
    kind: Kind,
    object: &Object,
) -> Result<(), AuthError> {
    if principal.admin {
        return Ok(());
    }
    let name = object.metadata.name.as_str();
    let verbs: &[&str] = match verb {
        Verb::Update => &["update", "patch"],
        v => &[v.rule_verb()],
    };
    let by = |access: &Access| verbs.iter().any(|v| access.allows_hub(v, kind, Some(name)));
    let globally = verbs
        .iter()
        .any(|v| principal.may_globally(v, kind, Some(name)));
    let on_cluster = || cluster_of(kind, object).is_some_and(|c| by(&principal.on_cluster(c)));
    let on_project =
        || project_of(kind, object).is_some_and(|p| principal.on_project(p).is_some_and(by));
    let reserved = matches!(
        (kind, verb),
        (Kind::Host, Verb::Create)
            | (Kind::Machine, Verb::Create | Verb::Update)
            | (Kind::Plan, Verb::Create | Verb::Update | Verb::Delete)
            | (Kind::EtcdSnapshot, Verb::Update)
            | (
                Kind::RoleTemplate | Kind::GlobalRole,
                Verb::Create | Verb::Update | Verb::Delete
            )
            | (Kind::Token, Verb::Update)
            | (
                Kind::BundleDeployment,
                Verb::Create | Verb::Update | Verb::Delete
            )
    );
    let allowed = !reserved
        && match kind {
            // A cluster is made by those a global role lets (who then own it); the people of
            // a project see its cluster (not its hosts).
            Kind::Cluster if verb == Verb::Create => globally,
            Kind::Cluster => globally || on_cluster() || (verb.reads() && principal.reaches(name)),
            Kind::User => (verb == Verb::Get && name == principal.user) || globally,
            Kind::Token => {
                let mine = spec_str(object, "user") == Some(principal.user.as_str());
                let agent = object.spec.get("agent").is_some();
                mine || (agent && verb != Verb::Create && on_cluster())
            }
            _ => globally || on_cluster() || on_project(),
        };
    if allowed {
        Ok(())
    } else {
        Err(AuthError::Forbidden(forbidden_message(
            principal, verb, kind, object,
        )))
    }
}

/// Whether `principal` may list or watch `kind` at all. Lists are filtered to the objects the
/// caller may read; a kind whose objects are no cluster's or project's (users, directories,
/// cloud credentials) is refused outright unless a global role lets the caller list it, as
/// Kubernetes refuses a list, so a client says "not allowed" rather than showing an empty list.
pub fn may_list(principal: &Principal, kind: Kind) -> Result<(), AuthError> {
    match kind {
        Kind::User | Kind::AuthProvider | Kind::CloudCredential
            if !principal.may_globally("list", kind, None) =>
        {
            Err(AuthError::Forbidden(format!(
                "user {:?} may not list {}: that needs the admin role",
                principal.user,
                kind.plural()
            )))
        }
        _ => Ok(()),
    }
}

fn forbidden_message(principal: &Principal, verb: Verb, kind: Kind, object: &Object) -> String {
    let what = format!("{:?} {} {:?}", verb, kind.name(), object.metadata.name).to_lowercase();
    match cluster_of(kind, object) {
        Some(cluster) => format!(
            "user {:?} may not {what}: that needs {} on cluster {cluster:?}; ask an admin or the cluster's owner",
            principal.user,
            if verb.reads() {
                "a role".to_owned()
            } else {
                format!(
                    "the cluster-owner role (or a role that allows {} {} in {HUB_GROUP})",
                    verb.rule_verb(),
                    kind.plural()
                )
            }
        ),
        None => format!(
            "user {:?} may not {what}: that needs the admin role",
            principal.user
        ),
    }
}
