use std::collections::BTreeMap;

use drivers::hosted::{Cluster, NodeGroup, Phase, Size};
use serde_json::json;

use super::*;

const UID: &str = "uid-1";

fn spec(version: &str, groups: &[(&str, u32)]) -> HostedSpec {
    let groups: Vec<_> = groups
        .iter()
        .map(|(name, desired)| json!({"name": name, "desiredSize": desired, "minSize": 1, "maxSize": 5}))
        .collect();
    serde_json::from_value(json!({
        "driver": "eks", "credential": "aws", "region": "eu-west-1",
        "kubernetesVersion": version, "roleArn": "arn:aws:iam::1:role/c",
        "nodeRole": "arn:aws:iam::1:role/n", "subnets": ["s"], "nodeGroups": groups,
    }))
    .unwrap()
}

fn imported(version: &str, groups: &[(&str, u32)]) -> HostedSpec {
    HostedSpec {
        import: Some(crate::model::HostedImport {
            name: "legacy".into(),
        }),
        ..spec(version, groups)
    }
}

fn tags(owner: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (CLUSTER_TAG.to_owned(), "shop".to_owned()),
        (OWNER_TAG.to_owned(), owner.to_owned()),
    ])
}

fn cluster(status: &str, version: &str) -> Option<Cluster> {
    Some(Cluster {
        name: "shop".into(),
        phase: match status {
            "ACTIVE" => Phase::Active,
            "CREATING" => Phase::Creating,
            "UPDATING" => Phase::Updating,
            "DELETING" => Phase::Deleting,
            _ => Phase::Failed,
        },
        status: status.into(),
        version: version.into(),
        endpoint: "https://x".into(),
        ca_pem: String::new(),
        tags: tags(UID),
    })
}

fn group(name: &str, status: &str, version: &str, desired: u32) -> NodeGroup {
    NodeGroup {
        name: name.into(),
        phase: match status {
            "ACTIVE" => Phase::Active,
            "CREATING" => Phase::Creating,
            "UPDATING" => Phase::Updating,
            "DELETING" => Phase::Deleting,
            _ => Phase::Failed,
        },
        status: status.into(),
        version: version.into(),
        desired_size: desired,
        min_size: 1,
        max_size: 5,
        tags: tags(UID),
    }
}

/// With the agents installed (rows about installing them say otherwise).
fn observed(cluster: Option<Cluster>, groups: Vec<NodeGroup>) -> Observed {
    Observed {
        cluster,
        node_groups: groups,
        agents_installed: true,
    }
}

fn not_installed(observed: Observed) -> Observed {
    Observed {
        agents_installed: false,
        ..observed
    }
}

fn size(desired: u32) -> Size {
    Size {
        desired,
        min: 1,
        max: 5,
    }
}

fn waiting(text: &str) -> Standing {
    Standing::Waiting(text.into())
}

