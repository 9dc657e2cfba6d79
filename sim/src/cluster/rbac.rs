//! Authorization as kube-apiserver's RBAC authorizer does it: every request, after
//! impersonation, is allowed only if a rule of a Role or ClusterRole bound to the user, one of
//! their groups or their service account grants the verb on the resource (and subresource),
//! in the namespace, for the name. ClusterRoles with an `aggregationRule` take the rules of
//! every ClusterRole their selectors match, as the built-in `admin`, `edit` and `view` do.
//! The defaults a new cluster has are seeded at start: `cluster-admin` (bound to
//! `system:masters`), `admin`, `edit`, `view`, and `system:basic-user` so that everyone may
//! ask what they may do (`SelfSubjectAccessReview`, i.e. `kubectl auth can-i`).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Identity, store::Store};

const GROUP: &str = "rbac.authorization.k8s.io";
const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";
const AGGREGATE: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// What a request asks to do, in RBAC's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attributes {
    pub(crate) verb: String,
    /// "" for the core group.
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) subresource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
}

impl Attributes {
    /// The message kube-apiserver gives when RBAC says no.
    pub(crate) fn forbidden(&self, who: &Identity) -> String {
        let resource = match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        };
        let object = match &self.name {
            Some(name) => format!("{resource} \"{name}\""),
            None => resource.clone(),
        };
        let scope = match &self.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            who.user, self.verb, self.group
        )
    }
}

fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn listed(list: &Value, wanted: &str) -> bool {
    strings(list).any(|v| v == "*" || v == wanted)
}

/// Does one PolicyRule grant `attrs`?
fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    if !listed(&rule["verbs"], &attrs.verb) || !listed(&rule["apiGroups"], &attrs.group) {
        return false;
    }
    let resource_ok = match &attrs.subresource {
        Some(sub) => strings(&rule["resources"]).any(|r| {
            r == "*" || r == format!("{}/{sub}", attrs.resource) || r == format!("*/{sub}")
        }),
        None => listed(&rule["resources"], &attrs.resource),
    };
    if !resource_ok {
        return false;
    }
    let names: Vec<&str> = strings(&rule["resourceNames"]).collect();
    names.is_empty() || attrs.name.as_deref().is_some_and(|n| names.contains(&n))
}

fn labels_match(object: &Value, selector: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn any_rule(role: &Value, attrs: &Attributes) -> bool {
    role["rules"]
        .as_array()
        .is_some_and(|rules| rules.iter().any(|rule| rule_allows(rule, attrs)))
}

/// Whether a ClusterRole grants `attrs`: by its own rules, or (aggregated) by those of the
/// roles it selects, and of what those select in turn (the controller that fills `rules` in
/// Kubernetes gets there over several passes; `view` is selected by `edit`, `edit` by
/// `admin`). Objects are shared, not copied: this runs on every request.
fn cluster_role_allows(store: &Store, role: Arc<Value>, attrs: &Attributes) -> bool {
    if any_rule(&role, attrs) {
        return true;
    }
    if role["aggregationRule"].is_null() {
        return false;
    }
    let (all, _) = store.list(CLUSTER_ROLES, None);
    let mut seen = vec![role["metadata"]["name"].clone()];
    let mut pending = vec![role];
    while let Some(role) = pending.pop() {
        for selector in role["aggregationRule"]["clusterRoleSelectors"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for other in &all {
                let name = &other["metadata"]["name"];
                if labels_match(other, selector) && !seen.contains(name) {
                    if any_rule(other, attrs) {
                        return true;
                    }
                    seen.push(name.clone());
                    pending.push(other.clone());
                }
            }
        }
    }
    false
}

fn subject_matches(subject: &Value, who: &Identity, binding_namespace: &str) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => who.user == name,
        Some("Group") => who.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"]
                .as_str()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(binding_namespace);
            who.user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn bound(binding: &Value, who: &Identity) -> bool {
    let namespace = binding["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| subject_matches(s, who, namespace))
}

fn role_allows(
    store: &Store,
    role_ref: &Value,
    namespace: Option<&str>,
    attrs: &Attributes,
) -> bool {
    let name = role_ref["name"].as_str().unwrap_or_default().to_owned();
    match (role_ref["kind"].as_str(), namespace) {
        (Some("ClusterRole"), _) => store
            .get(CLUSTER_ROLES, &(String::new(), name))
            .is_some_and(|role| cluster_role_allows(store, role, attrs)),
        (Some("Role"), Some(ns)) => store
            .get(ROLES, &(ns.to_owned(), name))
            .is_some_and(|role| any_rule(&role, attrs)),
        _ => false,
    }
}

/// Whether `who` may do `attrs`, and the binding that allows it (for the review's reason).
pub(crate) fn allowed(store: &Store, who: &Identity, attrs: &Attributes) -> Option<String> {
    let grants = |binding: &Arc<Value>, namespace: Option<&str>| {
        bound(binding, who) && role_allows(store, &binding["roleRef"], namespace, attrs)
    };
    let name = |binding: &Value| {
        binding["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let (cluster_bindings, _) = store.list(CLUSTER_ROLE_BINDINGS, None);
    if let Some(b) = cluster_bindings.iter().find(|b| grants(b, None)) {
        return Some(format!(
            "RBAC: allowed by ClusterRoleBinding \"{}\"",
            name(b)
        ));
    }
    let namespace = attrs.namespace.as_deref()?;
    let (bindings, _) = store.list(ROLE_BINDINGS, Some(namespace));
    bindings
        .iter()
        .find(|b| grants(b, Some(namespace)))
        .map(|b| format!("RBAC: allowed by RoleBinding \"{}/{namespace}\"", name(b)))
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

/// Rules of the built-in aggregated roles, as far as the resources served here go. Each holds
/// only what its level adds: `edit` takes `view`'s by aggregation, `admin` both.
fn view_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "pods",
                "pods/log",
                "pods/status",
                "replicationcontrollers",
                "serviceaccounts",
                "services",
                "services/status",
                "events",
                "namespaces",
                "namespaces/status",
                "limitranges",
                "resourcequotas",
                "resourcequotas/status",
            ],
            READ,
        ),
        rule(
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
            READ,
        ),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "statefulsets",
            ],
            READ,
        ),
    ]
}

