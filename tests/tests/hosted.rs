//! Hosted clusters (EKS) against moto's EKS server over TLS, with IAM authentication on: every
//! request's Signature Version 4 is checked, so the driver speaks EKS's real REST API.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

use std::{collections::BTreeMap, time::Duration};

use drivers::{
    DriverError,
    hosted::{ClusterRequest, HostedProvider, NodeGroupRequest, Phase, Size},
};
use serde_json::{Value, json};
use sim::cluster::{
    ADMIN_TOKEN, Serving, SimCluster, SimConfig,
    webhook::{self, TokenWebhook},
};
use tests::{
    HubProcess, api, api_text,
    browser::{Driver, check_and_save_as},
    cloud::Moto,
    eks_auth::EksAuthenticator,
    eks_front::EksFront,
    hub_cli,
    imported::{PodAt, agent_token, kubectl, kubectl_ok, remove_cluster},
    login, temp_dir, until,
};
use tokio_util::sync::CancellationToken;

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

/// What moto holds that carries the hub's tag for cluster `name`: its clusters and node
/// groups, by name.
async fn tagged(moto: &Moto, name: &str) -> Vec<String> {
    let eks = drivers::aws::Client::new(
        &moto.endpoint,
        tests::cloud::REGION,
        "eks",
        "",
        moto.credentials.clone(),
        Some(&moto.ca_pem),
    )
    .unwrap();
    let provider = moto.eks(moto.credentials.clone());
    let clusters = eks
        .rest("ListClusters", "GET", "/clusters", &[], None)
        .await
        .unwrap();
    let mut found = Vec::new();
    for cluster in clusters["clusters"].as_array().unwrap() {
        let cluster = cluster.as_str().unwrap();
        let described = provider.cluster(cluster).await.unwrap().unwrap();
        if described.tags.get("drover.io/cluster").map(String::as_str) == Some(name) {
            found.push(cluster.to_owned());
        }
        for group in provider.node_groups(cluster).await.unwrap() {
            if group.tags.get("drover.io/cluster").map(String::as_str) == Some(name) {
                found.push(format!("{cluster}/{}", group.name));
            }
        }
    }
    found
}

