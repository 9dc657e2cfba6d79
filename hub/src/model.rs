//! The kinds the hub stores, their specs as Rust types (validated on every write, and the
//! source of the OpenAPI document), and the `state` each object shows, derived from its
//! conditions as Rancher's API derives it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{Object, ObjectMeta, Store, StoreError};

/// A condition, as Kubernetes shapes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
}

/// The status every kind shares: conditions, plus kind-specific fields kept as given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Status {
    pub fn of(object: &Object) -> Status {
        serde_json::from_value(object.status.clone()).unwrap_or_default()
    }

    /// Sets a condition; `lastTransitionTime` moves only when the status changes.
    pub fn set_condition(&mut self, kind: &str, status: bool, reason: &str, message: &str) {
        self.set_condition_to(kind, Some(status), reason, message);
    }

    /// As [`Status::set_condition`], with `None` for "Unknown" (on its way; not a failure).
    /// The condition of type `kind`, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    pub fn set_condition_to(
        &mut self,
        kind: &str,
        status: Option<bool>,
        reason: &str,
        message: &str,
    ) {
        let status = match status {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .to_owned();
        let now = crate::store::now_rfc3339();
        match self.conditions.iter_mut().find(|c| c.kind == kind) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason.to_owned();
                c.message = message.to_owned();
            }
            None => self.conditions.push(Condition {
                kind: kind.to_owned(),
                status,
                reason: reason.to_owned(),
                message: message.to_owned(),
                last_transition_time: now,
            }),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterType {
    /// An existing cluster; the hub's import manifest installs the agents into it.
    Imported,
    /// A cluster the hub installs (K3s or RKE2) on registered hosts.
    Custom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    K3s,
    Rke2,
}

/// A downstream Kubernetes cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    #[serde(rename = "type")]
    pub cluster_type: ClusterType,
    /// For custom clusters: what to install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    /// For custom clusters: the distribution's version, e.g. `v1.33.4+k3s1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// For custom clusters: how many hosts a version change rolls at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<UpgradeStrategy>,
    /// For custom clusters: the planner leaves the cluster's hosts as they are (no new plans)
    /// until this is false again; hosts still register and connect.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// For custom clusters: scheduled etcd snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_snapshots: Option<SnapshotSchedule>,
    /// For custom clusters: restore etcd from a snapshot. A restore runs once per
    /// `generation`; raise it to run one again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreRequest>,
    /// For custom clusters: rotate the distribution's certificates, host by host within the
    /// upgrade strategy's concurrency. Runs once per `generation`; raise it to rotate again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotate_certificates: Option<Generation>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// When a custom cluster's etcd is snapshotted on its own, and how many such snapshots stay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotSchedule {
    /// A cron expression in UTC: minute hour day-of-month month day-of-week, each `*`, a
    /// number, a range `a-b`, a step `*/n` or `a-b/n`, or a list of those; e.g. `0 */6 * * *`.
    pub schedule: String,
    /// Scheduled snapshots kept (the oldest go first); snapshots taken on demand are never
    /// removed by this. Default 5.
    #[serde(default = "five")]
    pub retention: u32,
    /// Keep a copy of each scheduled snapshot in the hub's data directory too (sent through
    /// the tunnel), so a restore works after losing the host that took it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copy_to_hub: bool,
}

fn five() -> u32 {
    5
}

/// Which snapshot to restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestoreRequest {
    /// The EtcdSnapshot's name (one of this cluster's, saved).
    pub snapshot: String,
    pub generation: u64,
}

/// A request that runs once per generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Generation {
    pub generation: u64,
}

/// An etcd snapshot of a custom cluster: creating one takes it (as a task on one of the
/// cluster's etcd hosts, with the distribution's `etcd-snapshot save`); its status says where
/// it is, its size, checksum and the distribution version; deleting it deletes the file too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdSnapshotSpec {
    pub cluster: String,
    /// Taken by the cluster's schedule (and so subject to its retention), not on demand.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scheduled: bool,
    /// Keep a copy in the hub's data directory too (sent through the tunnel), so a restore
    /// works after losing the host that took it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copy_to_hub: bool,
}

