//! The planner: one controller that turns each custom Cluster (distribution, version, upgrade
//! strategy) and its registered Hosts into one Plan per host, in order. The first etcd host
//! initialises the cluster; the other etcd hosts join it once it is healthy, then the
//! control-plane hosts, then the workers, each step waiting for the earlier hosts' plans to be
//! applied and their probes (etcd health, apiserver readyz, kubelet healthz) to pass. The join
//! address and token come from the init host: its address, and the token its plan prints. A
//! version change rolls the hosts within the cluster's concurrency, servers before workers. A
//! host being removed gets an uninstall plan first. The init host's plan also puts the agents'
//! manifest into the distribution's auto-deploy directory, so the new cluster's cluster-agent
//! connects as an imported one does.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use proto::plan::v1::{File, Instruction, Plan, Probe, checksum};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use self::rollout::{Action, Removal};
use crate::{
    agents::update_status,
    auth::secret::{self, TokenKind},
    downstream,
    model::{ClusterSpec, ClusterType, Distribution, HostSpec, Kind, Status},
    registration,
    store::{LabelSelector, Object, Op, Store, StoreError},
};

/// The finalizer that keeps a Host until its uninstall plan has run (and a Cluster until its
/// clean-up is done).
pub const FINALIZER: &str = crate::model::CLEANUP_FINALIZER;

/// The file the agents' manifest goes to, inside the auto-deploy directory.
const MANIFEST_FILE: &str = "drover-cluster-agent.yaml";

/// The instruction whose output is the init host's join token.
const NODE_TOKEN: &str = "node-token";

/// On a Plan's status: the plan its node was drained for (uncordoned, and removed, once that
/// plan is applied).
const DRAINED: &str = "drainedFor";

/// What the planner needs besides the store.
#[derive(Debug, Clone)]
pub struct Planner {
    pub store: Arc<dyn Store>,
    pub server_url: String,
    pub ca_checksum: String,
    /// The hub's CA (PEM): air-gapped hosts fetch the artifacts trusting it.
    pub ca_pem: String,
    /// How to reach clusters' cluster-agents (to drain nodes, clean up imported clusters), on
    /// this replica or another (`None`: no draining, as in unit tests).
    pub agents: Option<downstream::Agents>,
    /// Where the hub keeps files from plans (copies of etcd snapshots); `None` in unit tests.
    pub files: Option<std::path::PathBuf>,
}

