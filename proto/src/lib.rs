//! Drover's wire protocol. The `.proto` files under `proto/` are the single definition that
//! the hub and every agent compile from; this crate holds nothing else.

#![allow(missing_debug_implementations, unreachable_pub)] // generated code

/// The tunnel protocol: stream headers, dial replies and the handshake service.
pub mod tunnel {
    /// Version 1 of the tunnel protocol.
    pub mod v1 {
        tonic::include_proto!("drover.tunnel.v1");
    }
}

/// What cluster-agents report to the hub.
pub mod cluster {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("drover.cluster.v1");
    }
}

/// The tunnel protocol version this build speaks. A hub refuses a `Hello` carrying another
/// version; bump it only for changes an older peer cannot understand.
pub const TUNNEL_PROTOCOL_VERSION: u32 = 1;

/// The in-process service of a cluster-agent that forwards the hub's proxied Kubernetes API
/// requests to its API server (opened with `Session::open_service`).
pub const KUBE_API_SERVICE: &str = "kube-api";

/// The in-process service of a cluster-agent that answers list queries from its watch-driven
/// caches: HTTP/1 `GET /<resource>?namespace=&labelSelector=`, a Kubernetes List in JSON.
pub const CLUSTER_CACHE_SERVICE: &str = "cluster-cache";
