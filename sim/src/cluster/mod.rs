//! A simulated Kubernetes API server, for tests, benchmarks and the demo: real kube-apiserver and
//! K3s binaries cannot be had on these machines. It speaks enough of the API over HTTPS (its
//! own CA, bearer tokens) for `kubectl` 1.32 and the `kube` crate: version, discovery, the
//! common core/apps/coordination/RBAC kinds, create/get/list/update/patch/delete, list and
//! watch with resourceVersion and label/field selectors, Tables for `kubectl get`,
//! impersonation for identities allowed it (recorded per request), and generated pod logs.
//! Nothing runs: pods are Running as soon as they exist, deployments are as ready as asked.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::http::Method;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tunnel::tls::{self, CertificateAuthority};

mod discovery;
mod eviction;
mod exec;
mod paging;
mod portforward;
mod protobuf;
mod rbac;
mod request;
pub(crate) mod resources;
mod server;
mod shell;
mod store;
mod table;
mod upgrade;
mod verbs;
pub mod webhook;
mod workloads;

pub use discovery::GIT_VERSION;

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// A service account, with the groups kube-apiserver gives its tokens.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Identity {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }
}

/// One request, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// Who the request acted as (after impersonation); empty if unauthenticated.
    pub user: String,
    pub groups: Vec<String>,
    /// Who impersonated, if anyone.
    pub impersonated_by: Option<String>,
    pub method: String,
    pub path: String,
    /// The query string (`watch=1&...`), empty if none.
    pub query: String,
    pub code: u16,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub listen: SocketAddr,
    /// Nodes to create at start.
    pub nodes: usize,
    /// Pods to create at start, spread over the nodes, in namespaces `load-0`…`load-9`.
    pub pods: usize,
    /// The `gitVersion` `/version` answers (the stand-in installer gives the version it
    /// "installed"); `None`: [`GIT_VERSION`].
    pub version: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            listen: ([127, 0, 0, 1], 0).into(),
            nodes: 3,
            pods: 0,
            version: None,
        }
    }
}

const AUDIT_LEN: usize = 10_000;

/// Shared state of one simulated cluster.
#[derive(Debug)]
pub(crate) struct Sim {
    store: store::Store,
    version: String,
    tokens: Mutex<HashMap<String, Identity>>,
    audit: Mutex<VecDeque<AuditEntry>>,
    counter: AtomicU64,
    /// Each container's stand-in file tree (namespace, pod, container), made at its first exec.
    containers: Mutex<HashMap<(String, String, String), shell::Files>>,
    /// Tokens the TokenRequest API issued (`kubectl create token`): each acts as its service
    /// account (namespace, name) for as long as that exists.
    service_account_tokens: Mutex<HashMap<String, (String, String)>>,
    /// exec and attach sessions open now (a test sees a closed browser tab end its shell).
    streams: std::sync::atomic::AtomicUsize,
    /// Asked about tokens no one else knows (`--authentication-token-webhook-config-file`).
    webhook: Option<webhook::TokenWebhook>,
}

impl Sim {
    /// Who `token` is: a token of the cluster's own, else the webhook's answer.
    async fn authenticate(&self, token: &str) -> Option<Identity> {
        if let Some(identity) = self.identity(token) {
            return Some(identity);
        }
        self.webhook.as_ref()?.authenticate(token).await
    }

    fn identity(&self, token: &str) -> Option<Identity> {
        let known = self
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned();
        if known.is_some() {
            return known;
        }
        let (namespace, name) = self
            .service_account_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()?;
        self.store
            .get("serviceaccounts", &(namespace.clone(), name.clone()))?;
        Some(Identity::service_account(&namespace, &name))
    }