impl Planner {
    /// Reconciles every custom cluster whenever a Cluster, Host or Plan changes (and every 10 s
    /// regardless), until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let from = match self.store.revision().await {
                Ok(r) => r,
                Err(_) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.reconcile_all().await;
            let mut changes = match self.store.watch(None, Some(from)).await {
                Ok(w) => w,
                Err(_) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            loop {
                let relevant = tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(10)) => true,
                    change = changes.next() => match change {
                        Some(Ok(e)) => matches!(e.object.kind.as_str(), "Cluster" | "Host" | "Plan" | "EtcdSnapshot"),
                        Some(Err(_)) | None => break,
                    },
                };
                if !relevant {
                    continue;
                }
                // Let a burst of changes (a status report per instruction) settle first.
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.reconcile_all().await;
            }
        }
    }

    async fn reconcile_all(&self) {
        if let Err(e) = self.try_reconcile_all().await {
            tracing::warn!(error = %e, "planning failed; retrying on the next change");
        }
    }

    async fn try_reconcile_all(&self) -> Result<(), StoreError> {
        let everything = LabelSelector::everything();
        let (clusters, _) = self.store.list(Kind::Cluster.name(), &everything).await?;
        // Hosts and plans are read only when some cluster is planned: with every custom
        // cluster paused (or none), plan status reports cost the planner nothing.
        let planned = clusters.iter().any(|c| {
            c.metadata.deletion_timestamp.is_some()
                || serde_json::from_value::<ClusterSpec>(c.spec.clone())
                    .is_ok_and(|s| s.cluster_type == ClusterType::Custom && !s.paused)
        });
        let (hosts, plans, snapshots) = if planned {
            (
                self.store.list(Kind::Host.name(), &everything).await?.0,
                self.store.list(Kind::Plan.name(), &everything).await?.0,
                self.store
                    .list(Kind::EtcdSnapshot.name(), &everything)
                    .await?
                    .0,
            )
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        let plans: HashMap<String, Object> = plans
            .into_iter()
            .map(|p| (p.metadata.name.clone(), p))
            .collect();
        let settings = Settings::read(self.store.as_ref()).await?;
        for cluster in clusters {
            let Ok(spec) = serde_json::from_value::<ClusterSpec>(cluster.spec.clone()) else {
                continue;
            };
            let mut mine: Vec<&Object> = hosts
                .iter()
                .filter(|h| {
                    h.spec.get("cluster").and_then(Value::as_str) == Some(&cluster.metadata.name)
                })
                .collect();
            mine.sort_by(|a, b| {
                (&a.metadata.creation_timestamp, &a.metadata.name)
                    .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
            });
            if let Err(e) = self.keep_cluster(&cluster).await {
                tracing::warn!(cluster = %cluster.metadata.name, error = %e, "cannot put the planner's finalizer on a cluster");
            }
            if cluster.metadata.deletion_timestamp.is_some() {
                let version = spec.version.clone().unwrap_or_default();
                let ctx = (spec.cluster_type == ClusterType::Custom)
                    .then(|| self.ctx(&spec, &settings, &version));
                if let Err(e) = self
                    .remove_cluster(&cluster, &mine, &plans, ctx.as_ref())
                    .await
                {
                    tracing::warn!(cluster = %cluster.metadata.name, error = %e, "removing a cluster failed; retrying");
                }
                continue;
            }
            if spec.cluster_type != ClusterType::Custom {
                continue;
            }
            let snapshots: Vec<&Object> = snapshots
                .iter()
                .filter(|s| {
                    s.spec.get("cluster").and_then(Value::as_str) == Some(&cluster.metadata.name)
                })
                .collect();
            if let Err(e) = self
                .reconcile(&cluster, &spec, &mine, &plans, snapshots, &settings)
                .await
            {
                tracing::warn!(cluster = %cluster.metadata.name, error = %e, "planning a cluster failed");
            }
        }
        Ok(())
    }

    async fn reconcile(
        &self,
        cluster: &Object,
        spec: &ClusterSpec,
        hosts: &[&Object],
        plans: &HashMap<String, Object>,
        snapshots: Vec<&Object>,
        settings: &Settings,
    ) -> Result<(), StoreError> {
        let name = &cluster.metadata.name;
        if spec.paused {
            return self
                .cluster_status(name, |s| {
                    s.set_condition_to(
                        "Provisioned",
                        None,
                        "Paused",
                        "paused: the planner leaves this cluster's hosts as they are (set spec.paused to false)",
                    );
                })
                .await;
        }
        let dist = spec.distribution.unwrap_or(Distribution::K3s);
        let version = spec.version.clone().unwrap_or_default();
        let strategy = spec.upgrade_strategy.clone().unwrap_or_default();
        let ctx = self.ctx(spec, settings, &version);

        // Hosts on their way out: uninstall, then let them go.
        let (leaving, staying): (Vec<&Object>, Vec<&Object>) = hosts
            .iter()
            .partition(|h| h.metadata.deletion_timestamp.is_some());
        for host in leaving {
            self.remove(&ctx, host, plans.get(&host.metadata.name), strategy.drain)
                .await?;
        }

        let previous_init = Status::of(cluster)
            .extra
            .get("initHost")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let specs: Vec<(&Object, HostSpec)> = staying
            .iter()
            .filter_map(|h| Some((*h, serde_json::from_value::<HostSpec>(h.spec.clone()).ok()?)))
            .collect();
        let Some((init_host, _)) = rollout::init_host(&specs, previous_init.as_deref()) else {
            let message = if specs.is_empty() {
                "waiting for hosts: run the host command on each machine".to_owned()
            } else {
                "waiting for a host with the etcd role (install one with --etcd or --all-roles)"
                    .to_owned()
            };
            return self
                .cluster_status(name, |s| {
                    s.set_condition_to("Provisioned", None, "WaitingForHosts", &message);
                })
                .await;
        };
        let init_name = init_host.metadata.name.clone();

        // Snapshots, restores, rotations; a restore owns the hosts until it is over.
        let operations = day2::Cluster {
            object: cluster,
            spec,
            dist,
            hosts: &specs,
            init: &init_name,
            plans,
            snapshots,
        };
        if self.day2(&operations).await? {
            return Ok(());
        }

        // The agents' manifest, made once (its registration token lives only inside it).
        let mut also = Vec::new();
        let manifest = match existing_manifest(plans.get(&init_name), dist) {
            Some(m) => m,
            None => {
                let token = secret::new_token(TokenKind::Registration);
                also.push(Op::Create(registration::token_object(name, &token)));
                registration::agents_manifest(
                    self.store.as_ref(),
                    &self.server_url,
                    &self.ca_checksum,
                    name,
                    &token.value,
                )
                .await?
            }
        };

        let decided = rollout::rollout(&rollout::View {
            hosts: &specs,
            plans,
            ctx: &ctx,
            strategy: &strategy,
            init: &init_name,
            manifest: &manifest,
        });
        let mut not_yet = Vec::new();
        for action in &decided.actions {
            match action {
                Action::RecordJoinToken { host, token } => {
                    update_status(self.store.as_ref(), Kind::Plan, host, |s| {
                        s.extra.insert("joinToken".into(), json!(token));
                    })
                    .await?;
                }
                Action::Uncordon { host, node } => self.uncordon(name, host, node).await,
                Action::Write { host, plan, drain } => {
                    if let Some(node) = drain {
                        if let Err(why) = self.drain(name, node).await {
                            not_yet.push(format!("{host}: draining node {node}: {why}"));
                            continue;
                        }
                        let sum = checksum(plan);
                        update_status(self.store.as_ref(), Kind::Plan, host, |s| {
                            s.extra.insert(DRAINED.into(), json!(sum));
                        })
                        .await?;
                    }
                    let Some(object) = specs.iter().find(|(h, _)| &h.metadata.name == host) else {
                        continue;
                    };
                    self.write_plan(name, object.0, "", plan, std::mem::take(&mut also))
                        .await?;
                }
            }
        }
        self.cluster_status(name, |s| decided.status(s, &init_name, &version, &not_yet))
            .await
    }

    /// How a custom cluster's hosts install and uninstall its distribution.
    fn ctx<'a>(&'a self, spec: &ClusterSpec, settings: &Settings, version: &'a str) -> Ctx<'a> {
        let dist = spec.distribution.unwrap_or(Distribution::K3s);
        Ctx {
            dist,
            version,
            installer: settings.installer(dist, &self.server_url, version),
            ca_pem: &self.ca_pem,
        }
    }

    /// Writes `plan` into `host`'s `slot` (and puts the planner's finalizer on the host), with
    /// `also`.
    async fn write_plan(
        &self,
        cluster: &str,
        host: &Object,
        slot: &str,
        plan: &Plan,
        mut also: Vec<Op>,
    ) -> Result<(), StoreError> {
        let name = &if slot.is_empty() {
            host.metadata.name.clone()
        } else {
            crate::plans::task_plan_name(&host.metadata.name)
        };
        let mut spec = json!({
            "host": host.metadata.name,
            "cluster": cluster,
            "plan": serde_json::to_value(plan).map_err(|e| StoreError::Backend(e.to_string()))?,
        });
        if !slot.is_empty() {
            spec["slot"] = json!(slot);
        }
        match self.store.get(Kind::Plan.name(), name).await {
            Ok(mut existing) => {
                existing.spec = spec;
                also.push(Op::Update(existing));
            }
            Err(StoreError::NotFound { .. }) => {
                also.push(Op::Create(Object::new(Kind::Plan.name(), name, spec)))
            }
            Err(e) => return Err(e),
        }
        if !host.metadata.finalizers.iter().any(|f| f == FINALIZER) {
            let mut host = host.clone();
            host.metadata.finalizers.push(FINALIZER.into());
            also.push(Op::Update(host));
        }
        tracing::info!(host = %host.metadata.name, %cluster, %slot, plan = %&checksum(plan)[..12], "planned");
        crate::refs::stamp_all(self.store.as_ref(), &mut also).await?;
        self.store.transact(also).await.map(drop)
    }

    /// A host being removed: its uninstall plan, then the finalizer goes (and the host with it).
    async fn remove(
        &self,
        ctx: &Ctx<'_>,
        host: &Object,
        stored: Option<&Object>,
        drain: bool,
    ) -> Result<(), StoreError> {
        let name = &host.metadata.name;
        let cluster = host
            .spec
            .get("cluster")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match rollout::removal(ctx, host, stored, drain) {
            Removal::Nothing | Removal::Wait => Ok(()),
            Removal::Uninstall { plan, drain } => {
                if let Some(node) = drain
                    && let Err(why) = self.drain(cluster, &node).await
                {
                    tracing::info!(host = %name, %node, "draining before removal: {why}");
                    return Ok(());
                }
                self.write_plan(cluster, host, "", &plan, Vec::new()).await
            }
            Removal::Release { node } => {
                if let Some(agents) = &self.agents
                    && !node.is_empty()
                {
                    // Best effort: the node object of a machine that is gone.
                    if let Err(why) = downstream::delete_node(agents, cluster, &node).await {
                        tracing::info!(host = %name, %node, "cannot delete the node: {why}");
                    }
                }
                let mut ops = vec![Op::Delete {
                    kind: Kind::Plan.name().into(),
                    name: name.clone(),
                    resource_version: None,
                }];
                // The machine's agent loses its credential with the host: a host registered
                // again later gets a new one.
                if let Some(token) =
                    crate::agents::host_credential(self.store.as_ref(), host).await?
                {
                    ops.push(Op::Delete {
                        kind: Kind::Token.name().into(),
                        resource_version: Some(token.revision()),
                        name: token.metadata.name,
                    });
                }
                let mut host = host.clone();
                host.metadata.finalizers.retain(|f| f != FINALIZER);
                tracing::info!(host = %name, "uninstalled; removing the host and its credential");
                ops.push(Op::Update(host));
                self.store.transact(ops).await.map(drop)
            }
        }
    }

    /// Drains `node` through the cluster's agent: `Ok` once drained, else why not yet.
    async fn drain(&self, cluster: &str, node: &str) -> Result<(), String> {
        let agents = self
            .agents
            .as_ref()
            .ok_or("this planner cannot reach clusters")?;
        downstream::drain(agents, cluster, node).await
    }

    /// Makes `node` schedulable again after its upgrade, and forgets that it was drained.
    async fn uncordon(&self, cluster: &str, host: &str, node: &str) {
        let Some(agents) = &self.agents else {
            return;
        };
        match downstream::uncordon(agents, cluster, node).await {
            Ok(()) => {
                let _ = update_status(self.store.as_ref(), Kind::Plan, host, |s| {
                    s.extra.remove(DRAINED);
                })
                .await;
            }
            Err(e) => tracing::warn!(%node, "cannot uncordon: {e}"),
        }
    }

    /// Changes the cluster's status (written only if it changed: the planner watches its own
    /// writes, and an unconditional write would wake it forever).
    async fn cluster_status(
        &self,
        name: &str,
        change: impl FnMut(&mut Status),
    ) -> Result<(), StoreError> {
        update_status(self.store.as_ref(), Kind::Cluster, name, change).await
    }
}