/// How a custom cluster's version change rolls over its hosts: servers (etcd and control
/// plane) first, then workers, each group so many hosts at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeStrategy {
    /// A number of hosts (`"1"`) or a share of them (`"25%"`, at least one); default `"1"`.
    #[serde(default = "one")]
    #[schemars(regex(pattern = r"^([1-9][0-9]*|([1-9][0-9]?|100)%)$"))]
    pub control_plane_concurrency: String,
    /// As `controlPlaneConcurrency`, for workers; default `"1"`.
    #[serde(default = "one")]
    #[schemars(regex(pattern = r"^([1-9][0-9]*|([1-9][0-9]?|100)%)$"))]
    pub worker_concurrency: String,
    /// Cordon each host's node and evict its pods (not DaemonSet pods) before its upgrade or
    /// its removal; uncordon it once upgraded.
    #[serde(default)]
    pub drain: bool,
}

fn one() -> String {
    "1".into()
}

impl Default for UpgradeStrategy {
    fn default() -> Self {
        Self {
            control_plane_concurrency: one(),
            worker_concurrency: one(),
            drain: false,
        }
    }
}

/// `"3"` → 3 hosts; `"25%"` → a quarter of `of`, rounded up, at least one. `None` if malformed.
pub fn concurrency(text: &str, of: usize) -> Option<usize> {
    match text.strip_suffix('%') {
        Some(pct) => {
            let pct: usize = pct.parse().ok().filter(|p| (1..=100).contains(p))?;
            Some((of * pct).div_ceil(100).max(1))
        }
        None => text.parse().ok().filter(|n| *n >= 1),
    }
}

/// Roles a host takes in its cluster: the ones its system-agent registers with.
pub use proto::register::HostRoles;

/// A machine running the system-agent, registered to a custom cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSpec {
    pub cluster: String,
    #[serde(default)]
    pub roles: HostRoles,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub internal_address: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// `key=value:Effect`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[^:]+:(NoSchedule|PreferNoSchedule|NoExecute)$")))]
    pub taints: Vec<String>,
}

/// A secret that lets agents of one cluster register. Only its hash is stored; the value is
/// shown once, inside the commands returned when it is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationTokenSpec {
    pub cluster: String,
    /// RFC 3339; none means it does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// sha256 of the secret, hex. Never returned by the API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(skip)]
    pub secret_hash: String,
}

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
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// A login session (dashboard cookie) rather than an API token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub session: bool,
    /// RFC 3339; none means it does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
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

/// Grants a role to a user (or a group) on one cluster, on one project of a cluster, or
/// globally for `admin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleBindingSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub role: Role,
    /// Required for cluster and project roles (a project's own cluster); absent for `admin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// For project roles: the project (of `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
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

/// What one host must look like; named after the host, pushed to its system-agent the moment
/// it is written. Written by the planner for custom clusters; an admin may write one too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanSpec {
    pub host: String,
    /// The host's cluster (for access checks).
    pub cluster: String,
    /// Which of the host's plan slots: "" (its plan) or "task" (a one-time operation, applied
    /// beside the plan; see `drover.plan.v1.Plans`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^(task)?$"))]
    pub slot: String,
    /// The plan (`drover.plan.v1.Plan` as JSON): `files`, `instructions`, `periodic`,
    /// `probes`, `maxFailures`.
    #[serde(default)]
    pub plan: Value,
}

/// A hub-wide setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SettingSpec {
    pub value: String,
}

/// The finalizer of the hub's clean-up: a Cluster carries it from its creation (its hosts
/// uninstalled, its access and credentials revoked before it goes), a Host until its uninstall
/// plan has run, an EtcdSnapshot until its file is deleted. Only the hub sets or removes it.
pub const CLEANUP_FINALIZER: &str = "drover.io/planner";

