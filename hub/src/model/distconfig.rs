//! A custom cluster's own configuration for its distribution: keys of K3s's or RKE2's
//! `config.yaml` (`spec.config`, and `spec.hostConfig` for the hosts a selector picks), checked
//! against the keys each distribution documents, and merged per host.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Distribution, HostRoles};

/// More configuration for the hosts `selector` picks, over `spec.config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostConfig {
    #[serde(default)]
    pub selector: HostSelector,
    pub config: BTreeMap<String, Value>,
}

/// Hosts with any of `roles` (every host when empty) and every one of `labels` among their
/// node labels.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSelector {
    /// `etcd`, `controlplane`, `worker`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl HostSelector {
    fn picks(&self, roles: &HostRoles, labels: &BTreeMap<String, String>) -> bool {
        let role = |r: &str| match r {
            "etcd" => roles.etcd,
            "controlplane" => roles.control_plane,
            "worker" => roles.worker,
            _ => false,
        };
        (self.roles.is_empty() || self.roles.iter().any(|r| role(r)))
            && self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Keys Drover writes itself, and where to say what they say instead.
const DROVERS: &[(&str, &str)] = &[
    ("node-name", "the host's node name (--node-name)"),
    (
        "node-ip",
        "the host's internal address (--internal-address)",
    ),
    ("node-external-ip", "the host's address (--address)"),
    ("node-label", "the host's labels or its pool's labels"),
    ("node-taint", "the host's taints or its pool's taints"),
    (
        "server",
        "the planner (hosts join the cluster's first server)",
    ),
    ("token", "the planner (the cluster's join token)"),
    ("agent-token", "the planner (the cluster's join token)"),
    ("cluster-init", "the planner (the first etcd host)"),
    ("cluster-reset", "spec.restore"),
    ("cluster-reset-restore-path", "spec.restore"),
    (
        "datastore-endpoint",
        "nothing: Drover's clusters keep their own etcd",
    ),
    ("disable-etcd", "the host's roles"),
    ("disable-apiserver", "the host's roles"),
    ("disable-controller-manager", "the host's roles"),
    ("disable-scheduler", "the host's roles"),
    ("etcd-snapshot-schedule-cron", "spec.etcdSnapshots"),
    ("etcd-snapshot-retention", "spec.etcdSnapshots"),
    ("etcd-disable-snapshots", "spec.etcdSnapshots"),
];

/// Keys whose defaults Drover relies on, and what moving them would break: the planner writes
/// and reads these paths as the distribution lays them out by default.
const PINNED: &[(&str, &str)] = &[
    (
        "data-dir",
        "etcd snapshots, restores and the air-gap images, which Drover keeps under the distribution's default data directory (/var/lib/rancher/k3s or /var/lib/rancher/rke2)",
    ),
    (
        "etcd-snapshot-dir",
        "snapshots, which Drover takes, copies to the hub and restores from the default snapshot directory",
    ),
    (
        "private-registry",
        "spec.registries, which Drover writes to the default registries.yaml; set registries there",
    ),
];

/// Keys for every host, server or agent, in both distributions (their agent options).
const NODE_KEYS: &[&str] = &[
    "data-dir",
    "kubelet-arg",
    "kube-proxy-arg",
    "container-runtime-endpoint",
    "default-runtime",
    "image-service-endpoint",
    "pause-image",
    "snapshotter",
    "private-registry",
    "disable-default-registry-endpoint",
    "resolv-conf",
    "selinux",
    "protect-kernel-defaults",
    "lb-server-port",
    "image-credential-provider-bin-dir",
    "image-credential-provider-config",
    "node-internal-dns",
    "node-external-dns",
    "with-node-id",
    "nonroot-devices",
    "debug",
    "v",
    "log",
    "alsologtostderr",
];

/// K3s's further agent options.
const K3S_NODE_KEYS: &[&str] = &[
    "flannel-iface",
    "flannel-conf",
    "flannel-cni-conf-dir",
    "vpn-auth",
    "vpn-auth-file",
    "prefer-bundled-bin",
    "airgap-extra-registry",
    "docker",
];

/// RKE2's further agent options.
const RKE2_NODE_KEYS: &[&str] = &[
    "cloud-provider-name",
    "cloud-provider-config",
    "runtime-image",
    "kube-proxy-extra-mount",
    "kube-proxy-extra-env",
    "kubelet-path",
    "enable-pprof",
];

/// Server options in both distributions (ignored on agents, so written on servers only).
const SERVER_KEYS: &[&str] = &[
    "bind-address",
    "advertise-address",
    "advertise-port",
    "https-listen-port",
    "tls-san",
    "tls-san-security",
    "cluster-cidr",
    "service-cidr",
    "service-node-port-range",
    "cluster-dns",
    "cluster-domain",
    "egress-selector-mode",
    "servicelb-namespace",
    "write-kubeconfig-mode",
    "write-kubeconfig-group",
    "helm-job-image",
    "etcd-arg",
    "kube-apiserver-arg",
    "kube-scheduler-arg",
    "kube-controller-manager-arg",
    "kube-cloud-controller-manager-arg",
    "etcd-expose-metrics",
    "etcd-snapshot-name",
    "etcd-snapshot-dir",
    "etcd-snapshot-compress",
    "etcd-s3",
    "etcd-s3-endpoint",
    "etcd-s3-endpoint-ca",
    "etcd-s3-skip-ssl-verify",
    "etcd-s3-access-key",
    "etcd-s3-secret-key",
    "etcd-s3-bucket",
    "etcd-s3-region",
    "etcd-s3-folder",
    "etcd-s3-insecure",
    "etcd-s3-timeout",
    "disable",
    "disable-cloud-controller",
    "disable-kube-proxy",
    "secrets-encryption",
    "system-default-registry",
    "kube-apiserver-image",
    "embedded-registry",
    "supervisor-metrics",
];

/// K3s's further server options.
const K3S_SERVER_KEYS: &[&str] = &[
    "flannel-backend",
    "flannel-ipv6-masq",
    "flannel-external-ip",
    "disable-network-policy",
    "disable-helm-controller",
    "default-local-storage-path",
    "supervisor-port",
    "apiserver-port",
    "apiserver-bind-address",
    "write-kubeconfig",
    "rootless",
    "enable-pprof",
];

/// RKE2's further server options.
const RKE2_SERVER_KEYS: &[&str] = &[
    "cni",
    "enable-servicelb",
    "ingress-controller",
    "profile",
    "audit-policy-file",
    "pod-security-admission-config-file",
    "control-plane-resource-requests",
    "control-plane-resource-limits",
    "kube-apiserver-extra-mount",
    "kube-apiserver-extra-env",
    "kube-scheduler-image",
    "kube-controller-manager-image",
    "etcd-image",
];

/// Whether `key` is an option of `dist`, and whether only its servers take it.
fn known(dist: Distribution, key: &str) -> Option<bool> {
    let (node, server) = match dist {
        Distribution::K3s => (K3S_NODE_KEYS, K3S_SERVER_KEYS),
        Distribution::Rke2 => (RKE2_NODE_KEYS, RKE2_SERVER_KEYS),
    };
    if NODE_KEYS.contains(&key) || node.contains(&key) {
        Some(false)
    } else if SERVER_KEYS.contains(&key) || server.contains(&key) {
        Some(true)
    } else {
        None
    }
}

/// Checks one `config` (at `at`, as `spec.config`): every key an option of `dist` that Drover
/// does not set itself, every value a string, number, boolean or list of strings.
fn check(dist: Distribution, at: &str, config: &BTreeMap<String, Value>) -> Result<(), String> {
    let name = match dist {
        Distribution::K3s => "K3s",
        Distribution::Rke2 => "RKE2",
    };
    for (key, value) in config {
        if let Some((_, instead)) = DROVERS.iter().find(|(k, _)| k == key) {
            return Err(format!(
                "{at}.{key}: Drover sets {key} itself; it comes from {instead}"
            ));
        }
        if let Some((_, breaks)) = PINNED.iter().find(|(k, _)| k == key) {
            return Err(format!(
                "{at}.{key}: Drover relies on {key}'s default; moving it would break {breaks}; leave it out"
            ));
        }
        if known(dist, key).is_none() {
            return Err(format!(
                "{at}.{key}: not a {name} config.yaml option (see its server and agent options; a flag's name without the leading --)"
            ));
        }
        let ok = match value {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => true,
            Value::Array(items) => items.iter().all(Value::is_string),
            Value::Null | Value::Object(_) => false,
        };
        if !ok {
            return Err(format!(
                "{at}.{key}: give a string, number, boolean or list of strings"
            ));
        }
    }
    Ok(())
}

/// Checks `spec.config` and `spec.hostConfig` for `dist`.
pub fn validate(
    dist: Distribution,
    config: &BTreeMap<String, Value>,
    host_config: &[HostConfig],
) -> Result<(), String> {
    check(dist, "spec.config", config)?;
    for (i, entry) in host_config.iter().enumerate() {
        for role in &entry.selector.roles {
            if !matches!(role.as_str(), "etcd" | "controlplane" | "worker") {
                return Err(format!(
                    "spec.hostConfig[{i}].selector.roles: {role:?} is not a role; use etcd, controlplane or worker"
                ));
            }
        }
        check(dist, &format!("spec.hostConfig[{i}].config"), &entry.config)?;
    }
    Ok(())
}

/// What a host with `roles` and node `labels` is configured with: `config`, then each
/// `host_config` entry that picks it (a later entry's key replaces an earlier one's); server
/// options only on servers (etcd or control plane), where the distribution reads them.
pub fn for_host(
    dist: Distribution,
    config: &BTreeMap<String, Value>,
    host_config: &[HostConfig],
    roles: &HostRoles,
    labels: &BTreeMap<String, String>,
) -> BTreeMap<String, Value> {
    let server = roles.etcd || roles.control_plane;
    let mut merged = config.clone();
    for entry in host_config {
        if entry.selector.picks(roles, labels) {
            merged.extend(entry.config.clone());
        }
    }
    merged.retain(|key, _| known(dist, key).is_some_and(|server_only| server || !server_only));
    merged
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn map(v: Value) -> BTreeMap<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_are_checked_against_the_distributions_options_by_name() {
        let ok = map(
            json!({"cluster-cidr": "10.42.0.0/16", "tls-san": ["api.example.com"],
                            "disable": ["traefik"], "kubelet-arg": ["max-pods=200"]}),
        );
        assert!(validate(Distribution::K3s, &ok, &[]).is_ok());
        let cases = [
            (
                Distribution::K3s,
                json!({"cni": "calico"}),
                "spec.config.cni: not a K3s config.yaml option",
            ),
            (
                Distribution::Rke2,
                json!({"flannel-backend": "wireguard-native"}),
                "spec.config.flannel-backend: not a RKE2",
            ),
            (
                Distribution::K3s,
                json!({"node-name": "n1"}),
                "spec.config.node-name: Drover sets node-name itself",
            ),
            (
                Distribution::K3s,
                json!({"token": "x"}),
                "spec.config.token: Drover sets token itself",
            ),
            (
                Distribution::K3s,
                json!({"kubelet-arg": {"max-pods": 200}}),
                "spec.config.kubelet-arg: give a string",
            ),
            // Paths the planner writes by their defaults: moved, snapshots, restores, the
            // registries and the air-gap images would break quietly.
            (
                Distribution::K3s,
                json!({"data-dir": "/data/k3s"}),
                "spec.config.data-dir: Drover relies on data-dir's default",
            ),
            (
                Distribution::Rke2,
                json!({"etcd-snapshot-dir": "/backups"}),
                "spec.config.etcd-snapshot-dir: Drover relies on",
            ),
            (
                Distribution::Rke2,
                json!({"private-registry": "/etc/my-registries.yaml"}),
                "spec.config.private-registry: Drover relies on",
            ),
        ];
        for (dist, config, wanted) in cases {
            let err = validate(dist, &map(config.clone()), &[]).unwrap_err();
            assert!(err.starts_with(wanted), "{config}: {err}");
        }
        assert!(validate(Distribution::Rke2, &map(json!({"cni": ["calico"]})), &[]).is_ok());
        let entry = HostConfig {
            selector: HostSelector {
                roles: vec!["controlplanes".into()],
                labels: BTreeMap::new(),
            },
            config: BTreeMap::new(),
        };
        let err = validate(Distribution::K3s, &BTreeMap::new(), &[entry]).unwrap_err();
        assert!(
            err.starts_with("spec.hostConfig[0].selector.roles: \"controlplanes\""),
            "{err}"
        );
    }

    #[test]
    fn a_host_gets_the_clusters_config_then_what_picks_it_servers_alone_their_options() {
        let config = map(json!({"cluster-cidr": "10.42.0.0/16", "kubelet-arg": ["max-pods=110"]}));
        let host_config = vec![
            HostConfig {
                selector: HostSelector {
                    roles: vec!["worker".into()],
                    labels: BTreeMap::from([("gpu".into(), "true".into())]),
                },
                config: map(json!({"kubelet-arg": ["max-pods=30"]})),
            },
            HostConfig {
                selector: HostSelector {
                    roles: vec!["controlplane".into()],
                    labels: BTreeMap::new(),
                },
                config: map(json!({"tls-san": ["api.example.com"]})),
            },
        ];
        let server = HostRoles {
            etcd: true,
            control_plane: true,
            worker: true,
        };
        let worker = HostRoles {
            worker: true,
            ..HostRoles::default()
        };
        let gpu = BTreeMap::from([("gpu".to_owned(), "true".to_owned())]);
        let none = BTreeMap::new();
        let of = |roles, labels| {
            Value::Object(
                for_host(Distribution::K3s, &config, &host_config, roles, labels)
                    .into_iter()
                    .collect(),
            )
        };
        assert_eq!(
            of(&server, &none),
            json!({"cluster-cidr": "10.42.0.0/16", "kubelet-arg": ["max-pods=110"],
                   "tls-san": ["api.example.com"]})
        );
        // A worker takes no server option; a GPU worker's kubelet args replace the cluster's.
        assert_eq!(of(&worker, &none), json!({"kubelet-arg": ["max-pods=110"]}));
        assert_eq!(of(&worker, &gpu), json!({"kubelet-arg": ["max-pods=30"]}));
    }
}
