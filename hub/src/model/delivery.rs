//! Continuous delivery: bundles of Kubernetes objects, the clusters they target, and what each
//! cluster was given (see `docs/delivery.md`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::LabelSelector;

/// A Kubernetes label selector, as a Deployment's `selector` reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl Selector {
    /// The selector as a [`LabelSelector`]; the message names what is wrong, under `field`.
    pub fn parse(&self, field: &str) -> Result<LabelSelector, String> {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for (i, r) in self.match_expressions.iter().enumerate() {
            let values = r.values.join(",");
            parts.push(match (r.operator.as_str(), r.values.is_empty()) {
                ("In", false) => format!("{} in ({values})", r.key),
                ("NotIn", false) => format!("{} notin ({values})", r.key),
                ("Exists", true) => r.key.clone(),
                ("DoesNotExist", true) => format!("!{}", r.key),
                (op @ ("In" | "NotIn"), true) => {
                    return Err(format!("{field}.matchExpressions[{i}]: {op} needs values"));
                }
                (op @ ("Exists" | "DoesNotExist"), false) => {
                    return Err(format!(
                        "{field}.matchExpressions[{i}]: {op} takes no values"
                    ));
                }
                (op, _) => {
                    return Err(format!(
                        "{field}.matchExpressions[{i}].operator: {op:?} is not one of In, NotIn, Exists, DoesNotExist"
                    ));
                }
            });
        }
        LabelSelector::parse(&parts.join(",")).map_err(|e| format!("{field}: {e}"))
    }
}

/// A named label selector of clusters (`/v1/clustergroups`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterGroupSpec {
    pub selector: Selector,
}

/// Which clusters: a name, a label selector, a cluster group, or several (all must hold).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<Selector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group: Option<String>,
}

/// Where a bundle goes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleTarget {
    /// How the target is named in the bundle's status ("prod"); default `target-N`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(flatten)]
    pub clusters: ClusterMatch,
}

/// What changes for the clusters it matches. Every matching customisation applies, in order:
/// a later one's namespace wins, labels and images add up (a later one's value for the same
/// key wins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Customization {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(flatten)]
    pub clusters: ClusterMatch,
    /// Every namespaced object goes to this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Added to every object's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Image replacements: `nginx` (any tag) or `nginx:1.27` (that one) → what replaces it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, String>,
}

/// A bundle's content as stored: content-addressed chunks, once, however many clusters get it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContentRef {
    /// `sha256-HEX` of the whole content (a JSON array of objects).
    pub digest: String,
    /// The chunks' digests, in order.
    pub chunks: Vec<String>,
    pub objects: u32,
    pub bytes: u64,
}

/// Kubernetes objects delivered to the clusters its targets match (`/v1/bundles`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleSpec {
    /// The objects, when written through the API: a list of Kubernetes objects…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<Value>>,
    /// …or multi-document YAML. Either is stored as [`ContentRef`] and not kept in the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests: Option<String>,
    /// Set by the hub from the above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ContentRef>,
    /// For objects that name no namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default_namespace: String,
    #[serde(default)]
    pub targets: Vec<BundleTarget>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub customizations: Vec<Customization>,
    /// Bundles that must be ready in a cluster before this one is delivered there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Re-apply what was changed in a cluster behind the hub's back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub correct_drift: bool,
    /// How a change reaches the clusters already given the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// No cluster is given anything new of this bundle while set (what it has stays).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// A change goes out partition by partition; within one, at most `maxUnavailable` clusters are
/// between being given it and being ready with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rollout {
    /// A number of clusters ("2") or a share of those targeted ("25%"); default all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
    /// In order; clusters in none of them form a last partition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<Partition>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Partition {
    pub name: String,
    #[serde(flatten)]
    pub clusters: ClusterMatch,
    /// How many of its clusters may be not ready with the change for the next partition to
    /// start: a number or a share of the partition; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

/// `text` ("3", "25%") as a number of `of`: at least `floor`; `None` if it is neither.
pub fn count_of(text: &str, of: usize, floor: usize) -> Option<usize> {
    let n = match text.strip_suffix('%') {
        Some(pct) => {
            let pct: usize = pct.parse().ok().filter(|p| *p <= 100)?;
            (of * pct).div_ceil(100)
        }
        None => text.parse().ok()?,
    };
    Some(n.max(floor))
}