/// The kinds, with their URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Cluster,
    Host,
    RegistrationToken,
    User,
    Token,
    RoleBinding,
    Plan,
    Setting,
    Project,
    ProjectSecret,
    EtcdSnapshot,
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::Cluster,
        Kind::Host,
        Kind::RegistrationToken,
        Kind::User,
        Kind::Token,
        Kind::RoleBinding,
        Kind::Plan,
        Kind::Setting,
        Kind::Project,
        Kind::ProjectSecret,
        Kind::EtcdSnapshot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Cluster => "Cluster",
            Kind::Host => "Host",
            Kind::RegistrationToken => "RegistrationToken",
            Kind::User => "User",
            Kind::Token => "Token",
            Kind::RoleBinding => "RoleBinding",
            Kind::Plan => "Plan",
            Kind::Setting => "Setting",
            Kind::Project => "Project",
            Kind::ProjectSecret => "ProjectSecret",
            Kind::EtcdSnapshot => "EtcdSnapshot",
        }
    }

    /// The collection's path segment under `/v1/`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Cluster => "clusters",
            Kind::Host => "hosts",
            Kind::RegistrationToken => "registrationtokens",
            Kind::User => "users",
            Kind::Token => "tokens",
            Kind::RoleBinding => "rolebindings",
            Kind::Plan => "plans",
            Kind::Setting => "settings",
            Kind::Project => "projects",
            Kind::ProjectSecret => "projectsecrets",
            Kind::EtcdSnapshot => "etcdsnapshots",
        }
    }

    pub fn from_plural(plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == plural)
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The JSON Schema of this kind's spec.
    pub fn spec_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        match self {
            Kind::Cluster => generator.subschema_for::<ClusterSpec>(),
            Kind::Host => generator.subschema_for::<HostSpec>(),
            Kind::RegistrationToken => generator.subschema_for::<RegistrationTokenSpec>(),
            Kind::User => generator.subschema_for::<UserSpec>(),
            Kind::Token => generator.subschema_for::<TokenSpec>(),
            Kind::RoleBinding => generator.subschema_for::<RoleBindingSpec>(),
            Kind::Plan => generator.subschema_for::<PlanSpec>(),
            Kind::Setting => generator.subschema_for::<SettingSpec>(),
            Kind::Project => generator.subschema_for::<ProjectSpec>(),
            Kind::ProjectSecret => generator.subschema_for::<ProjectSecretSpec>(),
            Kind::EtcdSnapshot => generator.subschema_for::<EtcdSnapshotSpec>(),
        }
    }

    /// Checks `spec` parses as this kind's spec and holds sensible values; returns it
    /// normalised (as its type serialises it). The message says what to fix.
    pub fn validate_spec(self, spec: &Value) -> Result<Value, String> {
        fn check<T: serde::de::DeserializeOwned + Serialize>(
            spec: &Value,
            more: impl FnOnce(&T) -> Result<(), String>,
        ) -> Result<Value, String> {
            let typed: T =
                serde_json::from_value(spec.clone()).map_err(|e| format!("spec: {e}"))?;
            more(&typed)?;
            serde_json::to_value(&typed).map_err(|e| e.to_string())
        }
        match self {
            Kind::Cluster => check::<ClusterSpec>(spec, |s| {
                match s.cluster_type {
                ClusterType::Custom if s.distribution.is_none() => {
                    Err("spec.distribution: a custom cluster needs \"k3s\" or \"rke2\"".into())
                }
                ClusterType::Custom if s.version.as_deref().is_none_or(str::is_empty) => {
                    Err("spec.version: a custom cluster needs the distribution's version, e.g. v1.33.4+k3s1".into())
                }
                ClusterType::Imported if s.distribution.is_some() || s.version.is_some() => Err(
                    "spec.distribution and spec.version are for custom clusters; an imported cluster keeps its own"
                        .into(),
                ),
                ClusterType::Imported if s.paused => Err(
                    "spec.paused is for custom clusters; the hub plans nothing for an imported cluster"
                        .into(),
                ),
                ClusterType::Imported if s.upgrade_strategy.is_some() => Err(
                    "spec.upgradeStrategy is for custom clusters; the hub does not upgrade an imported cluster"
                        .into(),
                ),
                ClusterType::Imported
                    if s.etcd_snapshots.is_some()
                        || s.restore.is_some()
                        || s.rotate_certificates.is_some() =>
                {
                    Err("spec.etcdSnapshots, spec.restore and spec.rotateCertificates are for custom clusters; an imported cluster's etcd and certificates are its own".into())
                }
                _ => {
                    let strategy = s.upgrade_strategy.clone().unwrap_or_default();
                    for (field, value) in [
                        ("controlPlaneConcurrency", &strategy.control_plane_concurrency),
                        ("workerConcurrency", &strategy.worker_concurrency),
                    ] {
                        if concurrency(value, 100).is_none() {
                            return Err(format!(
                                "spec.upgradeStrategy.{field}: {value:?} must be a number of hosts (\"2\") or a percentage (\"25%\")"
                            ));
                        }
                    }
                    if let Some(schedule) = &s.etcd_snapshots {
                        crate::cron::Cron::parse(&schedule.schedule)
                            .map_err(|e| format!("spec.etcdSnapshots.schedule: {e}"))?;
                        if schedule.retention == 0 {
                            return Err("spec.etcdSnapshots.retention: keep at least 1 scheduled snapshot (or remove spec.etcdSnapshots to stop scheduling)".into());
                        }
                    }
                    if let Some(restore) = &s.restore {
                        validate_name(Kind::EtcdSnapshot, &restore.snapshot)
                            .map_err(|e| format!("spec.restore.snapshot: {e}"))?;
                    }
                    Ok(())
                }
            }
            }),
            Kind::Host => check::<HostSpec>(spec, |s| {
                if s.cluster.is_empty() {
                    return Err("spec.cluster: name the cluster this host belongs to".into());
                }
                for taint in &s.taints {
                    let ok = taint.split_once(':').is_some_and(|(kv, effect)| {
                        !kv.is_empty()
                            && matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
                    });
                    if !ok {
                        return Err(format!(
                            "spec.taints: {taint:?} must be key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute"
                        ));
                    }
                }
                Ok(())
            }),
            Kind::RegistrationToken => {
                check::<RegistrationTokenSpec>(spec, |s| non_empty("spec.cluster", &s.cluster))
            }
            Kind::User => check::<UserSpec>(spec, |s| {
                if let Some(p) = &s.password
                    && p.chars().count() < 12
                {
                    return Err("spec.password must have at least 12 characters".into());
                }
                for group in &s.groups {
                    // Like object names: no ':' so no group here can pose as a Kubernetes
                    // system group (system:masters) when impersonated downstream.
                    validate_name(Kind::User, group).map_err(|_| {
                        format!(
                            "spec.groups: {group:?} must be lowercase letters, digits and '-', starting with a letter"
                        )
                    })?;
                }
                Ok(())
            }),
            Kind::Token => check::<TokenSpec>(spec, |s| match (&s.user, &s.agent) {
                (Some(_), None) | (None, Some(_)) => Ok(()),
                _ => Err("a token acts as exactly one of spec.user or spec.agent".into()),
            }),
            Kind::RoleBinding => check::<RoleBindingSpec>(spec, |s| {
                if s.user.is_some() == s.group.is_some() {
                    return Err(
                        "a role binding names exactly one of spec.user or spec.group".into(),
                    );
                }
                match (s.role, &s.cluster, &s.project) {
                    (Role::Admin, None, None) => Ok(()),
                    (Role::Admin, _, _) => Err(
                        "spec.cluster, spec.project: admin is a global role; leave them out".into(),
                    ),
                    (Role::ProjectOwner | Role::ProjectMember, _, None) => Err(format!(
                        "spec.project: {} needs the project it applies to",
                        s.role.label()
                    )),
                    (Role::ClusterOwner | Role::ClusterMember, _, Some(_)) => Err(format!(
                        "spec.project: {} is a cluster role; for a project use project-owner, project-member or read-only",
                        s.role.label()
                    )),
                    (_, None, _) => Err(
                        "spec.cluster: cluster and project roles need the cluster they apply to"
                            .into(),
                    ),
                    (_, Some(c), project) => {
                        non_empty("spec.cluster", c)?;
                        project
                            .as_deref()
                            .map_or(Ok(()), |p| non_empty("spec.project", p))
                    }
                }
            }),
            Kind::Plan => check::<PlanSpec>(spec, |s| {
                non_empty("spec.host", &s.host)?;
                non_empty("spec.cluster", &s.cluster)?;
                if !matches!(s.slot.as_str(), "" | "task") {
                    return Err(format!(
                        "spec.slot: {:?} is not a slot; use \"\" (the host's plan) or \"task\"",
                        s.slot
                    ));
                }
                parse_plan(&s.plan).map(drop)
            }),
            Kind::Setting => check::<SettingSpec>(spec, |_| Ok(())),
            Kind::Project => check::<ProjectSpec>(spec, |s| non_empty("spec.cluster", &s.cluster)),
            Kind::EtcdSnapshot => {
                check::<EtcdSnapshotSpec>(spec, |s| non_empty("spec.cluster", &s.cluster))
            }
            Kind::ProjectSecret => check::<ProjectSecretSpec>(spec, |s| {
                non_empty("spec.cluster", &s.cluster)?;
                non_empty("spec.project", &s.project)?;
                for (key, value) in &s.data {
                    let key_ok = !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                    if !key_ok {
                        return Err(format!(
                            "spec.data: key {key:?} must be letters, digits, '-', '_' or '.'"
                        ));
                    }
                    use base64::Engine as _;
                    if base64::engine::general_purpose::STANDARD
                        .decode(value)
                        .is_err()
                    {
                        return Err(format!("spec.data.{key}: the value must be base64"));
                    }
                }
                Ok(())
            }),
        }
    }

    /// Removes what the API never returns (secret hashes, passwords).
    pub fn redact(self, object: &mut Object) {
        redact_spec(&mut object.spec);
    }

    /// As [`Kind::redact`], on an object already turned into JSON.
    pub fn redact_value(self, object: &mut Value) {
        if let Some(spec) = object.get_mut("spec") {
            redact_spec(spec);
        }
    }
}

