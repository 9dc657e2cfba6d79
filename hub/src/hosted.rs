//! The hosted-cluster controller (leader only, writing fenced like the planner): makes each
//! hosted cluster's cloud hold what its spec says — the control plane, then its node groups,
//! resized, upgraded (control plane first, then one node group at a time), and on deletion
//! its node groups and then its control plane, before the cluster's finalizer goes.
//!
//! Everything the hub makes in the cloud is tagged with the cluster's name and uid, and found
//! again by name before anything is made: a hub that crashed mid-create finds what it made
//! and goes on, never making it twice. A failed call is recorded on the cluster with when it
//! is tried next (doubling from 5 s to 5 min; at once when the spec changes). The decisions
//! are in [`decide`]; this module observes and carries them out.

use std::{sync::Arc, time::Duration};

use drivers::{
    DriverError,
    hosted::{ClusterRequest, HostedProvider, NodeGroupRequest},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    model::{CloudCredentialSpec, ClusterSpec, ClusterType, HostedSpec, Kind, Status},
    store::{LabelSelector, Object, Op, Store, StoreError},
};

pub mod decide;
mod install;
use decide::{Action, CLUSTER_TAG, Decision, OWNER_TAG, Observed, Standing, decide};

/// The finalizer a hosted cluster carries until nothing of it is left in the cloud.
pub const FINALIZER: &str = crate::model::HOSTED_FINALIZER;
/// The condition that says where the cloud stands.
const PROVISIONED: &str = "Provisioned";
/// Status fields of a failed call: how many in a row, when the next try is, and the
/// generation of the spec they failed with.
const FAILURES: &str = "hostedFailures";
const NEXT_ATTEMPT: &str = "hostedNextAttempt";
const FAILED_GENERATION: &str = "hostedFailedGeneration";
/// How many times one pass looks at the cloud again after acting.
const ROUNDS: u32 = 4;
/// On the status: when the hub installed the agents (never again after).
const AGENTS_INSTALLED: &str = "agentsInstalled";
/// The condition that says whether the agents are installed, and the failed tries' count and
/// next attempt.
const INSTALLED: &str = "AgentsInstalled";
const INSTALL_FAILURES: &str = "installFailures";
const INSTALL_NEXT_ATTEMPT: &str = "installNextAttempt";
/// On the registration token the install made: the cluster's name.
const INSTALL_LABEL: &str = "drover.io/hosted-install";
const FIRST_WAIT: Duration = Duration::from_secs(5);
const LONGEST_WAIT: Duration = Duration::from_secs(300);

/// How long to wait after the `n`th failure in a row.
fn backoff(n: u64) -> Duration {
    let doublings = u32::try_from(n.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(16);
    FIRST_WAIT
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(LONGEST_WAIT)
}

/// Makes the provider a cluster's spec names, with its credential ([`cloud_providers`]).
pub type Providers = Arc<
    dyn Fn(&HostedSpec, &CloudCredentialSpec) -> Result<Box<dyn HostedProvider>, String>
        + Send
        + Sync,
>;

/// The providers the hub speaks: EKS with the credential's access key.
pub fn cloud_providers() -> Providers {
    Arc::new(|spec: &HostedSpec, credential: &CloudCredentialSpec| {
        let Some(key) = &credential.amazonec2 else {
            return Err(format!(
                "credential {:?} holds no AWS access key (an amazonec2 credential)",
                spec.credential
            ));
        };
        let credentials = drivers::aws::Credentials {
            access_key_id: key.access_key_id.clone(),
            secret_access_key: key.secret_access_key.clone(),
        };
        let ca = (!spec.endpoint_ca.trim().is_empty()).then_some(spec.endpoint_ca.as_str());
        drivers::eks::Eks::new(&spec.endpoint, &spec.region, credentials, ca)
            .map(|eks| Box::new(eks) as Box<dyn HostedProvider>)
            .map_err(|e| e.to_string())
    })
}

#[derive(Clone)]
pub struct Controller {
    store: Arc<dyn Store>,
    providers: Providers,
    /// What the agents installed into a cluster dial, and the CA they pin.
    server_url: String,
    ca_checksum: String,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("hosted::Controller")
    }
}

/// A failed step: which, and why (the cloud's own words).
struct Failure {
    step: String,
    why: String,
}