    /// A new token for a service account, or `None` if there is no such account.
    fn issue_token(&self, namespace: &str, name: &str) -> Option<String> {
        self.store
            .get("serviceaccounts", &(namespace.to_owned(), name.to_owned()))?;
        let mut secret = [0u8; 24];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret).ok()?;
        use base64::Engine as _;
        let token = format!(
            "sa.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        );
        self.service_account_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.clone(), (namespace.to_owned(), name.to_owned()));
        Some(token)
    }

    fn record(
        &self,
        who: Option<&Identity>,
        impersonated_by: Option<String>,
        method: &Method,
        uri: &axum::http::Uri,
        code: u16,
    ) {
        let mut audit = self.audit.lock().unwrap_or_else(|p| p.into_inner());
        if audit.len() == AUDIT_LEN {
            audit.pop_front();
        }
        audit.push_back(AuditEntry {
            user: who.map(|w| w.user.clone()).unwrap_or_default(),
            groups: who.map(|w| w.groups.clone()).unwrap_or_default(),
            impersonated_by,
            method: method.to_string(),
            path: uri.path().to_owned(),
            query: uri.query().unwrap_or_default().to_owned(),
            code,
        });
    }

    fn audit(&self) -> Vec<AuditEntry> {
        self.audit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    fn random_suffix(&self) -> String {
        name_suffix(
            self.next().wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xdead_beef,
            5,
        )
    }

    /// What a real cluster's controllers would have filled in by the time anyone looks.
    fn defaults(&self, resource: &resources::Resource, object: &mut Value) {
        match resource.plural {
            "pods" => {
                pod_spec_defaults(&mut object["spec"]);
                let n = self.next();
                if object.pointer("/spec/nodeName").is_none() {
                    let nodes = self.store.list("nodes", None).0;
                    if let Some(node) = nodes.get((n as usize) % nodes.len().max(1)) {
                        object["spec"]["nodeName"] = node["metadata"]["name"].clone();
                    }
                }
                object["status"] = pod_status(&object["spec"], "Running", n);
            }
            "namespaces" => object["status"] = json!({"phase": "Active"}),
            "secrets" => {
                if object.get("type").is_none() {
                    object["type"] = json!("Opaque");
                }
                // As kube-apiserver does: stringData is write-only, folded into data.
                if let Some(Value::Object(plain)) =
                    object.as_object_mut().and_then(|o| o.remove("stringData"))
                {
                    use base64::Engine as _;
                    for (key, value) in plain {
                        let encoded = base64::engine::general_purpose::STANDARD
                            .encode(value.as_str().unwrap_or_default());
                        object["data"][key] = json!(encoded);
                    }
                }
            }
            "services" => {
                let n = self.next();
                if object.pointer("/spec/type").is_none() {
                    object["spec"]["type"] = json!("ClusterIP");
                }
                if object.pointer("/spec/clusterIP").is_none() {
                    object["spec"]["clusterIP"] =
                        json!(format!("10.43.{}.{}", (n / 250) % 250, n % 250 + 2));
                }
            }
            "nodes" if object.get("status").is_none() => object["status"] = node_status(),
            "deployments" => {
                // kube-apiserver's defaults for a Deployment, which kubectl describe shows.
                let spec = &mut object["spec"];
                let strategy = &mut spec["strategy"];
                if strategy.get("type").is_none() {
                    strategy["type"] = json!("RollingUpdate");
                }
                if strategy["type"] == "RollingUpdate" {
                    for bound in ["maxUnavailable", "maxSurge"] {
                        if strategy
                            .pointer(&format!("/rollingUpdate/{bound}"))
                            .is_none()
                        {
                            strategy["rollingUpdate"][bound] = json!("25%");
                        }
                    }
                }
                for (field, value) in [
                    ("revisionHistoryLimit", 10),
                    ("progressDeadlineSeconds", 600),
                ] {
                    if spec.get(field).is_none() {
                        spec[field] = json!(value);
                    }
                }
                pod_spec_defaults(&mut object["spec"]["template"]["spec"]);
                deployment_status(object);
            }
            "daemonsets" | "replicasets" | "statefulsets" => {
                pod_spec_defaults(&mut object["spec"]["template"]["spec"]);
                deployment_status(object);
            }
            "jobs" => pod_spec_defaults(&mut object["spec"]["template"]["spec"]),
            "cronjobs" => {
                let spec = &mut object["spec"];
                for (field, value) in [
                    ("suspend", json!(false)),
                    ("concurrencyPolicy", json!("Allow")),
                ] {
                    if spec.get(field).is_none() {
                        spec[field] = value;
                    }
                }
                pod_spec_defaults(&mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"]);
            }
            _ => {}
        }
    }

    /// Keeps derived state true after a write (a deployment's status follows its replicas).
    fn after_write(&self, resource: &resources::Resource, object: &Value) {
        if matches!(
            resource.plural,
            "deployments" | "replicasets" | "statefulsets"
        ) {
            let replicas = object
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            if object.pointer("/status/replicas").and_then(Value::as_u64) != Some(replicas)
                || object.pointer("/status/observedGeneration")
                    != object.pointer("/metadata/generation")
            {
                let key = store::key_of(object);
                let _ = self.store.update(&resource.key(), &key, None, |current| {
                    let mut next = current.clone();
                    deployment_status(&mut next);
                    next
                });
            }
        }
        if eviction::affects_budgets(resource) {
            eviction::refresh(
                self,
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
            );
        }
        // As the service account controller does: every namespace has a `default` account.
        if resource.plural == "namespaces"
            && let Some(name) = object["metadata"]["name"].as_str()
            && self
                .store
                .get("serviceaccounts", &(name.to_owned(), "default".to_owned()))
                .is_none()
        {
            let _ = self
                .store
                .create("serviceaccounts", default_service_account(name));
        }
    }

    fn after_delete(&self, resource: &resources::Resource, object: &Value) {
        if eviction::affects_budgets(resource) {
            eviction::refresh(
                self,
                object["metadata"]["namespace"].as_str().unwrap_or_default(),
            );
        }
        // A deleted pod's containers (or a deleted namespace's) take their files with them:
        // a new pod of the same name starts afresh.
        let name = |field: &str| {
            object["metadata"][field]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        // (namespace, the pod or every pod in it)
        let (namespace, pod) = match resource.plural {
            "pods" => (name("namespace"), Some(name("name"))),
            "namespaces" => (name("name"), None),
            _ => return,
        };
        self.containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(ns, p, _), _| *ns != namespace || pod.as_ref().is_some_and(|pod| p != pod));
    }
}

fn default_service_account(namespace: &str) -> Value {
    json!({"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": "default", "namespace": namespace}})
}

