//! A hub with one imported (simulated) cluster `prod`: the hub's import manifest applied to
//! the simulated cluster with the real kubectl, and the cluster-agent's settings read back from
//! the Secret that manifest created, as a pod would see them.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
};

use base64::Engine as _;
use serde_json::{Value, json};
use sim::cluster::{ADMIN_TOKEN, SimCluster, SimConfig};
use tokio_util::sync::CancellationToken;

use crate::{HubProcess, api, login, temp_dir};

/// Who the agent's service account token acts as.
pub const AGENT_USER: &str = "system:serviceaccount:drover-system:drover-agent";

/// What the import manifest creates in a cluster (and removing the cluster takes away).
pub const IMPORT_OBJECTS: [&str; 3] = [
    "namespace/drover-system",
    "clusterrolebinding/drover-admin",
    "clusterrolebinding/drover-agent",
];

/// Deletes cluster `name` through the hub's API and waits (up to 60 s) until it is gone.
pub async fn remove_cluster(hub: &HubProcess, admin: &str, name: &str) {
    let path = format!("/v1/clusters/{name}");
    let (status, body) = api(hub.addr, "DELETE", &path, Some(admin), None).await;
    assert_eq!(status, 200, "{body}");
    let started = std::time::Instant::now();
    loop {
        let (status, cluster) = api(hub.addr, "GET", &path, Some(admin), None).await;
        if status == 404 {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "not removed: {cluster:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Runs kubectl (v1.32, installed on every machine here) with `kubeconfig`: success, stdout,
/// stderr.
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
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

/// kubectl that must succeed; its stdout.
pub async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(kubeconfig, args).await;
    assert!(ok, "kubectl {args:?}: {stderr}");
    stdout
}

/// `kubectl port-forward` to `port` of pod `namespace`/`pod` on a local port it picks; each of
/// `messages` is sent on a connection of its own, and what came back before the far end
/// closed is returned, one entry a connection. Panics with kubectl's output if it fails.
pub async fn port_forward(
    kubeconfig: &Path,
    namespace: &str,
    pod: &str,
    port: u16,
    messages: &[&str],
) -> Vec<String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let mut child = tokio::process::Command::new("kubectl")
        .args([
            "port-forward",
            "-n",
            namespace,
            &format!("pod/{pod}"),
            "--address",
            "127.0.0.1",
            &format!(":{port}"),
        ])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl (v1.32) must be installed");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("kubectl port-forward says where it listens within 20 s")
        .unwrap();
    let Some(local) = first.as_deref().and_then(|l| {
        l.strip_prefix("Forwarding from ")
            .and_then(|rest| rest.split(' ').next())
    }) else {
        let mut stderr = String::new();
        let _ = child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await;
        panic!("kubectl port-forward: {first:?} {stderr}");
    };
    let mut answers = Vec::new();
    for message in messages {
        let mut conn = tokio::net::TcpStream::connect(local).await.unwrap();
        conn.write_all(message.as_bytes()).await.unwrap();
        conn.shutdown().await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            conn.read_to_string(&mut answer),
        )
        .await
        .expect("the forwarded connection ends after the pod's side closes")
        .unwrap();
        answers.push(answer);
    }
    child.kill().await.unwrap();
    answers
}

