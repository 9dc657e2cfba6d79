//! A downstream cluster's spec: its type, distribution and version, how upgrades roll, its
//! snapshots, restores and certificate rotations.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClusterType {
    /// An existing cluster; the hub's import manifest installs the agents into it.
    Imported,
    /// A cluster the hub installs (K3s or RKE2) on registered hosts.
    Custom,
    /// A cluster whose control plane a cloud runs (EKS), made and scaled through its API;
    /// the hub installs the agents into it once it is up.
    Hosted,
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
    /// For custom clusters: the authorized cluster endpoint. Users reach the cluster's API
    /// servers directly with their hub-issued kubeconfig (also while the hub is down): each
    /// control-plane host's API server asks an authenticator on its own loopback about hub
    /// tokens, from hashed copies the cluster-agent keeps in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorized_endpoint: Option<AuthorizedEndpoint>,
    /// For hosted clusters: the cloud, its control plane and node groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted: Option<super::HostedSpec>,
    /// For custom clusters: machines the hub makes itself, pool by pool, from templates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_pools: Vec<MachinePool>,
    /// For custom clusters: the distribution's own configuration, keys of its `config.yaml`
    /// (`cluster-cidr`, `tls-san`, `disable`, `kube-apiserver-arg`, …), on every host (server
    /// options on servers). A change rolls the hosts it touches, as an upgrade does.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub config: std::collections::BTreeMap<String, serde_json::Value>,
    /// For custom clusters: more configuration for the hosts a selector picks, over `config`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_config: Vec<super::distconfig::HostConfig>,
    /// For custom clusters: private registries and mirrors, as every host's `registries.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registries: Option<super::registries::Registries>,
    /// For custom clusters: the registry the distribution's own images come from
    /// (`system-default-registry`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub system_default_registry: String,
    /// More environment for the agents (`HTTPS_PROXY`, `NO_PROXY`, …) and, on a custom
    /// cluster's hosts, for the distribution's services and installer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_env: Vec<super::agentconfig::EnvVar>,
    /// The agents' images and how the cluster pulls them (else the hub's settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_images: Option<super::agentconfig::AgentImages>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// A pool of like machines (as Cluster API's MachineDeployment): `quantity` of them, made from
/// `template`, registered with `roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachinePool {
    pub name: String,
    pub quantity: u32,
    pub roles: super::HostRoles,
    /// The MachineTemplate its machines are made from.
    pub template: String,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// `key=value:Effect`, as a host's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// Drain a machine's node before it is removed (scale down, replacement).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain_before_delete: bool,
    /// While the pool rolls to a new template: how many machines it may have beyond its
    /// quantity (default 1) ...
    #[serde(default = "one_machine", skip_serializing_if = "is_one")]
    pub max_surge: u32,
    /// ... and how many below its quantity may be unready (default 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_unavailable: u32,
    /// Replace a machine whose host stays disconnected this long, or that has not registered
    /// this long after it was made (`90s`, `10m`, `1h`); never when unset.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unhealthy_after: String,
}

fn one_machine() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `90s`, `10m`, `1h`: a whole number of seconds, minutes or hours.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let unit = text.chars().last()?;
    let n: u64 = text[..text.len() - unit.len_utf8()].parse().ok()?;
    let seconds = match unit {
        's' => n,
        'm' => n.checked_mul(60)?,
        'h' => n.checked_mul(3600)?,
        _ => return None,
    };
    (seconds > 0).then(|| std::time::Duration::from_secs(seconds))
}