impl Controller {
    pub fn new(
        store: Arc<dyn Store>,
        providers: Providers,
        server_url: String,
        ca_checksum: String,
    ) -> Self {
        Self {
            store,
            providers,
            server_url,
            ca_checksum,
        }
    }

    /// Reconciles every hosted cluster whenever a Cluster or CloudCredential changes other
    /// than in its status, and every 10 s regardless (the cloud changes on its own), until
    /// `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut clusters = crate::store::SpecChanges::default();
        let relevant = |e: &crate::store::WatchEvent| match e.object.kind.as_str() {
            "Cluster" => clusters.relevant(e),
            "CloudCredential" => true,
            _ => false,
        };
        crate::store::on_changes_where(
            "the hosted-cluster controller",
            self.store.as_ref(),
            relevant,
            &shutdown,
            || self.reconcile_all(),
        )
        .await;
    }

    async fn reconcile_all(&self) {
        if let Err(e) = self.try_reconcile_all().await {
            tracing::warn!(error = %e, "the hosted-cluster controller failed a pass; retrying");
        }
    }

    async fn try_reconcile_all(&self) -> Result<(), StoreError> {
        let (clusters, _) = self
            .store
            .list(Kind::Cluster.name(), &LabelSelector::everything())
            .await?;
        // Most clusters are not hosted: their specs are not parsed on every pass.
        for cluster in clusters.iter().filter(|c| c.spec["type"] == "hosted") {
            let Ok(spec) = serde_json::from_value::<ClusterSpec>(cluster.spec.clone()) else {
                continue;
            };
            let (ClusterType::Hosted, Some(hosted)) = (spec.cluster_type, spec.hosted.clone())
            else {
                continue;
            };
            self.reconcile(cluster, &spec, &hosted).await?;
        }
        Ok(())
    }

    async fn reconcile(
        &self,
        cluster: &Object,
        cluster_spec: &ClusterSpec,
        spec: &HostedSpec,
    ) -> Result<(), StoreError> {
        let meta = &cluster.metadata;
        let deleting = meta.deletion_timestamp.is_some();
        if deleting && !meta.finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        if !deleting && !meta.finalizers.iter().any(|f| f == FINALIZER) {
            // Before anything is made in the cloud: the cluster cannot go without its clean-up.
            let mut kept = cluster.clone();
            kept.metadata.finalizers.push(FINALIZER.into());
            return self.store.transact(vec![Op::Update(kept)]).await.map(drop);
        }
        if waiting_to_retry(cluster) {
            return Ok(());
        }
        let provider = match self.provider(spec).await? {
            Ok(provider) => provider,
            Err(why) => {
                let failure = Failure {
                    step: "reading the credential".into(),
                    why,
                };
                return self.failed(cluster, failure).await;
            }
        };
        // What was done is looked at again at once: a step the cloud finishes at once (a
        // resize, a node group's deletion on some clouds) leads to the next without waiting
        // for the next pass. A few rounds at most: the cloud's slow steps are waited out
        // between passes.
        let mut rounds = 0;
        let mut installed = Status::of(cluster).extra.contains_key(AGENTS_INSTALLED);
        let mut install_tried = false;
        loop {
            rounds += 1;
            let observed = match observe(provider.as_ref(), spec.cloud_name(&meta.name)).await {
                Ok(observed) => Observed {
                    agents_installed: installed,
                    ..observed
                },
                Err(e) => {
                    let failure = Failure {
                        step: "reading the cloud's cluster".into(),
                        why: e.to_string(),
                    };
                    return self.failed(cluster, failure).await;
                }
            };
            let decision = decide(&meta.name, &meta.uid, spec, deleting, &observed);
            let mut performed = 0;
            for action in &decision.actions {
                if *action == Action::InstallAgents {
                    // Its own retries, once a pass at most: a cluster the hub cannot reach
                    // yet still gets its node groups.
                    if install_tried || !install_due(cluster) {
                        continue;
                    }
                    install_tried = true;
                    performed += 1;
                    let done = self
                        .install(cluster, cluster_spec, spec, &observed, provider.as_ref())
                        .await?;
                    match done {
                        Ok(()) => installed = true,
                        Err(why) => self.install_failed(cluster, why).await?,
                    }
                    continue;
                }
                if let Err(e) = act(provider.as_ref(), cluster, spec, &observed, action).await {
                    let failure = Failure {
                        step: step_of(action),
                        why: e.to_string(),
                    };
                    return self.failed(cluster, failure).await;
                }
                performed += 1;
                tracing::info!(cluster = %meta.name, action = ?action, "hosted cluster");
            }
            if performed == 0 || rounds == ROUNDS {
                return self.record(cluster, &observed, &decision).await;
            }
        }
    }

    /// Applies the cluster's import manifest at its API server (see [`install`]), with a
    /// registration token made for it (any one an earlier try made goes), and records it.
    async fn install(
        &self,
        cluster: &Object,
        cluster_spec: &ClusterSpec,
        spec: &HostedSpec,
        observed: &Observed,
        provider: &dyn HostedProvider,
    ) -> Result<Result<(), String>, StoreError> {
        let name = &cluster.metadata.name;
        let Some(cloud) = &observed.cluster else {
            return Ok(Err("the cloud reports no cluster".into()));
        };
        let token = crate::auth::secret::new_token(crate::auth::secret::TokenKind::Registration);
        let mut token_object = crate::registration::token_object(name, &token);
        token_object
            .metadata
            .labels
            .insert(INSTALL_LABEL.into(), name.clone());
        let selector = LabelSelector::parse(&format!("{INSTALL_LABEL}={name}"))
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let (earlier, _) = self
            .store
            .list(Kind::RegistrationToken.name(), &selector)
            .await?;
        let mut ops: Vec<Op> = earlier
            .iter()
            .map(|t| Op::Delete {
                kind: Kind::RegistrationToken.name().to_owned(),
                name: t.metadata.name.clone(),
                resource_version: None,
            })
            .collect();
        ops.push(Op::Create(token_object));
        crate::refs::stamp_all(self.store.as_ref(), &mut ops).await?;
        self.store.transact(ops).await?;
        let manifest = match crate::registration::agents_manifest(
            self.store.as_ref(),
            &self.server_url,
            &self.ca_checksum,
            name,
            cluster_spec,
            &token.value,
        )
        .await
        {
            Ok(manifest) => manifest,
            Err(StoreError::Invalid(why)) => return Ok(Err(why)),
            Err(e) => return Err(e),
        };
        let bearer = provider.api_token(spec.cloud_name(name));
        match install::apply(&cloud.endpoint, &cloud.ca_pem, &bearer, &manifest).await {
            Ok(applied) => {
                tracing::info!(cluster = %name, objects = applied, "installed the agents into the hosted cluster");
                let at = crate::store::now_rfc3339();
                crate::model::update_status(self.store.as_ref(), Kind::Cluster, name, move |s| {
                    s.extra.insert(AGENTS_INSTALLED.into(), json!(at));
                    s.extra.remove(INSTALL_FAILURES);
                    s.extra.remove(INSTALL_NEXT_ATTEMPT);
                    s.set_condition(INSTALLED, true, "Applied", "");
                })
                .await?;
                Ok(Ok(()))
            }
            Err(why) => Ok(Err(why)),
        }
    }

    async fn provider(
        &self,
        spec: &HostedSpec,
    ) -> Result<Result<Box<dyn HostedProvider>, String>, StoreError> {
        let credential = match self
            .store
            .get(Kind::CloudCredential.name(), &spec.credential)
            .await
        {
            Ok(c) => match serde_json::from_value::<CloudCredentialSpec>(c.spec) {
                Ok(credential) => credential,
                Err(e) => return Ok(Err(e.to_string())),
            },
            Err(StoreError::NotFound { .. }) => {
                return Ok(Err(format!(
                    "credential {:?} does not exist",
                    spec.credential
                )));
            }
            Err(e) => return Err(e),
        };
        Ok((self.providers)(spec, &credential))
    }

    /// Records what the cloud holds and where the cluster stands; lets it go once released.
    async fn record(
        &self,
        cluster: &Object,
        observed: &Observed,
        decision: &Decision,
    ) -> Result<(), StoreError> {
        let name = cluster.metadata.name.clone();
        if decision.standing == Standing::Released {
            tracing::info!(cluster = %name, "nothing of the hosted cluster is left in the cloud");
            let mut gone = cluster.clone();
            gone.metadata.finalizers.retain(|f| f != FINALIZER);
            return crate::model::unless_gone(self.store.as_ref(), vec![Op::Update(gone)]).await;
        }
        let provider = observed
            .cluster
            .as_ref()
            .map(|c| json!({"status": c.status, "version": c.version, "endpoint": c.endpoint}));
        let groups: Vec<Value> = observed
            .node_groups
            .iter()
            .map(|g| {
                json!({"name": g.name, "status": g.status, "version": g.version,
                       "desiredSize": g.desired_size, "minSize": g.min_size,
                       "maxSize": g.max_size})
            })
            .collect();
        let standing = decision.standing.clone();
        crate::model::update_status(self.store.as_ref(), Kind::Cluster, &name, move |s| {
            for field in [FAILURES, NEXT_ATTEMPT, FAILED_GENERATION] {
                s.extra.remove(field);
            }
            match &provider {
                Some(p) => s.extra.insert("provider".into(), p.clone()),
                None => s.extra.remove("provider"),
            };
            s.extra
                .insert("nodeGroups".into(), Value::Array(groups.clone()));
            match &standing {
                Standing::Ready => s.set_condition(PROVISIONED, true, "Ready", ""),
                Standing::Waiting(what) => s.set_condition_to(PROVISIONED, None, "Waiting", what),
                Standing::Stuck(why) => s.set_condition(PROVISIONED, false, "Stuck", why),
                Standing::Released => {}
            }
        })
        .await
    }

    /// Records a failed install and when it is tried again (the cloud's steps go on).
    async fn install_failed(&self, cluster: &Object, why: String) -> Result<(), StoreError> {
        let n = Status::of(cluster)
            .extra
            .get(INSTALL_FAILURES)
            .and_then(Value::as_u64)
            .unwrap_or(0)
            + 1;
        let next = crate::model::format_time(time::OffsetDateTime::now_utc() + backoff(n));
        let message = format!(
            "installing the agents failed: {why}; tried again at {next} (failure {n} in a row)"
        );
        tracing::warn!(cluster = %cluster.metadata.name, %message, "hosted cluster");
        crate::model::update_status(
            self.store.as_ref(),
            Kind::Cluster,
            &cluster.metadata.name,
            move |s| {
                s.extra.insert(INSTALL_FAILURES.into(), json!(n));
                s.extra.insert(INSTALL_NEXT_ATTEMPT.into(), json!(next));
                s.set_condition(INSTALLED, false, "Failed", &message);
            },
        )
        .await
    }

    /// Records a failed step and when it is tried again.
    async fn failed(&self, cluster: &Object, failure: Failure) -> Result<(), StoreError> {
        let status = Status::of(cluster);
        let n = status
            .extra
            .get(FAILURES)
            .and_then(Value::as_u64)
            .unwrap_or(0)
            + 1;
        let wait = backoff(n);
        let next = time::OffsetDateTime::now_utc() + wait;
        let next_text = crate::model::format_time(next);
        let message = format!(
            "{} failed: {}; tried again at {next_text} (failure {n} in a row, or at once when the spec changes)",
            failure.step, failure.why
        );
        tracing::warn!(cluster = %cluster.metadata.name, %message, "hosted cluster");
        let generation = cluster.metadata.generation;
        crate::model::update_status(
            self.store.as_ref(),
            Kind::Cluster,
            &cluster.metadata.name,
            move |s| {
                s.extra.insert(FAILURES.into(), json!(n));
                s.extra.insert(NEXT_ATTEMPT.into(), json!(next_text));
                s.extra.insert(FAILED_GENERATION.into(), json!(generation));
                s.set_condition(PROVISIONED, false, "Failed", &message);
            },
        )
        .await
    }
}