#[test]
fn creating_and_resizing() {
    use Action::*;
    let two = [("small", 2), ("big", 3)];
    let cases: Vec<(&str, HostedSpec, Observed, Vec<Action>, Standing)> = vec![
        (
            "nothing in the cloud: the control plane is made",
            spec("1.31", &two),
            observed(None, vec![]),
            vec![CreateCluster],
            waiting("creating the control plane"),
        ),
        (
            "the control plane on its way: nothing else yet",
            spec("1.31", &two),
            observed(cluster("CREATING", "1.31"), vec![]),
            vec![],
            waiting("control plane CREATING"),
        ),
        (
            "active: both node groups made at once",
            spec("1.31", &two),
            observed(cluster("ACTIVE", "1.31"), vec![]),
            vec![
                CreateNodeGroup("small".into()),
                CreateNodeGroup("big".into()),
            ],
            waiting("creating node group small; creating node group big"),
        ),
        (
            "one made, one on its way",
            spec("1.31", &two),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    group("big", "CREATING", "1.31", 3),
                ],
            ),
            vec![],
            waiting("node group big CREATING"),
        ),
        (
            "everything as the spec says",
            spec("1.31", &two),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    group("big", "ACTIVE", "1.31", 3),
                ],
            ),
            vec![],
            Standing::Ready,
        ),
        (
            "a size changed: that group is resized",
            spec("1.31", &[("small", 4), ("big", 3)]),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    group("big", "ACTIVE", "1.31", 3),
                ],
            ),
            vec![ScaleNodeGroup("small".into(), size(4))],
            waiting("scaling node group small to 4"),
        ),
        (
            "a group no longer in the spec is deleted",
            spec("1.31", &[("small", 2)]),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    group("big", "ACTIVE", "1.31", 3),
                ],
            ),
            vec![DeleteNodeGroup("big".into())],
            waiting("deleting node group big"),
        ),
        (
            "a group the hub did not make (on a cluster taken over) is left alone",
            imported("1.31", &[("small", 2)]),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    NodeGroup {
                        tags: BTreeMap::new(),
                        ..group("theirs", "ACTIVE", "1.31", 3)
                    },
                ],
            ),
            vec![],
            Standing::Ready,
        ),
        (
            "active at last: the agents are installed at once, with the node groups made",
            spec("1.31", &two),
            not_installed(observed(cluster("ACTIVE", "1.31"), vec![])),
            vec![
                CreateNodeGroup("small".into()),
                CreateNodeGroup("big".into()),
                InstallAgents,
            ],
            waiting("creating node group small; creating node group big"),
        ),
        (
            "not before the control plane is active",
            spec("1.31", &two),
            not_installed(observed(cluster("CREATING", "1.31"), vec![])),
            vec![],
            waiting("control plane CREATING"),
        ),
        (
            "the cloud as the spec says: only the install is left (the cloud is ready)",
            spec("1.31", &[]),
            not_installed(observed(cluster("ACTIVE", "1.31"), vec![])),
            vec![InstallAgents],
            Standing::Ready,
        ),
    ];
    check(cases);
}

#[test]
fn upgrading_control_plane_first_then_one_group_at_a_time() {
    use Action::*;
    let two = [("small", 2), ("big", 3)];
    let at = |small: (&str, &str), big: (&str, &str)| {
        vec![
            group("small", small.0, small.1, 2),
            group("big", big.0, big.1, 3),
        ]
    };
    let cases: Vec<(&str, HostedSpec, Observed, Vec<Action>, Standing)> = vec![
        (
            "a newer version: the control plane goes first",
            spec("1.32", &two),
            observed(
                cluster("ACTIVE", "1.31"),
                at(("ACTIVE", "1.31"), ("ACTIVE", "1.31")),
            ),
            vec![UpgradeCluster("1.32".into())],
            waiting("upgrading the control plane to 1.32"),
        ),
        (
            "two versions newer: one minor version at a time",
            spec("1.33", &two),
            observed(
                cluster("ACTIVE", "1.31"),
                at(("ACTIVE", "1.31"), ("ACTIVE", "1.31")),
            ),
            vec![UpgradeCluster("1.32".into())],
            waiting("upgrading the control plane to 1.32"),
        ),
        (
            "the control plane upgrading: nothing else",
            spec("1.32", &two),
            observed(
                cluster("UPDATING", "1.31"),
                at(("ACTIVE", "1.31"), ("ACTIVE", "1.31")),
            ),
            vec![],
            waiting("control plane UPDATING"),
        ),
        (
            "a node group still being made holds the control plane's upgrade",
            spec("1.32", &two),
            observed(
                cluster("ACTIVE", "1.31"),
                at(("ACTIVE", "1.31"), ("CREATING", "1.31")),
            ),
            vec![],
            waiting("node groups to settle before the control plane upgrades"),
        ),
        (
            "the control plane done: the first group upgrades, the other waits",
            spec("1.32", &two),
            observed(
                cluster("ACTIVE", "1.32"),
                at(("ACTIVE", "1.31"), ("ACTIVE", "1.31")),
            ),
            vec![UpgradeNodeGroup("small".into(), "1.32".into())],
            waiting("upgrading node group small to 1.32; node group big waits its turn to upgrade"),
        ),
        (
            "the first group upgrading: the second still waits",
            spec("1.32", &two),
            observed(
                cluster("ACTIVE", "1.32"),
                at(("UPDATING", "1.31"), ("ACTIVE", "1.31")),
            ),
            vec![],
            waiting("node group small UPDATING; node group big waits its turn to upgrade"),
        ),
        (
            "the first done: the second upgrades",
            spec("1.32", &two),
            observed(
                cluster("ACTIVE", "1.32"),
                at(("ACTIVE", "1.32"), ("ACTIVE", "1.31")),
            ),
            vec![UpgradeNodeGroup("big".into(), "1.32".into())],
            waiting("upgrading node group big to 1.32"),
        ),
        (
            "a group made during the upgrade is made at the control plane's version",
            spec("1.32", &[("small", 2), ("big", 3), ("new", 1)]),
            observed(
                cluster("ACTIVE", "1.32"),
                at(("ACTIVE", "1.32"), ("ACTIVE", "1.32")),
            ),
            vec![CreateNodeGroup("new".into())],
            waiting("creating node group new"),
        ),
    ];
    check(cases);
}

