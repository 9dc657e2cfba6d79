//! The kinds the hub stores, with their URL names, how each is validated on every write, and
//! what of each is never shown.

use serde::Serialize;
use serde_json::Value;

use super::{
    AuthProviderSpec, BundleDeploymentSpec, BundleSpec, CloudCredentialSpec, ClusterGroupSpec,
    ClusterSpec, ClusterType, Distribution, EtcdSnapshotSpec, GitRepoSpec, GlobalRoleSpec,
    HostSpec, MachineSpec, MachineTemplateSpec, PlanSpec, ProjectSecretSpec, ProjectSpec,
    RegistrationTokenSpec, Role, RoleBindingSpec, RoleTemplateSpec, SettingSpec, TokenSpec,
    UserSpec, concurrency, parse_plan,
};
use crate::store::Object;

/// The finalizer of the hub's clean-up: a Cluster carries it from its creation (its hosts
/// uninstalled, its access and credentials revoked before it goes), a Host until its uninstall
/// plan has run, an EtcdSnapshot until its file is deleted. Only the hub sets or removes it.
pub const CLEANUP_FINALIZER: &str = "drover.io/planner";
/// On a hosted cluster until nothing of it is left in the cloud.
pub const HOSTED_FINALIZER: &str = "drover.io/hosted";

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
    AuthProvider,
    CloudCredential,
    MachineTemplate,
    Machine,
    RoleTemplate,
    GlobalRole,
    ClusterGroup,
    Bundle,
    BundleDeployment,
    GitRepo,
}

