//! Hosted clusters (EKS) against moto's EKS server over TLS, with IAM authentication on: every
//! request's Signature Version 4 is checked, so the driver speaks EKS's real REST API.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::collections::BTreeMap;

use drivers::{
    DriverError,
    hosted::{ClusterRequest, HostedProvider, NodeGroupRequest, Phase, Size},
};
use tests::{cloud::Moto, temp_dir};

/// The role ARNs moto checks the form of.
const CLUSTER_ROLE: &str = "arn:aws:iam::123456789012:role/eks-cluster";
const NODE_ROLE: &str = "arn:aws:iam::123456789012:role/eks-nodes";

/// The driver alone: a control plane and two node groups made, found, scaled and deleted;
/// making one again is refused as in use (the controller finds by name first); a wrong secret
/// is refused by the cloud's signature check, and said so.
#[tokio::test]
async fn the_eks_driver_makes_finds_scales_and_deletes() {
    let dir = temp_dir("hosted-driver");
    let moto = Moto::start(&dir).await;
    let eks = moto.eks(moto.credentials.clone());
    assert_eq!(eks.cluster("probe").await.unwrap(), None);
    let tags = BTreeMap::from([("drover.io/cluster".to_owned(), "probe".to_owned())]);
    let request = ClusterRequest {
        name: "probe".into(),
        version: "1.31".into(),
        role_arn: CLUSTER_ROLE.into(),
        subnets: vec![moto.subnet_id.clone()],
        endpoint_public_access: true,
        tags: tags.clone(),
        token: "probe-1".into(),
        ..ClusterRequest::default()
    };
    eks.create_cluster(&request).await.unwrap();
    let again = eks.create_cluster(&request).await.unwrap_err();
    assert!(
        matches!(&again, DriverError::Unavailable(why) if why.contains("ResourceInUseException")),
        "{again:?}"
    );
    let cluster = eks.cluster("probe").await.unwrap().unwrap();
    assert_eq!(
        (cluster.phase, cluster.version.as_str()),
        (Phase::Active, "1.31")
    );
    assert!(cluster.endpoint.starts_with("https://"), "{cluster:?}");
    assert_eq!(cluster.tags, tags);

    for (name, desired) in [("small", 2), ("big", 3)] {
        eks.create_node_group(&NodeGroupRequest {
            cluster: "probe".into(),
            name: name.into(),
            instance_type: "t3.large".into(),
            desired_size: desired,
            min_size: 1,
            max_size: 5,
            disk_size: 40,
            subnets: vec![moto.subnet_id.clone()],
            node_role: NODE_ROLE.into(),
            labels: BTreeMap::from([("pool".to_owned(), name.to_owned())]),
            taints: vec!["dedicated=probe:NoSchedule".into()],
            tags: tags.clone(),
            token: format!("probe-{name}"),
            ..NodeGroupRequest::default()
        })
        .await
        .unwrap();
    }
    let sizes = async || -> Vec<(String, u32)> {
        let mut groups: Vec<(String, u32)> = eks
            .node_groups("probe")
            .await
            .unwrap()
            .into_iter()
            .map(|g| (g.name, g.desired_size))
            .collect();
        groups.sort();
        groups
    };
    assert_eq!(sizes().await, [("big".into(), 3), ("small".into(), 2)]);
    eks.scale_node_group(
        "probe",
        "small",
        Size {
            desired: 4,
            min: 1,
            max: 5,
        },
    )
    .await
    .unwrap();
    assert_eq!(sizes().await, [("big".into(), 3), ("small".into(), 4)]);

    let forged = moto.eks(drivers::aws::Credentials {
        access_key_id: moto.credentials.access_key_id.clone(),
        secret_access_key: "not-the-secret".into(),
    });
    let refused = forged.cluster("probe").await.unwrap_err();
    assert!(matches!(&refused, DriverError::Refused(_)), "{refused:?}");

    // A cluster with node groups cannot go first; without them it can; twice is fine.
    let in_use = eks.delete_cluster("probe").await.unwrap_err();
    assert!(matches!(&in_use, DriverError::Unavailable(_)), "{in_use:?}");
    for name in ["small", "big", "big"] {
        eks.delete_node_group("probe", name).await.unwrap();
    }
    assert_eq!(sizes().await, []);
    eks.delete_cluster("probe").await.unwrap();
    eks.delete_cluster("probe").await.unwrap();
    assert_eq!(eks.cluster("probe").await.unwrap(), None);
    let _ = std::fs::remove_dir_all(&dir);
}