/// `len` letters of a generated name (`web-7d9f5`) for `n`, from the letters Kubernetes draws
/// them from (no vowels, no look-alikes).
fn name_suffix(mut n: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..len)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// The status of a pod with `spec` once its kubelet has started it (`Running`, every
/// container ready) or seen it finish (`Succeeded`); the `n`th pod's address.
fn pod_status(spec: &Value, phase: &str, n: u64) -> Value {
    let finished = phase == "Succeeded";
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    let state = if finished {
        json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-11-01T02:00:00Z", "finishedAt": "2026-11-01T02:00:41Z"}})
    } else {
        json!({"running": {"startedAt": "2026-11-01T00:00:00Z"}})
    };
    json!({
        "phase": phase,
        "podIP": format!("10.42.{}.{}", (n / 250) % 250, n % 250 + 2),
        "conditions": [
            {"type": "Ready", "status": if finished { "False" } else { "True" }},
            {"type": "PodScheduled", "status": "True"},
        ],
        "containerStatuses": containers.iter().map(|c| json!({
            "name": c["name"], "image": c["image"], "ready": !finished, "restartCount": 0,
            "started": !finished, "state": state,
        })).collect::<Vec<_>>(),
    })
}

/// kube-apiserver's defaults for a pod's spec that kubectl shows (`describe`'s `80/TCP`).
fn pod_spec_defaults(spec: &mut Value) {
    for (field, value) in [("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst")] {
        if spec.get(field).is_none() {
            spec[field] = json!(value);
        }
    }
    let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) else {
        return;
    };
    for container in containers {
        if container.get("imagePullPolicy").is_none() {
            let image = container["image"].as_str().unwrap_or_default();
            let latest = image.ends_with(":latest")
                || !image.rsplit('/').next().unwrap_or(image).contains(':');
            container["imagePullPolicy"] = json!(if latest { "Always" } else { "IfNotPresent" });
        }
        for port in container
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if port.get("protocol").is_none() {
                port["protocol"] = json!("TCP");
            }
        }
    }
}

fn node_status() -> Value {
    json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
        "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        "nodeInfo": {"kubeletVersion": GIT_VERSION, "osImage": "drover-sim", "architecture": "amd64", "operatingSystem": "linux"},
    })
}

