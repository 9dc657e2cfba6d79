#![allow(clippy::unwrap_used)]

use super::*;
use crate::store::sqlite::SqliteStore;

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
            registry: None,
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
        let spec = json!({"cluster": "edge", "nodeName": name, "address": address,
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
        update_status(self.store(), Kind::Plan, host, |s| {
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
    update_status(f.store(), Kind::Plan, "h-a", |s| {
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
    update_status(f.store(), Kind::Plan, "h-a", |s| {
        s.extra.insert("checksum".into(), json!(sum));
    })
    .await
    .unwrap();
    f.planner.reconcile_all().await;
    let status = f.cluster_status().await;
    let c = status
        .conditions
        .iter()
        .find(|c| c.kind == "Provisioned")
        .unwrap();
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
            && script.contains("--cacert /etc/drover/hub-ca.pem")
            && script.contains("INSTALL_K3S_SKIP_DOWNLOAD=true"),
        "{script}"
    );
    assert!(!script.contains("get.k3s.io"));
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
    let etcd = config_yaml(Distribution::K3s, &host(true, false), Step::Etcd, None);
    assert!(
        etcd.contains("disable-apiserver: true") && !etcd.contains("disable-etcd"),
        "{etcd}"
    );
    assert!(etcd.contains("- \"rack=r1\"") && etcd.contains("- \"dedicated=infra:NoSchedule\""));
    let cp = config_yaml(
        Distribution::K3s,
        &host(false, true),
        Step::ControlPlane,
        None,
    );
    assert!(
        cp.contains("disable-etcd: true") && !cp.contains("disable-apiserver"),
        "{cp}"
    );
    let rke2 = config_yaml(Distribution::Rke2, &host(true, true), Step::Init, None);
    assert!(
        !rke2.contains("cluster-init"),
        "RKE2 initialises without it: {rke2}"
    );
}