/// Checks the pools: unique names, roles, a template name, a sane quantity, taints.
pub fn validate_pools(pools: &[MachinePool]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, pool) in pools.iter().enumerate() {
        let at = format!("spec.machinePools[{i}]");
        let label_ok = !pool.name.is_empty()
            && pool.name.len() <= 20
            && pool
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !pool.name.starts_with('-')
            && !pool.name.ends_with('-');
        if !label_ok {
            return Err(format!(
                "{at}.name: {:?} must be 1-20 lowercase letters, digits and '-' (it names the pool's machines)",
                pool.name
            ));
        }
        if !seen.insert(&pool.name) {
            return Err(format!(
                "{at}.name: {:?} is used by another pool",
                pool.name
            ));
        }
        if !(pool.roles.etcd || pool.roles.control_plane || pool.roles.worker) {
            return Err(format!(
                "{at}.roles: give at least one of etcd, controlPlane, worker"
            ));
        }
        if pool.quantity > 1000 {
            return Err(format!("{at}.quantity: at most 1000 machines a pool"));
        }
        super::validate_name(super::Kind::MachineTemplate, &pool.template)
            .map_err(|e| format!("{at}.template: {e}"))?;
        if pool.max_surge == 0 && pool.max_unavailable == 0 {
            return Err(format!(
                "{at}.maxSurge: maxSurge and maxUnavailable cannot both be 0 (a new template could never roll out)"
            ));
        }
        if !pool.unhealthy_after.is_empty() && parse_duration(&pool.unhealthy_after).is_none() {
            return Err(format!(
                "{at}.unhealthyAfter: {:?} is not a duration like 90s, 10m or 1h",
                pool.unhealthy_after
            ));
        }
        for taint in &pool.taints {
            let ok = taint.split_once(':').is_some_and(|(kv, effect)| {
                !kv.is_empty() && matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
            });
            if !ok {
                return Err(format!(
                    "{at}.taints: {taint:?} must be key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute"
                ));
            }
        }
    }
    Ok(())
}

/// `spec.authorizedEndpoint` of a custom cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorizedEndpoint {
    pub enabled: bool,
    /// A name (with an optional `:port`, default 6443) that reaches the control plane, e.g. a
    /// load balancer in front of the servers: the kubeconfig gets a context for it too.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fqdn: String,
    /// PEM CA certificates that verify the FQDN's server certificate (when it is not the
    /// cluster's own CA, which the kubeconfig's per-host contexts use).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_certs: String,
}

impl ClusterSpec {
    /// Whether the authorized cluster endpoint is on.
    pub fn endpoint_enabled(&self) -> bool {
        self.cluster_type == ClusterType::Custom
            && self.authorized_endpoint.as_ref().is_some_and(|e| e.enabled)
    }
}

/// Checks `spec.authorizedEndpoint`: an FQDN that is a DNS name with an optional port, CA
/// certificates that parse.
pub fn validate_endpoint(endpoint: &AuthorizedEndpoint) -> Result<(), String> {
    let fqdn = endpoint.fqdn.trim();
    if !fqdn.is_empty() {
        let (host, port) = match fqdn.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (fqdn, None),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.len() > 253 || !host.split('.').all(label_ok) || fqdn != endpoint.fqdn {
            return Err(format!(
                "spec.authorizedEndpoint.fqdn: {:?} must be a DNS name (letters, digits, '-' and '.'), optionally with :PORT, e.g. api.edge.example.com:6443",
                endpoint.fqdn
            ));
        }
        if let Some(port) = port
            && port.parse::<u16>().ok().filter(|p| *p > 0).is_none()
        {
            return Err(format!(
                "spec.authorizedEndpoint.fqdn: {port:?} is not a port (1-65535)"
            ));
        }
    }
    if !endpoint.ca_certs.trim().is_empty() {
        match tunnel::tls::certs_from_pem(endpoint.ca_certs.as_bytes()) {
            Ok(certs) if !certs.is_empty() => {}
            _ => {
                return Err(
                    "spec.authorizedEndpoint.caCerts: give PEM certificates (-----BEGIN CERTIFICATE-----)"
                        .into(),
                );
            }
        }
    }
    Ok(())
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

/// The annotation that removes a cluster without waiting for its hosts (`drover-hub cluster
/// delete --force`, `DELETE /v1/clusters/NAME?force=true`, the dashboard's "Remove anyway"):
/// who asked, and when.
pub const REMOVE_ANYWAY: &str = "drover.io/remove-anyway";
/// The `Removed` condition's reason on a cluster removed anyway.
pub const REMOVED_ANYWAY: &str = "RemovedAnyway";
