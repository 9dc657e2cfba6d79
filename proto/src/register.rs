//! `POST /v3/register`: an agent trades its registration token (`drr_…`) for a credential of
//! its own. The one definition of the request, the reply and the agent kinds, for the hub and
//! every agent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The agents there are; each holds tunnel sessions under its kind's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AgentKind {
    /// One per imported cluster (a Deployment): the way to its API server and its caches.
    ClusterAgent,
    /// One per node of an imported cluster (a DaemonSet): node health, the fallback route.
    NodeAgent,
    /// One per host of a custom cluster: applies the hub's plans.
    SystemAgent,
}

impl AgentKind {
    pub const ALL: [AgentKind; 3] = [Self::ClusterAgent, Self::NodeAgent, Self::SystemAgent];

    /// The name on the wire (the tunnel's agent kind, the request's `kind`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ClusterAgent => "cluster-agent",
            Self::NodeAgent => "node-agent",
            Self::SystemAgent => "system-agent",
        }
    }

    /// The kind named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an agent sends to register. `kind` stays text on the wire so that the hub can say
/// which kinds there are when it is none of them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterRequest {
    /// `cluster-agent`, `node-agent` or `system-agent`.
    pub kind: String,
    /// For a system-agent: the host's stable id (kept in the agent's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// For a system-agent: how the host joins its cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<RegisterHost>,
}

impl RegisterRequest {
    /// The request of a cluster-agent or node-agent, which say nothing but their kind.
    pub fn of(kind: AgentKind) -> Self {
        Self {
            kind: kind.as_str().to_owned(),
            host_id: None,
            host: None,
        }
    }
}

/// How a host joins its cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterHost {
    #[serde(default)]
    pub roles: HostRoles,
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub internal_address: String,
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<String>,
}

/// Roles a host takes in its cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HostRoles {
    #[serde(default)]
    pub etcd: bool,
    #[serde(default)]
    pub control_plane: bool,
    #[serde(default)]
    pub worker: bool,
}

/// What the hub answers a registration with.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterReply {
    /// The agent's own credential; the registration token is not needed again.
    pub credential: String,
    /// The identity the credential proves (`cluster/NAME`, `node/NAME`, `host/NAME`).
    pub id: String,
    /// The cluster the agent belongs to.
    pub cluster: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_back_from_their_names() {
        for kind in AgentKind::ALL {
            assert_eq!(AgentKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(AgentKind::parse("hub"), None);
    }

    #[test]
    fn a_request_is_the_json_the_hub_has_always_read() {
        let request = RegisterRequest {
            host_id: Some("0123456789".into()),
            host: Some(RegisterHost {
                roles: HostRoles {
                    control_plane: true,
                    ..HostRoles::default()
                },
                node_name: "h1".into(),
                ..RegisterHost::default()
            }),
            ..RegisterRequest::of(AgentKind::SystemAgent)
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["kind"], "system-agent");
        assert_eq!(json["hostId"], "0123456789");
        assert_eq!(json["host"]["roles"]["controlPlane"], true);
        assert_eq!(json["host"]["nodeName"], "h1");
        assert_eq!(
            serde_json::to_value(RegisterRequest::of(AgentKind::NodeAgent)).unwrap(),
            serde_json::json!({"kind": "node-agent"})
        );
    }
}
