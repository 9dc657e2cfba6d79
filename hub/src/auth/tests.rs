//! Access rules, as a matrix of roles, verbs and clusters.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::model::Role;

fn principal(admin: bool, roles: &[(&str, Role)]) -> Principal {
    Principal {
        user: "u".into(),
        groups: Vec::new(),
        admin,
        clusters: roles
            .iter()
            .map(|(c, r)| (c.to_string(), *r))
            .collect::<BTreeMap<_, _>>(),
        projects: BTreeMap::new(),
        token: "t".into(),
    }
}

fn object(kind: Kind, name: &str, cluster: &str) -> Object {
    let spec = match kind {
        Kind::Cluster => json!({"type": "imported"}),
        Kind::Host => json!({"cluster": cluster}),
        Kind::RegistrationToken => json!({"cluster": cluster}),
        Kind::RoleBinding => json!({"user": "x", "role": "read-only", "cluster": cluster}),
        Kind::Plan => json!({"host": "h", "cluster": cluster}),
        Kind::EtcdSnapshot => json!({"cluster": cluster}),
        _ => json!({}),
    };
    Object::new(kind.name(), name, spec)
}

const VERBS: [Verb; 6] = [
    Verb::Get,
    Verb::List,
    Verb::Watch,
    Verb::Create,
    Verb::Update,
    Verb::Delete,
];

/// The expected answer for a cluster-scoped kind, by the caller's role on that cluster.
fn expected(kind: Kind, verb: Verb, role: Option<Role>) -> bool {
    let read = matches!(verb, Verb::Get | Verb::List | Verb::Watch);
    let owner = role == Some(Role::ClusterOwner);
    match kind {
        Kind::Cluster | Kind::Host => {
            (read && role.is_some()) || (owner && matches!(verb, Verb::Update | Verb::Delete))
        }
        Kind::RegistrationToken => owner,
        Kind::RoleBinding => (read && role.is_some()) || (owner && !read),
        Kind::Plan => read && owner,
        Kind::EtcdSnapshot => {
            (read && role.is_some()) || (owner && matches!(verb, Verb::Create | Verb::Delete))
        }
        _ => unreachable!(),
    }
}

#[test]
fn every_role_times_every_verb_on_its_own_and_another_cluster() {
    let roles = [
        None,
        Some(Role::ReadOnly),
        Some(Role::ClusterMember),
        Some(Role::ClusterOwner),
    ];
    for kind in [
        Kind::Cluster,
        Kind::Host,
        Kind::RegistrationToken,
        Kind::RoleBinding,
        Kind::Plan,
        Kind::EtcdSnapshot,
    ] {
        for role in roles {
            let p = principal(false, &role.map(|r| vec![("mine", r)]).unwrap_or_default());
            for verb in VERBS {
                let own = object(kind, "mine", "mine");
                let other = object(kind, "theirs", "theirs");
                assert_eq!(
                    authorize(&p, verb, kind, &own).is_ok(),
                    expected(kind, verb, role),
                    "{role:?} {verb:?} {kind:?} on its own cluster"
                );
                assert!(
                    authorize(&p, verb, kind, &other).is_err(),
                    "{role:?} {verb:?} {kind:?} on another cluster must be refused"
                );
            }
        }
    }
}

#[test]
fn admins_may_do_everything() {
    let p = principal(true, &[]);
    for kind in Kind::ALL {
        for verb in VERBS {
            assert!(
                authorize(&p, verb, kind, &object(kind, "x", "any")).is_ok(),
                "{verb:?} {kind:?}"
            );
        }
    }
}

#[test]
fn users_manage_their_own_tokens_and_read_only_themselves() {
    let p = principal(false, &[("mine", Role::ClusterOwner)]);
    let mine = Object::new("Token", "t1", json!({"user": "u"}));
    let theirs = Object::new("Token", "t2", json!({"user": "v"}));
    for verb in [Verb::Get, Verb::List, Verb::Create, Verb::Delete] {
        assert!(
            authorize(&p, verb, Kind::Token, &mine).is_ok(),
            "{verb:?} own token"
        );
        assert!(
            authorize(&p, verb, Kind::Token, &theirs).is_err(),
            "{verb:?} another's token"
        );
    }
    let agent = |cluster: &str| {
        Object::new(
            "Token",
            "a",
            json!({"agent": {"kind": "cluster-agent", "id": "c", "cluster": cluster}}),
        )
    };
    assert!(
        authorize(&p, Verb::Delete, Kind::Token, &agent("mine")).is_ok(),
        "an owner revokes its agents"
    );
    assert!(authorize(&p, Verb::Delete, Kind::Token, &agent("theirs")).is_err());
    assert!(
        authorize(&p, Verb::Create, Kind::Token, &agent("mine")).is_err(),
        "agents get credentials by registering"
    );

    assert!(
        authorize(
            &p,
            Verb::Get,
            Kind::User,
            &Object::new("User", "u", json!({}))
        )
        .is_ok()
    );
    assert!(
        authorize(
            &p,
            Verb::Get,
            Kind::User,
            &Object::new("User", "v", json!({}))
        )
        .is_err()
    );
    assert!(
        authorize(
            &p,
            Verb::Update,
            Kind::User,
            &Object::new("User", "u", json!({}))
        )
        .is_err()
    );
    assert!(
        authorize(
            &p,
            Verb::Get,
            Kind::Setting,
            &Object::new("Setting", "s", json!({}))
        )
        .is_ok()
    );
    assert!(
        authorize(
            &p,
            Verb::Update,
            Kind::Setting,
            &Object::new("Setting", "s", json!({}))
        )
        .is_err()
    );
}

#[test]
fn the_strongest_binding_wins() {
    let binding = |role: &str, cluster: Option<&str>| {
        Object::new(
            "RoleBinding",
            role,
            json!({"user": "u", "role": role, "cluster": cluster}),
        )
    };
    let bindings = [
        binding("read-only", Some("a")),
        binding("cluster-owner", Some("a")),
        binding("cluster-member", Some("b")),
        Object::new(
            "RoleBinding",
            "other",
            json!({"user": "v", "role": "admin"}),
        ),
    ];
    let roles = roles_of(&bindings, "u", &[]);
    assert!(!roles.admin);
    assert_eq!(roles.clusters.get("a"), Some(&Role::ClusterOwner));
    assert_eq!(roles.clusters.get("b"), Some(&Role::ClusterMember));
    assert!(roles_of(&bindings, "v", &[]).admin);
}

#[test]
fn failed_logins_block_the_user_and_the_address() {
    let limiter = LoginLimiter::default();
    let addr: IpAddr = "10.0.0.1".parse().unwrap();
    for _ in 0..LOGIN_FAILURES {
        assert!(limiter.check("alice", Some(addr)).is_ok());
        limiter.failed("alice", Some(addr));
    }
    assert!(
        limiter.check("alice", None).is_err(),
        "blocked by user name from anywhere"
    );
    assert!(
        limiter.check("bob", Some(addr)).is_err(),
        "blocked by address for any user"
    );
    assert!(
        limiter
            .check("bob", Some("10.0.0.2".parse().unwrap()))
            .is_ok()
    );
}

#[test]
fn the_credential_comes_from_the_bearer_header_or_the_session_cookie() {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::COOKIE,
        "theme=dark; drover_session=drt_tx.y".parse().unwrap(),
    );
    assert_eq!(credential(&headers), Some("drt_tx.y"));
    headers.insert(
        http::header::AUTHORIZATION,
        "Bearer drt_ta.b".parse().unwrap(),
    );
    assert_eq!(credential(&headers), Some("drt_ta.b"));
}
