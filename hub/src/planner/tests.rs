#![allow(clippy::unwrap_used)]

use super::{
    host_plan::{HUB_CA, Installer, config_yaml},
    *,
};
use crate::store::{before_writes::BeforeWrites, sqlite::SqliteStore};

/// A planner over a fresh SQLite store in a temp directory.
struct Fixture {
    planner: Planner,
    dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fixture() -> Fixture {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("drover-planner-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("state.db")).unwrap());
    Fixture {
        planner: Planner {
            files: None,
            store,
            server_url: "https://hub.example:8443".into(),
            ca_checksum: "ab".repeat(32),
            ca_pem: "-----BEGIN CERTIFICATE-----\nhub\n-----END CERTIFICATE-----\n".into(),
            agents: None,
        },
        dir,
    }
}

impl Fixture {
    fn store(&self) -> &dyn Store {
        self.planner.store.as_ref()
    }

    async fn cluster(&self, version: &str, strategy: Value) {
        let spec = json!({"type": "custom", "distribution": "k3s", "version": version, "upgradeStrategy": strategy});
        match self.store().get("Cluster", "edge").await {
            Ok(mut c) => {
                c.spec = spec;
                self.store().update(c).await.unwrap();
            }
            Err(_) => {
                self.store()
                    .create(Object::new("Cluster", "edge", spec))
                    .await
                    .unwrap();
            }
        }
    }

    async fn host(&self, name: &str, etcd: bool, worker: bool, address: &str) {
        self.host_on_node(name, name, etcd, worker, address).await;
    }

    /// A host whose node is named `node` (hosts are named after random ids, nodes are not).
    async fn host_on_node(&self, name: &str, node: &str, etcd: bool, worker: bool, address: &str) {
        let spec = json!({"cluster": "edge", "nodeName": node, "address": address,
                          "roles": {"etcd": etcd, "controlPlane": etcd, "worker": worker}});
        self.store()
            .create(Object::new("Host", name, spec))
            .await
            .unwrap();
    }

    /// The plan the planner wrote for `host`, if any.
    async fn plan(&self, host: &str) -> Option<Plan> {
        let object = self.store().get("Plan", host).await.ok()?;
        crate::model::parse_plan(&object.spec["plan"]).ok()
    }

    /// Reports `host`'s current plan applied with every probe healthy, as its agent would.
    async fn applied(&self, host: &str, output: &str) {
        let plan = self.plan(host).await.unwrap();
        let sum = checksum(&plan);
        let probes: Vec<Value> = plan
            .probes
            .iter()
            .map(|p| json!({"name": p.name, "healthy": true}))
            .collect();
        let results: Vec<Value> = plan
            .instructions
            .iter()
            .map(|i| json!({"name": i.name, "exitCode": 0, "stdout": if i.save_output { output } else { "" }}))
            .collect();
        update_status(self.store(), Kind::Plan, host, move |s| {
            s.extra.insert("checksum".into(), json!(sum));
            s.extra.insert("appliedChecksum".into(), json!(sum));
            s.extra.insert("state".into(), json!("applied"));
            s.extra.insert("probes".into(), json!(probes));
            s.extra.insert("results".into(), json!(results));
        })
        .await
        .unwrap();
    }

    async fn version_of(&self, host: &str) -> Option<String> {
        let plan = self.plan(host).await?;
        plan.instructions[0]
            .env
            .iter()
            .find_map(|e| e.strip_prefix("INSTALL_K3S_VERSION="))
            .map(str::to_owned)
    }

    async fn cluster_status(&self) -> Status {
        Status::of(&self.store().get("Cluster", "edge").await.unwrap())
    }
}

#[tokio::test]
async fn hosts_are_planned_in_order_and_workers_join_the_init_host() {
    let f = fixture();
    f.cluster("v1.33.4+k3s1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.host("h-b", false, true, "10.0.0.2").await;
    f.host("h-c", false, true, "10.0.0.3").await;
    f.planner.reconcile_all().await;

    let init = f
        .plan("h-a")
        .await
        .expect("the init host is planned at once");
    assert!(
        f.plan("h-b").await.is_none(),
        "workers wait for the init host"
    );
    let config = String::from_utf8(init.files[0].content.clone()).unwrap();
    assert!(
        config.contains("cluster-init: true") && config.contains("node-name: \"h-a\""),
        "{config}"
    );
    assert!(
        init.files[1]
            .path
            .ends_with("/server/manifests/drover-cluster-agent.yaml")
    );
    let manifest = String::from_utf8(init.files[1].content.clone()).unwrap();
    assert!(manifest.contains("drr_") && manifest.contains("https://hub.example:8443"));
    let names: Vec<_> = init.instructions.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["install", "node-token"]);
    let probes: Vec<_> = init.probes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(probes, ["kubelet", "kube-apiserver", "etcd"]);
    let status = f.cluster_status().await;
    assert_eq!(status.extra["initHost"], "h-a");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.kind == "Provisioned" && c.status == "Unknown")
    );

    // Planning again changes nothing (the manifest and its token are kept).
    f.planner.reconcile_all().await;
    assert_eq!(f.plan("h-a").await.unwrap(), init);

    f.applied("h-a", "K10abc::server:secret\n").await;
    f.planner.reconcile_all().await;
    for worker in ["h-b", "h-c"] {
        let plan = f
            .plan(worker)
            .await
            .expect("workers follow a ready init host");
        let config = String::from_utf8(plan.files[0].content.clone()).unwrap();
        assert!(
            config.contains("server: \"https://10.0.0.1:6443\""),
            "{config}"
        );
        assert!(
            config.contains("token: \"K10abc::server:secret\""),
            "{config}"
        );
        assert!(!config.contains("cluster-init"));
        assert_eq!(plan.files.len(), 1, "only the init host deploys the agents");
        assert!(
            plan.instructions[0]
                .env
                .contains(&"INSTALL_K3S_EXEC=agent".to_owned())
        );
        let probes: Vec<_> = plan.probes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(probes, ["kubelet"]);
    }
    f.applied("h-b", "").await;
    f.applied("h-c", "").await;
    f.planner.reconcile_all().await;
    let status = f.cluster_status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.kind == "Provisioned" && c.status == "True"),
        "{status:?}"
    );
    assert_eq!(status.extra["hosts"], json!({"ready": 3, "total": 3}));
}

