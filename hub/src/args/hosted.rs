//! `drover-hub cluster create NAME --hosted eks …` and `drover-hub nodegroup scale`: hosted
//! clusters from the command line. The flags only build `spec.hosted`; the hub validates it
//! and names a bad field.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::{Map, Value, json};

use super::ConfigError;

/// `cluster create`'s flags for a hosted cluster.
#[derive(clap::Args, Debug, Default)]
pub(super) struct HostedFlags {
    /// Make a hosted cluster: its control plane and node groups run by this cloud (eks)
    #[arg(long)]
    hosted: Option<String>,
    /// Hosted: the CloudCredential (an amazonec2 access key) the hub acts with
    #[arg(long)]
    credential: Option<String>,
    /// Hosted: the cloud's region, e.g. eu-west-1
    #[arg(long)]
    region: Option<String>,
    /// Hosted: the IAM role EKS acts as for the cluster
    #[arg(long)]
    role_arn: Option<String>,
    /// Hosted: the IAM role the node groups' machines take
    #[arg(long)]
    node_role: Option<String>,
    /// Hosted: a subnet for the control plane and node groups (repeat for several)
    #[arg(long = "subnet")]
    subnets: Vec<String>,
    /// Hosted: a security group for the control plane (repeat for several)
    #[arg(long = "security-group")]
    security_groups: Vec<String>,
    /// Hosted: the cloud API's endpoint, if not AWS's for the region
    #[arg(long)]
    endpoint: Option<String>,
    /// Hosted: a file with the CA (PEM) of the endpoint's certificate
    #[arg(long)]
    endpoint_ca: Option<PathBuf>,
    /// Hosted: a node group, as name=NAME,instanceType=TYPE,desiredSize=N,minSize=N,maxSize=N
    /// (and diskSize=GIB); repeat for several
    #[arg(long = "node-group")]
    node_groups: Vec<String>,
    /// Hosted: a tag KEY=VALUE on everything the hub makes in the cloud (repeat for several)
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Hosted: take over the cloud's existing cluster of this name instead of making one
    #[arg(long)]
    import: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(super) enum NodeGroupCommand {
    /// Set a hosted cluster's node group size (the cloud adds or removes machines)
    Scale {
        cluster: String,
        group: String,
        /// The number of machines, within the group's minSize and maxSize
        #[arg(long)]
        desired: u32,
        /// A new lower bound
        #[arg(long)]
        min: Option<u32>,
        /// A new upper bound
        #[arg(long)]
        max: Option<u32>,
    },
}

fn invalid(flag: &'static str, value: &str, reason: String) -> ConfigError {
    ConfigError::Flag {
        flag,
        value: value.to_owned(),
        reason,
    }
}

impl HostedFlags {
    /// Whether `--hosted` was given.
    pub(super) fn hosted(&self) -> bool {
        self.hosted.is_some()
    }

    /// `spec.hosted`, with the cluster's `version` as its Kubernetes version.
    pub(super) fn spec(self, version: Option<String>) -> Result<Value, ConfigError> {
        let driver = self.hosted.unwrap_or_default();
        let mut hosted = json!({
            "driver": driver,
            "credential": self.credential.unwrap_or_default(),
            "region": self.region.unwrap_or_default(),
            "kubernetesVersion": version.unwrap_or_default(),
        });
        let mut set = |key: &str, value: Value| {
            hosted[key] = value;
        };
        if let Some(role) = self.role_arn {
            set("roleArn", role.into());
        }
        if let Some(role) = self.node_role {
            set("nodeRole", role.into());
        }
        if !self.subnets.is_empty() {
            set("subnets", self.subnets.into());
        }
        if !self.security_groups.is_empty() {
            set("securityGroups", self.security_groups.into());
        }
        if let Some(endpoint) = self.endpoint {
            set("endpoint", endpoint.into());
        }
        if let Some(path) = self.endpoint_ca {
            let pem = std::fs::read_to_string(&path).map_err(|e| {
                invalid(
                    "--endpoint-ca",
                    &path.display().to_string(),
                    format!("cannot read it: {e}"),
                )
            })?;
            set("endpointCA", pem.into());
        }
        let mut tags = Map::new();
        for tag in &self.tags {
            let Some((key, value)) = tag.split_once('=') else {
                return Err(invalid("--tag", tag, "write it KEY=VALUE".into()));
            };
            tags.insert(key.to_owned(), value.into());
        }
        if !tags.is_empty() {
            set("tags", Value::Object(tags));
        }
        if let Some(name) = self.import {
            set("import", json!({"name": name}));
        }
        let groups = self
            .node_groups
            .iter()
            .map(|g| node_group(g))
            .collect::<Result<Vec<_>, _>>()?;
        if !groups.is_empty() {
            set("nodeGroups", groups.into());
        }
        Ok(hosted)
    }
}

/// `name=small,instanceType=t3.large,desiredSize=2,minSize=1,maxSize=5`.
fn node_group(text: &str) -> Result<Value, ConfigError> {
    let mut group = Map::new();
    for pair in text.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(invalid(
                "--node-group",
                text,
                format!("{pair:?} is not key=value"),
            ));
        };
        let value = match key {
            "name" | "instanceType" => Value::from(value),
            "desiredSize" | "minSize" | "maxSize" | "diskSize" => {
                let n: u32 = value.parse().map_err(|_| {
                    invalid(
                        "--node-group",
                        text,
                        format!("{key}={value:?} is not a whole number"),
                    )
                })?;
                Value::from(n)
            }
            _ => {
                return Err(invalid(
                    "--node-group",
                    text,
                    format!(
                        "{key:?} is not one of name, instanceType, desiredSize, minSize, maxSize, diskSize"
                    ),
                ));
            }
        };
        group.insert(key.to_owned(), value);
    }
    for key in ["name", "desiredSize", "maxSize"] {
        if !group.contains_key(key) {
            return Err(invalid("--node-group", text, format!("give {key}=…")));
        }
    }
    Ok(Value::Object(group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_groups_are_read_from_key_value_lists() {
        assert_eq!(
            node_group("name=small,instanceType=t3.large,desiredSize=2,minSize=1,maxSize=5")
                .unwrap(),
            json!({"name": "small", "instanceType": "t3.large", "desiredSize": 2,
                   "minSize": 1, "maxSize": 5})
        );
        for (bad, says) in [
            ("name=a,desiredSize=two,maxSize=3", "not a whole number"),
            ("name=a,desired=2,maxSize=3", "is not one of"),
            ("name=a,maxSize=3", "give desiredSize"),
            ("name", "not key=value"),
        ] {
            let error = node_group(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
