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

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, TryStreamExt};

use proto::plan::v1::{Plan, checksum};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use self::{
    host_plan::{
        Ctx, Join, Settings, Step, existing_manifest, host_plan, join_token, stored_checksum,
        with_env_removal,
    },
    report::PlanReport,
    rollout::{Action, Removal},
};
use crate::{
    auth::secret::{self, TokenKind},
    downstream,
    model::update_status,
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

/// A pass's plan writes in flight at once: enough for the store to commit many in one
/// transaction (256 wrote 10,000 hosts' upgrades about a tenth faster than 32), few enough
/// that other writers queued meanwhile wait for one such commit, not for the whole rollout.
const PLAN_WRITERS: usize = 256;

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
    /// Reconciles every custom cluster whenever a Cluster, Host, Plan, snapshot, cloud
    /// credential or role binding changes (and every 10 s regardless), until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        // A registry credential a cluster waits for, or its grant to the cluster's owners,
        // counts as a change of that cluster.
        let kinds = [
            "Cluster",
            "Host",
            "Plan",
            "EtcdSnapshot",
            "CloudCredential",
            "RoleBinding",
        ];
        crate::store::on_changes(
            "the planner",
            self.store.as_ref(),
            &kinds,
            &shutdown,
            || self.reconcile_all(),
        )
        .await;
    }

    /// One pass over every cluster, as [`Planner::run`] makes on each change (for `bench
    /// planner`, which times passes without the rest of a hub).
    pub async fn pass(&self) -> Result<(), StoreError> {
        self.try_reconcile_all().await
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
                .cluster_status(name, move |s| {
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
        let mut ctx = self.ctx(spec, settings, &version);

        // Hosts on their way out: uninstall, then let them go.
        let (leaving, staying): (Vec<&Object>, Vec<&Object>) = hosts
            .iter()
            .partition(|h| h.metadata.deletion_timestamp.is_some());
        for host in leaving {
            self.remove(&ctx, cluster, host, plans, strategy.drain)
                .await?;
        }
        // After the removals, which need no registry: a missing login must not hold a host's
        // uninstall (or its machine's release).
        if let Some(registries) = &spec.registries {
            match self.logins(name, registries).await? {
                Ok(logins) => ctx.registries = host_plan::registry_files(dist, registries, &logins),
                Err(why) => {
                    // No host gets a registries.yaml without the credentials it needs.
                    return self
                        .cluster_status(name, move |s| {
                            s.set_condition_to("Provisioned", None, "RegistryCredential", &why);
                        })
                        .await;
                }
            }
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
                .cluster_status(name, move |s| {
                    s.set_condition_to("Provisioned", None, "WaitingForHosts", &message);
                })
                .await;
        };
        let init_name = init_host.metadata.name.clone();

        // Snapshots, restores, rotations; a restore owns the hosts until it is over.
        let operations = tasks::Cluster {
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

        // The agents' manifest carries their pull secret: while an owner of the cluster is not
        // granted its credential, no host is planned with it (a manifest made earlier, for
        // owners who were, included).
        if let Some(credential) = spec
            .agent_images
            .as_ref()
            .map(|i| i.pull_credential.as_str())
            .filter(|c| !c.is_empty())
            && let Err(why) =
                crate::grants::cluster_may_use(self.store.as_ref(), name, credential).await?
        {
            let why = format!("spec.agentImages.pullCredential: {why}");
            return self
                .cluster_status(name, move |s| {
                    s.set_condition_to("Provisioned", None, "AgentImages", &why);
                })
                .await;
        }
        // The agents' manifest, made once (its registration token lives only inside it).
        let mut also = Vec::new();
        let manifest = match existing_manifest(plans.get(&init_name), dist) {
            Some(m) => m,
            None => {
                let token = secret::new_token(TokenKind::Registration);
                also.push(Op::Create(registration::token_object(name, &token)));
                match registration::agents_manifest(
                    self.store.as_ref(),
                    &self.server_url,
                    &self.ca_checksum,
                    name,
                    spec,
                    &token.value,
                )
                .await
                {
                    Ok(manifest) => manifest,
                    // What to fix is the cluster's: say so on it, and try again when it changes.
                    Err(StoreError::Invalid(why)) => {
                        return self
                            .cluster_status(name, move |s| {
                                s.set_condition_to("Provisioned", None, "AgentImages", &why);
                            })
                            .await;
                    }
                    Err(e) => return Err(e),
                }
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
        let mut writes = Vec::new();
        // By name: a pass over 10,000 hosts looks each of them up.
        let by_name: HashMap<&str, &Object> = specs
            .iter()
            .map(|(h, _)| (h.metadata.name.as_str(), *h))
            .collect();
        for action in &decided.actions {
            match action {
                Action::RecordJoinToken { host, token } => {
                    let token = json!(token);
                    update_status(self.store.as_ref(), Kind::Plan, host, move |s| {
                        s.extra.insert("joinToken".into(), token.clone());
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
                        update_status(self.store.as_ref(), Kind::Plan, host, move |s| {
                            s.extra.insert(DRAINED.into(), json!(sum));
                        })
                        .await?;
                    }
                    let Some(object) = by_name.get(host.as_str()) else {
                        continue;
                    };
                    writes.push((*object, plan));
                }
            }
        }
        // The hosts' plans, after this pass's drains (each drained host still before its own
        // plan): the first with what goes with it, then the rest at once, so the store commits
        // them together (one after another, 10,000 hosts were 10,000 commits).
        if !writes.is_empty() {
            // One line a pass, not one a host: an upgrade of 10,000 hosts is one event.
            tracing::info!(cluster = %name, hosts = writes.len(), "planned");
        }
        let mut writes = writes.into_iter();
        let stored = |host: &Object| plans.get(&host.metadata.name);
        if let Some((host, plan)) = writes.next() {
            self.write_plan(cluster, host, "", plan, stored(host), also)
                .await?;
        }
        // Made here, not in the stream: a closure there is more than the compiler can prove
        // `Send` for the task the planner runs in.
        let writes: Vec<_> = writes
            .map(|(host, plan)| self.write_plan(cluster, host, "", plan, stored(host), Vec::new()))
            .collect();
        futures::stream::iter(writes)
            .buffer_unordered(PLAN_WRITERS)
            .try_collect::<Vec<()>>()
            .await?;
        self.cluster_status(name, move |s| {
            decided.status(s, &init_name, &version, &not_yet)
        })
        .await
    }

    /// The registry credentials `registries` names, by name, or why one cannot be had.
    async fn logins(
        &self,
        cluster: &str,
        registries: &crate::model::registries::Registries,
    ) -> Result<
        Result<std::collections::BTreeMap<String, crate::model::RegistryCredential>, String>,
        StoreError,
    > {
        let mut logins = std::collections::BTreeMap::new();
        for name in crate::model::registries::credentials_named(registries) {
            // A host's plan reaches whoever registers it: the cluster's owners.
            if let Err(why) =
                crate::grants::cluster_may_use(self.store.as_ref(), cluster, &name).await?
            {
                return Ok(Err(format!("spec.registries: {why}")));
            }
            match crate::model::registries::login(self.store.as_ref(), &name).await? {
                Ok(login) => logins.insert(name, login),
                Err(why) => return Ok(Err(format!("spec.registries: {why}"))),
            };
        }
        Ok(Ok(logins))
    }

    /// How a custom cluster's hosts install and uninstall its distribution.
    fn ctx<'a>(&'a self, spec: &ClusterSpec, settings: &Settings, version: &'a str) -> Ctx<'a> {
        let dist = spec.distribution.unwrap_or(Distribution::K3s);
        Ctx {
            dist,
            version,
            installer: settings.installer(dist, &self.server_url, version),
            ca_pem: &self.ca_pem,
            endpoint: spec.endpoint_enabled(),
            config: {
                let mut config = spec.config.clone();
                if !spec.system_default_registry.is_empty() {
                    config.insert(
                        "system-default-registry".into(),
                        json!(spec.system_default_registry),
                    );
                }
                config
            },
            host_config: spec.host_config.clone(),
            registries: Vec::new(),
            env: spec
                .agent_env
                .iter()
                .map(|v| (v.name.clone(), v.value.clone()))
                .collect(),
        }
    }

    /// Writes `plan` into `host`'s `slot` (and puts the planner's finalizer on the host), with
    /// `also`. `stored` is the slot's plan as this pass read it: a plan there is changed as the
    /// store holds it when the write commits (no read before, and no conflict with a report
    /// landing meanwhile); a new one names `cluster` and `host` as this pass read them. Either
    /// guess, if the store has changed since, fails the write and the next pass reads afresh.
    async fn write_plan(
        &self,
        cluster: &Object,
        host: &Object,
        slot: &str,
        plan: &Plan,
        stored: Option<&Object>,
        mut also: Vec<Op>,
    ) -> Result<(), StoreError> {
        let name = if slot.is_empty() {
            host.metadata.name.clone()
        } else {
            crate::plans::task_plan_name(&host.metadata.name)
        };
        let mut spec = json!({
            "host": host.metadata.name,
            "cluster": cluster.metadata.name,
            "plan": serde_json::to_value(plan).map_err(|e| StoreError::Backend(e.to_string()))?,
        });
        if !slot.is_empty() {
            spec["slot"] = json!(slot);
        }
        // Per host at debug (the pass says it at info): the checksum is computed only then.
        tracing::debug!(host = %host.metadata.name, cluster = %cluster.metadata.name, %slot, plan = %&checksum(plan)[..12], "planned");
        // What came along is stamped from the store; the plan, below, from what the pass read
        // (neither the cluster nor the host is made in this transaction).
        crate::refs::stamp_all(self.store.as_ref(), &mut also).await?;
        if stored.is_some() {
            also.push(Op::Modify {
                kind: Kind::Plan.name().into(),
                name,
                change: crate::store::Modifier::new(move |p| p.spec = spec.clone()),
            });
        } else {
            let mut created = Object::new(Kind::Plan.name(), &name, spec);
            crate::refs::stamp(self.store.as_ref(), &mut created, &[cluster, host])
                .await
                .map_err(StoreError::from)?;
            also.push(Op::Create(created));
        }
        if !host.metadata.finalizers.iter().any(|f| f == FINALIZER) {
            // Changed as stored, too: a host's reports change it all the time.
            also.push(Op::Modify {
                kind: Kind::Host.name().into(),
                name: host.metadata.name.clone(),
                change: crate::store::Modifier::new(|h| {
                    if h.metadata.deletion_timestamp.is_none()
                        && !h.metadata.finalizers.iter().any(|f| f == FINALIZER)
                    {
                        h.metadata.finalizers.push(FINALIZER.into());
                    }
                }),
            });
        }
        self.store.transact(also).await.map(drop)
    }

    /// A host being removed: its uninstall plan, then the finalizer goes (and the host with it).
    async fn remove(
        &self,
        ctx: &Ctx<'_>,
        cluster_object: &Object,
        host: &Object,
        plans: &HashMap<String, Object>,
        drain: bool,
    ) -> Result<(), StoreError> {
        let name = &host.metadata.name;
        let cluster = cluster_object.metadata.name.as_str();
        let stored = plans.get(name);
        match rollout::removal(ctx, host, stored, drain) {
            Removal::Nothing | Removal::Wait => Ok(()),
            Removal::Uninstall { plan, drain } => {
                if let Some(node) = drain
                    && let Err(why) = self.drain(cluster, &node).await
                {
                    tracing::info!(host = %name, %node, "draining before removal: {why}");
                    return Ok(());
                }
                tracing::info!(host = %name, %cluster, "uninstall planned");
                self.write_plan(cluster_object, host, "", &plan, stored, Vec::new())
                    .await
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
                let ops = self.release(host).await?;
                tracing::info!(host = %name, "uninstalled; removing the host and its credential");
                self.store.transact(ops).await.map(drop)
            }
        }
    }

    /// What lets a deleted host go: its plan deleted, its agent's credential revoked (a host
    /// registered again later gets a new one), and the planner's finalizer off it.
    async fn release(&self, host: &Object) -> Result<Vec<Op>, StoreError> {
        let mut ops = vec![Op::Delete {
            kind: Kind::Plan.name().into(),
            name: host.metadata.name.clone(),
            resource_version: None,
        }];
        if let Some(token) = crate::agents::host_credential(self.store.as_ref(), host).await? {
            ops.push(Op::Delete {
                kind: Kind::Token.name().into(),
                resource_version: Some(token.revision()),
                name: token.metadata.name,
            });
        }
        let mut host = host.clone();
        host.metadata.finalizers.retain(|f| f != FINALIZER);
        ops.push(Op::Update(host));
        Ok(ops)
    }

    /// Drains `node` through the cluster's agent: `Ok` once drained, else why not yet.
    async fn drain(&self, cluster: &str, node: &str) -> Result<(), String> {
        let agents = self
            .agents
            .as_ref()
            .ok_or("this planner cannot reach clusters")?;
        downstream::drain(agents, cluster, node, None)
            .await
            .map_err(|e| e.to_string())
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
        change: impl Fn(&mut Status) + Send + Sync + 'static,
    ) -> Result<(), StoreError> {
        update_status(self.store.as_ref(), Kind::Cluster, name, change).await
    }
}

mod day2;
mod host_plan;
mod removal;
mod report;
mod restore;
mod rollout;
mod rotation;
mod snapshots;
mod tasks;
#[cfg(test)]
mod tests;