/// Where a host comes in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Step {
    Init,
    Etcd,
    ControlPlane,
    Worker,
}

#[derive(Debug, Clone)]
struct Join {
    url: String,
    token: String,
}

impl Distribution {
    fn name(self) -> &'static str {
        match self {
            Distribution::K3s => "k3s",
            Distribution::Rke2 => "rke2",
        }
    }

    /// K3s joins at the API server's port; RKE2 at its supervisor port.
    fn join_port(self) -> u16 {
        match self {
            Distribution::K3s => 6443,
            Distribution::Rke2 => 9345,
        }
    }
}

/// How the distribution gets installed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Installer {
    /// The distribution's own install script, from its site or a mirror (settings
    /// `k3s-install-url`, `rke2-install-url`), downloading what it needs from the internet.
    Script(String),
    /// Air-gapped (setting `install-source` = `hub`): the distribution's air-gap artifacts and
    /// its install script, served by the hub at `/v3/artifacts/<version>/`, fetched trusting
    /// the hub's CA.
    Hub { base: String },
}

#[derive(Debug, Clone, Default)]
struct Settings {
    k3s_url: String,
    rke2_url: String,
    from_hub: bool,
}

impl Settings {
    async fn read(store: &dyn Store) -> Result<Settings, StoreError> {
        let source = registration::setting(store, "install-source", "internet".into()).await?;
        Ok(Settings {
            k3s_url: registration::setting(store, "k3s-install-url", "https://get.k3s.io".into())
                .await?,
            rke2_url: registration::setting(
                store,
                "rke2-install-url",
                "https://get.rke2.io".into(),
            )
            .await?,
            from_hub: source == "hub",
        })
    }

