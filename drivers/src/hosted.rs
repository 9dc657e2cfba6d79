//! Hosted Kubernetes: clusters whose control plane a cloud runs (EKS; GKE and AKS would sit
//! behind the same interface), with node groups the cloud scales. The hub's hosted-cluster
//! controller speaks only [`HostedProvider`]; each provider maps it onto its own API.

use std::collections::BTreeMap;

use crate::{BoxFuture, DriverError};

/// Where a cluster or a node group is in its life, as the provider says it (its own word is
/// kept in `status` beside this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Creating,
    Active,
    /// A version or size change is under way.
    Updating,
    Deleting,
    /// The provider gave up on it (EKS: `FAILED`, `CREATE_FAILED`, `DELETE_FAILED`,
    /// `DEGRADED`).
    Failed,
}

/// A control plane as its provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub phase: Phase,
    /// The provider's own word for the phase (`CREATING`, `ACTIVE`, …).
    pub status: String,
    pub version: String,
    /// The API server's URL, once there is one.
    pub endpoint: String,
    /// The CA (PEM) of the API server's certificate, once there is one.
    pub ca_pem: String,
    pub tags: BTreeMap<String, String>,
}

/// A node group as its provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroup {
    pub name: String,
    pub phase: Phase,
    pub status: String,
    pub version: String,
    pub desired_size: u32,
    pub min_size: u32,
    pub max_size: u32,
    pub tags: BTreeMap<String, String>,
}

/// A control plane to make.
#[derive(Debug, Clone, Default)]
pub struct ClusterRequest {
    pub name: String,
    pub version: String,
    /// The role the provider acts as for the cluster (EKS: an IAM role's ARN).
    pub role_arn: String,
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
    pub endpoint_public_access: bool,
    pub endpoint_private_access: bool,
    pub tags: BTreeMap<String, String>,
    /// The provider's idempotency key: the same request again makes nothing new.
    pub token: String,
}

/// A node group to make.
#[derive(Debug, Clone, Default)]
pub struct NodeGroupRequest {
    pub cluster: String,
    pub name: String,
    pub version: String,
    pub instance_type: String,
    pub desired_size: u32,
    pub min_size: u32,
    pub max_size: u32,
    pub disk_size: u32,
    pub subnets: Vec<String>,
    /// The role its machines take (EKS: an IAM role's ARN).
    pub node_role: String,
    pub labels: BTreeMap<String, String>,
    /// `key=value:Effect`, as a Kubernetes taint is written.
    pub taints: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub token: String,
}

/// A node group's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub desired: u32,
    pub min: u32,
    pub max: u32,
}

/// One cloud's hosted Kubernetes. Every call is safe to repeat: creating what exists answers
/// [`DriverError::Refused`] only when the settings differ, deleting what is gone succeeds.
pub trait HostedProvider: Send + Sync + std::fmt::Debug {
    /// A bearer token the cluster's API server takes for the provider's credential, valid a
    /// few minutes, that does not disclose the credential (EKS: [`crate::eks::token`]).
    fn api_token(&self, cluster: &str) -> String;
    /// The control plane `name`, unless there is none.
    fn cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Cluster>, DriverError>>;
    fn create_cluster<'a>(
        &'a self,
        request: &'a ClusterRequest,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
    /// Starts moving the control plane to `version` (one minor version at a time).
    fn upgrade_cluster<'a>(
        &'a self,
        name: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
    /// Starts deleting the control plane (its node groups must be gone).
    fn delete_cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), DriverError>>;
    /// The cluster's node groups.
    fn node_groups<'a>(
        &'a self,
        cluster: &'a str,
    ) -> BoxFuture<'a, Result<Vec<NodeGroup>, DriverError>>;
    fn create_node_group<'a>(
        &'a self,
        request: &'a NodeGroupRequest,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
    fn scale_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
        size: Size,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
    fn upgrade_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
        version: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
    fn delete_node_group<'a>(
        &'a self,
        cluster: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
}
