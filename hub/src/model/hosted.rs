//! A hosted cluster's spec (`spec.type: hosted`): a control plane and node groups a cloud runs
//! (EKS), which the hosted-cluster controller makes, scales, upgrades and deletes through the
//! cloud's API, or takes over (`import`) as they are.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The clouds whose hosted Kubernetes the hub drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HostedDriver {
    /// Amazon EKS (or an endpoint that speaks its REST API).
    Eks,
}

/// `spec.hosted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostedSpec {
    pub driver: HostedDriver,
    /// The CloudCredential (an `amazonec2` access key) the hub acts with. Naming it is a use
    /// of it, checked as for machine templates.
    pub credential: String,
    pub region: String,
    /// The cloud API's endpoint (default: AWS's for the region).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// The CA (PEM) that signs the endpoint's certificate, for an endpoint outside the
    /// system's trust.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        rename = "endpointCA"
    )]
    pub endpoint_ca: String,
    /// The control plane's Kubernetes minor version, e.g. `1.31`. Raising it upgrades the
    /// control plane, then each node group, one minor version at a time.
    pub kubernetes_version: String,
    /// The IAM role EKS acts as for the cluster.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub role_arn: String,
    /// The IAM role the node groups' machines take.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_role: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    #[serde(default = "yes")]
    pub endpoint_public_access: bool,
    #[serde(default)]
    pub endpoint_private_access: bool,
    /// More tags on what the hub makes (beside its own `drover.io/cluster` and
    /// `drover.io/owner`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_groups: Vec<NodeGroupSpec>,
    /// Take over the cloud's existing cluster of this name rather than make one: its control
    /// plane is never made or deleted by the hub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<HostedImport>,
}

fn yes() -> bool {
    true
}

/// `spec.hosted.import`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostedImport {
    /// The cluster's name in the cloud.
    pub name: String,
}

/// A node group: machines the cloud keeps at `desiredSize` within `minSize`..`maxSize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroupSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_type: String,
    pub desired_size: u32,
    #[serde(default)]
    pub min_size: u32,
    pub max_size: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `key=value:Effect`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// GiB; the cloud's default when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_size: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl HostedSpec {
    /// The cluster's name in the cloud: the imported one's, else the hub's.
    pub fn cloud_name<'a>(&'a self, hub_name: &'a str) -> &'a str {
        self.import.as_ref().map_or(hub_name, |i| i.name.as_str())
    }
}