impl Kind {
    pub const ALL: [Kind; 21] = [
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
        Kind::AuthProvider,
        Kind::CloudCredential,
        Kind::MachineTemplate,
        Kind::Machine,
        Kind::RoleTemplate,
        Kind::GlobalRole,
        Kind::ClusterGroup,
        Kind::Bundle,
        Kind::BundleDeployment,
        Kind::GitRepo,
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
            Kind::AuthProvider => "AuthProvider",
            Kind::CloudCredential => "CloudCredential",
            Kind::MachineTemplate => "MachineTemplate",
            Kind::Machine => "Machine",
            Kind::RoleTemplate => "RoleTemplate",
            Kind::GlobalRole => "GlobalRole",
            Kind::ClusterGroup => "ClusterGroup",
            Kind::Bundle => "Bundle",
            Kind::BundleDeployment => "BundleDeployment",
            Kind::GitRepo => "GitRepo",
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
            Kind::AuthProvider => "authproviders",
            Kind::CloudCredential => "cloudcredentials",
            Kind::MachineTemplate => "machinetemplates",
            Kind::Machine => "machines",
            Kind::RoleTemplate => "roletemplates",
            Kind::GlobalRole => "globalroles",
            Kind::ClusterGroup => "clustergroups",
            Kind::Bundle => "bundles",
            Kind::BundleDeployment => "bundledeployments",
            Kind::GitRepo => "gitrepos",
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
            Kind::AuthProvider => generator.subschema_for::<AuthProviderSpec>(),
            Kind::CloudCredential => generator.subschema_for::<CloudCredentialSpec>(),
            Kind::MachineTemplate => generator.subschema_for::<MachineTemplateSpec>(),
            Kind::Machine => generator.subschema_for::<MachineSpec>(),
            Kind::RoleTemplate => generator.subschema_for::<RoleTemplateSpec>(),
            Kind::GlobalRole => generator.subschema_for::<GlobalRoleSpec>(),
            Kind::ClusterGroup => generator.subschema_for::<ClusterGroupSpec>(),
            Kind::Bundle => generator.subschema_for::<BundleSpec>(),
            Kind::BundleDeployment => generator.subschema_for::<BundleDeploymentSpec>(),
            Kind::GitRepo => generator.subschema_for::<GitRepoSpec>(),
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
                ClusterType::Hosted if s.hosted.is_none() => Err(
                    "spec.hosted: a hosted cluster needs its cloud's settings (driver, credential, region, kubernetesVersion, …)".into(),
                ),
                ClusterType::Imported | ClusterType::Custom if s.hosted.is_some() => Err(
                    "spec.hosted is for hosted clusters (spec.type: hosted)".into(),
                ),
                ClusterType::Hosted if s.distribution.is_some() || s.version.is_some() => Err(
                    "spec.distribution and spec.version are for custom clusters; a hosted cluster's version is spec.hosted.kubernetesVersion".into(),
                ),
                ClusterType::Hosted
                    if s.paused
                        || s.upgrade_strategy.is_some()
                        || s.etcd_snapshots.is_some()
                        || s.restore.is_some()
                        || s.rotate_certificates.is_some()
                        || s.authorized_endpoint.is_some()
                        || !s.machine_pools.is_empty()
                        || s.registries.is_some()
                        || !s.system_default_registry.is_empty()
                        || !s.config.is_empty()
                        || !s.host_config.is_empty() =>
                {
                    Err("spec.paused, upgradeStrategy, etcdSnapshots, restore, rotateCertificates, authorizedEndpoint, machinePools, registries, systemDefaultRegistry, config and hostConfig are for custom clusters: a hosted cluster's control plane and machines are the cloud's (its node groups are spec.hosted.nodeGroups)".into())
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
                ClusterType::Imported if !s.machine_pools.is_empty() => Err(
                    "spec.machinePools are for custom clusters: the hub makes their machines; an imported cluster's are its own"
                        .into(),
                ),
                ClusterType::Imported
                    if s.registries.is_some() || !s.system_default_registry.is_empty() =>
                {
                    Err("spec.registries and spec.systemDefaultRegistry are for custom clusters: they configure the distribution Drover installs; an imported cluster's are its own".into())
                }
                ClusterType::Imported if !s.config.is_empty() || !s.host_config.is_empty() => Err(
                    "spec.config and spec.hostConfig are for custom clusters: they configure the distribution Drover installs; an imported cluster's is its own"
                        .into(),
                ),
                ClusterType::Imported if s.authorized_endpoint.is_some() => Err(
                    "spec.authorizedEndpoint is for custom clusters: Drover configures the API servers it installs; an imported cluster's are its own"
                        .into(),
                ),
                _ => {
                    super::agentconfig::validate_env(&s.agent_env)?;
                    if let Some(images) = &s.agent_images {
                        super::agentconfig::validate_images(images)?;
                    }
                    if let (ClusterType::Custom, Some(dist), Some(version)) =
                        (s.cluster_type, s.distribution, s.version.as_deref())
                        && !release_of(dist, version)
                    {
                        let (name, _, example) = release_naming(dist);
                        return Err(format!(
                            "spec.version: {version:?} is not a {name} release; give one as its releases are named, e.g. {example}"
                        ));
                    }
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
                    if let Some(endpoint) = &s.authorized_endpoint {
                        super::cluster::validate_endpoint(endpoint)?;
                    }
                    super::cluster::validate_pools(&s.machine_pools)?;
                    if let Some(hosted) = &s.hosted {
                        super::validate_hosted(hosted)?;
                    }
                    // A custom cluster installs K3s unless it says otherwise.
                    let dist = s.distribution.unwrap_or(super::Distribution::K3s);
                    super::distconfig::validate(dist, &s.config, &s.host_config)?;
                    if let Some(registries) = &s.registries {
                        super::registries::validate(registries)?;
                    }
                    if !s.system_default_registry.is_empty() {
                        let ok = !s.system_default_registry.contains(['/', ' ']);
                        if !ok {
                            return Err(format!(
                                "spec.systemDefaultRegistry: {:?} must be a registry's host (and port), e.g. registry.example.com:5000",
                                s.system_default_registry
                            ));
                        }
                        let set_twice = s.config.contains_key("system-default-registry")
                            || s.host_config.iter().any(|h| h.config.contains_key("system-default-registry"));
                        if set_twice {
                            return Err("spec.config.system-default-registry: set it once, as spec.systemDefaultRegistry".into());
                        }
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
            Kind::Token => check::<TokenSpec>(spec, |s| {
                match (&s.user, &s.agent) {
                (None, Some(_)) if s.cluster.is_some() => Err(
                    "spec.cluster is for a user's token; an agent's credential names its cluster in spec.agent".into(),
                ),
                (Some(_), None) | (None, Some(_)) => Ok(()),
                _ => Err("a token acts as exactly one of spec.user or spec.agent".into()),
            }
            }),
            Kind::RoleBinding => check::<RoleBindingSpec>(spec, |s| {
                if s.user.is_some() == s.group.is_some() {
                    return Err(
                        "a role binding names exactly one of spec.user or spec.group".into(),
                    );
                }
                if let Some(group) = &s.group {
                    group_name(group)?;
                }
                let named = [
                    s.role.is_some(),
                    s.role_template.is_some(),
                    s.global_role.is_some(),
                ];
                if named.iter().filter(|n| **n).count() != 1 {
                    return Err("a role binding grants exactly one of spec.roleTemplate (on a cluster or a project), spec.globalRole (on the hub) or spec.role (a builtin role by its name)".into());
                }
                for (field, name) in [
                    ("spec.roleTemplate", &s.role_template),
                    ("spec.globalRole", &s.global_role),
                ] {
                    if let Some(name) = name {
                        validate_name(Kind::RoleTemplate, name)
                            .map_err(|e| format!("{field}: {e}"))?;
                    }
                }
                match (s.role, &s.cluster, &s.project) {
                    (Some(Role::Admin), None, None) => return Ok(()),
                    (Some(Role::Admin), _, _) => {
                        return Err(
                            "spec.cluster, spec.project: admin is a global role; leave them out"
                                .into(),
                        );
                    }
                    (Some(Role::ProjectOwner | Role::ProjectMember), _, None) => {
                        return Err(format!(
                            "spec.project: {} needs the project it applies to",
                            s.role.map(Role::label).unwrap_or_default()
                        ));
                    }
                    (Some(Role::ClusterOwner | Role::ClusterMember), _, Some(_)) => {
                        return Err(format!(
                            "spec.project: {} is a cluster role; for a project use project-owner, project-member or read-only",
                            s.role.map(Role::label).unwrap_or_default()
                        ));
                    }
                    _ => {}
                }
                match (&s.global_role, &s.cluster, &s.project) {
                    (Some(_), None, None) => Ok(()),
                    (Some(_), _, _) => Err(
                        "spec.cluster, spec.project: a global role applies on the hub; leave them out (a role on a cluster is a spec.roleTemplate)".into(),
                    ),
                    (None, None, _) => Err(
                        "spec.cluster: cluster and project roles need the cluster they apply to"
                            .into(),
                    ),
                    (None, Some(c), project) => {
                        non_empty("spec.cluster", c)?;
                        project
                            .as_deref()
                            .map_or(Ok(()), |p| non_empty("spec.project", p))
                    }
                }
            }),
            Kind::RoleTemplate => check::<RoleTemplateSpec>(spec, |s| {
                super::validate_rules(&s.rules)?;
                for (i, name) in s.inherits.iter().enumerate() {
                    validate_name(Kind::RoleTemplate, name)
                        .map_err(|e| format!("spec.inherits[{i}]: {e}"))?;
                }
                Ok(())
            }),
            Kind::GlobalRole => check::<GlobalRoleSpec>(spec, |s| {
                super::validate_rules(&s.rules)?;
                for (i, name) in s.inherited_cluster_roles.iter().enumerate() {
                    validate_name(Kind::RoleTemplate, name)
                        .map_err(|e| format!("spec.inheritedClusterRoles[{i}]: {e}"))?;
                }
                Ok(())
            }),
            Kind::ClusterGroup => {
                check::<ClusterGroupSpec>(spec, |s| s.selector.parse("spec.selector").map(drop))
            }
            Kind::Bundle => check::<BundleSpec>(spec, super::validate_bundle),
            Kind::BundleDeployment => check::<BundleDeploymentSpec>(spec, |_| Ok(())),
            Kind::GitRepo => check::<GitRepoSpec>(spec, super::validate_gitrepo),
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
            Kind::AuthProvider => check::<AuthProviderSpec>(spec, super::validate_provider),
            Kind::CloudCredential => check::<CloudCredentialSpec>(spec, super::validate_credential),
            Kind::MachineTemplate => check::<MachineTemplateSpec>(spec, super::validate_template),
            Kind::Machine => check::<MachineSpec>(spec, |_| Ok(())),
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

    /// Removes what the API never returns (secret hashes, passwords, a provider's secret).
    pub fn redact(self, object: &mut Object) {
        redact_spec(&mut object.spec);
        redact_status(&mut object.status);
    }

    /// As [`Kind::redact`], on an object already turned into JSON.
    pub fn redact_value(self, object: &mut Value) {
        if let Some(spec) = object.get_mut("spec") {
            redact_spec(spec);
        }
        if let Some(status) = object.get_mut("status") {
            redact_status(status);
        }
    }
}

/// The write-only fields of every kind: top-level ones, an auth provider's secrets
/// ([`SECRET_FIELDS`]), the password of a proxy URL in a cluster's `agentEnv`, and a plan's
/// secret files.
fn redact_spec(spec: &mut Value) {
    if let Value::Object(map) = spec {
        for field in ["secretHash", "passwordHash", "password"] {
            map.remove(field);
        }
    }
    super::agentconfig::redact_env(spec);
    super::redact_plan_files(spec);
    for pointer in SECRET_FIELDS {
        let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
        if let Some(Value::Object(map)) = spec.pointer_mut(parent) {
            map.remove(field);
        }
    }
}

/// On a Machine's status: the text of its bootstrap token, kept so that a retried create sends
/// the same user data; never shown.
pub const MACHINE_TOKEN_SECRET: &str = "bootstrapTokenSecret";

/// The hub's own secrets in a status (a machine's bootstrap token), never shown.
fn redact_status(status: &mut Value) {
    if let Value::Object(map) = status {
        map.remove(MACHINE_TOKEN_SECRET);
    }
}

/// Secrets written into an object's spec that the API never returns, and that an update
/// which leaves them out keeps (JSON pointers into the spec).
pub const SECRET_FIELDS: [&str; 10] = [
    "/ssh/privateKey",
    "/amazonec2/secretAccessKey",
    "/registry/password",
    "/registry/key",
    "/ldap/bindPassword",
    "/oidc/clientSecret",
    "/github/clientSecret",
    "/git/password",
    "/git/privateKey",
    "/webhookSecret",
];

/// A distribution's name, the build suffix of its release names, and an example release.
fn release_naming(dist: Distribution) -> (&'static str, &'static str, &'static str) {
    match dist {
        Distribution::K3s => ("k3s", "k3s", "v1.33.4+k3s1"),
        Distribution::Rke2 => ("rke2", "rke2r", "v1.33.4+rke2r1"),
    }
}

/// Whether `version` names a release of `dist` as its installer takes it:
/// `vMAJOR.MINOR.PATCH[-PRERELEASE]+k3sN` or `…+rke2rN`.
fn release_of(dist: Distribution, version: &str) -> bool {
    let (_, suffix, _) = release_naming(dist);
    let Some((kube, build)) = version.strip_prefix('v').and_then(|v| v.split_once('+')) else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (core, pre) = kube.split_once('-').unwrap_or((kube, "a"));
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| number(p))
        && !pre.is_empty()
        && pre.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
        && build.strip_prefix(suffix).is_some_and(number)
}

/// A group a role binding may name: one of the hub's own (`ops`) or a directory's, prefixed
/// with its provider (`corp:ops`). Never Kubernetes' own (`system:authenticated` would grant
/// the role to everyone in the cluster) nor the hub's (`drover:admin`).
fn group_name(group: &str) -> Result<(), String> {
    let ok = match group.split_once(':') {
        None => validate_name(Kind::User, group).is_ok(),
        Some((provider, name)) => {
            !super::RESERVED.contains(&provider)
                && validate_name(Kind::AuthProvider, provider).is_ok()
                && !name.trim().is_empty()
                && name.len() <= 256
                && !name.chars().any(char::is_control)
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "spec.group: {group:?} is not a group; name one of the hub's (lowercase letters, digits and '-') or a directory's as provider:name (corp:ops); Kubernetes' system: and the hub's drover: groups cannot be bound"
        ))
    }
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
    // What one cluster is given of one bundle is named by both.
    if kind == Kind::BundleDeployment {
        let ok = name.split_once('.').is_some_and(|(bundle, cluster)| {
            validate_name(Kind::Bundle, bundle).is_ok()
                && validate_name(Kind::Cluster, cluster).is_ok()
        });
        return if ok {
            Ok(())
        } else {
            Err(format!(
                "BundleDeployment name {name:?} is not valid: it is BUNDLE.CLUSTER, each a valid name"
            ))
        };
    }
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
