//! What the hub's access becomes in the cluster, as tables of what is wanted.

use proto::cluster::v1::{ProjectAccess, ProjectSecret, Subject as HubSubject};

use super::*;

fn grant(role: &str, kind: &str, name: &str) -> Grant {
    Grant {
        role: role.into(),
        subject: Some(HubSubject {
            kind: kind.into(),
            name: name.into(),
        }),
    }
}

fn namespace(name: &str, project: Option<&str>) -> Namespace {
    let mut labels = BTreeMap::new();
    if let Some(p) = project {
        labels.insert(PROJECT_LABEL.to_owned(), p.to_owned());
    }
    Namespace {
        metadata: meta(name, None, labels),
        ..Namespace::default()
    }
}

#[test]
fn hub_roles_become_the_documented_objects() {
    let snapshot = AccessSnapshot {
        cluster_grants: vec![
            grant("cluster-owner", "User", "olga"),
            grant("cluster-member", "Group", "devs"),
            grant("cluster-member", "User", "mia"),
            grant("read-only", "User", "rita"),
        ],
        projects: vec![ProjectAccess {
            name: "shop".into(),
            grants: vec![grant("project-member", "User", "pat")],
            secrets: vec![ProjectSecret {
                name: "db".into(),
                r#type: String::new(),
                data: [("password".to_owned(), b"s3cret".to_vec())].into(),
            }],
        }],
        endpoint: None,
        templates: Vec::new(),
    };
    let namespaces = [
        namespace("drover-system", None),
        namespace("web", None),
        namespace("shop-a", Some("shop")),
        namespace("other", Some("gone")),
    ];
    let want = desired(&snapshot, &namespaces, "drover-system");
    let names =
        |bindings: &[ClusterRoleBinding]| bindings.iter().map(|b| b.name_any()).collect::<Vec<_>>();
    assert_eq!(
        names(&want.cluster_bindings),
        ["drover-cluster-owner", "drover-read-only", CLUSTER_VIEW]
    );
    let member_namespaces: Vec<String> = want
        .bindings
        .iter()
        .filter(|b| b.name_any() == "drover-cluster-member")
        .map(|b| b.namespace().unwrap())
        .collect();
    assert_eq!(
        member_namespaces,
        ["web", "shop-a", "other"],
        "not the agent's own"
    );
    let members = &want.bindings[0].subjects.as_ref().unwrap();
    assert_eq!(
        members
            .iter()
            .map(|s| (s.kind.as_str(), s.name.as_str()))
            .collect::<Vec<_>>(),
        [("Group", "devs"), ("User", "mia")]
    );
    let project: Vec<_> = want
        .bindings
        .iter()
        .filter(|b| b.labels().get(PROJECT_LABEL).is_some())
        .map(|b| {
            (
                b.namespace().unwrap(),
                b.name_any(),
                b.role_ref.name.clone(),
            )
        })
        .collect();
    assert_eq!(
        project,
        [(
            "shop-a".into(),
            "drover-project-member".into(),
            "edit".into()
        )]
    );
    assert_eq!(want.secrets.len(), 1);
    assert_eq!(want.secrets[0].namespace().as_deref(), Some("shop-a"));
    assert_eq!(want.secrets[0].type_.as_deref(), Some("Opaque"));
}

#[test]
fn each_template_is_one_role_bound_once_with_all_its_holders() {
    use proto::cluster::v1::{Rule, Template};
    let deployer = Template {
        name: "deployer".into(),
        builtin: false,
        context: "project".into(),
        rules: vec![Rule {
            api_groups: vec!["apps".into()],
            resources: vec!["deployments".into()],
            verbs: vec!["get".into(), "patch".into()],
            ..Rule::default()
        }],
    };
    let auditor = Template {
        name: "auditor".into(),
        context: "cluster".into(),
        ..deployer.clone()
    };
    let snapshot = AccessSnapshot {
        cluster_grants: vec![
            grant("auditor", "User", "ann"),
            grant("auditor", "Group", "audit"),
        ],
        projects: vec![
            ProjectAccess {
                name: "shop".into(),
                grants: vec![
                    grant("deployer", "Group", "ci"),
                    grant("deployer", "User", "dan"),
                    grant("read-only", "User", "old-hub"),
                ],
                secrets: Vec::new(),
            },
            ProjectAccess {
                name: "empty".into(),
                ..ProjectAccess::default()
            },
        ],
        endpoint: None,
        templates: vec![deployer, auditor],
    };
    let namespaces = [
        namespace("shop-a", Some("shop")),
        namespace("shop-b", Some("shop")),
        namespace("empty-a", Some("empty")),
    ];
    let want = desired(&snapshot, &namespaces, "drover-system");
    let roles: Vec<(String, Option<Vec<String>>)> = want
        .cluster_roles
        .iter()
        .map(|r| {
            (
                r.name_any(),
                r.rules.as_ref().map(|rules| rules[0].verbs.clone()),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            (
                "drover-role-deployer".into(),
                Some(vec!["get".into(), "patch".into()])
            ),
            (
                "drover-role-auditor".into(),
                Some(vec!["get".into(), "patch".into()])
            ),
        ]
    );
    let auditors = want
        .cluster_bindings
        .iter()
        .find(|b| b.name_any() == "drover-role-auditor")
        .unwrap();
    assert_eq!(auditors.role_ref.name, "drover-role-auditor");
    assert_eq!(auditors.subjects.as_ref().unwrap().len(), 2);
    // One RoleBinding per namespace of the project where someone holds it, none in the
    // project where no one does, and no project template cluster-wide.
    let deployers: Vec<(String, usize)> = want
        .bindings
        .iter()
        .filter(|b| b.name_any() == "drover-role-deployer")
        .map(|b| (b.namespace().unwrap(), b.subjects.as_ref().unwrap().len()))
        .collect();
    assert_eq!(deployers, [("shop-a".into(), 2), ("shop-b".into(), 2)]);
    assert!(
        !want
            .cluster_bindings
            .iter()
            .any(|b| b.name_any() == "drover-role-deployer")
    );
    // The project read-only of a hub from before templates still binds view.
    assert!(
        want.bindings
            .iter()
            .any(|b| b.name_any() == "drover-project-read-only" && b.role_ref.name == "view")
    );
}

#[test]
fn nothing_granted_means_nothing_wanted() {
    let want = desired(
        &AccessSnapshot::default(),
        &[namespace("web", None)],
        "drover-system",
    );
    assert!(want.cluster_bindings.is_empty() && want.bindings.is_empty());
    assert!(want.cluster_roles.is_empty() && want.secrets.is_empty());
}
