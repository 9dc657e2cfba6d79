//! Rule matching as Kubernetes' RBAC does it, inheritance, and what a grant needs.

use super::{builtin::rule, *};
use crate::model::HUB_GROUP;

fn template(context: TemplateContext, rules: Vec<PolicyRule>, inherits: &[&str]) -> Object {
    let spec = RoleTemplateSpec {
        display_name: String::new(),
        description: String::new(),
        context,
        rules,
        inherits: inherits.iter().map(|s| (*s).to_owned()).collect(),
        locked: false,
        builtin: false,
    };
    Object::new(
        "RoleTemplate",
        "x",
        serde_json::to_value(spec).unwrap_or_default(),
    )
}

fn named(mut object: Object, name: &str) -> Object {
    object.metadata.name = name.into();
    object
}

/// A rule, what is asked of it (verb, group, resource, name) and whether it allows it.
type Case<'a> = (
    &'a PolicyRule,
    &'a str,
    &'a str,
    &'a str,
    Option<&'a str>,
    bool,
);

#[test]
fn rules_match_verbs_groups_resources_subresources_and_names() {
    let mut scale = rule(
        &["apps"],
        &["deployments", "deployments/scale"],
        &["get", "patch"],
    );
    let logs = rule(&[""], &["pods/log"], &["get"]);
    let cases: &[Case<'_>] = &[
        (&scale, "patch", "apps", "deployments", Some("web"), true),
        (&scale, "update", "apps", "deployments", Some("web"), false),
        (&scale, "patch", "", "deployments", Some("web"), false),
        (
            &scale,
            "patch",
            "apps",
            "deployments/scale",
            Some("web"),
            true,
        ),
        (
            &scale,
            "patch",
            "apps",
            "deployments/status",
            Some("web"),
            false,
        ),
        (&logs, "get", "", "pods/log", Some("p"), true),
        (&logs, "get", "", "pods", Some("p"), false),
        (&logs, "get", "", "secrets", Some("s"), false),
    ];
    for (rule, verb, group, resource, name, want) in cases {
        assert_eq!(
            rule_allows(rule, verb, group, resource, *name),
            *want,
            "{verb} {group}/{resource}"
        );
    }
    scale.resource_names = vec!["web".into()];
    assert!(rule_allows(
        &scale,
        "patch",
        "apps",
        "deployments",
        Some("web")
    ));
    assert!(!rule_allows(
        &scale,
        "patch",
        "apps",
        "deployments",
        Some("api")
    ));
    // A list names no object: a rule limited to names does not allow it.
    assert!(!rule_allows(&scale, "get", "apps", "deployments", None));
    let any_sub = rule(&["*"], &["*/scale"], &["*"]);
    assert!(rule_allows(
        &any_sub,
        "update",
        "apps",
        "statefulsets/scale",
        None
    ));
    assert!(!rule_allows(
        &any_sub,
        "update",
        "apps",
        "statefulsets",
        None
    ));
}

#[test]
fn inheritance_gathers_rules_once_and_survives_a_cycle() {
    let pods = || vec![rule(&[""], &["pods"], &["get"])];
    let a = named(template(TemplateContext::Project, pods(), &[]), "a");
    let b = named(template(TemplateContext::Project, pods(), &["a"]), "b");
    let services = vec![rule(&[""], &["services"], &["get"])];
    let c = named(
        template(
            TemplateContext::Project,
            services,
            &["b", "project-read-only"],
        ),
        "c",
    );
    let catalog = Catalog::new(&[a, b, c], &[]);
    assert_eq!(catalog.closure("c"), ["c", "b", "a", "project-read-only"]);
    let rules = catalog.rules_of("c");
    assert_eq!(rules.iter().filter(|r| r.resources == ["pods"]).count(), 1);
    // What c inherits from the builtin project-read-only: deployments, the hub's projects.
    assert!(allows(&rules, "list", "apps", "deployments", None));
    assert!(allows(&rules, "get", HUB_GROUP, "projects", Some("any")));
    assert!(!allows(&rules, "get", "", "secrets", Some("s")));

    // A cycle stored behind validation's back ends where it closes.
    let x = named(template(TemplateContext::Cluster, Vec::new(), &["y"]), "x");
    let y = named(template(TemplateContext::Cluster, Vec::new(), &["x"]), "y");
    let looped = Catalog::new(&[x, y], &[]);
    assert_eq!(looped.closure("x"), ["x", "y"]);

    // A cluster template inheriting a project one (stored behind validation's back) does not
    // take its rules: no project rule reaches a cluster-wide binding.
    let a = named(template(TemplateContext::Project, pods(), &[]), "a");
    let leak = named(
        template(TemplateContext::Cluster, Vec::new(), &["a"]),
        "leak",
    );
    let mixed = Catalog::new(&[a, leak], &[]);
    assert_eq!(mixed.closure("leak"), ["leak"]);
    assert!(mixed.rules_of("leak").is_empty());
}