    fn installer(&self, dist: Distribution, hub: &str, version: &str) -> Installer {
        match (self.from_hub, dist) {
            (true, _) => Installer::Hub {
                base: format!("{hub}/v3/artifacts/{}", encode_version(version)),
            },
            (false, Distribution::K3s) => Installer::Script(self.k3s_url.clone()),
            (false, Distribution::Rke2) => Installer::Script(self.rke2_url.clone()),
        }
    }
}

/// A version as one URL path segment (`+` is fine in paths; nothing else needs escaping in
/// the versions K3s and RKE2 publish, but a stray `/` must not become a path).
fn encode_version(version: &str) -> String {
    version.replace('/', "%2F")
}

/// Where a plan keeps the hub's CA, to fetch artifacts from the hub.
const HUB_CA: &str = "/etc/drover/hub-ca.pem";

struct Ctx<'a> {
    dist: Distribution,
    version: &'a str,
    installer: Installer,
    /// The hub's CA (PEM), for air-gapped installs.
    ca_pem: &'a str,
}

impl Ctx<'_> {
    /// Installs (or upgrades to) the version, as a server or an agent, and starts it.
    fn install(&self, server: bool) -> Instruction {
        let kind = if server { "server" } else { "agent" };
        let script = match (&self.installer, self.dist) {
            (Installer::Script(url), Distribution::K3s) => format!("curl -sfL {url} | sh -s -"),
            (Installer::Script(url), Distribution::Rke2) => format!(
                "curl -sfL {url} | sh - && systemctl enable rke2-{kind} && systemctl restart rke2-{kind}"
            ),
            // K3s's and RKE2's documented air-gap installs, with the files from the hub.
            (Installer::Hub { base }, dist) => {
                let fetch = format!(
                    "set -e\ncase \"$(uname -m)\" in aarch64|arm64) arch=arm64 ;; *) arch=amd64 ;; esac\n\
                     fetch() {{ curl -fsS --cacert {HUB_CA} -o \"$2\" \"{base}/$1\"; }}\n"
                );
                match dist {
                    Distribution::K3s => format!(
                        "{fetch}mkdir -p /usr/local/bin /var/lib/rancher/k3s/agent/images\n\
                         fetch k3s /usr/local/bin/k3s.download && chmod 0755 /usr/local/bin/k3s.download && mv -f /usr/local/bin/k3s.download /usr/local/bin/k3s\n\
                         fetch k3s-airgap-images-$arch.tar.zst /var/lib/rancher/k3s/agent/images/k3s-airgap-images-$arch.tar.zst\n\
                         fetch k3s-install.sh /var/lib/rancher/k3s/install.sh\n\
                         INSTALL_K3S_SKIP_DOWNLOAD=true sh /var/lib/rancher/k3s/install.sh\n"
                    ),
                    Distribution::Rke2 => format!(
                        "{fetch}dir=/var/lib/rancher/rke2/artifacts\nmkdir -p $dir\n\
                         for f in rke2.linux-$arch.tar.gz rke2-images.linux-$arch.tar.zst sha256sum-$arch.txt; do fetch $f $dir/$f; done\n\
                         fetch rke2-install.sh $dir/install.sh\n\
                         INSTALL_RKE2_ARTIFACT_PATH=$dir sh $dir/install.sh\n\
                         systemctl enable rke2-{kind} && systemctl restart rke2-{kind}\n"
                    ),
                }
            }
        };
        let (version_var, type_var) = match self.dist {
            Distribution::K3s => ("INSTALL_K3S_VERSION", "INSTALL_K3S_EXEC"),
            Distribution::Rke2 => ("INSTALL_RKE2_VERSION", "INSTALL_RKE2_TYPE"),
        };
        Instruction {
            name: "install".into(),
            script,
            env: vec![
                format!("{version_var}={}", self.version),
                format!("{type_var}={kind}"),
            ],
            ..Instruction::default()
        }
    }

    /// The uninstall scripts the distributions' installers leave behind.
    fn uninstall(&self, server: bool) -> Instruction {
        let script = match self.dist {
            Distribution::K3s if server => "/usr/local/bin/k3s-uninstall.sh",
            Distribution::K3s => "/usr/local/bin/k3s-agent-uninstall.sh",
            Distribution::Rke2 => "/usr/local/bin/rke2-uninstall.sh",
        };
        Instruction {
            name: "uninstall".into(),
            script: script.into(),
            ..Instruction::default()
        }
    }
}

