//! Access rules, as a matrix of roles, verbs and clusters.

use serde_json::json;

use super::*;
use crate::{model::Role, roles::Catalog, store::Object};

fn principal(admin: bool, roles: &[(&str, Role)]) -> Principal {
    Principal::holding("u", admin, roles, &[])
}

fn object(kind: Kind, name: &str, cluster: &str) -> Object {
    let spec = match kind {
        Kind::Cluster => json!({"type": "imported"}),
        Kind::Host => json!({"cluster": cluster}),
        Kind::RegistrationToken => json!({"cluster": cluster}),
        Kind::RoleBinding => json!({"user": "x", "role": "read-only", "cluster": cluster}),
        Kind::Plan => json!({"host": "h", "cluster": cluster}),
        Kind::EtcdSnapshot => json!({"cluster": cluster}),
        Kind::Project => json!({"cluster": cluster}),
        Kind::ProjectSecret => json!({"cluster": cluster, "project": "shop", "data": {}}),
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

/// What each cluster role may do to each cluster-scoped kind on its own cluster, written out
/// (not derived from the rules under test): the verbs allowed, in the order get, list, watch,
/// create, update, delete; `-` where refused.
const CLUSTER_ROLES: &[(Kind, [&str; 4])] = &[
    //                       none      read-only  member    owner
    (Kind::Cluster, ["------", "glw---", "glw---", "glw-ud"]),
    (Kind::Host, ["------", "glw---", "glw---", "glw-ud"]),
    (
        Kind::RegistrationToken,
        ["------", "------", "------", "glwcud"],
    ),
    (Kind::RoleBinding, ["------", "glw---", "glw---", "glwcud"]),
    (Kind::Plan, ["------", "------", "------", "glw---"]),
    (Kind::EtcdSnapshot, ["------", "glw---", "glw---", "glwc-d"]),
    (Kind::Project, ["------", "glw---", "glw---", "glwcud"]),
    (
        Kind::ProjectSecret,
        ["------", "------", "------", "glwcud"],
    ),
];

/// Whether `allowed` (a row of the table) allows `verb`.
fn in_row(allowed: &str, verb: Verb) -> bool {
    let at = VERBS.iter().position(|v| *v == verb).unwrap();
    allowed.as_bytes()[at] != b'-'
}

#[test]
fn every_role_times_every_verb_on_its_own_and_another_cluster() {
    let roles = [
        None,
        Some(Role::ReadOnly),
        Some(Role::ClusterMember),
        Some(Role::ClusterOwner),
    ];
    for (kind, row) in CLUSTER_ROLES {
        let kind = *kind;
        for (role, allowed) in roles.into_iter().zip(row) {
            let p = principal(false, &role.map(|r| vec![("mine", r)]).unwrap_or_default());
            for verb in VERBS {
                let own = object(kind, "mine", "mine");
                let other = object(kind, "theirs", "theirs");
                assert_eq!(
                    authorize(&p, verb, kind, &own).is_ok(),
                    in_row(allowed, verb),
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

/// A principal holding `role` on project `shop` of cluster `mine`, and nothing on the cluster.
fn in_project(role: Role) -> Principal {
    Principal::holding("u", false, &[], &[("shop", "mine", role)])
}

#[test]
fn project_owners_and_members_on_their_project_and_another() {
    let binding = |project: &str| {
        Object::new(
            "RoleBinding",
            "b",
            json!({"user": "x", "role": "project-member", "cluster": "mine", "project": project}),
        )
    };
    let secret = |project: &str| {
        Object::new(
            "ProjectSecret",
            "s",
            json!({"cluster": "mine", "project": project, "data": {}}),
        )
    };
    let project = |name: &str| Object::new("Project", name, json!({"cluster": "mine"}));
    // (what, project-owner's verbs, project-member's verbs), in the table's order.
    let cases: [(&str, Kind, Object, &str, &str); 8] = [
        (
            "its project",
            Kind::Project,
            project("shop"),
            "glw---",
            "glw---",
        ),
        (
            "another project",
            Kind::Project,
            project("lab"),
            "------",
            "------",
        ),
        (
            "its bindings",
            Kind::RoleBinding,
            binding("shop"),
            "glwcud",
            "------",
        ),
        (
            "another's bindings",
            Kind::RoleBinding,
            binding("lab"),
            "------",
            "------",
        ),
        (
            "its secrets",
            Kind::ProjectSecret,
            secret("shop"),
            "glwcud",
            "------",
        ),
        (
            "another's secrets",
            Kind::ProjectSecret,
            secret("lab"),
            "------",
            "------",
        ),
        (
            "the cluster",
            Kind::Cluster,
            object(Kind::Cluster, "mine", "mine"),
            "glw---",
            "glw---",
        ),
        (
            "the cluster's hosts",
            Kind::Host,
            object(Kind::Host, "h", "mine"),
            "------",
            "------",
        ),
    ];
    for (what, kind, object, owner, member) in cases {
        for (role, allowed) in [(Role::ProjectOwner, owner), (Role::ProjectMember, member)] {
            let p = in_project(role);
            for verb in VERBS {
                assert_eq!(
                    authorize(&p, verb, kind, &object).is_ok(),
                    in_row(allowed, verb),
                    "{role:?} {verb:?} {what}"
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
    let catalog = Catalog::new(&[], &[]);
    let roles = roles_of(&bindings, &catalog, "u", &[]);
    assert!(!roles.admin);
    let held = |cluster: &str| -> Vec<&str> {
        roles.clusters[cluster]
            .templates
            .iter()
            .map(String::as_str)
            .collect()
    };
    assert_eq!(held("a"), ["cluster-owner", "read-only"]);
    assert_eq!(held("b"), ["cluster-member"]);
    assert!(roles_of(&bindings, &catalog, "v", &[]).admin);
}

#[test]
fn failed_logins_block_the_account_however_spelled_and_an_address_only_far_later() {
    let limiter = LoginLimiter::default();
    let addr: IpAddr = "10.0.0.1".parse().unwrap();
    let alice = |name: &str| vec![login_key("corp", name)];
    for spelling in ["alice", "ALICE", " alice", "CORP\\aLiCe", "alice "] {
        assert!(limiter.check(&alice(spelling), Some(addr)).is_ok());
        limiter.failed(&alice(spelling), Some(addr));
    }
    assert_eq!(LOGIN_FAILURES, 5);
    assert!(
        limiter.check(&alice("Alice"), None).is_err(),
        "blocked by account from anywhere"
    );
    // Found by the directory under another name (a UPN): counted by the entry too.
    let upn = vec![
        login_key("corp", "alice.liddell@corp.example"),
        entry_key("corp", "CN=Alice,OU=People,DC=corp"),
    ];
    for _ in 0..LOGIN_FAILURES {
        limiter.failed(&upn, None);
    }
    assert!(
        limiter
            .check(&[entry_key("corp", "cn=alice,ou=people,dc=corp")], None)
            .is_err()
    );
    // Others behind the same address still sign in: it takes many more failures.
    assert!(
        limiter
            .check(&[login_key("corp", "bob")], Some(addr))
            .is_ok()
    );
    for n in 0..ADDRESS_FAILURES {
        limiter.failed(&[login_key("corp", &format!("user-{n}"))], Some(addr));
    }
    assert!(
        limiter
            .check(&[login_key("corp", "bob")], Some(addr))
            .is_err()
    );
    let v6: IpAddr = "2001:db8:1:2::7".parse().unwrap();
    assert_eq!(source_of(Some(v6)), "2001:db8:1:2::/64");
    assert_eq!(
        source_of(Some("2001:db8:1:2:ffff::1".parse().unwrap())),
        source_of(Some(v6))
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