async fn add_credential(hub: &HubProcess, admin: &str, moto: &Moto) {
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/cloudcredentials",
        Some(admin),
        Some(json!({"metadata": {"name": "aws"},
                    "spec": {"driver": "amazonec2",
                             "amazonec2": {"accessKeyId": moto.credentials.access_key_id,
                                           "secretAccessKey": moto.credentials.secret_access_key}}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    tests::note_secret(&moto.credentials.secret_access_key);
}

/// `spec.hosted` for EKS at `endpoint` (moto, or a front of it), version 1.31.
fn hosted_spec(moto: &Moto, endpoint: &str, groups: Value) -> Value {
    json!({"driver": "eks", "credential": "aws", "region": tests::cloud::REGION,
           "endpoint": endpoint, "endpointCA": moto.ca_pem,
           "kubernetesVersion": "1.31", "roleArn": CLUSTER_ROLE, "nodeRole": NODE_ROLE,
           "subnets": [moto.subnet_id], "tags": {"team": "shop"},
           "nodeGroups": groups})
}

/// Node groups `small` (of `small` machines) and `big` (3).
fn groups(small: u32) -> Value {
    json!([
        {"name": "small", "instanceType": "t3.large", "desiredSize": small, "minSize": 1,
         "maxSize": 5, "labels": {"pool": "small"}, "taints": ["dedicated=shop:NoSchedule"]},
        {"name": "big", "instanceType": "m5.xlarge", "desiredSize": 3, "minSize": 1,
         "maxSize": 5, "diskSize": 50},
    ])
}

/// Cluster `shop` as the hub shows it.
async fn shop(hub: &HubProcess, admin: &str) -> Value {
    let (code, body) = api(hub.addr, "GET", "/v1/clusters/shop", Some(admin), None).await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Waits until the hub reports `shop` provisioned with node groups `want` (name, size).
async fn until_groups(hub: &HubProcess, admin: &str, want: &[(&str, u64)], within: Duration) {
    let want: Vec<(String, u64)> = want.iter().map(|(n, d)| ((*n).to_owned(), *d)).collect();
    until(
        &format!("the hub reports node groups {want:?}, provisioned"),
        within,
        async || {
            let c = shop(hub, admin).await;
            reported_groups(&c) == want && provisioned(&c) == Some("True")
        },
    )
    .await;
}

/// The cluster's node groups as the hub reports them: (name, desired size).
fn reported_groups(cluster: &Value) -> Vec<(String, u64)> {
    let mut groups: Vec<(String, u64)> = cluster["status"]["nodeGroups"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .map(|g| {
                    (
                        g["name"].as_str().unwrap().to_owned(),
                        g["desiredSize"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    groups.sort();
    groups
}

fn provisioned(cluster: &Value) -> Option<&str> {
    cluster["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Provisioned")
        .and_then(|c| c["status"].as_str())
}

/// The hub makes an EKS cluster with two node groups, resizes one 2 → 4 → 1, and on delete
/// removes the node groups and then the control plane, leaving moto nothing tagged for it.
#[tokio::test]
async fn the_hub_makes_scales_and_deletes_an_eks_cluster() {
    let dir = temp_dir("hosted-hub");
    let moto = Moto::start(&dir).await;
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    add_credential(&hub, &admin, &moto).await;

    // A bad spec is refused naming its field, and nothing is made.
    let hosted = |groups: Value| hosted_spec(&moto, &moto.endpoint, groups);
    let mut bad = hosted(groups(9));
    bad["nodeGroups"][0]["desiredSize"] = json!(9);
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"}, "spec": {"type": "hosted", "hosted": bad}})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("spec.hosted.nodeGroups[0].desiredSize"),
        "{body}"
    );

    // Made with the command line, as an operator would.
    let cli = hub.cli_login(&dir);
    let ca_file = dir.join("eks-ca.pem");
    std::fs::write(&ca_file, &moto.ca_pem).unwrap();
    let created = hub_cli(
        &cli,
        &[
            "cluster",
            "create",
            "shop",
            "--hosted",
            "eks",
            "--credential",
            "aws",
            "--region",
            tests::cloud::REGION,
            "--endpoint",
            &moto.endpoint,
            "--endpoint-ca",
            ca_file.to_str().unwrap(),
            "--kubernetes-version",
            "1.31",
            "--role-arn",
            CLUSTER_ROLE,
            "--node-role",
            NODE_ROLE,
            "--subnet",
            &moto.subnet_id,
            "--tag",
            "team=shop",
            "--node-group",
            "name=small,instanceType=t3.large,desiredSize=2,minSize=1,maxSize=5",
            "--node-group",
            "name=big,instanceType=m5.xlarge,desiredSize=3,minSize=1,maxSize=5,diskSize=50",
        ],
        "",
    );
    assert_eq!(created.code, 0, "{}", created.stderr);
    assert!(
        created.stdout.contains("The hub makes it in the cloud"),
        "{}",
        created.stdout
    );
    let misspelt = hub_cli(
        &cli,
        &[
            "cluster",
            "create",
            "other",
            "--hosted",
            "eks",
            "--node-group",
            "name=a,desired=2",
        ],
        "",
    );
    assert_ne!(misspelt.code, 0);
    assert!(
        misspelt.stderr.contains("\"desired\" is not one of"),
        "{}",
        misspelt.stderr
    );
    let cluster = async || shop(&hub, &admin).await;
    let wait_for_groups = async |want: &[(&str, u64)]| {
        until_groups(&hub, &admin, want, Duration::from_secs(60)).await;
    };
    wait_for_groups(&[("big", 3), ("small", 2)]).await;
    // moto gives every cluster a made-up endpoint and CA, so the hub cannot install the
    // agents: it says why and when it tries again, and the node groups were made regardless.
    until(
        "the failed install is explained",
        Duration::from_secs(30),
        async || {
            let c = cluster().await;
            let agents = c["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "AgentsInstalled")
                .cloned()
                .unwrap_or_default();
            let message = agents["message"].as_str().unwrap_or_default();
            agents["status"] == "False"
                && message.starts_with("installing the agents failed: the cluster's CA: ")
                && message.contains("; tried again at ")
        },
    )
    .await;
    let shop = cluster().await;
    assert_eq!(shop["status"]["provider"]["status"], "ACTIVE", "{shop}");
    assert_eq!(shop["status"]["provider"]["version"], "1.31", "{shop}");

    // In the cloud: what the spec said, tagged.
    let eks = moto.eks(moto.credentials.clone());
    let made = eks.cluster("shop").await.unwrap().unwrap();
    assert_eq!(made.tags["team"], "shop");
    assert_eq!(made.tags["drover.io/cluster"], "shop");
    assert_eq!(
        made.tags["drover.io/owner"],
        shop["metadata"]["uid"].as_str().unwrap()
    );
    let mut in_cloud = eks.node_groups("shop").await.unwrap();
    in_cloud.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        in_cloud
            .iter()
            .map(|g| (
                g.name.as_str(),
                g.version.as_str(),
                g.desired_size,
                g.max_size
            ))
            .collect::<Vec<_>>(),
        [("big", "1.31", 3, 5), ("small", "1.31", 2, 5)]
    );

    // Resized 2 → 4 with the command line, 4 → 1 through the API.
    let scaled = hub_cli(
        &cli,
        &["nodegroup", "scale", "shop", "small", "--desired", "4"],
        "",
    );
    assert_eq!(scaled.code, 0, "{}", scaled.stderr);
    let unknown = hub_cli(
        &cli,
        &["nodegroup", "scale", "shop", "huge", "--desired", "4"],
        "",
    );
    assert!(
        unknown
            .stderr
            .contains("no node group \"huge\" (its node groups: small, big)"),
        "{}",
        unknown.stderr
    );
    wait_for_groups(&[("big", 3), ("small", 4)]).await;
    let mut spec = cluster().await["spec"].clone();
    spec["hosted"]["nodeGroups"][0]["desiredSize"] = json!(1);
    let (code, body) = api(
        hub.addr,
        "PUT",
        "/v1/clusters/shop",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"}, "spec": spec})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    wait_for_groups(&[("big", 3), ("small", 1)]).await;
    let small = eks
        .node_groups("shop")
        .await
        .unwrap()
        .into_iter()
        .find(|g| g.name == "small")
        .unwrap();
    assert_eq!(small.desired_size, 1);

    // Deleted: node groups, then the control plane, then the cluster object.
    remove_cluster(&hub, &admin, "shop").await;
    assert_eq!(tagged(&moto, "shop").await, Vec::<String>::new());
    assert_eq!(eks.cluster("shop").await.unwrap(), None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hub killed while the cloud makes its cluster (the create call made, its answer never
/// heard) finds the cluster by name after its restart and makes nothing twice; a new version
/// upgrades the control plane first, then the node groups one at a time. The front makes each
/// step take a while, as EKS does, and answers the upgrades moto lacks.
#[tokio::test]
async fn a_hub_killed_mid_create_makes_nothing_twice_and_upgrades_in_order() {
    let dir = temp_dir("hosted-crash");
    let moto = Moto::start(&dir).await;
    let front = EksFront::start(&moto, &dir, 1).await;
    let mut hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    add_credential(&hub, &admin, &moto).await;
    front.stall_next_create();
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"},
                    "spec": {"type": "hosted",
                             "hosted": hosted_spec(&moto, &front.endpoint, groups(2))}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    until(
        "the hub asks the cloud for the cluster",
        Duration::from_secs(30),
        async || front.count("CreateCluster") == 1,
    )
    .await;
    hub.crash().await;
    let hub = HubProcess::start(&dir.join("hub")).await;
    until_groups(
        &hub,
        &admin,
        &[("big", 3), ("small", 2)],
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(front.count("CreateCluster"), 1, "made once");
    assert_eq!(front.count("CreateNodegroup"), 2);
    assert_eq!(
        moto.eks(moto.credentials.clone())
            .node_groups("shop")
            .await
            .unwrap()
            .len(),
        2
    );

    // 1.31 → 1.32: the control plane, then `small`, then `big` (the spec's order), each
    // begun only once the one before it ended.
    let mut spec = shop(&hub, &admin).await["spec"].clone();
    spec["hosted"]["kubernetesVersion"] = json!("1.32");
    let (code, body) = api(
        hub.addr,
        "PUT",
        "/v1/clusters/shop",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"}, "spec": spec})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    until(
        "the control plane and both node groups at 1.32",
        Duration::from_secs(120),
        async || {
            let c = shop(&hub, &admin).await;
            let groups = c["status"]["nodeGroups"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            c["status"]["provider"]["version"] == "1.32"
                && groups.len() == 2
                && groups.iter().all(|g| g["version"] == "1.32")
                && provisioned(&c) == Some("True")
        },
    )
    .await;
    assert_eq!(
        front.upgrades(),
        [
            "start shop/1.32",
            "end shop/1.32",
            "start shop/small/1.32",
            "end shop/small/1.32",
            "start shop/big/1.32",
            "end shop/big/1.32",
        ]
    );
    // Going down is refused, and says why.
    spec["hosted"]["kubernetesVersion"] = json!("1.31");
    let (code, body) = api(
        hub.addr,
        "PUT",
        "/v1/clusters/shop",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"}, "spec": spec})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cannot be downgraded"),
        "{body}"
    );

    remove_cluster(&hub, &admin, "shop").await;
    assert_eq!(tagged(&moto, "shop").await, Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Once the cloud says the control plane is active, the hub installs the agents into it with
/// no hand step: at the endpoint the cloud reports (a simulated cluster here, whose API server
/// takes EKS's `k8s-aws-v1.` tokens through an authenticator that checks their signature with
/// the test's key), with a token made from the credential, the import manifest applied with
/// server-side apply. The agent it installs connects, and kubectl works through the hub; the
/// credential is nowhere in the cluster.
#[tokio::test]
async fn a_hosted_cluster_gets_its_agents_without_a_hand_step() {
    let dir = temp_dir("hosted-import");
    let moto = Moto::start(&dir).await;
    let front = EksFront::start(&moto, &dir, 1).await;
    let authenticator =
        EksAuthenticator::start("shop", tests::cloud::REGION, moto.credentials.clone()).await;
    let webhook_config = dir.join("webhook.kubeconfig");
    authenticator.config_file(&webhook_config);
    let shutdown = CancellationToken::new();
    let serving = Serving {
        webhook: Some(
            TokenWebhook::from_config_file(&webhook_config, "v1", webhook::DEFAULT_TTL).unwrap(),
        ),
        ..Serving::default()
    };
    let sim = SimCluster::start_with(SimConfig::default(), serving, shutdown.clone())
        .await
        .unwrap();
    front.serve_cluster("shop", &sim.url(), sim.ca_pem());
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    add_credential(&hub, &admin, &moto).await;
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"},
                    "spec": {"type": "hosted",
                             "hosted": hosted_spec(&moto, &front.endpoint, groups(2))}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    until_groups(
        &hub,
        &admin,
        &[("big", 3), ("small", 2)],
        Duration::from_secs(90),
    )
    .await;
    let installed = shop(&hub, &admin).await["status"]["agentsInstalled"].clone();
    assert!(installed.is_string(), "{installed}");

    // In the cluster: the manifest's objects, applied by the hub under its own field manager,
    // with a token the authenticator took.
    let sim_admin = dir.join("sim-admin.kubeconfig");
    std::fs::write(&sim_admin, sim.kubeconfig(ADMIN_TOKEN)).unwrap();
    let deployment = kubectl_ok(
        &sim_admin,
        &[
            "get",
            "deployment",
            "drover-cluster-agent",
            "-n",
            "drover-system",
            "-o",
            "json",
            "--show-managed-fields",
        ],
    )
    .await;
    let deployment: Value = serde_json::from_str(&deployment).unwrap();
    let managers: Vec<&str> = deployment["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert_eq!(managers, ["drover-hub"], "{deployment}");
    assert!(authenticator.reviews.lock().unwrap().contains(&true));
    let everything = kubectl_ok(
        &sim_admin,
        &["get", "secrets,configmaps", "-A", "-o", "json"],
    )
    .await;
    assert!(!everything.contains(&moto.credentials.secret_access_key));
    assert!(!everything.contains(&moto.credentials.access_key_id));

    // Kubelet's part: the agent runs as the manifest says, and connects.
    let token = agent_token(&sim_admin).await;
    let pod = PodAt {
        sim_admin: &sim_admin,
        sim: &sim,
        hub_url: &hub.url(),
        dir: &dir,
        token: &token,
    };
    let env = pod
        .env(
            "deployment",
            "drover-cluster-agent",
            "drover-cluster-agent-0",
            "",
        )
        .await;
    let config = cluster_agent::Config::from_env(&env).unwrap();
    tokio::spawn(cluster_agent::run(config, shutdown.child_token()));
    let (status, kubeconfig) = api_text(
        hub.addr,
        "POST",
        "/v1/clusters/shop/kubeconfig",
        Some(&admin),
    )
    .await;
    assert_eq!(status, 201, "{kubeconfig}");
    let user_kubeconfig = dir.join("shop.kubeconfig");
    std::fs::write(&user_kubeconfig, &kubeconfig).unwrap();
    until(
        "kubectl through the hub reaches the cluster",
        Duration::from_secs(60),
        async || {
            kubectl(&user_kubeconfig, &["get", "namespace", "drover-system"])
                .await
                .0
        },
    )
    .await;
    // Installed once: later passes do not apply it again.
    assert_eq!(
        shop(&hub, &admin).await["status"]["agentsInstalled"],
        installed
    );

    remove_cluster(&hub, &admin, "shop").await;
    assert_eq!(tagged(&moto, "shop").await, Vec::<String>::new());
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dashboard: an admin creates a hosted cluster with a node group on the create page, sees
/// the cloud's status of the control plane and the group on the cluster's page as it changes,
/// adds a machine with the group's + button and upgrades the Kubernetes version with the
/// page's form; the cloud follows each step. No console error, no accessibility problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_create_scale_and_upgrade_a_hosted_cluster_from_the_dashboard() {
    let dir = temp_dir("hosted-dashboard");
    let moto = Moto::start(&dir).await;
    let front = EksFront::start(&moto, &dir, 0).await;
    let hub = HubProcess::start(&dir.join("hub")).await;
    let base = hub.url();
    let password = hub.admin_password.clone().unwrap();
    let admin = login(hub.addr, "admin", &password).await;
    add_credential(&hub, &admin, &moto).await;

    let driver = Driver::start(&dir).await;
    let browser = driver.browser("hosted-admin", 1280, 900).await;
    browser.goto(&format!("{base}/")).await;
    browser.find("form#login").await;
    browser.type_into("#username", "admin").await;
    browser.type_into("#password", &password).await;
    browser.click("form#login button[type=submit]").await;
    browser.find("table#clusters").await;

    browser.goto(&format!("{base}/clusters/new")).await;
    browser.type_into("#name", "shop").await;
    browser.click("input[name=type][value=hosted]").await;
    browser.find("#hosted-fields:not([hidden])").await;
    browser
        .run(
            "const [values, group] = arguments; \
             for (const [name, value] of Object.entries(values)) \
               document.querySelector(`#hosted-fields [name=\"${name}\"]`).value = value; \
             const row = document.querySelector('.group-row'); \
             for (const [name, value] of Object.entries(group)) \
               row.querySelector(`[name=\"group-${name}\"]`).value = value;",
            json!([
                {"credential": "aws", "region": tests::cloud::REGION, "kubernetesVersion": "1.31",
                 "roleArn": CLUSTER_ROLE, "nodeRole": NODE_ROLE, "subnets": moto.subnet_id,
                 "endpoint": front.endpoint, "endpointCA": moto.ca_pem},
                {"name": "small", "instanceType": "t3.large", "desiredSize": "2", "minSize": "1",
                 "maxSize": "5"},
            ]),
        )
        .await;
    check_and_save_as(&browser, "hosted-create").await;
    browser
        .click("form#create-cluster button[type=submit]")
        .await;
    browser.find("#created:not([hidden])").await;
    assert!(
        browser
            .text("#created-help")
            .await
            .contains("The hub makes it in the cloud")
    );

    browser.goto(&format!("{base}/clusters/shop")).await;
    let group_is = |status: &str, version: &str, machines: u32| {
        format!(
            "const row = document.querySelector('table#node-groups tr[data-name=small]'); \
             const cell = (label) => row && row.querySelector(`td[data-label=\"${{label}}\"]`).textContent; \
             return row !== null && cell('Status') === '{status}' && cell('Version') === '{version}' \
               && cell('Machines') === '{machines}';"
        )
    };
    browser
        .until(
            "node group small ACTIVE with 2 machines",
            Duration::from_secs(60),
            &group_is("ACTIVE", "1.31", 2),
        )
        .await;
    assert_eq!(
        browser
            .text("table#hosted-provider tr[data-name=control-plane] td[data-label=Status]")
            .await,
        "ACTIVE"
    );
    check_and_save_as(&browser, "hosted-cluster").await;

    // + : a third machine, asked of the cloud.
    browser
        .click("button.scale-group[data-group=small][data-by='1']")
        .await;
    browser
        .until(
            "node group small at 3",
            Duration::from_secs(60),
            &group_is("ACTIVE", "1.31", 3),
        )
        .await;
    let eks = moto.eks(moto.credentials.clone());
    assert_eq!(eks.node_groups("shop").await.unwrap()[0].desired_size, 3);

    // Upgrade: the form offers the next minor version.
    assert_eq!(
        browser
            .run(
                "return document.querySelector('#hosted-version').value;",
                json!([])
            )
            .await,
        "1.32"
    );
    browser
        .click("form#upgrade-hosted button[type=submit]")
        .await;
    browser
        .until(
            "the control plane and node group small at 1.32",
            Duration::from_secs(90),
            &format!(
                "{} && document.querySelector('table#hosted-provider td[data-label=Version]').textContent === '1.32';",
                group_is("ACTIVE", "1.32", 3).trim_end_matches(';')
            ),
        )
        .await;
    assert_eq!(
        front.upgrades(),
        [
            "start shop/1.32",
            "end shop/1.32",
            "start shop/small/1.32",
            "end shop/small/1.32"
        ]
    );
    check_and_save_as(&browser, "hosted-upgraded").await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Taking over an EKS cluster made elsewhere (`import`): the hub makes no control plane, adds
/// the node groups its spec names beside the cluster's own, and on delete removes only what it
/// made — the control plane and the group it found stay.
#[tokio::test]
async fn a_cluster_taken_over_keeps_what_the_hub_did_not_make() {
    let dir = temp_dir("hosted-takeover");
    let moto = Moto::start(&dir).await;
    let eks = moto.eks(moto.credentials.clone());
    eks.create_cluster(&ClusterRequest {
        name: "legacy".into(),
        version: "1.31".into(),
        role_arn: CLUSTER_ROLE.into(),
        subnets: vec![moto.subnet_id.clone()],
        endpoint_public_access: true,
        token: "made-elsewhere".into(),
        ..ClusterRequest::default()
    })
    .await
    .unwrap();
    eks.create_node_group(&NodeGroupRequest {
        cluster: "legacy".into(),
        name: "theirs".into(),
        version: "1.31".into(),
        desired_size: 1,
        min_size: 1,
        max_size: 2,
        subnets: vec![moto.subnet_id.clone()],
        node_role: NODE_ROLE.into(),
        token: "theirs".into(),
        ..NodeGroupRequest::default()
    })
    .await
    .unwrap();
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    add_credential(&hub, &admin, &moto).await;
    let mut hosted = hosted_spec(
        &moto,
        &moto.endpoint,
        json!([{"name": "small", "desiredSize": 2, "minSize": 1, "maxSize": 5}]),
    );
    hosted["import"] = json!({"name": "legacy"});
    let (code, body) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "shop"}, "spec": {"type": "hosted", "hosted": hosted}})),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    until_groups(
        &hub,
        &admin,
        &[("small", 2), ("theirs", 1)],
        Duration::from_secs(60),
    )
    .await;
    let legacy = eks.cluster("legacy").await.unwrap().unwrap();
    assert!(
        legacy.tags.is_empty(),
        "the hub tagged what it did not make: {legacy:?}"
    );
    assert_eq!(
        eks.cluster("shop").await.unwrap(),
        None,
        "no control plane of its own"
    );
    assert_eq!(tagged(&moto, "shop").await, ["legacy/small"]);

    remove_cluster(&hub, &admin, "shop").await;
    assert_eq!(tagged(&moto, "shop").await, Vec::<String>::new());
    let left: Vec<String> = eks
        .node_groups("legacy")
        .await
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(left, ["theirs"]);
    assert!(eks.cluster("legacy").await.unwrap().is_some());
    let _ = std::fs::remove_dir_all(&dir);
}