#[tokio::test]
async fn workers_roll_in_the_order_of_their_node_names_not_their_host_ids() {
    let f = fixture();
    f.cluster("v1", json!({})).await;
    f.host_on_node("h-5e1", "node-1", true, true, "10.0.0.1")
        .await;
    f.host_on_node("h-f00", "node-2", false, true, "10.0.0.2")
        .await;
    f.host_on_node("h-0ab", "node-3", false, true, "10.0.0.3")
        .await;
    f.planner.reconcile_all().await;
    f.applied("h-5e1", "token").await;
    f.planner.reconcile_all().await;
    f.applied("h-f00", "").await;
    f.applied("h-0ab", "").await;
    f.planner.reconcile_all().await;
    f.cluster("v2", json!({"workerConcurrency": "1"})).await;
    f.planner.reconcile_all().await;
    f.applied("h-5e1", "token").await;
    f.planner.reconcile_all().await;
    assert_eq!(
        f.version_of("h-f00").await.as_deref(),
        Some("v2"),
        "node-2 first"
    );
    assert_eq!(
        f.version_of("h-0ab").await.as_deref(),
        Some("v1"),
        "node-3 waits"
    );
}

#[tokio::test]
async fn a_version_change_rolls_servers_then_workers_within_the_concurrency() {
    let f = fixture();
    f.cluster("v1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.host("h-b", false, true, "10.0.0.2").await;
    f.host("h-c", false, true, "10.0.0.3").await;
    f.planner.reconcile_all().await;
    f.applied("h-a", "token").await;
    f.planner.reconcile_all().await;
    f.applied("h-b", "").await;
    f.applied("h-c", "").await;
    f.planner.reconcile_all().await;

    f.cluster("v2", json!({"workerConcurrency": "1"})).await;
    f.planner.reconcile_all().await;
    let versions = async || {
        let mut v = Vec::new();
        for h in ["h-a", "h-b", "h-c"] {
            v.push(f.version_of(h).await.unwrap());
        }
        v
    };
    assert_eq!(
        versions().await,
        ["v2", "v1", "v1"],
        "the server goes first"
    );
    let status = f.cluster_status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.kind == "Updated" && c.status == "Unknown")
    );
    f.planner.reconcile_all().await;
    assert_eq!(
        versions().await,
        ["v2", "v1", "v1"],
        "workers wait for the server"
    );
    f.applied("h-a", "token").await;
    f.planner.reconcile_all().await;
    assert_eq!(versions().await, ["v2", "v2", "v1"], "one worker at a time");
    f.applied("h-b", "").await;
    f.planner.reconcile_all().await;
    assert_eq!(versions().await, ["v2", "v2", "v2"]);
    f.applied("h-c", "").await;
    f.planner.reconcile_all().await;
    let status = f.cluster_status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.kind == "Updated" && c.status == "True"),
        "{status:?}"
    );
    assert_eq!(status.extra["version"], "v2");

    // 100% of workers: both at once.
    f.cluster("v3", json!({"workerConcurrency": "100%"})).await;
    f.planner.reconcile_all().await;
    f.applied("h-a", "token").await;
    f.planner.reconcile_all().await;
    assert_eq!(versions().await, ["v3", "v3", "v3"]);
}

#[tokio::test]
async fn a_failing_host_shows_why_on_the_cluster() {
    let f = fixture();
    f.cluster("v1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.planner.reconcile_all().await;
    update_status(f.store(), Kind::Plan, "h-a", move |s| {
        s.extra.insert("checksum".into(), json!(""));
        s.extra.insert("state".into(), json!("failed"));
        s.extra.insert("failureCount".into(), json!(1));
        s.extra.insert("maxFailures".into(), json!(5));
        s.extra.insert(
            "message".into(),
            json!("instruction \"install\" exited with 1: no space left"),
        );
    })
    .await
    .unwrap();
    // The failure is about this plan.
    let sum = checksum(&f.plan("h-a").await.unwrap());
    update_status(f.store(), Kind::Plan, "h-a", move |s| {
        s.extra.insert("checksum".into(), json!(sum));
    })
    .await
    .unwrap();
    f.planner.reconcile_all().await;
    let status = f.cluster_status().await;
    let c = status.condition("Provisioned").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ProvisioningFailed")
    );
    assert!(
        c.message.contains("h-a") && c.message.contains("no space left"),
        "{}",
        c.message
    );
}