/// A workload's status as its controller would report it once it has caught up: every
/// replica ready (a Deployment's fields) or scheduled (a DaemonSet's, which has no replicas).
fn deployment_status(object: &mut Value) {
    let daemon_set = object["kind"] == "DaemonSet";
    let replicas = object
        .pointer("/spec/replicas")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let generation = object
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    object["status"] = if daemon_set {
        json!({
            "observedGeneration": generation,
            "desiredNumberScheduled": replicas,
            "currentNumberScheduled": replicas,
            "updatedNumberScheduled": replicas,
            "numberReady": replicas,
            "numberAvailable": replicas,
        })
    } else {
        json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
            "availableReplicas": replicas,
        })
    };
}

/// How a simulated API server serves, beyond [`SimConfig`].
#[derive(Debug, Default)]
pub struct Serving {
    /// The CA its serving certificate comes from (kept across restarts, as K3s keeps its
    /// own); `None`: a new one.
    pub ca: Option<CertificateAuthority>,
    /// More names and addresses for its certificate (its node's addresses, `tls-san`).
    pub names: Vec<String>,
    /// The token webhook it asks about tokens it does not know itself.
    pub webhook: Option<webhook::TokenWebhook>,
}

/// A running simulated cluster.
#[derive(Debug)]
pub struct SimCluster {
    addr: SocketAddr,
    ca_pem: String,
    sim: Arc<Sim>,
    task: JoinHandle<()>,
}

/// The token of the built-in admin (`kubernetes-admin`, `system:masters`, may impersonate).
pub const ADMIN_TOKEN: &str = "sim-admin-token";

impl SimCluster {
    pub async fn start(
        config: SimConfig,
        shutdown: CancellationToken,
    ) -> std::io::Result<SimCluster> {
        Self::start_with(config, Serving::default(), shutdown).await
    }