/// A git repository whose paths become bundles (`/v1/gitrepos`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GitRepoSpec {
    /// `https://…`, `ssh://…` or `user@host:path`; `git://…` only where the network is trusted.
    pub repo: String,
    /// Followed unless `revision` pins a commit; default `main`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub branch: String,
    /// A fixed commit (40 hex digits), instead of following the branch.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// Each a directory of the repository that becomes one bundle; default the whole of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// How often the branch is looked at ("60s", "5m"); default 60 s, at least 5 s.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub polling_interval: String,
    /// A CloudCredential of driver `git`: an HTTPS login or an SSH key with pinned host keys.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credential: String,
    /// Write-only: the secret a webhook's `X-Hub-Signature-256` is made with
    /// (`POST /v1/gitrepos/NAME/webhook`); without it the webhook is off.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub webhook_secret: String,
    /// Where the bundles go (as a bundle's targets).
    #[serde(default)]
    pub targets: Vec<BundleTarget>,
    /// No commit is taken while set (bundles keep the last one; they are not paused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// What one cluster is given of one bundle (`/v1/bundledeployments`, `BUNDLE.CLUSTER`): made
/// by the hub, read by the cluster's agent, its status reported by the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BundleDeploymentSpec {
    pub bundle: String,
    pub cluster: String,
    pub target: String,
    pub content: ContentRef,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub default_namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vars: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub correct_drift: bool,
    /// Digest of all of the above but this: what the agent reports it applied.
    #[serde(default)]
    pub revision: String,
}

/// The kind of the stored chunks of bundle content: not an API kind (nobody lists them), kept
/// by name `sha256-HEX`, never changed, deleted when no bundle names them any more.
pub const CHUNK_KIND: &str = "BundleChunk";

/// The most a chunk holds: well under etcd's 1.5 MiB request limit.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// The object states an agent reports, in the order a summary prefers the worst.
pub const OBJECT_STATES: [&str; 5] = ["ErrApplied", "Missing", "Modified", "NotReady", "Ready"];

pub(crate) fn validate_match(field: &str, m: &ClusterMatch) -> Result<(), String> {
    if m.cluster_name.is_none() && m.cluster_selector.is_none() && m.cluster_group.is_none() {
        return Err(format!(
            "{field}: name the clusters: clusterName, clusterSelector or clusterGroup"
        ));
    }
    if let Some(selector) = &m.cluster_selector {
        selector.parse(&format!("{field}.clusterSelector"))?;
    }
    for (what, name) in [
        ("clusterName", &m.cluster_name),
        ("clusterGroup", &m.cluster_group),
    ] {
        if let Some(name) = name {
            super::validate_name(super::Kind::Cluster, name)
                .map_err(|e| format!("{field}.{what}: {e}"))?;
        }
    }
    Ok(())
}

/// "30s", "5m", "1h" (or a number of seconds) as a duration.
pub fn interval(text: &str) -> Option<std::time::Duration> {
    let (number, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(seconds))
}

pub(crate) fn validate_gitrepo(s: &GitRepoSpec) -> Result<(), String> {
    let repo = s.repo.as_str();
    let scp = !repo.contains("://") && repo.split_once(':').is_some_and(|(h, _)| h.contains('@'));
    let scheme_ok = ["https://", "ssh://", "git://"]
        .iter()
        .any(|p| repo.starts_with(p));
    if !(scheme_ok || scp) || repo.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "spec.repo: {repo:?} is not a repository URL the hub reads: https://host/path, ssh://user@host/path or user@host:path (git:// where the network is trusted)"
        ));
    }
    // A password in the URL would be shown to everyone who may read the GitRepo, and in git's
    // errors in its status and the hub's log.
    let authority = repo
        .split_once("://")
        .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
    if authority
        .split_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    {
        return Err("spec.repo: a password in the URL would be readable by everyone who may read this GitRepo; put the login in a CloudCredential of driver git and name it in spec.credential".into());
    }
    if repo.starts_with('-') || s.branch.starts_with('-') {
        return Err("spec.repo, spec.branch: must not start with '-'".into());
    }
    let commit = |r: &str| r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit());
    if !(s.revision.is_empty() || commit(&s.revision)) {
        return Err(format!(
            "spec.revision: {:?} must be a commit's full id (40 hex digits)",
            s.revision
        ));
    }
    let branch_ok = s.branch.is_empty()
        || s.branch
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            && !s.branch.contains("..");
    if !branch_ok {
        return Err(format!("spec.branch: {:?} is not a branch name", s.branch));
    }
    for (i, path) in s.paths.iter().enumerate() {
        let ok = !path.starts_with('/')
            && !path.split('/').any(|p| p == "..")
            && !path.chars().any(char::is_control);
        if !ok {
            return Err(format!(
                "spec.paths[{i}]: {path:?} must be a directory inside the repository (relative, no '..')"
            ));
        }
    }
    if !s.polling_interval.is_empty() {
        let every = interval(&s.polling_interval).ok_or_else(|| {
            format!(
                "spec.pollingInterval: {:?} is not a duration: 30s, 5m or 1h",
                s.polling_interval
            )
        })?;
        if every < std::time::Duration::from_secs(5) {
            return Err("spec.pollingInterval: at least 5s".into());
        }
    }
    if !s.credential.is_empty() {
        super::validate_name(super::Kind::CloudCredential, &s.credential)
            .map_err(|e| format!("spec.credential: {e}"))?;
    }
    for (i, t) in s.targets.iter().enumerate() {
        validate_match(&format!("spec.targets[{i}]"), &t.clusters)?;
    }
    Ok(())
}