/// The plan that makes `host` a node of the cluster at the cluster's version.
fn host_plan(
    ctx: &Ctx<'_>,
    host: &HostSpec,
    step: Step,
    join: Option<&Join>,
    manifest: Option<&str>,
) -> Plan {
    let dist = ctx.dist.name();
    let server = host.roles.etcd || host.roles.control_plane;
    let data = format!("/var/lib/rancher/{dist}");
    let mut files = vec![File {
        path: format!("/etc/rancher/{dist}/config.yaml"),
        content: config_yaml(ctx.dist, host, step, join).into_bytes(),
        permissions: "0600".into(),
        ..File::default()
    }];
    if matches!(ctx.installer, Installer::Hub { .. }) {
        files.push(File {
            path: HUB_CA.into(),
            content: ctx.ca_pem.as_bytes().to_vec(),
            permissions: "0644".into(),
            ..File::default()
        });
    }
    if let Some(manifest) = manifest {
        files.push(File {
            path: format!("{data}/server/manifests/{MANIFEST_FILE}"),
            content: manifest.as_bytes().to_vec(),
            permissions: "0600".into(),
            ..File::default()
        });
    }
    let mut instructions = vec![ctx.install(server)];
    if step == Step::Init {
        instructions.push(Instruction {
            name: NODE_TOKEN.into(),
            // The server writes it shortly after it starts.
            script: format!(
                "for i in $(seq 300); do [ -s {data}/server/node-token ] && exec cat {data}/server/node-token; sleep 1; done; echo 'no node token after 300 s' >&2; exit 1"
            ),
            save_output: true,
            ..Instruction::default()
        });
    }
    let mut probes = vec![Probe {
        name: "kubelet".into(),
        url: "http://127.0.0.1:10248/healthz".into(),
        period_seconds: 2,
        ..Probe::default()
    }];
    if server && host.roles.control_plane {
        let tls = format!("{data}/server/tls");
        probes.push(Probe {
            name: "kube-apiserver".into(),
            url: "https://127.0.0.1:6443/readyz".into(),
            ca_cert: format!("{tls}/server-ca.crt"),
            client_cert: format!("{tls}/client-kube-apiserver.crt"),
            client_key: format!("{tls}/client-kube-apiserver.key"),
            period_seconds: 2,
            ..Probe::default()
        });
    }
    if host.roles.etcd {
        probes.push(Probe {
            name: "etcd".into(),
            url: "http://127.0.0.1:2381/health".into(),
            period_seconds: 2,
            ..Probe::default()
        });
    }
    Plan {
        files,
        instructions,
        probes,
        ..Plan::default()
    }
}

