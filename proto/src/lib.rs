//! Drover's wire protocol. The `.proto` files under `proto/` are the single definition that
//! the hub and every agent compile from; this crate holds nothing else but what both ends must
//! do alike (a plan's checksum, how a file moves in chunks).

#![allow(missing_debug_implementations, unreachable_pub)] // generated code

pub mod codec;
pub mod files;
pub mod overview;
pub mod register;

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

/// Heartbeats, host facts and usage, from every agent to the hub.
pub mod health {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("drover.health.v1");
    }
}

/// Messages on a session's WebSocket beside its streams: heartbeats and plans.
pub mod session {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("drover.session.v1");
    }
}

/// Install plans and their status, between the hub and system-agents.
pub mod plan {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("drover.plan.v1");

        /// A plan's identity: hex sha256 of its protobuf encoding. The messages hold no maps,
        /// so the encoding (fields in tag order) is canonical.
        pub fn checksum(plan: &Plan) -> String {
            use prost::Message as _;
            let digest = ring::digest::digest(&ring::digest::SHA256, &plan.encode_to_vec());
            digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
        }

        /// Whether `name` may name a file the hub keeps for plans (`Upload.name`,
        /// `Download.name`): 1 to 4 parts joined by '/', each of lowercase letters, digits,
        /// '-' and '.', starting and ending with a letter or digit; so never a path that leaves
        /// the hub's directory for them.
        pub fn valid_file_name(name: &str) -> bool {
            let parts: Vec<&str> = name.split('/').collect();
            name.len() <= 255
                && (1..=4).contains(&parts.len())
                && parts.iter().all(|p| {
                    let edge = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
                    p.starts_with(edge)
                        && p.ends_with(edge)
                        && p.chars().all(|c| edge(c) || c == '-' || c == '.')
                        && !p.contains("..")
                })
        }

        impl PlanState {
            /// The name people see in JSON (`in-progress`, `applied`, `failed`).
            pub fn label(self) -> &'static str {
                match self {
                    PlanState::Unspecified => "",
                    PlanState::InProgress => "in-progress",
                    PlanState::Applied => "applied",
                    PlanState::Failed => "failed",
                }
            }
        }
    }
}

/// Serde helpers the generated plan types name in their attributes.
/// etcd's v3 API, the part the hub's etcd store uses (client stubs only).
#[cfg(feature = "etcd")]
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

pub mod json {
    /// `bytes` as base64 text.
    pub mod base64_bytes {
        use base64::Engine as _;
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            let text = String::deserialize(d)?;
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| serde::de::Error::custom(format!("content is not base64: {e}")))
        }
    }

    /// `PlanState` by its label.
    pub mod plan_state {
        use serde::{Deserialize, Deserializer, Serializer};

        use crate::plan::v1::PlanState;

        pub fn serialize<S: Serializer>(state: &i32, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(PlanState::try_from(*state).unwrap_or_default().label())
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
            let text = String::deserialize(d)?;
            [
                PlanState::InProgress,
                PlanState::Applied,
                PlanState::Failed,
                PlanState::Unspecified,
            ]
            .into_iter()
            .find(|s| s.label() == text)
            .map(|s| s as i32)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown plan state {text:?}")))
        }
    }
}

/// The tunnel protocol version this build speaks. A hub refuses a `Hello` carrying another
/// version; bump it only for changes an older peer cannot understand. Version 2: each gRPC call
/// is a stream of its own (`StreamHeader.call`) instead of one HTTP/2 control channel.
pub const TUNNEL_PROTOCOL_VERSION: u32 = 2;

/// The in-process service of a cluster-agent that forwards the hub's proxied Kubernetes API
/// requests to its API server (opened with `Session::open_service`).
pub const KUBE_API_SERVICE: &str = "kube-api";

/// The in-process service of a cluster-agent that answers list queries from its watch-driven
/// caches: HTTP/1 `GET /<resource>?namespace=&labelSelector=`, a Kubernetes List in JSON.
pub const CLUSTER_CACHE_SERVICE: &str = "cluster-cache";

/// A resource the cluster-agent's cache holds, as the hub must know it to ask the cluster's
/// RBAC whether a caller may list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedResource {
    /// The name queries use (the resource's plural).
    pub name: &'static str,
    /// Its API group ("" for the core group).
    pub group: &'static str,
    pub namespaced: bool,
}

/// What the cluster-agent's cache holds.
pub const CACHED_RESOURCES: [CachedResource; 6] = [
    CachedResource {
        name: "nodes",
        group: "",
        namespaced: false,
    },
    CachedResource {
        name: "namespaces",
        group: "",
        namespaced: false,
    },
    CachedResource {
        name: "pods",
        group: "",
        namespaced: true,
    },
    CachedResource {
        name: "deployments",
        group: "apps",
        namespaced: true,
    },
    CachedResource {
        name: "services",
        group: "",
        namespaced: true,
    },
    CachedResource {
        name: "events",
        group: "",
        namespaced: true,
    },
];

/// sha256 (hex) of a token's secret part: what the hub stores instead of the token, and what
/// the authorized endpoint's authenticator compares a presented token with.
pub fn token_hash(secret: &str) -> String {
    files::hex(ring::digest::digest(
        &ring::digest::SHA256,
        secret.as_bytes(),
    ))
}

/// How a bundle's content and its chunks are named, by both the hub (which stores them so) and
/// the cluster-agent (which checks what it was sent): `sha256-` and the hex digest.
pub fn content_digest(bytes: &[u8]) -> String {
    format!(
        "sha256-{}",
        files::hex(ring::digest::digest(&ring::digest::SHA256, bytes))
    )
}

/// The cached resource named `name`, if the cache holds it.
pub fn cached_resource(name: &str) -> Option<CachedResource> {
    CACHED_RESOURCES.into_iter().find(|r| r.name == name)
}

#[cfg(test)]
mod tests {
    use super::plan::v1::{Plan, PlanState, PlanStatus, checksum};

    #[test]
    fn plans_read_as_json_for_people_and_keep_their_identity() {
        let json = r#"{"files": [{"path": "/etc/x", "content": "aGVsbG8=", "permissions": "0600"}],
                      "instructions": [{"name": "install", "command": "/bin/true", "env": ["A=b"]}],
                      "maxFailures": 2}"#;
        let plan: Plan = serde_json::from_str(json).unwrap();
        assert_eq!(plan.files[0].content, b"hello");
        assert_eq!(plan.instructions[0].env, ["A=b"]);
        let again: Plan = serde_json::from_value(serde_json::to_value(&plan).unwrap()).unwrap();
        assert_eq!(checksum(&again), checksum(&plan));
        assert_eq!(checksum(&plan).len(), 64);
        let mut other = plan.clone();
        other.max_failures = 3;
        assert_ne!(checksum(&other), checksum(&plan));

        let err = serde_json::from_str::<Plan>(r#"{"instructions": [{"nmae": "x"}]}"#).unwrap_err();
        assert!(err.to_string().contains("nmae"), "{err}");
        let err = serde_json::from_str::<Plan>(r#"{"files": [{"content": "%%"}]}"#).unwrap_err();
        assert!(err.to_string().contains("base64"), "{err}");

        let status = PlanStatus {
            state: PlanState::Applied as i32,
            ..PlanStatus::default()
        };
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(value["state"], "applied");
        let back: PlanStatus = serde_json::from_value(value).unwrap();
        assert_eq!(back.state, PlanState::Applied as i32);
    }
}