/// Whether an install that failed may be tried again now (the cluster object is the one read
/// at the start of the pass: a failure earlier in this pass is not seen, which is one try).
fn install_due(cluster: &Object) -> bool {
    Status::of(cluster)
        .extra
        .get(INSTALL_NEXT_ATTEMPT)
        .and_then(Value::as_str)
        .and_then(crate::model::parse_time)
        .is_none_or(|due| time::OffsetDateTime::now_utc() >= due)
}

/// Whether the cluster's last failure asks to wait still: its next attempt is not due, and
/// its spec is the one that failed.
fn waiting_to_retry(cluster: &Object) -> bool {
    let status = Status::of(cluster);
    let failed_generation = status.extra.get(FAILED_GENERATION).and_then(Value::as_u64);
    let due = status
        .extra
        .get(NEXT_ATTEMPT)
        .and_then(Value::as_str)
        .and_then(crate::model::parse_time);
    match (failed_generation, due) {
        (Some(generation), Some(due)) => {
            generation == cluster.metadata.generation && time::OffsetDateTime::now_utc() < due
        }
        _ => false,
    }
}

/// What the cloud holds for `cloud_name`.
async fn observe(provider: &dyn HostedProvider, cloud_name: &str) -> Result<Observed, DriverError> {
    let cluster = provider.cluster(cloud_name).await?;
    let node_groups = match &cluster {
        Some(_) => provider.node_groups(cloud_name).await?,
        None => Vec::new(),
    };
    Ok(Observed {
        cluster,
        node_groups,
        agents_installed: false,
    })
}