/// The first line `kubectl attach` shows of pod `namespace`/`pod` (within 20 s); kubectl is
/// then stopped, as a user's Ctrl-C would.
pub async fn attach_first_line(kubeconfig: &Path, namespace: &str, pod: &str) -> String {
    use tokio::io::AsyncBufReadExt;
    let mut attach = tokio::process::Command::new("kubectl")
        .args(["attach", pod, "-n", namespace])
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl (v1.32) must be installed");
    let mut lines = tokio::io::BufReader::new(attach.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("kubectl attach shows a line within 20 s")
        .unwrap()
        .unwrap_or_default();
    attach.kill().await.unwrap();
    first
}

#[derive(Debug)]
pub struct Imported {
    pub dir: PathBuf,
    pub hub: HubProcess,
    /// The hub admin's token.
    pub admin: String,
    pub registration: String,
    pub sim: SimCluster,
    /// A kubeconfig straight to the simulated cluster as its admin.
    pub sim_admin: PathBuf,
    /// The token of the manifest's `drover-agent` service account, as its pods get it.
    pub agent_token: String,
    /// What `kubectl apply` of the manifest printed.
    pub applied: String,
    /// Stops the simulated cluster (and whatever the test hangs on it).
    pub shutdown: CancellationToken,
}

/// A further imported cluster on an [`Imported`]'s hub (see [`Imported::another`]).
#[derive(Debug)]
pub struct Another {
    pub sim: SimCluster,
    /// kubectl as the simulated cluster's admin.
    pub sim_admin: PathBuf,
    /// Its cluster-agent's environment.
    pub env: HashMap<String, String>,
}

impl Imported {
    pub async fn start(label: &str, sim: SimConfig) -> Self {
        Self::start_with(label, sim, &["--listen", "127.0.0.1:0"]).await
    }

    /// As [`Imported::start`], with the hub's `serve` flags of the caller's choosing.
    pub async fn start_with(label: &str, sim: SimConfig, hub_flags: &[&str]) -> Self {
        let dir = temp_dir(label);
        let hub = HubProcess::start_with(&dir.join("hub"), hub_flags).await;
        let admin = login(hub.addr, "admin", hub.admin_password.as_deref().unwrap()).await;
        let registration = crate::create_imported_cluster(hub.addr, &admin, "prod").await;
        Self::attach(dir, hub, admin, registration, sim).await
    }

    /// A simulated cluster for the imported cluster whose registration token is
    /// `registration` on `hub`, with the hub's import manifest applied to it by kubectl.
    pub async fn attach(
        dir: PathBuf,
        hub: HubProcess,
        admin: String,
        registration: String,
        sim: SimConfig,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let sim = SimCluster::start(sim, shutdown.clone()).await.unwrap();
        let sim_admin = dir.join("sim-admin.kubeconfig");
        std::fs::write(&sim_admin, sim.kubeconfig(ADMIN_TOKEN)).unwrap();
        let (_, manifest) =
            crate::https_get(hub.addr, &format!("/v3/import/{registration}.yaml")).await;
        let manifest_path = dir.join("import.yaml");
        std::fs::write(&manifest_path, &manifest).unwrap();
        let applied = kubectl_ok(
            &sim_admin,
            &["apply", "-f", manifest_path.to_str().unwrap()],
        )
        .await;
        let agent_token = agent_token(&sim_admin).await;
        Self {
            agent_token,
            dir,
            hub,
            admin,
            registration,
            sim,
            sim_admin,
            applied,
            shutdown,
        }
    }

    /// Another imported cluster `name` on the same hub, with its own simulated cluster (the
    /// import manifest applied with kubectl) and its cluster-agent's settings: those of this
    /// cluster's agent with the other cluster's registration, name, token and state.
    pub async fn another(&self, name: &str) -> Another {
        let registration = crate::create_imported_cluster(self.hub.addr, &self.admin, name).await;
        let sim = SimCluster::start(SimConfig::default(), self.shutdown.clone())
            .await
            .unwrap();
        let sim_admin = self.dir.join(format!("{name}-admin.kubeconfig"));
        std::fs::write(&sim_admin, sim.kubeconfig(ADMIN_TOKEN)).unwrap();
        let (_, manifest) =
            crate::https_get(self.hub.addr, &format!("/v3/import/{registration}.yaml")).await;
        let manifest_path = self.dir.join(format!("{name}-import.yaml"));
        std::fs::write(&manifest_path, &manifest).unwrap();
        kubectl_ok(
            &sim_admin,
            &["apply", "-f", manifest_path.to_str().unwrap()],
        )
        .await;
        let token = agent_token(&sim_admin).await;
        let kubeconfig = self.dir.join(format!("{name}-agent.kubeconfig"));
        std::fs::write(&kubeconfig, sim.kubeconfig(&token)).unwrap();
        let mut env = self.agent_env("drover-cluster-agent-0").await;
        env.extend([
            ("DROVER_TOKEN".to_owned(), registration),
            ("DROVER_CLUSTER".to_owned(), name.to_owned()),
            (
                "DROVER_STATE_DIR".to_owned(),
                self.dir.join(format!("{name}-agent")).display().to_string(),
            ),
            ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ]);
        Another {
            sim,
            sim_admin,
            env,
        }
    }

    /// `drover-hub login` as the admin, into a CLI config of its own; returns its path.
    pub fn cli_login(&self) -> PathBuf {
        self.hub.cli_login(&self.dir)
    }

    /// The environment of a cluster-agent pod named `pod`, as Kubernetes would build it from
    /// the manifest's Deployment and Secret; and (outside a real pod) a kubeconfig with the
    /// service account's token, and a state directory of its own.
    pub async fn agent_env(&self, pod: &str) -> HashMap<String, String> {
        self.pod_env("deployment", "drover-cluster-agent", pod, "")
            .await
    }

    /// The environment of the node-agent pod on `node`, from the manifest's DaemonSet, as
    /// [`Imported::agent_env`] builds the cluster-agent's.
    pub async fn node_agent_env(&self, node: &str) -> HashMap<String, String> {
        self.pod_env(
            "daemonset",
            "drover-node-agent",
            &format!("drover-node-agent-{node}"),
            node,
        )
        .await
    }

    async fn pod_env(
        &self,
        kind: &'static str,
        workload: &'static str,
        pod: &str,
        node: &str,
    ) -> HashMap<String, String> {
        let pod_at = PodAt {
            sim_admin: &self.sim_admin,
            sim: &self.sim,
            hub_url: &self.hub.url(),
            dir: &self.dir,
            token: &self.agent_token,
        };
        pod_at.env(kind, workload, pod, node).await
    }
}

/// Where a pod of the import manifest runs, for [`PodAt::env`].
#[derive(Debug)]
pub struct PodAt<'a> {
    /// kubectl as the cluster's admin.
    pub sim_admin: &'a Path,
    pub sim: &'a SimCluster,
    /// How the test reaches the hub.
    pub hub_url: &'a str,
    /// Where the pod's state directory and kubeconfig go.
    pub dir: &'a Path,
    /// The pod's service account token.
    pub token: &'a str,
}