#[tokio::test]
async fn a_removed_host_is_uninstalled_before_it_goes() {
    let f = fixture();
    f.cluster("v1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.planner.reconcile_all().await;
    let host = f.store().get("Host", "h-a").await.unwrap();
    assert!(host.metadata.finalizers.contains(&FINALIZER.to_owned()));
    f.store().delete("Host", "h-a", None).await.unwrap();
    f.planner.reconcile_all().await;
    let plan = f.plan("h-a").await.unwrap();
    assert_eq!(plan.instructions[0].name, "uninstall");
    assert!(
        f.store().get("Host", "h-a").await.is_ok(),
        "kept until uninstalled"
    );
    f.applied("h-a", "").await;
    f.planner.reconcile_all().await;
    assert!(f.store().get("Host", "h-a").await.is_err());
    assert!(f.store().get("Plan", "h-a").await.is_err());
}

#[tokio::test]
async fn air_gapped_hosts_fetch_the_artifacts_from_the_hub_trusting_its_ca() {
    let f = fixture();
    f.store()
        .create(Object::new(
            "Setting",
            "install-source",
            json!({"value": "hub"}),
        ))
        .await
        .unwrap();
    f.cluster("v1.33.4+k3s1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.planner.reconcile_all().await;
    let plan = f.plan("h-a").await.unwrap();
    let ca = plan
        .files
        .iter()
        .find(|f| f.path == HUB_CA)
        .expect("the hub's CA");
    assert_eq!(ca.content, f.planner.ca_pem.as_bytes());
    let script = &plan.instructions[0].script;
    assert!(
        script.contains("https://hub.example:8443/v3/artifacts/v1.33.4+k3s1")
            && script.contains("--cacert \"$DROVER_ROOT/etc/drover/hub-ca.pem\"")
            && script.contains("INSTALL_K3S_SKIP_DOWNLOAD=true"),
        "{script}"
    );
    assert!(!script.contains("get.k3s.io"));
}

/// What a cluster of `dist` with no configuration of its own installs with.
fn dist_ctx(dist: Distribution) -> Ctx<'static> {
    Ctx {
        dist,
        version: "v1.33.4+k3s1",
        installer: Installer::Script("https://get.k3s.io".into()),
        ca_pem: "",
        endpoint: false,
        config: std::collections::BTreeMap::new(),
        host_config: Vec::new(),
        registries: Vec::new(),
        env: Vec::new(),
    }
}

#[test]
fn etcd_only_and_control_plane_only_hosts_disable_the_rest() {
    let host = |etcd, cp| HostSpec {
        cluster: "edge".into(),
        roles: crate::model::HostRoles {
            etcd,
            control_plane: cp,
            worker: false,
        },
        node_name: "n".into(),
        address: String::new(),
        internal_address: String::new(),
        node_labels: [("rack".to_owned(), "r1".to_owned())].into(),
        taints: vec!["dedicated=infra:NoSchedule".into()],
    };
    let etcd = config_yaml(
        &dist_ctx(Distribution::K3s),
        &host(true, false),
        Step::Etcd,
        None,
        false,
    );
    assert!(
        etcd.contains("disable-apiserver: true") && !etcd.contains("disable-etcd"),
        "{etcd}"
    );
    assert!(etcd.contains("- \"rack=r1\"") && etcd.contains("- \"dedicated=infra:NoSchedule\""));
    let cp = config_yaml(
        &dist_ctx(Distribution::K3s),
        &host(false, true),
        Step::ControlPlane,
        None,
        false,
    );
    assert!(
        cp.contains("disable-etcd: true") && !cp.contains("disable-apiserver"),
        "{cp}"
    );
    let rke2 = config_yaml(
        &dist_ctx(Distribution::Rke2),
        &host(true, true),
        Step::Init,
        None,
        false,
    );
    assert!(
        !rke2.contains("cluster-init"),
        "RKE2 initialises without it: {rke2}"
    );
}

/// A cluster's private registries reach every host as the distribution documents its
/// `registries.yaml`, with the credential's password read from the store; without the
/// credential no host is planned and the cluster says why.
#[tokio::test]
async fn registries_are_written_on_every_host_with_their_credentials() {
    let f = fixture();
    let spec = json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
        "systemDefaultRegistry": "registry.example.com:5000",
        "registries": {
            "mirrors": {"docker.io": {"endpoint": ["https://registry.example.com:5000"],
                                      "rewrite": {"^rancher/(.*)": "mirror/rancher/$1"}}},
            "configs": {"mtls.example.com": {"credential": "mtls-login"},
                        "registry.example.com:5000": {"credential": "mirror-login",
                "tls": {"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}}}});
    f.store()
        .create(Object::new("Cluster", "edge", spec))
        .await
        .unwrap();
    f.host("h-a", true, true, "10.0.0.1").await;
    f.host("h-b", false, true, "10.0.0.2").await;
    f.planner.reconcile_all().await;
    assert!(f.plan("h-a").await.is_none());
    let status = f.cluster_status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.reason == "RegistryCredential"
                && c.message
                    .contains("CloudCredential mirror-login does not exist")),
        "{status:?}"
    );

    f.store()
        .create(Object::new(
            "CloudCredential",
            "mirror-login",
            json!({"driver": "registry", "registry": {"username": "puller", "password": "pull secret"}}),
        ))
        .await
        .unwrap();
    f.store()
        .create(Object::new(
            "CloudCredential",
            "mtls-login",
            json!({"driver": "registry", "registry": {
                "certificate": "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n",
                "key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"}}),
        ))
        .await
        .unwrap();
    f.planner.reconcile_all().await;
    f.applied("h-a", "K10abc::server:secret").await;
    f.planner.reconcile_all().await;
    let wanted = "mirrors:\n  \"docker.io\":\n    endpoint:\n      - \"https://registry.example.com:5000\"\n    \
                  rewrite:\n      \"^rancher/(.*)\": \"mirror/rancher/$1\"\nconfigs:\n  \"mtls.example.com\":\n    tls:\n      \
                  cert_file: \"/etc/rancher/k3s/registries.d/mtls.example.com/client.crt\"\n      \
                  key_file: \"/etc/rancher/k3s/registries.d/mtls.example.com/client.key\"\n  \"registry.example.com:5000\":\n    \
                  auth:\n      username: \"puller\"\n      password: \"pull secret\"\n    tls:\n      \
                  ca_file: \"/etc/rancher/k3s/registries.d/registry.example.com_5000/ca.crt\"\n";
    for host in ["h-a", "h-b"] {
        let plan = f.plan(host).await.unwrap();
        let file = |path: &str| plan.files.iter().find(|f| f.path == path).cloned();
        let registries = file("/etc/rancher/k3s/registries.yaml").expect(host);
        assert_eq!(
            String::from_utf8_lossy(&registries.content),
            wanted,
            "{host}"
        );
        assert_eq!(registries.permissions, "0600");
        let ca =
            file("/etc/rancher/k3s/registries.d/registry.example.com_5000/ca.crt").expect(host);
        assert!(String::from_utf8_lossy(&ca.content).starts_with("-----BEGIN CERTIFICATE-----"));
        let key = file("/etc/rancher/k3s/registries.d/mtls.example.com/client.key").expect(host);
        assert_eq!(key.permissions, "0600");
        assert!(String::from_utf8_lossy(&key.content).contains("MIIE"));
        let config =
            String::from_utf8_lossy(&file("/etc/rancher/k3s/config.yaml").unwrap().content)
                .into_owned();
        // The system default registry is a server option.
        assert_eq!(
            config.contains("system-default-registry: \"registry.example.com:5000\""),
            host == "h-a",
            "{host}: {config}"
        );
    }
}

/// A registry's password reaches a cluster's hosts only if every owner of the cluster may use
/// its credential: whoever registers a host receives its plan. The files holding secrets are
/// marked so, for the API to leave them out.
#[tokio::test]
async fn registry_secrets_reach_only_clusters_whose_owners_are_granted_them() {
    let f = fixture();
    let spec = json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
        "agentImages": {"registry": "mtls.example.com", "pullCredential": "corp-login"},
        "registries": {"configs": {"mtls.example.com": {"credential": "corp-login"}}}});
    f.store()
        .create(Object::new("Cluster", "edge", spec))
        .await
        .unwrap();
    f.store()
        .create(Object::new(
            "CloudCredential",
            "corp-login",
            json!({"driver": "registry", "registry": {"username": "puller", "password": "corp password",
                "certificate": "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n",
                "key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"}}),
        ))
        .await
        .unwrap();
    for (name, spec) in [
        ("owner", json!({})),
        ("admin-group-member", json!({"groups": ["admins"]})),
    ] {
        f.store()
            .create(Object::new("User", name, spec))
            .await
            .unwrap();
    }
    for (name, spec) in [
        ("admins", json!({"group": "admins", "role": "admin"})),
        (
            "edge-owner",
            json!({"user": "owner", "role": "cluster-owner", "cluster": "edge"}),
        ),
        (
            "edge-admin",
            json!({"user": "admin-group-member", "role": "cluster-owner", "cluster": "edge"}),
        ),
        // A member reads no plans and makes no registration tokens: not asked.
        (
            "edge-member",
            json!({"group": "devs", "role": "cluster-member", "cluster": "edge"}),
        ),
    ] {
        crate::refs::create(f.store(), Object::new("RoleBinding", name, spec))
            .await
            .unwrap();
    }
    f.host("h-a", true, true, "10.0.0.1").await;
    f.planner.reconcile_all().await;
    assert!(f.plan("h-a").await.is_none());
    let status = f.cluster_status().await;
    let refused = status
        .conditions
        .iter()
        .find(|c| c.reason == "RegistryCredential")
        .unwrap_or_else(|| panic!("{status:?}"));
    assert_eq!(
        refused.message,
        "spec.registries: CloudCredential \"corp-login\" is not granted to user \"owner\", an owner of \
         cluster \"edge\" (role binding \"edge-owner\"), who could read it from the cluster's manifests \
         and plans; an admin grants it in the credential's spec.allowed"
    );

    let mut credential = f
        .store()
        .get("CloudCredential", "corp-login")
        .await
        .unwrap();
    credential.spec["allowed"] = json!({"users": ["owner"]});
    f.store().update(credential).await.unwrap();
    f.planner.reconcile_all().await;
    let plan = f
        .plan("h-a")
        .await
        .expect("planned once the owner is granted");
    let secret = |path: &str| {
        plan.files
            .iter()
            .find(|f| f.path == path)
            .unwrap_or_else(|| panic!("{path}"))
            .secret
    };
    let d = "/etc/rancher/k3s";
    assert!(secret(&format!("{d}/registries.yaml")));
    assert!(secret(&format!(
        "{d}/registries.d/mtls.example.com/client.key"
    )));
    assert!(!secret(&format!(
        "{d}/registries.d/mtls.example.com/client.crt"
    )));
    assert!(secret(&format!(
        "/var/lib/rancher/k3s/server/manifests/{}",
        MANIFEST_FILE
    )));
    assert!(!secret(&format!("{d}/config.yaml")));

    // A later owner who is not granted the credential stops the planning of new hosts: the
    // agents' manifest made earlier (with the pull secret) reaches no host of theirs, also
    // with no registry naming the credential any more.
    let mut cluster = f.store().get("Cluster", "edge").await.unwrap();
    cluster.spec.as_object_mut().unwrap().remove("registries");
    f.store().update(cluster).await.unwrap();
    f.planner.reconcile_all().await;
    f.applied("h-a", "K10abc::server:secret").await;
    f.store()
        .create(Object::new("User", "late", json!({})))
        .await
        .unwrap();
    crate::refs::create(
        f.store(),
        Object::new(
            "RoleBinding",
            "edge-late",
            json!({"user": "late", "role": "cluster-owner", "cluster": "edge"}),
        ),
    )
    .await
    .unwrap();
    f.host("h-b", true, true, "10.0.0.2").await;
    f.planner.reconcile_all().await;
    assert!(f.plan("h-b").await.is_none());
    let status = f.cluster_status().await;
    assert!(
        status.conditions.iter().any(|c| c.message.contains(
            "is not granted to user \"late\", an owner of cluster \"edge\" (role binding \"edge-late\")"
        )),
        "{status:?}"
    );
}

#[tokio::test]
async fn agent_env_reaches_the_installer_the_service_and_the_agents() {
    let f = fixture();
    let spec = json!({"type": "custom", "distribution": "k3s", "version": "v1.33.4+k3s1",
        "agentEnv": [{"name": "HTTPS_PROXY", "value": "http://drover:pa$$\"w@proxy.corp:3128"},
                     {"name": "NO_PROXY", "value": "10.0.0.0/8,.svc"}],
        "agentImages": {"registry": "registry.corp:5000", "pullPolicy": "Always",
                        "pullCredential": "agent-pull"}});
    f.store()
        .create(Object::new("Cluster", "edge", spec))
        .await
        .unwrap();
    f.host("h-a", true, true, "10.0.0.1").await;
    f.host("h-b", false, true, "10.0.0.2").await;
    f.planner.reconcile_all().await;
    // The pull secret's credential is missing: nothing is planned, and the cluster says why.
    assert!(f.plan("h-a").await.is_none());
    let status = f.cluster_status().await;
    assert!(
        status.conditions.iter().any(|c| c.reason == "AgentImages"
            && c.message
                .contains("CloudCredential agent-pull does not exist")),
        "{status:?}"
    );
    f.store()
        .create(Object::new(
            "CloudCredential",
            "agent-pull",
            json!({"driver": "registry", "registry": {"username": "puller", "password": "pull secret"}}),
        ))
        .await
        .unwrap();
    f.planner.reconcile_all().await;
    f.applied("h-a", "K10abc::server:secret").await;
    f.planner.reconcile_all().await;
    for (host, unit) in [("h-a", "k3s"), ("h-b", "k3s-agent")] {
        let plan = f.plan(host).await.unwrap();
        let env = env_file(&plan, unit).expect(host);
        assert_eq!(env.permissions, "0600");
        assert_eq!(
            String::from_utf8_lossy(&env.content)
                .lines()
                .skip(1)
                .collect::<Vec<_>>(),
            [
                r#"HTTPS_PROXY="http://drover:pa\$\$\"w@proxy.corp:3128""#,
                r#"NO_PROXY="10.0.0.0/8,.svc""#
            ],
            "{host}"
        );
        assert!(
            plan.instructions[0]
                .env
                .contains(&"NO_PROXY=10.0.0.0/8,.svc".to_owned()),
            "{host}: {:?}",
            plan.instructions[0].env
        );
    }
    // The agents' manifest on the init host: images from the registry, pulled with the secret,
    // the variables from a Secret.
    let plan = f.plan("h-a").await.unwrap();
    let manifest = plan
        .files
        .iter()
        .find(|f| {
            f.path
                .ends_with("/server/manifests/drover-cluster-agent.yaml")
        })
        .map(|f| String::from_utf8_lossy(&f.content).into_owned())
        .expect("the agents' manifest");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        manifest.contains(&format!(
            "image: \"registry.corp:5000/drover/cluster-agent:{version}\""
        )),
        "{manifest}"
    );
    assert!(manifest.contains(&format!(
        "image: \"registry.corp:5000/drover/node-agent:{version}\""
    )));
    assert_eq!(manifest.matches("imagePullPolicy: \"Always\"").count(), 2);
    assert_eq!(
        manifest
            .matches("imagePullSecrets: [{name: drover-registry}]")
            .count(),
        2
    );
    assert_eq!(
        manifest
            .matches("valueFrom: {secretKeyRef: {name: drover-agent-env, key: HTTPS_PROXY}}")
            .count(),
        2
    );
    assert!(manifest.contains("type: kubernetes.io/dockerconfigjson"));

    // The proxy taken out of the spec: the service's environment file goes too (a rollout,
    // one host at a time), and the removal stays in the plans, which then hold still.
    f.applied("h-b", "").await;
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    c.spec.as_object_mut().unwrap().remove("agentEnv");
    f.store().update(c).await.unwrap();
    for host in ["h-a", "h-b"] {
        f.planner.reconcile_all().await;
        f.applied(host, "K10abc::server:secret").await;
    }
    f.planner.reconcile_all().await;
    for (host, unit) in [("h-a", "k3s"), ("h-b", "k3s-agent")] {
        let plan = f.plan(host).await.unwrap();
        let env = env_file(&plan, unit).expect(host);
        assert!(env.delete && env.content.is_empty(), "{host}: {env:?}");
        assert!(
            !plan.instructions[0]
                .env
                .iter()
                .any(|e| e.starts_with("HTTPS_PROXY="))
        );
        let before = checksum(&plan);
        f.planner.reconcile_all().await;
        assert_eq!(checksum(&f.plan(host).await.unwrap()), before, "{host}");
    }
}