#[test]
fn failures_and_someone_elses_cluster() {
    let cases: Vec<(&str, HostedSpec, Observed, Vec<Action>, Standing)> = vec![
        (
            "the cloud failed the control plane",
            spec("1.31", &[]),
            observed(cluster("FAILED", "1.31"), vec![]),
            vec![],
            Standing::Stuck("the cloud reports the control plane FAILED".into()),
        ),
        (
            "a cluster of the name that another made is never taken silently",
            spec("1.31", &[]),
            observed(
                cluster("ACTIVE", "1.31").map(|c| Cluster { tags: tags("someone-else"), ..c }),
                vec![],
            ),
            vec![],
            Standing::Stuck("an EKS cluster \"shop\" exists that this cluster did not make; take it over with spec.hosted.import, or give this cluster another name".into()),
        ),
        (
            "an import names a cluster that is not there",
            imported("1.31", &[]),
            observed(None, vec![]),
            vec![],
            Standing::Stuck("no EKS cluster \"legacy\" in eu-west-1: check spec.hosted.import.name and the region".into()),
        ),
        (
            "a failed node group is reported",
            spec("1.31", &[("small", 2)]),
            observed(cluster("ACTIVE", "1.31"), vec![group("small", "CREATE_FAILED", "1.31", 2)]),
            vec![],
            Standing::Stuck("node group small is CREATE_FAILED".into()),
        ),
    ];
    check(cases);
}

#[test]
fn deleting_node_groups_then_the_control_plane() {
    use Action::*;
    let cases: Vec<(&str, HostedSpec, Observed, Vec<Action>, Standing)> = vec![
        (
            "node groups go first",
            spec("1.31", &[("small", 2), ("big", 3)]),
            observed(
                cluster("ACTIVE", "1.31"),
                vec![
                    group("small", "ACTIVE", "1.31", 2),
                    group("big", "DELETING", "1.31", 3),
                ],
            ),
            vec![DeleteNodeGroup("small".into())],
            waiting("deleting node group small; node group big DELETING"),
        ),
        (
            "then the control plane",
            spec("1.31", &[("small", 2)]),
            observed(cluster("ACTIVE", "1.31"), vec![]),
            vec![DeleteCluster],
            waiting("deleting the control plane"),
        ),
        (
            "the control plane going",
            spec("1.31", &[]),
            observed(cluster("DELETING", "1.31"), vec![]),
            vec![],
            waiting("control plane DELETING"),
        ),
        (
            "nothing left: released",
            spec("1.31", &[]),
            observed(None, vec![]),
            vec![],
            Standing::Released,
        ),
        (
            "a cluster taken over keeps its control plane and its own groups",
            imported("1.31", &[("small", 2)]),
            observed(
                cluster("ACTIVE", "1.31").map(|c| Cluster {
                    tags: BTreeMap::new(),
                    ..c
                }),
                vec![NodeGroup {
                    tags: BTreeMap::new(),
                    ..group("theirs", "ACTIVE", "1.31", 3)
                }],
            ),
            vec![],
            Standing::Released,
        ),
        (
            "a cluster of the name that another made is not deleted",
            spec("1.31", &[]),
            observed(
                cluster("ACTIVE", "1.31").map(|c| Cluster {
                    tags: tags("someone-else"),
                    ..c
                }),
                vec![],
            ),
            vec![],
            Standing::Released,
        ),
    ];
    for (what, spec, observed, actions, standing) in cases {
        let got = decide("shop", UID, &spec, true, &observed);
        assert_eq!(got, Decision { actions, standing }, "{what}");
    }
}

fn check(cases: Vec<(&str, HostedSpec, Observed, Vec<Action>, Standing)>) {
    for (what, spec, observed, actions, standing) in cases {
        let got = decide("shop", UID, &spec, false, &observed);
        assert_eq!(got, Decision { actions, standing }, "{what}");
    }
}
