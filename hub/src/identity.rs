//! Who an agent is: the agent kinds, the identities their credentials are issued for
//! (`cluster/<c>`, `node/<c>`, `host/<h>`, each copy adding `/<name>`), and what an identity
//! belongs to. Read by the tunnel's authenticator, registration, health and the proxy.

use proto::register::AgentKind;

pub const CLUSTER_AGENT: &str = AgentKind::ClusterAgent.as_str();
pub const NODE_AGENT: &str = AgentKind::NodeAgent.as_str();
pub const SYSTEM_AGENT: &str = AgentKind::SystemAgent.as_str();

/// The identity an agent of `kind` (a cluster-agent or a node-agent) registers under for
/// `cluster`; its copies (replicas, one per node) add `/<name>`.
pub fn cluster_agent_id(kind: &str, cluster: &str) -> Option<String> {
    match kind {
        CLUSTER_AGENT => Some(format!("cluster/{cluster}")),
        NODE_AGENT => Some(format!("node/{cluster}")),
        _ => None,
    }
}

/// Where an agent's identity says it belongs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Belongs {
    Cluster(String),
    Host(String),
}

/// `cluster/<c>[/…]`, `node/<c>[/…]` → the cluster; `host/<id>` → the host.
pub fn belongs(peer_id: &str) -> Option<Belongs> {
    let mut parts = peer_id.splitn(3, '/');
    match (parts.next(), parts.next()) {
        (Some("cluster" | "node"), Some(c)) if !c.is_empty() => {
            Some(Belongs::Cluster(c.to_owned()))
        }
        (Some("host"), Some(h)) if !h.is_empty() => Some(Belongs::Host(h.to_owned())),
        _ => None,
    }
}

/// The kind of agent a control-channel `request` came from and what it belongs to, from the
/// tunnel session it came on (never from anything the agent says).
pub(crate) fn caller_of<T>(
    request: &tonic::Request<T>,
) -> Result<(String, Option<Belongs>), tonic::Status> {
    let peer = request
        .extensions()
        .get::<tunnel::SessionInfo>()
        .map(|i| &i.peer)
        .ok_or_else(|| {
            tonic::Status::internal("a control-channel call outside a tunnel session")
        })?;
    Ok((peer.kind.clone(), belongs(&peer.id)))
}