impl PodAt<'_> {
    /// The environment of pod `pod` of workload `kind`/`workload` (on node `node`), as
    /// Kubernetes would build it from the manifest's objects in the cluster; and (outside a
    /// real pod) a kubeconfig with the service account's token, and a state directory.
    pub async fn env(
        &self,
        kind: &'static str,
        workload: &'static str,
        pod: &str,
        node: &str,
    ) -> HashMap<String, String> {
        let get = |kind: &'static str, name: &'static str| async move {
            let json = kubectl_ok(
                self.sim_admin,
                &["get", kind, name, "-n", "drover-system", "-o", "json"],
            )
            .await;
            serde_json::from_str::<Value>(&json).unwrap()
        };
        let deployment = get(kind, workload).await;
        let mut env = HashMap::new();
        for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
        {
            let name = var["name"].as_str().unwrap().to_owned();
            let from = &var["valueFrom"];
            let value = if let Some(value) = var["value"].as_str() {
                value.to_owned()
            } else if let Some(key) = from["secretKeyRef"]["key"].as_str() {
                let secret = from["secretKeyRef"]["name"].as_str().unwrap();
                let json = kubectl_ok(
                    self.sim_admin,
                    &["get", "secret", secret, "-n", "drover-system", "-o", "json"],
                )
                .await;
                let secret: Value = serde_json::from_str(&json).unwrap();
                let encoded = secret["data"][key].as_str().unwrap();
                String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .unwrap(),
                )
                .unwrap()
            } else if from["fieldRef"]["fieldPath"] == "metadata.name" {
                pod.to_owned()
            } else if from["fieldRef"]["fieldPath"] == "spec.nodeName" {
                node.to_owned()
            } else {
                panic!("the test does not know how to fill {var}");
            };
            env.insert(name, value);
        }
        // The manifest names the hub by its server URL; the test reaches it on 127.0.0.1.
        assert!(env.contains_key("DROVER_SERVER"));
        env.insert("DROVER_SERVER".to_owned(), self.hub_url.to_owned());
        let kubeconfig = self.dir.join("agent.kubeconfig");
        std::fs::write(&kubeconfig, self.sim.kubeconfig(self.token)).unwrap();
        env.extend([
            (
                "DROVER_STATE_DIR".to_owned(),
                self.dir.join(pod).display().to_string(),
            ),
            ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ]);
        env
    }
}

/// The token the agent's pod is given for its service account, from a cluster the import
/// manifest was applied to (`sim_admin`: kubectl as its admin): what the agent may do in the
/// cluster is what the manifest's RBAC grants that account, nothing more.
pub async fn agent_token(sim_admin: &Path) -> String {
    kubectl_ok(
        sim_admin,
        &["create", "token", "drover-agent", "-n", "drover-system"],
    )
    .await
    .trim()
    .to_owned()
}

