//! Importing a (simulated) cluster end to end, with the real kubectl: the hub's manifest is
//! applied, the cluster-agent starts with its values, and users reach the cluster through the
//! hub's authentication proxy as themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, process::Stdio, time::Duration};

use base64::Engine as _;
use serde_json::{Value, json};
use sim::cluster::{ADMIN_TOKEN, Identity, SimCluster, SimConfig};
use tests::{HubProcess, api, login, temp_dir, wait_for_event};
use tokio_util::sync::CancellationToken;

const AGENT_TOKEN: &str = "sa-drover-agent-token";

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("kubectl (v1.32) must be installed");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(kubeconfig, args).await;
    assert!(ok, "kubectl {args:?}: {stderr}");
    stdout
}

/// A user with `role` on `cluster`, and a kubeconfig for them from the hub (aimed at the
/// address the test reaches the hub by).
async fn user_kubeconfig(
    hub: &HubProcess,
    admin: &str,
    dir: &Path,
    name: &str,
    role: Option<&str>,
) -> std::path::PathBuf {
    let password = "a long enough password";
    let (status, _) = api(
        hub.addr,
        "POST",
        "/v1/users",
        Some(admin),
        Some(json!({"metadata": {"name": name}, "spec": {"password": password}})),
    )
    .await;
    assert_eq!(status, 201);
    if let Some(role) = role {
        let binding = json!({"metadata": {"name": format!("{name}-{role}")}, "spec": {"user": name, "role": role, "cluster": "prod"}});
        assert_eq!(
            api(
                hub.addr,
                "POST",
                "/v1/rolebindings",
                Some(admin),
                Some(binding)
            )
            .await
            .0,
            201
        );
    }
    let token = login(hub.addr, name, password).await;
    // Without a role the hub issues no kubeconfig; the user's own API token stands in.
    let issuer = if role.is_some() {
        token.clone()
    } else {
        admin.to_owned()
    };
    let (status, kubeconfig) = tests::api_text(
        hub.addr,
        "POST",
        "/v1/clusters/prod/kubeconfig",
        Some(&issuer),
    )
    .await;
    assert_eq!(status, 201, "{kubeconfig}");
    let issued = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .to_owned();
    let kubeconfig = if role.is_some() {
        kubeconfig
    } else {
        kubeconfig.replace(&issued, &token)
    };
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    let reachable = format!("{}/k8s/clusters/prod", hub.url());
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig.replace(&server, &reachable)).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_cluster_is_reached_through_the_hub_as_each_user() {
    let dir = temp_dir("import");
    let hub = HubProcess::start(&dir.join("hub")).await;
    let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
    let (_, cluster) = api(
        hub.addr,
        "POST",
        "/v1/clusters",
        Some(&admin),
        Some(json!({"metadata": {"name": "prod"}, "spec": {"type": "imported"}})),
    )
    .await;
    let registration = cluster["registration"]["token"]
        .as_str()
        .unwrap()
        .to_owned();

    // The downstream cluster, and the hub's manifest applied to it with kubectl.
    let shutdown = CancellationToken::new();
    let sim = SimCluster::start(
        SimConfig {
            nodes: 2,
            pods: 10,
            ..SimConfig::default()
        },
        shutdown.clone(),
    )
    .await
    .unwrap();
    sim.add_token(
        AGENT_TOKEN,
        Identity {
            user: "system:serviceaccount:drover-system:drover-agent".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
            impersonator: true,
        },
    );
    let sim_admin = dir.join("sim-admin.kubeconfig");
    std::fs::write(&sim_admin, sim.kubeconfig(ADMIN_TOKEN)).unwrap();
    let (_, manifest) =
        tests::https_get(hub.addr, &format!("/v3/import/{registration}.yaml")).await;
    let manifest_path = dir.join("import.yaml");
    std::fs::write(&manifest_path, &manifest).unwrap();
    let applied = kubectl_ok(
        &sim_admin,
        &["apply", "-f", manifest_path.to_str().unwrap()],
    )
    .await;
    assert!(
        applied.contains("deployment.apps/drover-cluster-agent created"),
        "{applied}"
    );

    // The cluster-agent starts with the values the manifest put in its Secret.
    let secret = kubectl_ok(
        &sim_admin,
        &[
            "get",
            "secret",
            "drover-credentials",
            "-n",
            "drover-system",
            "-o",
            "json",
        ],
    )
    .await;
    let secret: Value = serde_json::from_str(&secret).unwrap();
    let value = |key: &str| {
        let encoded = secret["data"][key].as_str().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(value("token"), registration);
    let env = std::collections::HashMap::from([
        // The manifest names the hub by its server URL; the test reaches it on 127.0.0.1.
        ("DROVER_SERVER".to_owned(), hub.url()),
        ("DROVER_TOKEN".to_owned(), value("token")),
        ("DROVER_CA_CHECKSUM".to_owned(), value("ca-checksum")),
        ("DROVER_CLUSTER".to_owned(), "prod".to_owned()),
        (
            "DROVER_POD_NAME".to_owned(),
            "drover-cluster-agent-0".to_owned(),
        ),
        (
            "DROVER_STATE_DIR".to_owned(),
            dir.join("agent-state").display().to_string(),
        ),
        ("KUBECONFIG".to_owned(), {
            let path = dir.join("agent.kubeconfig");
            std::fs::write(&path, sim.kubeconfig(AGENT_TOKEN)).unwrap();
            path.display().to_string()
        }),
    ]);
    let config = cluster_agent::Config::from_env(&env).unwrap();
    let connected = tokio::spawn({
        let (addr, admin) = (hub.addr, admin.clone());
        async move {
            wait_for_event(
                addr,
                "/v1/clusters?watch=true",
                &admin,
                Duration::from_secs(30),
                // Connected, and the agent's first facts report has arrived.
                |e| {
                    let status = &e["object"]["status"];
                    status["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Connected" && c["status"] == "True")
                    }) && status["nodes"]["total"].as_u64() == Some(2)
                },
            )
            .await
        }
    });
    let agent = tokio::spawn(cluster_agent::run(config, shutdown.clone()));
    let cluster = connected.await.unwrap();
    let status = &cluster["object"]["status"];
    assert_eq!(status["nodes"]["ready"].as_u64(), Some(2), "{cluster:#}");
    assert!(
        status["kubernetesVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.")),
        "{cluster:#}"
    );
    assert!(
        status["capacity"]["cpuMillicores"].as_u64() > Some(0),
        "{cluster:#}"
    );

    // A cluster-member works with the cluster through the hub, as themselves.
    let member = user_kubeconfig(&hub, &admin, &dir, "mia", Some("cluster-member")).await;
    let pods = kubectl_ok(&member, &["get", "pods", "-A", "--no-headers"]).await;
    assert_eq!(pods.lines().count(), 10, "{pods}");
    let app = dir.join("app.yaml");
    std::fs::write(&app, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {k: v}\n").unwrap();
    assert!(
        kubectl_ok(&member, &["apply", "-f", app.to_str().unwrap()])
            .await
            .contains("created")
    );
    let logs = kubectl_ok(&member, &["logs", "pod-0", "-n", "load-0", "--tail=3"]).await;
    assert_eq!(logs.lines().count(), 3, "{logs}");
    assert!(
        kubectl_ok(&member, &["delete", "cm", "app", "-n", "default"])
            .await
            .contains("deleted")
    );
    // Watches stream through the proxy: a change made straight on the cluster shows up.
    let mut watch = tokio::process::Command::new("kubectl")
        .args([
            "get",
            "pods",
            "-n",
            "load-0",
            "-w",
            "--show-labels",
            "--request-timeout=30s",
        ])
        .env("KUBECONFIG", &member)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    let header = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(header.starts_with("NAME"), "{header}");
    kubectl_ok(
        &sim_admin,
        &["label", "pod", "pod-0", "-n", "load-0", "seen=through-hub"],
    )
    .await;
    let row = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = lines.next_line().await.unwrap().expect("watch ended");
            if line.contains("seen=through-hub") {
                return line;
            }
        }
    })
    .await
    .unwrap();
    assert!(row.starts_with("pod-0"), "{row}");
    drop(watch);

    let acted_as_mia = sim
        .audit()
        .into_iter()
        .filter(|e| e.user == "mia")
        .collect::<Vec<_>>();
    assert!(acted_as_mia.len() >= 4, "{acted_as_mia:?}");
    assert!(acted_as_mia.iter().all(|e| e.impersonated_by.as_deref()
        == Some("system:serviceaccount:drover-system:drover-agent")));
    assert!(
        acted_as_mia
            .iter()
            .all(|e| e.groups.iter().any(|g| g == "drover:cluster-member"))
    );

    // A forged Impersonate-User from the caller is dropped: the request still acts as mia.
    kubectl_ok(
        &member,
        &["get", "ns", "default", "--as", "kubernetes-admin"],
    )
    .await;
    assert!(
        !sim.audit()
            .iter()
            .any(|e| e.user == "kubernetes-admin" && e.impersonated_by.is_some())
    );

    // A user without a role on the cluster is refused by the hub; nothing reaches the cluster.
    let outsider = user_kubeconfig(&hub, &admin, &dir, "otto", None).await;
    let before = sim.audit().len();
    let (ok, _, stderr) = kubectl(&outsider, &["get", "pods", "-A"]).await;
    assert!(
        !ok && (stderr.contains("Forbidden") || stderr.contains("forbidden")),
        "{stderr}"
    );
    assert_eq!(
        sim.audit().len(),
        before,
        "the refused request never reached the cluster"
    );
    assert!(!sim.audit().iter().any(|e| e.user == "otto"));

    // A read-only user reads, and the hub refuses their writes before the cluster sees them.
    let reader = user_kubeconfig(&hub, &admin, &dir, "rita", Some("read-only")).await;
    kubectl_ok(&reader, &["get", "pods", "-n", "load-0"]).await;
    let (ok, _, stderr) = kubectl(&reader, &["delete", "pod", "pod-0", "-n", "load-0"]).await;
    assert!(!ok && stderr.contains("read-only"), "{stderr}");
    let rita = sim.audit().into_iter().filter(|e| e.user == "rita");
    assert!(rita.clone().count() > 0 && rita.clone().all(|e| e.method == "GET"));
    kubectl_ok(&sim_admin, &["get", "pod", "pod-0", "-n", "load-0"]).await;

    shutdown.cancel();
    let _ = agent.await;
    // With the agent gone, the proxy says so, naming the cluster.
    let (ok, _, stderr) = kubectl(&member, &["get", "ns"]).await;
    assert!(!ok && stderr.contains("not connected"), "{stderr}");
    assert!(hub.terminate().await);
    std::fs::remove_dir_all(&dir).unwrap();
}
