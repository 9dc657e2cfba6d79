//! What roles allow: role templates and global roles resolved with what they inherit, and
//! Kubernetes' rule matching over them. The hub asks it of its own objects (rules on
//! `management.drover.io`); the cluster's API server asks the same rules, as the
//! cluster-agent writes them, of everything else.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use crate::{
    model::{GlobalRoleSpec, Kind, PolicyRule, RoleTemplateSpec, TemplateContext},
    store::{LabelSelector, Object, Store, StoreError},
};

pub mod builtin;

/// Every role template and global role, the builtin ones as this hub defines them (whatever
/// the store holds under their names).
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    templates: BTreeMap<String, Arc<RoleTemplateSpec>>,
    globals: BTreeMap<String, Arc<GlobalRoleSpec>>,
}

impl Catalog {
    /// From stored objects (being deleted or not: a binding to a template being deleted still
    /// grants until it is gone) and the builtins.
    pub fn new(templates: &[Object], globals: &[Object]) -> Catalog {
        let mut catalog = Catalog::default();
        for object in templates {
            if let Ok(spec) = serde_json::from_value(object.spec.clone()) {
                catalog
                    .templates
                    .insert(object.metadata.name.clone(), Arc::new(spec));
            }
        }
        for object in globals {
            if let Ok(spec) = serde_json::from_value(object.spec.clone()) {
                catalog
                    .globals
                    .insert(object.metadata.name.clone(), Arc::new(spec));
            }
        }
        catalog
            .templates
            .extend(builtin::templates().iter().cloned());
        catalog.globals.extend(builtin::globals().iter().cloned());
        catalog
    }

    /// The catalog as the store holds it now.
    pub async fn read(store: &dyn Store) -> Result<Catalog, StoreError> {
        let all = LabelSelector::everything();
        let (templates, _) = store.list(Kind::RoleTemplate.name(), &all).await?;
        let (globals, _) = store.list(Kind::GlobalRole.name(), &all).await?;
        Ok(Catalog::new(&templates, &globals))
    }

    pub fn template(&self, name: &str) -> Option<&RoleTemplateSpec> {
        self.templates.get(name).map(Arc::as_ref)
    }

    pub fn global(&self, name: &str) -> Option<&GlobalRoleSpec> {
        self.globals.get(name).map(Arc::as_ref)
    }

    pub fn templates(&self) -> impl Iterator<Item = (&String, &RoleTemplateSpec)> {
        self.templates
            .iter()
            .map(|(name, spec)| (name, spec.as_ref()))
    }

    /// Every global role's name, in order.
    pub fn global_names(&self) -> Vec<String> {
        self.globals.keys().cloned().collect()
    }

    /// `name` and every template it inherits, directly or not, each once (a cycle, which
    /// validation refuses, ends where it closes). Names of missing templates are left out, and
    /// so are those of the other context (which validation refuses too): a project's rules
    /// never reach a cluster-wide binding, nor a cluster's a project's.
    pub fn closure(&self, name: &str) -> Vec<String> {
        let mut seen = BTreeSet::new();
        let mut order = Vec::new();
        let Some(context) = self.templates.get(name).map(|t| t.context) else {
            return order;
        };
        let mut pending = vec![name.to_owned()];
        while let Some(next) = pending.pop() {
            let Some(spec) = self.templates.get(&next).filter(|t| t.context == context) else {
                continue;
            };
            if !seen.insert(next.clone()) {
                continue;
            }
            order.push(next);
            pending.extend(spec.inherits.iter().rev().cloned());
        }
        order
    }

    /// The rules of template `name` and of all it inherits, each rule once, in order.
    pub fn rules_of(&self, name: &str) -> Vec<PolicyRule> {
        let mut seen = BTreeSet::new();
        let mut rules = Vec::new();
        for template in self.closure(name) {
            for rule in self.templates.get(&template).map_or(&[][..], |t| &t.rules) {
                if seen.insert(rule.clone()) {
                    rules.push(rule.clone());
                }
            }
        }
        rules
    }