pub(crate) fn validate_bundle(s: &BundleSpec) -> Result<(), String> {
    if s.resources.is_some() && s.manifests.is_some() {
        return Err(
            "spec.resources, spec.manifests: give the objects one way, as a list or as YAML".into(),
        );
    }
    for (i, t) in s.targets.iter().enumerate() {
        validate_match(&format!("spec.targets[{i}]"), &t.clusters)?;
    }
    for (i, c) in s.customizations.iter().enumerate() {
        let field = format!("spec.customizations[{i}]");
        validate_match(&field, &c.clusters)?;
        if let Some(ns) = &c.namespace {
            super::validate_name(super::Kind::Cluster, ns)
                .map_err(|e| format!("{field}.namespace: {e}"))?;
        }
    }
    if !s.default_namespace.is_empty() {
        super::validate_name(super::Kind::Cluster, &s.default_namespace)
            .map_err(|e| format!("spec.defaultNamespace: {e}"))?;
    }
    if let Some(rollout) = &s.rollout {
        if let Some(m) = &rollout.max_unavailable
            && count_of(m, 1, 1).is_none()
        {
            return Err(format!(
                "spec.rollout.maxUnavailable: {m:?} must be a number of clusters (\"2\") or a share (\"25%\")"
            ));
        }
        for (i, p) in rollout.partitions.iter().enumerate() {
            let field = format!("spec.rollout.partitions[{i}]");
            if p.name.is_empty() {
                return Err(format!(
                    "{field}.name: name the partition (it is shown in the bundle's status)"
                ));
            }
            validate_match(&field, &p.clusters)?;
            if let Some(m) = &p.max_unavailable
                && count_of(m, 1, 0).is_none()
            {
                return Err(format!(
                    "{field}.maxUnavailable: {m:?} must be a number of clusters (\"0\") or a share (\"10%\")"
                ));
            }
        }
    }
    for (i, name) in s.depends_on.iter().enumerate() {
        super::validate_name(super::Kind::Bundle, name)
            .map_err(|e| format!("spec.dependsOn[{i}]: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_repository_url_with_a_password_is_refused() {
        let spec = |repo: &str| GitRepoSpec {
            repo: repo.into(),
            ..GitRepoSpec::default()
        };
        let refused = validate_gitrepo(&spec("https://ann:tok3n@git.example.org/shop.git"));
        assert!(
            refused
                .unwrap_err()
                .contains("CloudCredential of driver git")
        );
        assert!(validate_gitrepo(&spec("ssh://git@git.example.org:2222/shop.git")).is_ok());
        assert!(validate_gitrepo(&spec("git@git.example.org:shop.git")).is_ok());
    }

    #[test]
    fn a_selector_reads_as_kubernetes_writes_it_and_says_what_is_wrong() {
        let s: Selector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"env": "prod"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "old", "operator": "DoesNotExist"}]
        }))
        .unwrap();
        let parsed = s.parse("spec.selector").unwrap();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(parsed.matches(&labels(&[("env", "prod"), ("tier", "a")])));
        assert!(!parsed.matches(&labels(&[("env", "prod"), ("tier", "c")])));
        assert!(!parsed.matches(&labels(&[("env", "prod"), ("tier", "a"), ("old", "x")])));
        let bad = Selector {
            match_expressions: vec![Requirement {
                key: "tier".into(),
                operator: "Within".into(),
                values: vec![],
            }],
            ..Selector::default()
        };
        assert_eq!(
            bad.parse("spec.selector").unwrap_err(),
            "spec.selector.matchExpressions[0].operator: \"Within\" is not one of In, NotIn, Exists, DoesNotExist"
        );
    }
}