fn redact_spec(spec: &mut Value) {
    if let Value::Object(spec) = spec {
        for field in ["secretHash", "passwordHash", "password"] {
            spec.remove(field);
        }
    }
}

/// A Plan's `spec.plan` as the protocol's type; the message says what to fix.
pub fn parse_plan(plan: &Value) -> Result<proto::plan::v1::Plan, String> {
    if plan.is_null() {
        return Ok(proto::plan::v1::Plan::default());
    }
    serde_json::from_value(plan.clone()).map_err(|e| format!("spec.plan: {e}"))
}

fn non_empty(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        Err(format!("{field} must not be empty"))
    } else {
        Ok(())
    }
}

/// Checks an object name: lowercase letters, digits and '-', starting with a letter, ending
/// with a letter or digit, at most 63 characters (it becomes part of URLs and DNS names).
pub fn validate_name(kind: Kind, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} name {name:?} is not valid: use 1-63 lowercase letters, digits and '-', starting with a letter",
            kind.name()
        ))
    }
}

/// What an object shows as its state, as Rancher's API summarises it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct State {
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// True when the state is an error the user should look at.
    #[serde(default)]
    pub error: bool,
    /// True while the object is on its way somewhere (provisioning, updating, removing).
    #[serde(default)]
    pub transitioning: bool,
}