/// The distribution's `config.yaml` for a host.
fn config_yaml(dist: Distribution, host: &HostSpec, step: Step, join: Option<&Join>) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut lines = Vec::new();
    if !host.node_name.is_empty() {
        lines.push(format!("node-name: {}", quote(&host.node_name)));
    }
    let internal = if host.internal_address.is_empty() {
        &host.address
    } else {
        &host.internal_address
    };
    if !internal.is_empty() {
        lines.push(format!("node-ip: {}", quote(internal)));
    }
    if !host.address.is_empty() && host.address != *internal {
        lines.push(format!("node-external-ip: {}", quote(&host.address)));
    }
    if !host.node_labels.is_empty() {
        lines.push("node-label:".into());
        for (k, v) in &host.node_labels {
            lines.push(format!("  - {}", quote(&format!("{k}={v}"))));
        }
    }
    if !host.taints.is_empty() {
        lines.push("node-taint:".into());
        for t in &host.taints {
            lines.push(format!("  - {}", quote(t)));
        }
    }
    if step == Step::Init && dist == Distribution::K3s {
        lines.push("cluster-init: true".into());
    }
    if let Some(join) = join {
        lines.push(format!("server: {}", quote(&join.url)));
        lines.push(format!("token: {}", quote(&join.token)));
    }
    let server = host.roles.etcd || host.roles.control_plane;
    if server && !host.roles.etcd {
        lines.push("disable-etcd: true".into());
    }
    if host.roles.etcd && !host.roles.control_plane {
        for flag in [
            "disable-apiserver",
            "disable-controller-manager",
            "disable-scheduler",
        ] {
            lines.push(format!("{flag}: true"));
        }
    }
    lines.join("\n") + "\n"
}