/// A cloud name: letters, digits, `-` and `_`, starting with a letter or digit (EKS's rule
/// for clusters and node groups), at most 100 characters.
fn cloud_name_ok(name: &str) -> bool {
    name.len() <= 100
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// `1.31`: a Kubernetes minor version as EKS names them.
pub fn minor_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Checks `spec.hosted`; the message names the field to fix.
pub fn validate_hosted(spec: &HostedSpec) -> Result<(), String> {
    super::validate_name(super::Kind::CloudCredential, &spec.credential)
        .map_err(|e| format!("spec.hosted.credential: {e}"))?;
    let region_ok = !spec.region.is_empty()
        && spec
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !region_ok {
        return Err(format!(
            "spec.hosted.region: {:?} is not a region like eu-west-1",
            spec.region
        ));
    }
    if !spec.endpoint.is_empty() && !spec.endpoint.starts_with("https://") {
        return Err(format!(
            "spec.hosted.endpoint: {:?} must start with https://",
            spec.endpoint
        ));
    }
    if !spec.endpoint_ca.trim().is_empty()
        && let Err(e) = tunnel::tls::roots_from_pem(spec.endpoint_ca.as_bytes())
    {
        return Err(format!(
            "spec.hosted.endpointCA: {e}; give the CA's certificates as PEM"
        ));
    }
    if minor_version(&spec.kubernetes_version).is_none() {
        return Err(format!(
            "spec.hosted.kubernetesVersion: {:?} is not a Kubernetes minor version like 1.31",
            spec.kubernetes_version
        ));
    }
    if let Some(import) = &spec.import
        && !cloud_name_ok(&import.name)
    {
        return Err(format!(
            "spec.hosted.import.name: {:?} is not an EKS cluster name (letters, digits, '-' and '_')",
            import.name
        ));
    }
    if spec.import.is_none() {
        if !spec.role_arn.starts_with("arn:") {
            return Err("spec.hosted.roleArn: give the IAM role EKS acts as for the cluster (arn:aws:iam::ACCOUNT:role/NAME)".into());
        }
        if spec.subnets.is_empty() {
            return Err(
                "spec.hosted.subnets: give the subnets the control plane reaches the nodes in"
                    .into(),
            );
        }
        if !(spec.endpoint_public_access || spec.endpoint_private_access) {
            return Err("spec.hosted.endpointPublicAccess: the API server must be reachable one way at least (public or private)".into());
        }
    }
    if !spec.node_groups.is_empty() && !spec.node_role.starts_with("arn:") {
        return Err("spec.hosted.nodeRole: give the IAM role the node groups' machines take (arn:aws:iam::ACCOUNT:role/NAME)".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, group) in spec.node_groups.iter().enumerate() {
        let at = format!("spec.hosted.nodeGroups[{i}]");
        if !cloud_name_ok(&group.name) || group.name.len() > 63 {
            return Err(format!(
                "{at}.name: {:?} must be 1-63 letters, digits, '-' and '_', starting with a letter or digit",
                group.name
            ));
        }
        if !seen.insert(&group.name) {
            return Err(format!(
                "{at}.name: {:?} is used by another node group",
                group.name
            ));
        }
        if group.max_size == 0 {
            return Err(format!("{at}.maxSize: at least 1"));
        }
        if !(group.min_size <= group.desired_size && group.desired_size <= group.max_size) {
            return Err(format!(
                "{at}.desiredSize: {} must lie within minSize {} and maxSize {}",
                group.desired_size, group.min_size, group.max_size
            ));
        }
        for taint in &group.taints {
            let ok = taint.rsplit_once(':').is_some_and(|(kv, effect)| {
                !kv.is_empty()
                    && !kv.starts_with('=')
                    && matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
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

/// What an update of a cluster may not change about its cloud: whether it is hosted, and
/// where its cloud cluster is (a changed region, endpoint or imported name would leave the
/// one made behind, unmanaged, and make another); nor may the version go down.
pub fn validate_hosted_change(
    before: &super::ClusterSpec,
    after: &super::ClusterSpec,
) -> Result<(), String> {
    use super::ClusterType::Hosted;
    if (before.cluster_type == Hosted) != (after.cluster_type == Hosted) {
        return Err(
            "spec.type: a cluster cannot become or stop being hosted; create a new cluster instead"
                .into(),
        );
    }
    let (Some(before), Some(after)) = (&before.hosted, &after.hosted) else {
        return Ok(());
    };
    for (field, was, is) in [
        (
            "driver",
            format!("{:?}", before.driver),
            format!("{:?}", after.driver),
        ),
        ("region", before.region.clone(), after.region.clone()),
        ("endpoint", before.endpoint.clone(), after.endpoint.clone()),
        (
            "import",
            format!("{:?}", before.import),
            format!("{:?}", after.import),
        ),
    ] {
        if was != is {
            return Err(format!(
                "spec.hosted.{field}: cannot change once created (it says which cloud cluster this is); create a new cluster instead"
            ));
        }
    }
    if minor_version(&after.kubernetes_version) < minor_version(&before.kubernetes_version) {
        return Err(format!(
            "spec.hosted.kubernetesVersion: {} is older than {}; a hosted control plane cannot be downgraded",
            after.kubernetes_version, before.kubernetes_version
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(change: impl FnOnce(&mut serde_json::Value)) -> Result<(), String> {
        let mut value = json!({
            "driver": "eks", "credential": "aws", "region": "eu-west-1",
            "kubernetesVersion": "1.31",
            "roleArn": "arn:aws:iam::123456789012:role/eks",
            "nodeRole": "arn:aws:iam::123456789012:role/nodes",
            "subnets": ["subnet-1"],
            "nodeGroups": [{"name": "main", "desiredSize": 2, "minSize": 1, "maxSize": 3}],
        });
        change(&mut value);
        let spec: HostedSpec = serde_json::from_value(value).map_err(|e| e.to_string())?;
        validate_hosted(&spec)
    }

    #[test]
    fn a_complete_spec_is_accepted() {
        assert_eq!(spec(|_| {}), Ok(()));
        // Taking over an existing cluster needs neither its role nor its subnets.
        assert_eq!(
            spec(|s| {
                s["import"] = json!({"name": "legacy_prod"});
                s["roleArn"] = json!("");
                s["subnets"] = json!([]);
            }),
            Ok(())
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        type Change = fn(&mut serde_json::Value);
        let cases: [(&str, Change); 11] = [
            ("spec.hosted.credential", |s| s["credential"] = json!("")),
            ("spec.hosted.region", |s| s["region"] = json!("EU West")),
            ("spec.hosted.endpoint", |s| {
                s["endpoint"] = json!("http://eks.local")
            }),
            ("spec.hosted.kubernetesVersion", |s| {
                s["kubernetesVersion"] = json!("v1.31.2")
            }),
            ("spec.hosted.roleArn", |s| s["roleArn"] = json!("eks-role")),
            ("spec.hosted.subnets", |s| s["subnets"] = json!([])),
            ("spec.hosted.nodeRole", |s| s["nodeRole"] = json!("")),
            ("spec.hosted.nodeGroups[0].name", |s| {
                s["nodeGroups"][0]["name"] = json!("-x")
            }),
            ("spec.hosted.nodeGroups[0].desiredSize", |s| {
                s["nodeGroups"][0]["desiredSize"] = json!(5)
            }),
            ("spec.hosted.nodeGroups[0].maxSize", |s| {
                s["nodeGroups"][0]["maxSize"] = json!(0)
            }),
            ("spec.hosted.nodeGroups[0].taints", |s| {
                s["nodeGroups"][0]["taints"] = json!(["gpu"])
            }),
        ];
        for (field, change) in cases {
            let error = spec(change).unwrap_err();
            assert!(error.starts_with(field), "{field}: {error}");
        }
        let twice = spec(|s| {
            let groups = s["nodeGroups"].as_array_mut().unwrap();
            groups.push(json!({"name": "main", "desiredSize": 1, "maxSize": 1}));
        });
        assert!(
            twice
                .unwrap_err()
                .starts_with("spec.hosted.nodeGroups[1].name"),
        );
        // Unknown fields are refused by name.
        assert!(
            spec(|s| s["nodegroups"] = json!([]))
                .unwrap_err()
                .contains("nodegroups")
        );
    }

    #[test]
    fn the_cloud_cluster_a_cluster_names_is_fixed_and_its_version_only_rises() {
        let cluster = |hosted: serde_json::Value| -> crate::model::ClusterSpec {
            let mut value = json!({"type": "hosted", "hosted": {
                "driver": "eks", "credential": "aws", "region": "eu-west-1",
                "kubernetesVersion": "1.30",
            }});
            for (k, v) in hosted.as_object().unwrap() {
                value["hosted"][k] = v.clone();
            }
            serde_json::from_value(value).unwrap()
        };
        let before = cluster(json!({}));
        let change = |after: serde_json::Value| validate_hosted_change(&before, &cluster(after));
        assert_eq!(
            change(json!({"kubernetesVersion": "1.31", "tags": {"a": "b"}})),
            Ok(())
        );
        assert!(
            change(json!({"region": "us-east-1"}))
                .unwrap_err()
                .starts_with("spec.hosted.region")
        );
        assert!(
            change(json!({"import": {"name": "x"}}))
                .unwrap_err()
                .starts_with("spec.hosted.import")
        );
        assert!(
            change(json!({"kubernetesVersion": "1.29"}))
                .unwrap_err()
                .contains("downgraded")
        );
        let imported: crate::model::ClusterSpec =
            serde_json::from_value(json!({"type": "imported"})).unwrap();
        assert!(
            validate_hosted_change(&before, &imported)
                .unwrap_err()
                .starts_with("spec.type")
        );
    }

    #[test]
    fn minor_versions_are_read_as_numbers() {
        assert_eq!(minor_version("1.31"), Some((1, 31)));
        assert!(minor_version("1.9") < minor_version("1.10"));
        assert_eq!(minor_version("1"), None);
        assert_eq!(minor_version("1.x"), None);
    }
}