impl State {
    fn new(state: &str, message: impl Into<String>, error: bool, transitioning: bool) -> Self {
        Self {
            state: state.to_owned(),
            message: message.into(),
            error,
            transitioning,
        }
    }
}

/// Derives the state from metadata and conditions. In order: being removed; an error; cut off;
/// still provisioning or updating; active when every condition holds.
pub fn derive_state(kind: Kind, meta: &ObjectMeta, status: &Status, spec: &Value) -> State {
    if meta.deletion_timestamp.is_some() {
        let waiting = meta.finalizers.join(", ");
        return State::new("removing", format!("waiting for {waiting}"), false, true);
    }
    let failed = |c: &Condition| {
        c.status == "False" && (c.reason.contains("Error") || c.reason.contains("Failed"))
    };
    if let Some(c) = status.conditions.iter().find(|c| failed(c)) {
        return State::new("error", c.message.clone(), true, false);
    }
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.kind == "Connected" && c.status == "False")
    {
        return State::new("disconnected", c.message.clone(), false, false);
    }
    for (condition, state) in [
        ("Provisioned", "provisioning"),
        ("Updated", "updating"),
        ("Restored", "restoring"),
        ("CertificatesRotated", "rotating"),
        ("Saved", "saving"),
    ] {
        if let Some(c) = status
            .conditions
            .iter()
            .find(|c| c.kind == condition && c.status != "True")
        {
            return State::new(state, c.message.clone(), false, true);
        }
    }
    if let Some(c) = status.conditions.iter().find(|c| c.status != "True") {
        return State::new(
            "unavailable",
            format!("{}: {}", c.kind, c.message),
            false,
            false,
        );
    }
    match kind {
        Kind::Cluster | Kind::Host if !status.conditions.iter().any(|c| c.kind == "Connected") => {
            let who = if kind == Kind::Cluster {
                "the cluster-agent"
            } else {
                "the system-agent"
            };
            State::new(
                "pending",
                format!("waiting for {who} to connect"),
                false,
                true,
            )
        }
        Kind::EtcdSnapshot if !status.conditions.iter().any(|c| c.kind == "Saved") => State::new(
            "pending",
            "waiting for the planner to take it (on the cluster's init host)",
            false,
            true,
        ),
        Kind::User if spec.get("disabled").and_then(Value::as_bool) == Some(true) => {
            State::new("inactive", "this user is disabled", false, false)
        }
        Kind::Token | Kind::RegistrationToken if expired(spec) => {
            State::new("expired", "this token has expired", false, false)
        }
        _ => State::new("active", "", false, false),
    }
}