/// The distribution's environment file for service `unit` in `plan`, if it has one.
fn env_file<'a>(plan: &'a Plan, unit: &str) -> Option<&'a proto::plan::v1::File> {
    let path = format!("/etc/default/{unit}");
    plan.files.iter().find(|f| f.path == path)
}

/// A provisioned cluster: `h-a` (etcd, control plane, worker) and worker `h-b`, both applied.
async fn provisioned() -> Fixture {
    let f = fixture();
    f.cluster("v1.33.4+k3s1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    f.host("h-b", false, true, "10.0.0.2").await;
    f.planner.reconcile_all().await;
    f.applied("h-a", "K10abc::server:secret").await;
    f.planner.reconcile_all().await;
    f.applied("h-b", "").await;
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    assert!(f.settled().await, "{:?}", f.cluster_status().await);
    f
}

impl Fixture {
    async fn settled(&self) -> bool {
        let status = self.cluster_status().await;
        ["Provisioned", "Updated"].iter().all(|k| {
            status
                .conditions
                .iter()
                .any(|c| c.kind == *k && c.status == "True")
        })
    }

    /// `host`'s current task, if any.
    async fn task(&self, host: &str) -> Option<Plan> {
        let object = self
            .store()
            .get("Plan", &crate::plans::task_plan_name(host))
            .await
            .ok()?;
        crate::model::parse_plan(&object.spec["plan"]).ok()
    }

    /// Reports `host`'s task as its agent would: applied (probes healthy), or failed for good.
    async fn task_done(&self, host: &str, outcome: Result<&str, &str>) {
        let plan = self.task(host).await.expect("a task");
        let sum = checksum(&plan);
        let probes: Vec<Value> = plan
            .probes
            .iter()
            .map(|p| json!({"name": p.name, "healthy": true}))
            .collect();
        let name = crate::plans::task_plan_name(host);
        let outcome = outcome.map(str::to_owned).map_err(str::to_owned);
        update_status(self.store(), Kind::Plan, &name, move |s| {
            s.extra.insert("checksum".into(), json!(sum));
            match &outcome {
                Ok(stdout) => {
                    let results: Vec<Value> = plan
                        .instructions
                        .iter()
                        .map(|i| json!({"name": i.name, "exitCode": 0, "stdout": stdout, "finishedAt": "2026-11-23T17:00:00Z"}))
                        .collect();
                    s.extra.insert("appliedChecksum".into(), json!(sum));
                    s.extra.insert("state".into(), json!("applied"));
                    s.extra.insert("probes".into(), json!(probes));
                    s.extra.insert("results".into(), json!(results));
                }
                Err(message) => {
                    s.extra.insert("state".into(), json!("failed"));
                    s.extra.insert("failureCount".into(), json!(3));
                    s.extra.insert("maxFailures".into(), json!(3));
                    s.extra.insert("message".into(), json!(message));
                }
            }
        })
        .await
        .unwrap();
    }

    /// A snapshot of `edge` saved on `h-a`. The store dates the record now.
    async fn saved_snapshot(&self, name: &str, scheduled: bool) {
        let mut object = Object::new(
            "EtcdSnapshot",
            name,
            json!({"cluster": "edge", "scheduled": scheduled}),
        );
        object.metadata.finalizers.push(FINALIZER.into());
        let mut created_object = self.store().create(object).await.unwrap();
        let mut status = Status::default();
        status.set_condition("Saved", true, "Saved", "");
        status.extra.insert("host".into(), json!("h-a"));
        status.extra.insert(
            "file".into(),
            json!(format!(
                "/var/lib/rancher/k3s/server/db/snapshots/{name}-h-a-1"
            )),
        );
        created_object.status = serde_json::to_value(status).unwrap();
        self.store().update(created_object).await.unwrap();
    }

    async fn restore(&self, snapshot: &str, generation: u64) {
        let mut c = self.store().get("Cluster", "edge").await.unwrap();
        c.spec["restore"] = json!({"snapshot": snapshot, "generation": generation});
        self.store().update(c).await.unwrap();
    }

    async fn restore_phase(&self) -> String {
        let status = self.cluster_status().await;
        status.extra["restore"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

#[tokio::test]
async fn a_restore_goes_step_by_step_and_leaves_the_hosts_plans_alone() {
    let f = provisioned().await;
    let plans_before = (f.plan("h-a").await, f.plan("h-b").await);
    f.saved_snapshot("s1", false).await;
    f.restore("s1", 1).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Stopping");
    let state = |s: &Status| {
        crate::model::derive_state(
            Kind::Cluster,
            &crate::store::ObjectMeta::default(),
            s,
            &Value::Null,
        )
    };
    assert_eq!(state(&f.cluster_status().await).state, "restoring");

    // 1. Every host stops its distribution.
    f.planner.reconcile_all().await;
    for (host, unit) in [("h-a", "k3s"), ("h-b", "k3s-agent")] {
        let task = f.task(host).await.expect("a stop task");
        assert_eq!(task.instructions[0].args, ["stop", unit]);
        assert!(
            task.instructions[0]
                .env
                .iter()
                .any(|e| e.starts_with("DROVER_TASK="))
        );
    }
    f.task_done("h-a", Ok("")).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Stopping", "waits for every host");
    f.task_done("h-b", Ok("")).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Restoring");

    // 2. etcd reset from the snapshot on its host, gated by that host's probes.
    f.planner.reconcile_all().await;
    let reset = f.task("h-a").await.unwrap();
    assert_eq!(reset.instructions[0].command, "k3s");
    assert_eq!(
        reset.instructions[0].args,
        [
            "server",
            "--cluster-reset",
            "--cluster-reset-restore-path=/var/lib/rancher/k3s/server/db/snapshots/s1-h-a-1"
        ]
    );
    assert_eq!(reset.instructions[1].args, ["start", "k3s"]);
    let probes: Vec<&str> = reset.probes.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(probes, ["kubelet", "kube-apiserver", "etcd"]);
    f.task_done("h-a", Ok("")).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Rejoining");

    // 3. The workers start again; then the restore is over and the tasks are cleared.
    f.planner.reconcile_all().await;
    assert_eq!(
        f.task("h-b").await.unwrap().instructions[0].args,
        ["start", "k3s-agent"]
    );
    f.task_done("h-b", Ok("")).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Restored");
    let status = f.cluster_status().await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.kind == "Restored" && c.status == "True")
    );
    f.planner.reconcile_all().await;
    assert!(f.task("h-a").await.is_none() && f.task("h-b").await.is_none());
    assert_eq!(
        (f.plan("h-a").await, f.plan("h-b").await),
        plans_before,
        "the hosts' plans never changed"
    );
    // Done once: another pass starts nothing.
    f.planner.reconcile_all().await;
    assert!(f.task("h-a").await.is_none());
}

#[tokio::test]
async fn a_failed_restore_step_stops_the_restore_and_says_where() {
    let f = provisioned().await;
    f.restore("nope", 1).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Failed");
    let message = f.cluster_status().await.extra["restore"]["message"].clone();
    assert!(
        message.as_str().unwrap().contains("no snapshot \"nope\""),
        "{message}"
    );

    f.saved_snapshot("s1", false).await;
    f.restore("s1", 2).await;
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    f.task_done(
        "h-a",
        Err("instruction \"stop\" exited with 5: Unit k3s.service not loaded"),
    )
    .await;
    f.task_done("h-b", Ok("")).await;
    f.planner.reconcile_all().await;
    assert_eq!(f.restore_phase().await, "Failed");
    let status = f.cluster_status().await;
    let restored = status.condition("Restored").unwrap();
    assert_eq!(
        (restored.status.as_str(), restored.reason.as_str()),
        ("False", "RestoreFailed")
    );
    for what in [
        "s1",
        "stopping",
        "host h-a",
        "Unit k3s.service not loaded",
        "spec.restore.generation",
    ] {
        assert!(
            restored.message.contains(what),
            "{what}: {}",
            restored.message
        );
    }
    // Stopped: nothing more is asked of the hosts.
    f.planner.reconcile_all().await;
    assert!(f.task("h-a").await.is_none(), "its tasks are cleared");
    assert!(f.task("h-b").await.is_none(), "its tasks are cleared");
}

#[tokio::test]
async fn scheduled_snapshots_are_taken_once_per_due_time_and_old_ones_go() {
    let f = provisioned().await;
    // Three scheduled snapshots saved before (the store dates each record itself, so they are
    // made first) and one taken on demand; retention keeps them all for now.
    let older = [
        "edge-202601010000",
        "edge-202601020000",
        "edge-202601030000",
    ];
    for name in older {
        f.saved_snapshot(name, true).await;
    }
    f.saved_snapshot("by-hand", false).await;
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    c.spec["etcdSnapshots"] = json!({"schedule": "*/5 * * * *", "retention": 10});
    f.store().update(c).await.unwrap();
    // The schedule counts from when it is first seen.
    f.planner.reconcile_all().await;
    let snapshots = async || {
        let (list, _) = f
            .store()
            .list("EtcdSnapshot", &LabelSelector::everything())
            .await
            .unwrap();
        list
    };
    let taken = async || {
        let mut list = snapshots().await;
        list.retain(|s| !older.contains(&s.metadata.name.as_str()) && s.metadata.name != "by-hand");
        list
    };
    assert!(taken().await.is_empty());
    assert_eq!(snapshots().await.len(), 4, "retention 10 deletes none");
    // An hour later (as if the hub had been down): one snapshot, for the latest due time.
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    let hour_ago = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    c.status["snapshotSchedule"]["last"] = json!(
        hour_ago
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    );
    f.store().update(c).await.unwrap();
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    let taken = taken().await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].spec["scheduled"], true);
    let name = &taken[0].metadata.name;
    assert!(
        name.starts_with("edge-") && name.len() == "edge-202611231700".len(),
        "{name}"
    );
    let minute: u32 = name[name.len() - 2..].parse().unwrap();
    assert_eq!(minute % 5, 0, "{name}");
    // It is taken on the init host, by the distribution's command.
    f.planner.reconcile_all().await;
    let task = f.task("h-a").await.expect("a snapshot task");
    assert!(
        task.instructions[0]
            .script
            .contains("k3s etcd-snapshot save --name \"$1\"")
    );
    assert_eq!(task.instructions[0].args, std::slice::from_ref(name));
    f.task_done(
        "h-a",
        Ok("file=/var/lib/rancher/k3s/server/db/snapshots/x\nsize=42\nsha256=abc\n"),
    )
    .await;
    f.planner.reconcile_all().await;
    let saved = f.store().get("EtcdSnapshot", name).await.unwrap();
    assert_eq!(
        (
            &saved.status["size"],
            &saved.status["sha256"],
            &saved.status["host"]
        ),
        (&json!(42), &json!("abc"), &json!("h-a"))
    );

    // Retention 2: with the three older scheduled ones saved, the oldest two go (the snapshot
    // on demand stays, however old).
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    c.spec["etcdSnapshots"]["retention"] = json!(2);
    f.store().update(c).await.unwrap();
    f.planner.reconcile_all().await;
    let deleting: Vec<String> = snapshots()
        .await
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_some())
        .map(|s| s.metadata.name)
        .collect();
    assert_eq!(deleting, ["edge-202601010000", "edge-202601020000"]);
    // Each goes once its file is deleted on its host.
    f.planner.reconcile_all().await;
    let task = f.task("h-a").await.unwrap();
    assert_eq!(
        task.instructions[0].args,
        ["etcd-snapshot", "delete", "edge-202601010000-h-a-1"]
    );
    f.task_done("h-a", Ok("")).await;
    f.planner.reconcile_all().await;
    assert!(
        f.store()
            .get("EtcdSnapshot", "edge-202601010000")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_rotation_asked_for_while_a_snapshot_is_taken_waits_and_the_save_runs_once() {
    let f = provisioned().await;
    let pending = Object::new("EtcdSnapshot", "s1", json!({"cluster": "edge"}));
    f.store().create(pending).await.unwrap();
    for _ in 0..3 {
        f.planner.reconcile_all().await;
    }
    let save = f.task("h-a").await.expect("the snapshot's task");
    assert_eq!(save.instructions[0].args, ["s1"]);
    // The host has run it; before the planner reads the result, a rotation is asked for.
    f.task_done("h-a", Ok("")).await;
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    c.spec["rotateCertificates"] = json!({"generation": 1});
    f.store().update(c).await.unwrap();
    f.planner.reconcile_all().await;
    let s1 = f.store().get("EtcdSnapshot", "s1").await.unwrap();
    assert_ne!(
        Status::of(&s1).condition("Saved").map(|c| c.status.clone()),
        Some("Unknown".into()),
        "the snapshot's result is read first"
    );
    // Then the rotation, in the slot the snapshot left; the save is never written again.
    for _ in 0..3 {
        f.planner.reconcile_all().await;
        assert_ne!(f.task("h-a").await.as_ref(), Some(&save));
    }
    let task = f.task("h-a").await.expect("the rotation's task");
    assert_eq!(task.instructions[1].args, ["certificate", "rotate"]);
}

#[tokio::test]
async fn an_operation_under_way_goes_on_while_the_hosts_restart() {
    let f = provisioned().await;
    let mut c = f.store().get("Cluster", "edge").await.unwrap();
    c.spec["rotateCertificates"] = json!({"generation": 1});
    f.store().update(c).await.unwrap();
    f.planner.reconcile_all().await;
    let task = f.task("h-a").await.expect("the first server rotates first");
    assert_eq!(task.instructions[1].args, ["certificate", "rotate"]);
    assert!(
        f.task("h-b").await.is_none(),
        "one host at a time, servers first"
    );
    // Its service restarting, h-a's probes fail: the cluster is no longer settled, yet the
    // rotation goes on and its task stays.
    update_status(f.store(), Kind::Plan, "h-a", move |s| {
        s.extra.insert(
            "probes".into(),
            json!([{"name": "kubelet", "healthy": false}]),
        );
    })
    .await
    .unwrap();
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    assert!(!f.settled().await);
    assert_eq!(f.task("h-a").await, Some(task), "the task under way stays");
    f.task_done("h-a", Ok("")).await;
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    let rotation = f.cluster_status().await.extra["certificateRotation"].clone();
    assert_eq!(rotation["done"], json!(["h-a"]), "{rotation}");
    assert_eq!(
        f.task("h-b").await.expect("then the worker").instructions[0].args,
        ["restart", "k3s-agent"]
    );
    // A new snapshot waits for the cluster to settle.
    f.saved_snapshot("s0", false).await;
    let pending = Object::new("EtcdSnapshot", "s1", json!({"cluster": "edge"}));
    f.store().create(pending).await.unwrap();
    f.task_done("h-b", Ok("")).await;
    f.planner.reconcile_all().await;
    f.planner.reconcile_all().await;
    let s1 = f.store().get("EtcdSnapshot", "s1").await.unwrap();
    assert!(
        s1.metadata.finalizers.is_empty(),
        "not started on an unsettled cluster"
    );
}

#[tokio::test]
async fn a_failed_snapshot_does_not_fail_the_next_one() {
    let f = provisioned().await;
    for name in ["s1", "s2"] {
        let snapshot = Object::new("EtcdSnapshot", name, json!({"cluster": "edge"}));
        f.store().create(snapshot).await.unwrap();
        // Distinct creation times, so they are taken in order.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    for _ in 0..3 {
        f.planner.reconcile_all().await;
    }
    f.task_done(
        "h-a",
        Err("instruction \"etcd-snapshot\" exited with 1: etcd is not running"),
    )
    .await;
    f.planner.reconcile_all().await;
    let saved = |s: &Object| {
        Status::of(s)
            .condition("Saved")
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let s1 = f.store().get("EtcdSnapshot", "s1").await.unwrap();
    assert_eq!(saved(&s1), Some(("False".into(), "SaveFailed".into())));
    // The next one gets its own task; the slot's old failure is not its.
    for _ in 0..3 {
        f.planner.reconcile_all().await;
    }
    let task = f.task("h-a").await.unwrap();
    assert_eq!(task.instructions[0].args, ["s2"]);
    let s2 = f.store().get("EtcdSnapshot", "s2").await.unwrap();
    assert_eq!(saved(&s2), Some(("Unknown".into(), "Saving".into())));
}

/// A pass plans from what it read at its start; a host reporting meanwhile (its Host's and
/// Plan's status) neither fails the host's plan nor loses the report.
#[tokio::test]
async fn reports_landing_while_a_pass_writes_neither_hold_its_plans_back_nor_are_lost() {
    let f = fixture();
    // Just before each write of a host's plan commits, that host's agent reports: its Host's
    // status changes and, once it has one, its Plan's status too (as the reports of thousands
    // of hosts land while a pass writes their plans).
    let reporting = BeforeWrites::new(f.planner.store.clone(), |store, ops| {
        Box::pin(async move {
            let hosts = ops
                .iter()
                .filter(|op| op.key().0 == "Plan" && !matches!(op, Op::Delete { .. }));
            for host in hosts.map(|op| op.key().1) {
                for kind in [Kind::Host, Kind::Plan] {
                    let at = json!(store.revision().await?);
                    update_status(store, kind, host, move |s| {
                        s.extra.insert("lastReport".into(), at.clone());
                    })
                    .await?;
                }
            }
            Ok(())
        })
    });
    let planner = Planner {
        store: Arc::new(reporting),
        ..f.planner.clone()
    };
    let reported = async |kind: &str, host: &str| {
        let object = f.store().get(kind, host).await.unwrap();
        Status::of(&object).extra.get("lastReport").cloned()
    };
    f.cluster("v1", json!({})).await;
    f.host("h-a", true, true, "10.0.0.1").await;
    planner.reconcile_all().await;
    assert_eq!(f.version_of("h-a").await.as_deref(), Some("v1"));
    let host = f.store().get("Host", "h-a").await.unwrap();
    assert!(host.metadata.finalizers.contains(&FINALIZER.to_owned()));
    assert!(reported("Host", "h-a").await.is_some(), "{host:?}");

    f.applied("h-a", "token").await;
    f.cluster("v2", json!({})).await;
    planner.reconcile_all().await;
    assert_eq!(f.version_of("h-a").await.as_deref(), Some("v2"));
    let plan = f.store().get("Plan", "h-a").await.unwrap();
    assert!(reported("Plan", "h-a").await.is_some(), "{plan:?}");
    assert_eq!(
        Status::of(&plan).extra["state"],
        "applied",
        "the report before it kept"
    );
}

/// Runs `script` with `sh` and `env` (`KEY=VALUE`), `PATH` led by `path_first`: whether it
/// succeeded, its stdout and stderr, and how long it took.
fn run_script(
    script: &str,
    env: &[String],
    path_first: &std::path::Path,
) -> (bool, String, String, std::time::Duration) {
    let started = std::time::Instant::now();
    let path = format!(
        "{}:{}",
        path_first.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("PATH", path)
        .envs(env.iter().filter_map(|kv| kv.split_once('=')))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

/// The install step downloads the installer, then runs it (with the plan's variables): a
/// download that fails fails the step at once, curl's error and the URL in its last lines,
/// where piped into `sh` it used to "succeed" and leave the next step waiting minutes.
#[test]
fn a_failed_installer_download_fails_the_install_step_at_once_saying_why() {
    let dir = std::env::temp_dir().join(format!("drover-installer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("install.sh"),
        "echo \"installed $INSTALL_K3S_EXEC$INSTALL_RKE2_TYPE $INSTALL_K3S_VERSION$INSTALL_RKE2_VERSION\"\n",
    )
    .unwrap();
    for dist in [Distribution::K3s, Distribution::Rke2] {
        let ctx = |url: String| Ctx {
            installer: Installer::Script(url),
            ..dist_ctx(dist)
        };
        // RKE2's step also starts its service: a stand-in systemctl says what it was asked.
        std::fs::write(dir.join("systemctl"), "#!/bin/sh\necho \"systemctl $*\"\n").unwrap();
        std::process::Command::new("chmod")
            .args(["0755", dir.join("systemctl").to_str().unwrap()])
            .status()
            .unwrap();
        let good = ctx(format!("file://{}/install.sh", dir.display())).install(true);
        let (ok, stdout, stderr, _) = run_script(&good.script, &good.env, &dir);
        assert!(ok, "{dist:?}: {stderr}");
        match dist {
            Distribution::K3s => assert_eq!(stdout, "installed server v1.33.4+k3s1\n"),
            Distribution::Rke2 => assert_eq!(
                stdout,
                "installed server v1.33.4+k3s1\nsystemctl enable rke2-server\nsystemctl restart rke2-server\n"
            ),
        }
        let missing = format!("file://{}/missing.sh", dir.display());
        let bad = ctx(missing.clone()).install(true);
        let (ok, stdout, stderr, took) = run_script(&bad.script, &bad.env, &dir);
        assert!(!ok, "{dist:?}: a failed download fails the step: {stdout}");
        assert!(stdout.is_empty(), "nothing was installed: {stdout}");
        assert!(stderr.contains("curl: (37)"), "curl's own error: {stderr}");
        assert_eq!(
            stderr.lines().last().unwrap(),
            format!("downloading the installer {missing} failed (curl exit 37)")
        );
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server whose service failed before writing its node token fails the wait at once, with
/// the end of the service's log: not after minutes of "no node token".
#[test]
fn a_failed_server_fails_the_node_token_wait_at_once_with_its_log() {
    let dir = std::env::temp_dir().join(format!("drover-node-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, body) in [
        (
            "systemctl",
            "#!/bin/sh\n[ \"$1\" = is-failed ] && exit 0\nexit 1\n",
        ),
        (
            "journalctl",
            "#!/bin/sh\necho 'level=fatal msg=\"starting kubernetes: port 6443 in use\"'\n",
        ),
    ] {
        std::fs::write(dir.join(name), body).unwrap();
        std::process::Command::new("chmod")
            .args(["0755", dir.join(name).to_str().unwrap()])
            .status()
            .unwrap();
    }
    let host = HostSpec {
        cluster: "edge".into(),
        roles: crate::model::HostRoles {
            etcd: true,
            control_plane: true,
            worker: true,
        },
        node_name: "n".into(),
        address: String::new(),
        internal_address: String::new(),
        node_labels: std::collections::BTreeMap::new(),
        taints: Vec::new(),
    };
    let ctx = dist_ctx(Distribution::K3s);
    let plan = host_plan::host_plan(&ctx, &host, Step::Init, None, None);
    let wait = plan
        .instructions
        .iter()
        .find(|i| i.name == NODE_TOKEN)
        .unwrap();
    let (ok, _, stderr, took) = run_script(&wait.script, &wait.env, &dir);
    assert!(!ok);
    assert_eq!(
        stderr.trim_end(),
        "the k3s service failed before writing its node token; its log ends with: \
         level=fatal msg=\"starting kubernetes: port 6443 in use\""
    );
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