#[test]
fn inheriting_checks_existence_context_and_cycles() {
    let deployer = named(
        template(TemplateContext::Project, Vec::new(), &[]),
        "deployer",
    );
    let senior = named(
        template(TemplateContext::Project, Vec::new(), &["deployer"]),
        "senior",
    );
    let ops = named(template(TemplateContext::Cluster, Vec::new(), &[]), "ops");
    let catalog = Catalog::new(&[deployer, senior, ops], &[]);
    let spec = |context, inherits: &[&str]| -> RoleTemplateSpec {
        serde_json::from_value(template(context, Vec::new(), inherits).spec).unwrap()
    };
    // A project template may not inherit a cluster one, nor a cluster template a project one:
    // the message names both.
    for (name, context, parent) in [
        ("p2", TemplateContext::Project, "ops"),
        ("c2", TemplateContext::Cluster, "deployer"),
    ] {
        let err = catalog
            .check_inherits(name, &spec(context, &[parent]))
            .unwrap_err();
        assert!(
            err.contains(&format!("{name:?}"))
                && err.contains(&format!("{parent:?}"))
                && err.contains("spec.inherits[0]"),
            "{err}"
        );
    }
    let fine = [
        (
            "p2",
            TemplateContext::Project,
            &["project-member", "senior"][..],
        ),
        ("c2", TemplateContext::Cluster, &["ops", "read-only"]),
    ];
    for (name, context, parents) in fine {
        assert!(
            catalog
                .check_inherits(name, &spec(context, parents))
                .is_ok()
        );
    }
    let missing = catalog
        .check_inherits("c2", &spec(TemplateContext::Cluster, &["nope"]))
        .unwrap_err();
    assert!(missing.contains("does not exist"), "{missing}");
    // deployer inheriting senior would close a loop (senior inherits deployer).
    let cycle = catalog
        .check_inherits("deployer", &spec(TemplateContext::Project, &["senior"]))
        .unwrap_err();
    assert!(cycle.contains("cycle"), "{cycle}");
}

#[test]
fn granting_needs_holding_what_is_granted() {
    let held = vec![
        rule(&["apps"], &["deployments"], &["get", "list", "patch"]),
        rule(&[""], &["pods", "pods/log"], &["get"]),
    ];
    assert!(covers(&held, &[rule(&["apps"], &["deployments"], &["patch"])]).is_ok());
    let more = covers(&held, &[rule(&[""], &["secrets"], &["get"])]).unwrap_err();
    assert_eq!(more, "get secrets (core group)");
    // A wildcard asked for needs a wildcard held.
    assert!(covers(&held, &[rule(&["apps"], &["*"], &["get"])]).is_err());
    let all = builtin::templates()
        .iter()
        .find(|(n, _)| n == "cluster-owner")
        .map(|(_, t)| t.rules.clone())
        .unwrap_or_default();
    assert!(covers(&all, &held).is_ok());
}

#[test]
fn only_rules_that_write_to_the_cluster_lift_the_read_only_gate() {
    assert!(!writes_downstream(&[rule(
        &["*"],
        &["*"],
        &["get", "list", "watch"]
    )]));
    // Writing the hub's objects is not writing to the cluster.
    assert!(!writes_downstream(&[rule(
        &[HUB_GROUP],
        &["etcdsnapshots"],
        &["create"]
    )]));
    assert!(writes_downstream(&[rule(
        &["apps"],
        &["deployments"],
        &["patch"]
    )]));
}