    /// As [`SimCluster::start`], serving as `serving` says (the stand-in distribution's API
    /// server: its kept CA, its node's addresses, its token webhook).
    pub async fn start_with(
        config: SimConfig,
        serving: Serving,
        shutdown: CancellationToken,
    ) -> std::io::Result<SimCluster> {
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let ca = match serving.ca {
            Some(ca) => ca,
            None => CertificateAuthority::generate("drover-sim cluster CA")
                .map_err(std::io::Error::other)?,
        };
        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ];
        if !addr.ip().is_unspecified() {
            names.push(addr.ip().to_string());
        }
        names.extend(serving.names);
        names.sort();
        names.dedup();
        let leaf = ca.issue_server(&names).map_err(std::io::Error::other)?;
        let tls_config = tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes())
            .map_err(std::io::Error::other)?;
        let sim = Arc::new(Sim {
            store: store::Store::default(),
            version: config
                .version
                .clone()
                .unwrap_or_else(|| GIT_VERSION.to_owned()),
            tokens: Mutex::new(HashMap::new()),
            audit: Mutex::new(VecDeque::new()),
            counter: AtomicU64::new(0),
            containers: Mutex::new(HashMap::new()),
            streams: std::sync::atomic::AtomicUsize::new(0),
            service_account_tokens: Mutex::new(HashMap::new()),
            webhook: serving.webhook,
        });
        sim.tokens.lock().unwrap_or_else(|p| p.into_inner()).insert(
            ADMIN_TOKEN.to_owned(),
            Identity {
                user: "kubernetes-admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
            },
        );
        seed(&sim, &config);
        let app = axum::Router::new()
            .fallback(server::handle)
            .with_state(sim.clone());
        let task = tokio::spawn(tunnel::listener::serve(listener, tls_config, app, shutdown));
        Ok(SimCluster {
            addr,
            ca_pem: ca.pem().cert_pem.clone(),
            sim,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT`.
    /// The address it is reached at: the one it listens on, or 127.0.0.1 when that is every
    /// address.
    pub fn url(&self) -> String {
        match self.addr.ip() {
            ip if ip.is_unspecified() => format!("https://127.0.0.1:{}", self.addr.port()),
            _ => format!("https://{}", self.addr),
        }
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Token reviews its webhook has been sent (0 without a webhook).
    pub fn webhook_calls(&self) -> u64 {
        self.sim
            .webhook
            .as_ref()
            .map_or(0, webhook::TokenWebhook::calls)
    }

    /// A token for the service account `namespace`/`name`, as the TokenRequest API issues
    /// it to a pod (`kubectl create token`); an error if the account does not exist.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Result<String, String> {
        self.sim
            .issue_token(namespace, name)
            .ok_or_else(|| format!("serviceaccounts \"{name}\" not found in namespace {namespace}"))
    }

    /// The objects of a kind (`"rbac.authorization.k8s.io/v1"`, `"RoleBinding"`) in every
    /// namespace whose labels match `selector` (as `?labelSelector=`), as a list by the
    /// cluster's admin would return them; for code that embeds a simulated cluster and counts
    /// what is in it.
    pub fn list(
        &self,
        api_version: &str,
        kind: &str,
        selector: &str,
    ) -> Result<Vec<Value>, String> {
        let resource = resources::by_kind(api_version, kind)
            .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
        let selector = kubeshape::LabelSelector::parse(selector).map_err(|e| e.to_string())?;
        let (objects, _) = self.sim.store.list(&resource.key(), None);
        Ok(objects
            .iter()
            .filter(|o| selector.matches(&request::labels_of(o)))
            .map(|o| (**o).clone())
            .collect())
    }

    /// Adds a bearer token for `identity`.
    pub fn add_token(&self, token: &str, identity: Identity) {
        self.sim
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_owned(), identity);
    }

    /// Creates (or replaces) every object of a multi-document YAML manifest, as `kubectl
    /// apply -f` by the cluster's admin would; returns how many. For code that embeds a
    /// simulated cluster and installs what an import manifest installs (the agent's RBAC).
    pub fn apply_manifest(&self, yaml: &str) -> Result<usize, String> {
        let objects: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| e.to_string())?;
        let mut applied = 0;
        for object in objects.into_iter().filter(Value::is_object) {
            let (api_version, kind) = (
                object["apiVersion"].as_str().unwrap_or_default().to_owned(),
                object["kind"].as_str().unwrap_or_default().to_owned(),
            );
            let resource = resources::by_kind(&api_version, &kind)
                .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
            let key = store::key_of(&object);
            // As the API server would: defaults and the status controllers keep.
            let mut object = object;
            self.sim.defaults(resource, &mut object);
            let wanted = object.clone();
            let written = match self.sim.store.create(&resource.key(), object) {
                Err(store::StoreError::AlreadyExists) => {
                    self.sim
                        .store
                        .update(&resource.key(), &key, None, |_| wanted)
                }
                other => other,
            }
            .map_err(|e| format!("{kind} {:?}: {e:?}", key.1))?;
            self.sim.after_write(resource, &written);
            applied += 1;
        }
        Ok(applied)
    }

    /// Does once what the workload controllers would have done by now (ReplicaSets for
    /// Deployments; the pods of ReplicaSets, StatefulSets and DaemonSets; each CronJob's last
    /// Job, finished, and its pod), leaving what exists; returns how many objects it made.
    pub fn settle_workloads(&self) -> usize {
        workloads::settle(&self.sim)
    }

    /// Every request so far (the last 10,000), oldest first.
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.sim.audit()
    }

    /// A kubeconfig for `token`, trusting this cluster's CA.
    pub fn kubeconfig(&self, token: &str) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: sim\n    cluster:\n      server: {}\n      certificate-authority-data: {ca}\nusers:\n  - name: sim\n    user:\n      token: {token}\ncontexts:\n  - name: sim\n    context:\n      cluster: sim\n      user: sim\ncurrent-context: sim\n",
            self.url()
        )
    }

    /// Every object, as JSON: what the stand-in installer keeps across a restart of the node
    /// service, as K3s keeps its datastore.
    pub fn export_state(&self) -> Value {
        self.sim.store.export()
    }

    /// A handle that exports the state on demand, for a task that outlives this borrow.
    pub fn state_reader(&self) -> std::sync::Arc<dyn Fn() -> Value + Send + Sync> {
        let sim = self.sim.clone();
        std::sync::Arc::new(move || sim.store.export())
    }

    /// Loads what [`SimCluster::export_state`] returned (call before serving anyone).
    pub fn import_state(&self, state: &Value) {
        self.sim.store.import(state);
    }

    /// How many exec and attach sessions are open now.
    pub fn open_exec_sessions(&self) -> usize {
        self.sim.streams.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until the server has stopped (after its shutdown token was cancelled).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// The CRD that defines a custom resource served here, with its printer columns.
fn custom_resource_definition(r: &resources::Resource) -> Value {
    let columns: Vec<Value> = r
        .printer_columns
        .iter()
        .map(|(name, kind, path)| json!({"name": name, "type": kind, "jsonPath": path}))
        .collect();
    json!({
        "kind": "CustomResourceDefinition",
        "apiVersion": "apiextensions.k8s.io/v1",
        "metadata": {"name": format!("{}.{}", r.plural, r.group)},
        "spec": {
            "group": r.group,
            "names": {"plural": r.plural, "singular": r.singular, "kind": r.kind, "listKind": format!("{}List", r.kind)},
            "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
            "versions": [{
                "name": r.version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "additionalPrinterColumns": columns,
            }],
        },
        "status": {
            "acceptedNames": {"plural": r.plural, "singular": r.singular, "kind": r.kind, "listKind": format!("{}List", r.kind)},
            "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}],
            "storedVersions": [r.version],
        },
    })
}

/// The namespaces every cluster has, the nodes, K3s's custom resources and the load pods.
fn seed(sim: &Sim, config: &SimConfig) {
    rbac::seed_defaults(&sim.store);
    let namespaces = ["default", "kube-system", "kube-public", "kube-node-lease"]
        .into_iter()
        .map(str::to_owned)
        .chain(
            (0..10)
                .filter(|_| config.pods > 0)
                .map(|i| format!("load-{i}")),
        );
    let namespaces: Vec<String> = namespaces.collect();
    sim.store.seed(
        "namespaces",
        namespaces.iter().map(|name| json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}, "status": {"phase": "Active"}})),
    );
    sim.store.seed(
        "serviceaccounts",
        namespaces.iter().map(|ns| default_service_account(ns)),
    );
    sim.store.seed(
        "apiextensions.k8s.io/customresourcedefinitions",
        resources::custom().map(custom_resource_definition),
    );
    // What K3s deploys through its own custom resources.
    sim.store.seed(
        "helm.cattle.io/helmcharts",
        ["traefik-crd", "traefik"].map(|chart| json!({
            "kind": "HelmChart", "apiVersion": "helm.cattle.io/v1",
            "metadata": {"name": chart, "namespace": "kube-system"},
            "spec": {"chart": format!("https://%{{KUBERNETES_API}}%/static/charts/{chart}-34.2.1+up34.2.0.tgz"), "targetNamespace": "kube-system", "bootstrap": chart == "traefik-crd"},
            "status": {"jobName": format!("helm-install-{chart}")},
        })),
    );
    sim.store.seed(
        "k3s.cattle.io/addons",
        ["coredns", "local-storage", "metrics-server"].map(|name| json!({
            "kind": "Addon", "apiVersion": "k3s.cattle.io/v1",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"source": format!("/var/lib/rancher/k3s/server/manifests/{name}.yaml"), "checksum": format!("{:064x}", name.len())},
        })),
    );
    sim.store.seed(
        "nodes",
        (0..config.nodes).map(|i| {
            let mut labels = json!({"kubernetes.io/hostname": format!("node-{i}"), "kubernetes.io/os": "linux"});
            if i == 0 {
                labels["node-role.kubernetes.io/control-plane"] = json!("true");
            }
            json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": format!("node-{i}"), "labels": labels}, "status": node_status()})
        }),
    );
    let nodes = config.nodes.max(1);
    sim.store.seed(
        "pods",
        (0..config.pods).map(|i| {
            let app = format!("app-{}", i % 100);
            json!({
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"name": format!("pod-{i}"), "namespace": format!("load-{}", i % 10), "labels": {"app": app}},
                "spec": {"nodeName": format!("node-{}", i % nodes), "containers": [{"name": "main", "image": "registry.example/app:1"}]},
                "status": {
                    "phase": "Running",
                    "podIP": format!("10.42.{}.{}", (i / 250) % 250, i % 250 + 2),
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "main", "image": "registry.example/app:1", "ready": true, "restartCount": 0, "started": true, "state": {"running": {"startedAt": "2026-11-01T00:00:00Z"}}}],
                },
            })
        }),
    );
}