fn edit_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &["pods/attach", "pods/exec", "pods/portforward"],
            &["create", "get"],
        ),
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
        rule(&[""], &["pods/eviction"], &["create"]),
        rule(&["policy"], &["poddisruptionbudgets"], WRITE),
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
    ]
}

fn admin_rules() -> Vec<Value> {
    vec![
        rule(&[GROUP], &["roles", "rolebindings"], &["*"]),
        rule(
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
            &["create"],
        ),
    ]
}

fn cluster_role(name: &str, labels: Value, rules: Vec<Value>, aggregate: Option<&str>) -> Value {
    let mut role = json!({
        "kind": "ClusterRole",
        "apiVersion": format!("{GROUP}/v1"),
        "metadata": {"name": name, "labels": labels},
        "rules": rules,
    });
    if let Some(to) = aggregate {
        role["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {format!("{AGGREGATE}{to}"): "true"}}]});
    }
    role
}

fn cluster_role_binding(name: &str, role: &str, group: &str) -> Value {
    json!({
        "kind": "ClusterRoleBinding",
        "apiVersion": format!("{GROUP}/v1"),
        "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": group}],
    })
}

/// The roles and bindings a new cluster starts with.
pub(crate) fn seed_defaults(store: &Store) {
    let defaults = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let with = |extra: &[&str]| {
        let mut labels = defaults.clone();
        for to in extra {
            labels[format!("{AGGREGATE}{to}")] = json!("true");
        }
        labels
    };
    store.seed(
        CLUSTER_ROLES,
        [
            cluster_role(
                "cluster-admin",
                defaults.clone(),
                vec![
                    rule(&["*"], &["*"], &["*"]),
                    json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
                ],
                None,
            ),
            // Empty rules: filled by aggregation, as in Kubernetes.
            cluster_role("admin", defaults.clone(), Vec::new(), Some("admin")),
            cluster_role("edit", with(&["admin"]), Vec::new(), Some("edit")),
            cluster_role("view", with(&["admin", "edit"]), Vec::new(), Some("view")),
            cluster_role(
                "system:aggregate-to-admin",
                with(&["admin"]),
                admin_rules(),
                None,
            ),
            cluster_role(
                "system:aggregate-to-edit",
                with(&["admin", "edit"]),
                edit_rules(),
                None,
            ),
            cluster_role(
                "system:aggregate-to-view",
                with(&["admin", "edit", "view"]),
                view_rules(),
                None,
            ),
            cluster_role(
                "system:basic-user",
                defaults.clone(),
                vec![rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                )],
                None,
            ),
        ],
    );
    store.seed(
        CLUSTER_ROLE_BINDINGS,
        [
            cluster_role_binding("cluster-admin", "cluster-admin", "system:masters"),
            cluster_role_binding(
                "system:basic-user",
                "system:basic-user",
                "system:authenticated",
            ),
        ],
    );
}

