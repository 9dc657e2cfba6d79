//! The kinds the hub stores, their specs as Rust types (validated on every write, and the
//! source of the OpenAPI document), and the `state` each object shows, derived from its
//! conditions as Rancher's API derives it. One file per concern; everything is named from here.

mod access;
pub mod agentconfig;
mod cluster;
mod delivery;
pub mod distconfig;
mod host;
mod hosted;
mod kind;
mod machines;
mod providers;
pub mod registries;
mod roles;
mod setting;
mod status;

pub use access::*;
pub use cluster::*;
pub use delivery::*;
pub use host::*;
pub use hosted::*;
pub use kind::*;
pub use machines::*;
pub use providers::*;
pub use roles::*;
pub use setting::*;
pub use status::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Object, ObjectMeta};
    use serde_json::json;

    fn state_of(kind: Kind, conditions: &[(&str, &str, &str)]) -> State {
        let mut status = Status::default();
        for (t, s, r) in conditions {
            status.conditions.push(Condition {
                kind: t.to_string(),
                status: s.to_string(),
                reason: r.to_string(),
                message: format!("{t} says {s}"),
                last_transition_time: String::new(),
            });
        }
        derive_state(kind, &ObjectMeta::default(), &status, &json!({}))
    }

    #[test]
    fn state_follows_conditions_in_rancher_order() {
        assert_eq!(state_of(Kind::Cluster, &[]).state, "pending");
        assert_eq!(
            state_of(Kind::Cluster, &[("Connected", "True", "")]).state,
            "active"
        );
        assert_eq!(
            state_of(Kind::Cluster, &[("Connected", "False", "Disconnected")]).state,
            "disconnected"
        );
        let err = state_of(
            Kind::Cluster,
            &[
                ("Connected", "True", ""),
                ("Provisioned", "False", "InstallFailed"),
            ],
        );
        assert_eq!((err.state.as_str(), err.error), ("error", true));
        assert_eq!(
            state_of(
                Kind::Host,
                &[("Connected", "True", ""), ("Provisioned", "Unknown", "")]
            )
            .state,
            "provisioning"
        );
        assert_eq!(state_of(Kind::Setting, &[]).state, "active");
    }

    #[test]
    fn a_deleting_object_is_removing() {
        let meta = ObjectMeta {
            deletion_timestamp: Some("2026-01-01T00:00:00Z".into()),
            finalizers: vec!["drover.io/agents".into()],
            ..ObjectMeta::default()
        };
        let s = derive_state(Kind::Cluster, &meta, &Status::default(), &json!({}));
        assert_eq!(s.state, "removing");
        assert!(s.message.contains("drover.io/agents"));
    }

    #[test]
    fn specs_are_checked_with_messages_that_name_the_field() {
        let cases = [
            (
                Kind::Cluster,
                json!({"type": "custom"}),
                "spec.distribution",
            ),
            (
                Kind::Cluster,
                json!({"type": "custom", "distribution": "k3s"}),
                "spec.version",
            ),
            (
                Kind::Cluster,
                json!({"type": "imported", "version": "v1"}),
                "custom clusters",
            ),
            (
                Kind::Cluster,
                json!({"type": "hosted"}),
                "spec.hosted: a hosted cluster needs",
            ),
            (Kind::Cluster, json!({"type": "managed"}), "unknown variant"),
            (
                Kind::Cluster,
                json!({"type": "imported", "colour": "red"}),
                "unknown field",
            ),
            (
                Kind::Host,
                json!({"cluster": "a", "taints": ["x=y"]}),
                "key=value:Effect",
            ),
            (Kind::User, json!({"password": "short"}), "12 characters"),
            (
                Kind::Cluster,
                json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
                       "upgradeStrategy": {"workerConcurrency": "0"}}),
                "workerConcurrency",
            ),
            (
                Kind::RoleBinding,
                json!({"user": "u", "role": "admin", "cluster": "a"}),
                "global role",
            ),
            (
                Kind::RoleBinding,
                json!({"user": "u", "role": "read-only"}),
                "need the cluster",
            ),
            (
                Kind::RoleBinding,
                json!({"role": "read-only", "cluster": "a"}),
                "exactly one",
            ),
        ];
        for (kind, spec, expect) in cases {
            let err = kind.validate_spec(&spec).unwrap_err();
            assert!(err.contains(expect), "{kind:?} {spec}: {err}");
        }
        // A custom cluster's version is a release of its distribution, as named there.
        let custom = |dist: &str, version: &str| {
            Kind::Cluster
                .validate_spec(&json!({"type": "custom", "distribution": dist, "version": version}))
        };
        for (dist, version) in [
            ("k3s", "1.33"),
            ("k3s", "v1.33"),
            ("k3s", "v1.33.4"),
            ("k3s", "v1.33.4+rke2r1"),
            ("k3s", "v1.33.4+k3s"),
            ("k3s", "latest"),
            ("rke2", "v1.33.4+k3s1"),
            ("rke2", "v1.33.x+rke2r1"),
        ] {
            let err = custom(dist, version).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "spec.version: {version:?} is not a {dist} release"
                )),
                "{dist} {version}: {err}"
            );
        }
        assert!(
            custom("k3s", "v1.33")
                .unwrap_err()
                .contains("e.g. v1.33.4+k3s1")
        );
        for (dist, version) in [
            ("k3s", "v1.33.4+k3s1"),
            ("k3s", "v1.34.0-rc1+k3s2"),
            ("rke2", "v1.32.10+rke2r1"),
        ] {
            assert!(custom(dist, version).is_ok(), "{dist} {version}");
        }
        assert!(
            Kind::Cluster
                .validate_spec(
                    &json!({"type": "custom", "distribution": "rke2", "version": "v1.33.4+rke2r1"})
                )
                .is_ok()
        );
    }

    #[test]
    fn concurrency_is_a_count_or_a_share() {
        assert_eq!(concurrency("2", 10), Some(2));
        assert_eq!(concurrency("25%", 10), Some(3));
        assert_eq!(concurrency("10%", 3), Some(1));
        assert_eq!(concurrency("100%", 7), Some(7));
        for bad in ["0", "0%", "101%", "x", "-1", ""] {
            assert_eq!(concurrency(bad, 10), None, "{bad}");
        }
    }

    #[test]
    fn names_must_be_dns_labels() {
        for good in ["a", "prod-1", "c0"] {
            assert!(validate_name(Kind::Cluster, good).is_ok(), "{good}");
        }
        for bad in ["", "Prod", "1a", "a-", "a_b", &"a".repeat(64)] {
            assert!(validate_name(Kind::Cluster, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redaction_removes_secrets() {
        let mut object = Object::new("Token", "t", json!({"user": "u", "secretHash": "abc"}));
        Kind::Token.redact(&mut object);
        assert_eq!(object.spec, json!({"user": "u"}));
    }
}