/// The checksum of the plan a Plan object holds.
fn stored_checksum(plan: &Object) -> Option<String> {
    crate::model::parse_plan(plan.spec.get("plan")?)
        .ok()
        .map(|p| checksum(&p))
}

/// The agents' manifest already in the init host's plan, if any.
fn existing_manifest(plan: Option<&Object>, dist: Distribution) -> Option<String> {
    let parsed = crate::model::parse_plan(plan?.spec.get("plan")?).ok()?;
    let path = format!(
        "/var/lib/rancher/{}/server/manifests/{MANIFEST_FILE}",
        dist.name()
    );
    parsed
        .files
        .into_iter()
        .find(|f| f.path == path)
        .and_then(|f| String::from_utf8(f.content).ok())
}

/// The init host's join token: kept on its Plan once seen, else from its plan's output.
fn join_token(plan: Option<&Object>) -> Option<String> {
    let status = Status::of(plan?);
    if let Some(token) = status.extra.get("joinToken").and_then(Value::as_str) {
        return Some(token.to_owned());
    }
    status
        .extra
        .get("results")?
        .as_array()?
        .iter()
        .find(|r| r["name"] == NODE_TOKEN && r["exitCode"].as_i64().unwrap_or(0) == 0)
        .and_then(|r| r["stdout"].as_str())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// What a host's agent last reported about its plan.
#[derive(Debug, Default)]
struct PlanReport {
    /// The status's plan and the last plan applied.
    checksum: String,
    applied: String,
    state: String,
    healthy: Vec<String>,
    /// Why the status's plan failed (see [`PlanReport::failure`]).
    failed: Option<String>,
    /// That plan failed as many times as it allows: the agent tries no more.
    out_of_attempts: bool,
    /// The one-time instructions' results (name, exit code, stdout, finished at).
    results: Vec<Value>,
}

impl PlanReport {
    fn of(plan: &Object) -> PlanReport {
        let s = Status::of(plan).extra;
        let text = |k: &str| {
            s.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (count, max) = (
            s.get("failureCount").and_then(Value::as_u64).unwrap_or(0),
            s.get("maxFailures").and_then(Value::as_u64).unwrap_or(0),
        );
        let failure = (text("state") == "failed").then(|| {
            if count >= max {
                format!("{} (gave up after {count} attempts)", text("message"))
            } else {
                format!("{} (attempt {count} of {max}; retrying)", text("message"))
            }
        });
        PlanReport {
            checksum: text("checksum"),
            applied: text("appliedChecksum"),
            state: text("state"),
            healthy: s
                .get("probes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|p| p["healthy"] == true)
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect(),
            out_of_attempts: text("state") == "failed" && count >= max,
            failed: failure,
            results: s
                .get("results")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        }
    }

    /// The `key=value` lines instruction `name` printed (with `saveOutput`).
    fn output(&self, name: &str) -> HashMap<String, String> {
        self.results
            .iter()
            .filter(|r| r["name"] == name)
            .filter_map(|r| r["stdout"].as_str())
            .flat_map(str::lines)
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    /// When instruction `name` finished (RFC 3339), or "".
    fn finished(&self, name: &str) -> String {
        self.results
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["finishedAt"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// Why plan `sum` failed, if it did: a status still about an earlier plan in the slot says
    /// nothing about this one.
    fn failure(&self, sum: &str) -> Option<&str> {
        self.failed.as_deref().filter(|_| self.checksum == sum)
    }

    /// Plan `sum` failed for good: the agent tries it no more.
    fn gave_up(&self, sum: &str) -> bool {
        self.out_of_attempts && self.checksum == sum
    }

    /// Applied at `sum` with every one of its `probes` healthy.
    fn ready(&self, sum: &str, probes: usize) -> bool {
        self.applied == sum
            && self.state == "applied"
            && self.checksum == sum
            && self.healthy.len() >= probes
    }

    fn progress(&self, sum: &str) -> String {
        if self.checksum != sum {
            "waiting for the system-agent to take its plan".into()
        } else if self.applied != sum {
            format!(
                "applying its plan ({} instructions done)",
                self.results.len()
            )
        } else {
            "waiting for its probes to pass".into()
        }
    }
}

pub mod cron;
mod day2;
mod removal;
mod rollout;
#[cfg(test)]
mod tests;