/// Reads what a `SelfSubjectAccessReview` asks (its JSON, or the JSON its protobuf stands for).
pub(crate) fn review_attributes(review: &Value) -> Result<Attributes, String> {
    let spec = &review["spec"]["resourceAttributes"];
    let field = |name: &str| {
        spec[name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let (Some(verb), Some(resource)) = (field("verb"), field("resource")) else {
        return Err(
            "spec.resourceAttributes needs a verb and a resource (non-resource reviews are not simulated)"
                .into(),
        );
    };
    Ok(Attributes {
        verb,
        group: field("group").unwrap_or_default(),
        resource,
        subresource: field("subresource"),
        namespace: field("namespace"),
        name: field("name"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    fn attrs(verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: None,
            namespace: namespace.map(str::to_owned),
            name: None,
        }
    }

    fn store_with(bindings: &[(&str, Value)]) -> Store {
        let store = Store::default();
        seed_defaults(&store);
        for (resource, binding) in bindings {
            store.seed(resource, [binding.clone()]);
        }
        store
    }

    #[test]
    fn aggregated_roles_grant_what_kubernetes_built_ins_grant() {
        let view = json!({"metadata": {"name": "v", "namespace": "team"}, "roleRef": {"kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "vera"}]});
        let edit = json!({"metadata": {"name": "e"}, "roleRef": {"kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "Group", "name": "devs"}]});
        let store = store_with(&[(ROLE_BINDINGS, view), (CLUSTER_ROLE_BINDINGS, edit)]);
        let vera = who("vera", &["system:authenticated"]);
        assert!(allowed(&store, &vera, &attrs("list", "", "pods", Some("team"))).is_some());
        assert!(allowed(&store, &vera, &attrs("delete", "", "pods", Some("team"))).is_none());
        assert!(allowed(&store, &vera, &attrs("list", "", "pods", Some("other"))).is_none());
        assert!(allowed(&store, &vera, &attrs("get", "", "secrets", Some("team"))).is_none());
        let dev = who("dan", &["devs"]);
        assert!(
            allowed(
                &store,
                &dev,
                &attrs("create", "apps", "deployments", Some("x"))
            )
            .is_some()
        );
        assert!(allowed(&store, &dev, &attrs("list", "", "nodes", None)).is_none());
        assert!(
            allowed(
                &store,
                &dev,
                &attrs("create", GROUP, "rolebindings", Some("x"))
            )
            .is_none()
        );
        let root = who("root", &["system:masters"]);
        assert!(allowed(&store, &root, &attrs("delete", "", "nodes", None)).is_some());
    }

    #[test]
    fn service_accounts_and_resource_names_are_matched_exactly() {
        let role = json!({"metadata": {"name": "one", "namespace": "ns"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["get"]}]});
        let binding = json!({"metadata": {"name": "b", "namespace": "ns"}, "roleRef": {"kind": "Role", "name": "one"},
            "subjects": [{"kind": "ServiceAccount", "name": "app"}]});
        let store = store_with(&[(ROLES, role), (ROLE_BINDINGS, binding)]);
        let sa = who("system:serviceaccount:ns:app", &[]);
        let mut get = attrs("get", "", "configmaps", Some("ns"));
        assert!(allowed(&store, &sa, &get).is_none(), "no name, no grant");
        get.name = Some("cfg".into());
        assert!(allowed(&store, &sa, &get).is_some());
        get.name = Some("other".into());
        assert!(allowed(&store, &sa, &get).is_none());
        let other = who("system:serviceaccount:elsewhere:app", &[]);
        get.name = Some("cfg".into());
        assert!(allowed(&store, &other, &get).is_none());
    }

    #[test]
    fn a_review_needs_a_verb_and_a_resource() {
        let asked = serde_json::json!({"spec": {"resourceAttributes": {"namespace": "default", "verb": "delete", "resource": "pods"}}});
        assert_eq!(
            review_attributes(&asked).unwrap(),
            attrs_of("delete", "pods", "default")
        );
        let nonresource = serde_json::json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        assert!(review_attributes(&nonresource).is_err());
    }

    fn attrs_of(verb: &str, resource: &str, namespace: &str) -> Attributes {
        attrs(verb, "", resource, Some(namespace))
    }
}