    /// Whether template `name`, as `spec` would make it, fits with the others: what it
    /// inherits exists, has a context it may inherit, and does not lead back to it.
    pub fn check_inherits(&self, name: &str, spec: &RoleTemplateSpec) -> Result<(), String> {
        for (i, parent) in spec.inherits.iter().enumerate() {
            let Some(found) = self.templates.get(parent) else {
                return Err(format!(
                    "spec.inherits[{i}]: RoleTemplate {parent:?} does not exist; create it first"
                ));
            };
            match (spec.context, found.context) {
                (TemplateContext::Project, TemplateContext::Cluster) => {
                    return Err(format!(
                        "spec.inherits[{i}]: project template {name:?} cannot inherit cluster template {parent:?}: a cluster's rules (nodes, the hub's hosts) mean nothing in a project's namespaces; inherit project templates"
                    ));
                }
                (TemplateContext::Cluster, TemplateContext::Project) => {
                    return Err(format!(
                        "spec.inherits[{i}]: cluster template {name:?} cannot inherit project template {parent:?}: its rules would reach the whole cluster, beyond the project's namespaces; inherit cluster templates"
                    ));
                }
                _ => {}
            }
            if parent == name || self.closure(parent).iter().any(|t| t == name) {
                return Err(format!(
                    "spec.inherits[{i}]: {parent:?} inherits {name:?} already; inheriting it back would make a cycle"
                ));
            }
        }
        Ok(())
    }

    /// The templates that inherit `name` directly.
    pub fn heirs(&self, name: &str) -> Vec<String> {
        self.templates
            .iter()
            .filter(|(_, t)| t.inherits.iter().any(|i| i == name))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The global roles that grant template `name` on every cluster.
    pub fn granting_globals(&self, name: &str) -> Vec<String> {
        self.globals
            .iter()
            .filter(|(_, g)| g.inherited_cluster_roles.iter().any(|i| i == name))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

fn listed(list: &[String], wanted: &str) -> bool {
    list.iter().any(|v| v == "*" || v == wanted)
}

/// Whether one rule grants `verb` on `resource` (`pods`, or `pods/log` for a subresource) of
/// API group `group`, for the object `name` (none for a list or a create), as
/// kube-apiserver's RBAC authorizer decides it.
pub fn rule_allows(
    rule: &PolicyRule,
    verb: &str,
    group: &str,
    resource: &str,
    name: Option<&str>,
) -> bool {
    if !listed(&rule.verbs, verb) || !listed(&rule.api_groups, group) {
        return false;
    }
    let resource_ok = match resource.split_once('/') {
        Some((_, sub)) => rule
            .resources
            .iter()
            .any(|r| r == "*" || r == resource || *r == format!("*/{sub}")),
        None => listed(&rule.resources, resource),
    };
    resource_ok
        && (rule.resource_names.is_empty()
            || name.is_some_and(|n| rule.resource_names.iter().any(|r| r == n)))
}

/// Whether any of `rules` grants it (see [`rule_allows`]).
pub fn allows(
    rules: &[PolicyRule],
    verb: &str,
    group: &str,
    resource: &str,
    name: Option<&str>,
) -> bool {
    rules
        .iter()
        .any(|r| rule_allows(r, verb, group, resource, name))
}

/// Whether any of `rules` grants `verb` on the non-resource `path` (`/healthz`; a rule's
/// trailing `*` matches below it).
pub fn allows_url(rules: &[PolicyRule], verb: &str, path: &str) -> bool {
    rules.iter().any(|r| {
        listed(&r.verbs, verb)
            && r.non_resource_urls.iter().any(|u| {
                u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            })
    })
}

/// The verbs that only read.
pub const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// Whether `rules` allow anything but reading, on resources of a group other than the hub's.
pub fn writes_downstream(rules: &[PolicyRule]) -> bool {
    rules.iter().any(|r| {
        r.verbs.iter().any(|v| !READ_VERBS.contains(&v.as_str()))
            && (!r.non_resource_urls.is_empty()
                || r.api_groups.iter().any(|g| g != crate::model::HUB_GROUP))
    })
}

/// Whether `held` grants everything `wanted` does (what a user must hold to grant `wanted`
/// to someone, as Kubernetes refuses a RoleBinding that escalates); the first thing not
/// covered, as a sentence, if not. A `*` in `wanted` needs a `*` in `held`.
pub fn covers(held: &[PolicyRule], wanted: &[PolicyRule]) -> Result<(), String> {
    for rule in wanted {
        for verb in &rule.verbs {
            for url in &rule.non_resource_urls {
                if !allows_url(held, verb, url) {
                    return Err(format!("{verb} on {url}"));
                }
            }
            for group in &rule.api_groups {
                for resource in &rule.resources {
                    let names: Vec<Option<&str>> = if rule.resource_names.is_empty() {
                        vec![None]
                    } else {
                        rule.resource_names
                            .iter()
                            .map(|n| Some(n.as_str()))
                            .collect()
                    };
                    for name in names {
                        if !allows(held, verb, group, resource, name) {
                            let group = if group.is_empty() { "core" } else { group };
                            let named = name.map(|n| format!(" {n:?}")).unwrap_or_default();
                            return Err(format!("{verb} {resource}{named} ({group} group)"));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