/// Waits until `kubectl auth can-i <can>` says yes for the user of `kubeconfig`: until the
/// cluster-agent has written the hub's role bindings into the cluster's RBAC. Panics after
/// 30 s with the last answer.
pub async fn until_allowed(kubeconfig: &Path, can: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut args = vec!["auth", "can-i"];
        args.extend_from_slice(can);
        let (_, stdout, stderr) = kubectl(kubeconfig, &args).await;
        if stdout.trim() == "yes" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl auth can-i {can:?} still says {stdout:?} {stderr}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A user with `role` on `cluster`, and a kubeconfig for them from the hub (aimed at the
/// address the test reaches the hub by).
pub async fn user_kubeconfig(
    hub: &HubProcess,
    admin: &str,
    dir: &Path,
    name: &str,
    role: Option<&str>,
) -> PathBuf {
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
    match role {
        Some(_) => issued_kubeconfig(hub, &token, dir, name, None).await,
        // Without a role the hub issues no kubeconfig; the user's own API token stands in.
        None => issued_kubeconfig(hub, admin, dir, name, Some(&token)).await,
    }
}

/// The bearer token in a kubeconfig written by [`issued_kubeconfig`].
pub fn kubeconfig_token(kubeconfig: &Path) -> String {
    std::fs::read_to_string(kubeconfig)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        // The hub quotes the kubeconfig's strings (JSON strings are YAML strings).
        .trim_matches('"')
        .to_owned()
}

/// The kubeconfig the hub issues for cluster `prod` to the holder of `token`, aimed at the
/// address the test reaches the hub by, written to `dir/<name>.kubeconfig`; with `use_token`,
/// that token in place of the issued one.
pub async fn issued_kubeconfig(
    hub: &HubProcess,
    token: &str,
    dir: &Path,
    name: &str,
    use_token: Option<&str>,
) -> PathBuf {
    let (status, kubeconfig) = crate::api_text(
        hub.addr,
        "POST",
        "/v1/clusters/prod/kubeconfig",
        Some(token),
    )
    .await;
    assert_eq!(status, 201, "{kubeconfig}");
    let field = |prefix: &str| {
        kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap()
            .to_owned()
    };
    let (issued, server) = (field("token: "), field("server: "));
    let mut kubeconfig = kubeconfig.replace(&server, &format!("{}/k8s/clusters/prod", hub.url()));
    if let Some(use_token) = use_token {
        kubeconfig = kubeconfig.replace(&issued, use_token);
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig).unwrap();
    path
}

/// Checks the import manifest the hub served for `cluster` with `registration`, as the
/// simulated-cluster and the real-cluster tests both do (one function, so the two cannot
/// drift apart). Returns the documents that bind the hub's users (Group subjects), which a
/// test against a real cluster applies on their own.
pub fn check_import_manifest(text: &str, cluster: &str, registration: &str) -> Vec<String> {
    let documents: Vec<&str> = text
        .split("\n---\n")
        .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
        .collect();
    let parsed: Vec<Value> = documents
        .iter()
        .map(|d| serde_saphyr::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect();
    let named: Vec<String> = parsed
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            "Namespace/drover-system",
            "ServiceAccount/drover-agent",
            "ClusterRoleBinding/drover-agent",
            "Role/drover-agent-removal",
            "RoleBinding/drover-agent-removal",
            "ClusterRoleBinding/drover-admin",
            "Secret/drover-credentials",
            "Secret/drover-agent-env",
            "Deployment/drover-cluster-agent",
            "DaemonSet/drover-node-agent",
        ]
    );
    let find = |kind: &str, name: &str| {
        parsed
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap()
    };
    // The agent's own service account is a cluster-admin; the hub's admins (impersonated into
    // the group drover:admin) are too; every other role is the cluster-agent's to sync.
    let agent = find("ClusterRoleBinding", "drover-agent");
    assert_eq!(agent["roleRef"]["name"], "cluster-admin");
    assert_eq!(
        agent["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "drover-agent", "namespace": "drover-system"}])
    );
    // ... and may delete its own namespace, the last step of the cluster's removal.
    let removal = find("Role", "drover-agent-removal");
    assert_eq!(removal["metadata"]["namespace"], "drover-system");
    assert_eq!(
        removal["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["drover-system"], "verbs": ["delete"]}])
    );
    let removal = find("RoleBinding", "drover-agent-removal");
    assert_eq!(removal["roleRef"]["name"], "drover-agent-removal");
    assert_eq!(
        removal["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "drover-agent", "namespace": "drover-system"}])
    );
    let admins = find("ClusterRoleBinding", "drover-admin");
    assert_eq!(admins["roleRef"]["name"], "cluster-admin");
    assert_eq!(
        admins["subjects"],
        serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "drover:admin"}])
    );
    let secret = find("Secret", "drover-credentials");
    assert_eq!(secret["metadata"]["namespace"], "drover-system");
    assert_eq!(secret["stringData"]["token"], registration);
    assert_eq!(
        secret["stringData"]["ca-checksum"].as_str().map(str::len),
        Some(64)
    );
    for (kind, name) in [
        ("Deployment", "drover-cluster-agent"),
        ("DaemonSet", "drover-node-agent"),
    ] {
        let pod = &find(kind, name)["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "drover-agent", "{kind} {name}");
    }
    let env = &find("Deployment", "drover-cluster-agent")["spec"]["template"]["spec"]["containers"]
        [0]["env"];
    let cluster_var = env
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "DROVER_CLUSTER")
        .unwrap();
    assert_eq!(cluster_var["value"], cluster);
    documents
        .iter()
        .zip(&parsed)
        .filter(|(_, o)| {
            o["kind"] == "ClusterRoleBinding"
                && o["subjects"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["kind"] == "Group"))
        })
        .map(|(d, _)| (*d).to_owned())
        .collect()
}
