//! The resources the simulated API server serves, as discovery describes them.

/// One resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resource {
    /// "" for the core group.
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) singular: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    pub(crate) short_names: &'static [&'static str],
    /// Subresources, e.g. "status", "scale", "log".
    pub(crate) subresources: &'static [&'static str],
    /// A custom resource's printer columns (its CRD's `additionalPrinterColumns`: name, type,
    /// JSON path); empty for built-in kinds, whose columns `table.rs` knows.
    pub(crate) printer_columns: &'static [(&'static str, &'static str, &'static str)],
}

impl Resource {
    /// `v1` or `apps/v1`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The key objects of this resource are stored under: `pods`, `apps/deployments`.
    pub(crate) fn key(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}/{}", self.group, self.plural)
        }
    }
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The verbs discovery lists for every resource here.
pub(crate) fn verbs() -> &'static [&'static str] {
    ALL_VERBS
}

macro_rules! resource {
    ($group:expr, $plural:expr, $singular:expr, $kind:expr, $namespaced:expr, [$($short:expr),*], [$($sub:expr),*]) => {
        Resource {
            group: $group,
            version: "v1",
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $namespaced,
            short_names: &[$($short),*],
            subresources: &[$($sub),*],
            printer_columns: &[],
        }
    };
}

/// Every resource served.
pub(crate) const RESOURCES: &[Resource] = &[
    resource!(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        ["ns"],
        ["status"]
    ),
    resource!("", "nodes", "node", "Node", false, ["no"], ["status"]),
    resource!(
        "",
        "pods",
        "pod",
        "Pod",
        true,
        ["po"],
        ["status", "log", "exec", "attach", "portforward", "eviction"]
    ),
    resource!(
        "",
        "services",
        "service",
        "Service",
        true,
        ["svc"],
        ["status"]
    ),
    resource!("", "configmaps", "configmap", "ConfigMap", true, ["cm"], []),
    resource!("", "secrets", "secret", "Secret", true, [], []),
    resource!(
        "",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        ["sa"],
        ["token"]
    ),
    resource!("", "events", "event", "Event", true, ["ev"], []),
    // Served (empty unless created) because `kubectl describe namespace` lists them.
    resource!(
        "",
        "resourcequotas",
        "resourcequota",
        "ResourceQuota",
        true,
        ["quota"],
        ["status"]
    ),
    resource!(
        "",
        "limitranges",
        "limitrange",
        "LimitRange",
        true,
        ["limits"],
        []
    ),
    resource!(
        "apps",
        "deployments",
        "deployment",
        "Deployment",
        true,
        ["deploy"],
        ["status", "scale"]
    ),
    resource!(
        "apps",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        ["ds"],
        ["status"]
    ),
    resource!(
        "apps",
        "replicasets",
        "replicaset",
        "ReplicaSet",
        true,
        ["rs"],
        ["status", "scale"]
    ),
    resource!(
        "apps",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        true,
        ["sts"],
        ["status", "scale"]
    ),
    resource!("batch", "jobs", "job", "Job", true, [], ["status"]),
    resource!(
        "batch",
        "cronjobs",
        "cronjob",
        "CronJob",
        true,
        ["cj"],
        ["status"]
    ),
    resource!(
        "policy",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        ["pdb"],
        ["status"]
    ),
    resource!(
        "coordination.k8s.io",
        "leases",
        "lease",
        "Lease",
        true,
        [],
        []
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "roles",
        "role",
        "Role",
        true,
        [],
        []
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        [],
        []
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        [],
        []
    ),
    resource!(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        [],
        []
    ),
    resource!(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        ["crd", "crds"],
        ["status"]
    ),
    // The custom resources K3s installs in every cluster (its helm-controller's HelmChart and
    // its deploy controller's Addon), served as the CRDs seeded in `seed` define them.
    Resource {
        group: "helm.cattle.io",
        version: "v1",
        plural: "helmcharts",
        singular: "helmchart",
        kind: "HelmChart",
        namespaced: true,
        short_names: &[],
        subresources: &["status"],
        printer_columns: &[
            ("Job", "string", ".status.jobName"),
            ("Chart", "string", ".spec.chart"),
            ("TargetNamespace", "string", ".spec.targetNamespace"),
            ("Version", "string", ".spec.version"),
            ("Repo", "string", ".spec.repo"),
            ("HelmVersion", "string", ".spec.helmVersion"),
            ("Bootstrap", "boolean", ".spec.bootstrap"),
        ],
    },
    Resource {
        group: "k3s.cattle.io",
        version: "v1",
        plural: "addons",
        singular: "addon",
        kind: "Addon",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        printer_columns: &[
            ("Source", "string", ".spec.source"),
            ("Checksum", "string", ".spec.checksum"),
        ],
    },
];

/// The resources served as custom resources: those with a CRD.
pub(crate) fn custom() -> impl Iterator<Item = &'static Resource> {
    RESOURCES.iter().filter(|r| !r.printer_columns.is_empty())
}

/// The groups other than core, in discovery order.
pub(crate) fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !groups.contains(&r.group) {
            groups.push(r.group);
        }
    }
    groups
}

/// The resource whose objects have this `apiVersion` and `kind`.
pub(crate) fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

/// The resource `plural` of `group`/`version`.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}