fn step_of(action: &Action) -> String {
    match action {
        Action::CreateCluster => "creating the control plane".into(),
        Action::InstallAgents => "installing the agents".into(),
        Action::UpgradeCluster(v) => format!("upgrading the control plane to {v}"),
        Action::DeleteCluster => "deleting the control plane".into(),
        Action::CreateNodeGroup(g) => format!("creating node group {g}"),
        Action::ScaleNodeGroup(g, size) => {
            format!("scaling node group {g} to {}", size.desired)
        }
        Action::UpgradeNodeGroup(g, v) => format!("upgrading node group {g} to {v}"),
        Action::DeleteNodeGroup(g) => format!("deleting node group {g}"),
    }
}

/// The tags of what the hub makes for `cluster`.
fn tags_of(cluster: &Object, spec: &HostedSpec) -> std::collections::BTreeMap<String, String> {
    let mut tags = spec.tags.clone();
    tags.insert(CLUSTER_TAG.into(), cluster.metadata.name.clone());
    tags.insert(OWNER_TAG.into(), cluster.metadata.uid.clone());
    tags
}

async fn act(
    provider: &dyn HostedProvider,
    cluster: &Object,
    spec: &HostedSpec,
    observed: &Observed,
    action: &Action,
) -> Result<(), DriverError> {
    let name = spec.cloud_name(&cluster.metadata.name);
    let uid = &cluster.metadata.uid;
    match action {
        Action::CreateCluster => {
            provider
                .create_cluster(&ClusterRequest {
                    name: name.to_owned(),
                    version: spec.kubernetes_version.clone(),
                    role_arn: spec.role_arn.clone(),
                    subnets: spec.subnets.clone(),
                    security_groups: spec.security_groups.clone(),
                    endpoint_public_access: spec.endpoint_public_access,
                    endpoint_private_access: spec.endpoint_private_access,
                    tags: tags_of(cluster, spec),
                    // The same request again (a hub that crashed before it saw the answer)
                    // makes nothing new.
                    token: uid.clone(),
                })
                .await
        }
        Action::UpgradeCluster(version) => provider.upgrade_cluster(name, version).await,
        Action::DeleteCluster => provider.delete_cluster(name).await,
        Action::CreateNodeGroup(group) => {
            let Some(want) = spec.node_groups.iter().find(|g| &g.name == group) else {
                return Ok(());
            };
            provider
                .create_node_group(&NodeGroupRequest {
                    cluster: name.to_owned(),
                    name: want.name.clone(),
                    // At the control plane's version, said rather than left to the cloud's
                    // default.
                    version: observed
                        .cluster
                        .as_ref()
                        .map(|c| c.version.clone())
                        .unwrap_or_default(),
                    instance_type: want.instance_type.clone(),
                    desired_size: want.desired_size,
                    min_size: want.min_size,
                    max_size: want.max_size,
                    disk_size: want.disk_size,
                    subnets: spec.subnets.clone(),
                    node_role: spec.node_role.clone(),
                    labels: want.labels.clone(),
                    taints: want.taints.clone(),
                    tags: tags_of(cluster, spec),
                    token: format!("{uid}-{}", want.name),
                })
                .await
        }
        Action::ScaleNodeGroup(group, size) => provider.scale_node_group(name, group, *size).await,
        Action::UpgradeNodeGroup(group, version) => {
            provider.upgrade_node_group(name, group, version).await
        }
        Action::DeleteNodeGroup(group) => provider.delete_node_group(name, group).await,
        // Not the cloud's: the controller does it itself.
        Action::InstallAgents => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_5_seconds_doubling_to_5_minutes() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(u64::MAX).as_secs(), 300);
    }
}