/// Whether `spec.expiresAt` lies in the past.
pub fn expired(spec: &Value) -> bool {
    spec.get("expiresAt")
        .and_then(Value::as_str)
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        })
        .is_some_and(|t| t <= time::OffsetDateTime::now_utc())
}

/// Sets one condition on an object, retrying on concurrent writes.
pub async fn set_condition(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    condition: &str,
    value: bool,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    update_status(store, kind, name, |status| {
        status.set_condition(condition, value, reason, message)
    })
    .await
}

/// Changes an object's status, retrying on concurrent writes; a missing object is left alone,
/// and so is one the change leaves as it was (no write, so no watch event: controllers that
/// watch what they write do not wake themselves).
pub async fn update_status(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    mut change: impl FnMut(&mut Status),
) -> Result<(), StoreError> {
    for _ in 0..10 {
        let mut object = match store.get(kind.name(), name).await {
            Ok(o) => o,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let before = Status::of(&object);
        let mut status = before.clone();
        change(&mut status);
        if status == before {
            return Ok(());
        }
        object.status =
            serde_json::to_value(status).map_err(|e| StoreError::Backend(e.to_string()))?;
        match store.update(object).await {
            Err(StoreError::Conflict { .. }) => continue,
            other => return other.map(drop),
        }
    }
    Err(StoreError::Backend(format!(
        "{} {name}: too many concurrent writers",
        kind.name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state_of(kind: Kind, conditions: &[(&str, &str, &str)]) -> State {
        let mut status = Status::default();
        for (t, s, r) in conditions {
            status.conditions.push(Condition {
                kind: t.to_string(),
                status: s.to_string(),
                reason: r.to_string(),
                message: format!("{t} says {s}"),
                last_transition_time: String::new(),
            });
        }
        derive_state(kind, &ObjectMeta::default(), &status, &json!({}))
    }

    #[test]
    fn state_follows_conditions_in_rancher_order() {
        assert_eq!(state_of(Kind::Cluster, &[]).state, "pending");
        assert_eq!(
            state_of(Kind::Cluster, &[("Connected", "True", "")]).state,
            "active"
        );
        assert_eq!(
            state_of(Kind::Cluster, &[("Connected", "False", "Disconnected")]).state,
            "disconnected"
        );
        let err = state_of(
            Kind::Cluster,
            &[
                ("Connected", "True", ""),
                ("Provisioned", "False", "InstallFailed"),
            ],
        );
        assert_eq!((err.state.as_str(), err.error), ("error", true));
        assert_eq!(
            state_of(
                Kind::Host,
                &[("Connected", "True", ""), ("Provisioned", "Unknown", "")]
            )
            .state,
            "provisioning"
        );
        assert_eq!(state_of(Kind::Setting, &[]).state, "active");
    }

    #[test]
    fn a_deleting_object_is_removing() {
        let meta = ObjectMeta {
            deletion_timestamp: Some("2026-01-01T00:00:00Z".into()),
            finalizers: vec!["drover.io/agents".into()],
            ..ObjectMeta::default()
        };
        let s = derive_state(Kind::Cluster, &meta, &Status::default(), &json!({}));
        assert_eq!(s.state, "removing");
        assert!(s.message.contains("drover.io/agents"));
    }

    #[test]
    fn specs_are_checked_with_messages_that_name_the_field() {
        let cases = [
            (
                Kind::Cluster,
                json!({"type": "custom"}),
                "spec.distribution",
            ),
            (
                Kind::Cluster,
                json!({"type": "custom", "distribution": "k3s"}),
                "spec.version",
            ),
            (
                Kind::Cluster,
                json!({"type": "imported", "version": "v1"}),
                "custom clusters",
            ),
            (Kind::Cluster, json!({"type": "hosted"}), "unknown variant"),
            (
                Kind::Cluster,
                json!({"type": "imported", "colour": "red"}),
                "unknown field",
            ),
            (
                Kind::Host,
                json!({"cluster": "a", "taints": ["x=y"]}),
                "key=value:Effect",
            ),
            (Kind::User, json!({"password": "short"}), "12 characters"),
            (
                Kind::Cluster,
                json!({"type": "custom", "distribution": "k3s", "version": "v1",
                       "upgradeStrategy": {"workerConcurrency": "0"}}),
                "workerConcurrency",
            ),
            (
                Kind::RoleBinding,
                json!({"user": "u", "role": "admin", "cluster": "a"}),
                "global role",
            ),
            (
                Kind::RoleBinding,
                json!({"user": "u", "role": "read-only"}),
                "need the cluster",
            ),
            (
                Kind::RoleBinding,
                json!({"role": "read-only", "cluster": "a"}),
                "exactly one",
            ),
        ];
        for (kind, spec, expect) in cases {
            let err = kind.validate_spec(&spec).unwrap_err();
            assert!(err.contains(expect), "{kind:?} {spec}: {err}");
        }
        assert!(
            Kind::Cluster
                .validate_spec(
                    &json!({"type": "custom", "distribution": "rke2", "version": "v1.33.4+rke2r1"})
                )
                .is_ok()
        );
    }

    #[test]
    fn concurrency_is_a_count_or_a_share() {
        assert_eq!(concurrency("2", 10), Some(2));
        assert_eq!(concurrency("25%", 10), Some(3));
        assert_eq!(concurrency("10%", 3), Some(1));
        assert_eq!(concurrency("100%", 7), Some(7));
        for bad in ["0", "0%", "101%", "x", "-1", ""] {
            assert_eq!(concurrency(bad, 10), None, "{bad}");
        }
    }

    #[test]
    fn names_must_be_dns_labels() {
        for good in ["a", "prod-1", "c0"] {
            assert!(validate_name(Kind::Cluster, good).is_ok(), "{good}");
        }
        for bad in ["", "Prod", "1a", "a-", "a_b", &"a".repeat(64)] {
            assert!(validate_name(Kind::Cluster, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redaction_removes_secrets() {
        let mut object = Object::new("Token", "t", json!({"user": "u", "secretHash": "abc"}));
        Kind::Token.redact(&mut object);
        assert_eq!(object.spec, json!({"user": "u"}));
    }
}
