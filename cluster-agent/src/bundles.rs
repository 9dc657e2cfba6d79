//! Continuous delivery in the cluster: the bundles the hub delivers here
//! (`ClusterAgent.WatchBundles`), applied with server-side apply (field manager `drover`),
//! pruned when a new revision drops an object, checked for drift and readiness, and reported
//! (`ReportBundle`).
//!
//! - **Content** is fetched by chunk (`GetChunk`) only when its digest is new here, checked
//!   against the digest, and kept in memory while a deployment names it.
//! - **Identity**: namespaced objects are applied as the ServiceAccount `drover-bundle` of
//!   their namespace, which the agent makes and binds to the ClusterRole `admin` there (OCM's
//!   executor); Namespaces by the agent itself; any other cluster-scoped object as the
//!   default namespace's account, so it is refused unless someone grants that account more.
//! - **Inventory**: a ConfigMap `drover-bundle-BUNDLE` in the agent's namespace lists what the
//!   bundle applied and the revision fully applied. The union of old and new is written before
//!   a new revision is applied, so a crash in between leaves nothing unknown; what the new one
//!   dropped is deleted after (only objects carrying `drover.io/bundle=BUNDLE`).
//! - **Drift**: between revisions each object is read back every pass; fields that differ
//!   from what was applied are `Modified` (or, with `correctDrift`, applied again, forced), a
//!   deleted object `Missing` (or re-created).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams},
    core::{ApiResource, DynamicObject, GroupVersionKind},
    discovery::Scope,
};
use proto::cluster::v1::{
    BundleDeployment, BundleReport, BundleSnapshot, ChunkRequest, ObjectState, WatchBundlesRequest,
    cluster_agent_client::ClusterAgentClient,
};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tunnel::AgentSession;

use crate::KubeTarget;

pub mod render;
pub mod state;

use render::BUNDLE_LABEL;

/// The field manager of everything applied.
pub const MANAGER: &str = "drover";
/// The account each bundle namespace's objects are applied as.
pub const EXECUTOR: &str = "drover-bundle";
const SYNC_LABEL: &str = "drover.io/sync";
const INVENTORY: &str = "bundle-inventory";

/// What the hub last sent, and the session to fetch content and report over.
#[derive(Clone)]
pub(crate) struct Desired {
    snapshot: BundleSnapshot,
    session: AgentSession,
}

/// Reads the hub's bundles for as long as `session` lasts, into `desired`.
pub(crate) async fn follow(session: AgentSession, desired: Arc<watch::Sender<Option<Desired>>>) {
    let mut client = ClusterAgentClient::new(session.channel.clone());
    let mut stream = match client.watch_bundles(WatchBundlesRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            tracing::warn!(error = %status.message(), "the hub does not send bundles; delivery waits");
            return;
        }
    };
    while let Some(message) = stream.next().await {
        match message {
            Ok(snapshot) => {
                desired.send_replace(Some(Desired {
                    snapshot,
                    session: session.clone(),
                }));
            }
            Err(status) => {
                tracing::info!(error = %status.message(), "the bundle stream ended");
                return;
            }
        }
    }
}

/// Keeps the cluster as the hub's bundles say until `stop`: at each new snapshot, and every
/// `period` for drift and readiness. Nothing is applied or pruned before the first snapshot.
pub(crate) async fn sync(
    client: Client,
    target: KubeTarget,
    own_namespace: String,
    mut desired: watch::Receiver<Option<Desired>>,
    period: Duration,
    stop: CancellationToken,
) {
    let mut reconciler = Reconciler {
        client,
        target,
        own_namespace,
        contents: HashMap::new(),
        kinds: HashMap::new(),
        executors: HashMap::new(),
        reported: HashMap::new(),
    };
    let mut recheck = RECHECK;
    loop {
        let now = desired.borrow_and_update().clone();
        let settled = match now {
            Some(now) => reconciler.pass(&now).await,
            None => true,
        };
        let wait;
        (wait, recheck) = next_wait(settled, recheck, period);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = desired.changed() => {
                if changed.is_err() {
                    return;
                }
                // New work: what it leaves not ready is looked at again soon, however long
                // the last thing waited for took.
                recheck = RECHECK;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The first wait before a bundle not yet ready everywhere (a Deployment rolling out, a
/// failed apply, a report the hub did not take) is looked at again; it doubles up to the
/// period, so a rollout shows as Ready within seconds, not at the next drift check.
const RECHECK: Duration = Duration::from_secs(1);

/// How long to wait after a pass, and the recheck wait after that: the period once everything
/// is Ready and reported, else `recheck`, doubling up to the period.
fn next_wait(settled: bool, recheck: Duration, period: Duration) -> (Duration, Duration) {
    if settled {
        (period, RECHECK)
    } else {
        (recheck.min(period), (recheck * 2).min(period))
    }
}

/// What a bundle's inventory says.
#[derive(Debug, Clone, Default)]
struct Inventory {
    /// The revision whose every object was applied.
    revision: String,
    objects: BTreeSet<ObjectRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    api_version: String,
    kind: String,
    #[serde(default)]
    namespace: String,
    name: String,
}

fn ref_of(object: &Value) -> ObjectRef {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    ObjectRef {
        api_version: text("/apiVersion"),
        kind: text("/kind"),
        namespace: text("/metadata/namespace"),
        name: text("/metadata/name"),
    }
}

fn state(r: &ObjectRef, state: &str, message: impl Into<String>) -> ObjectState {
    ObjectState {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        state: state.to_owned(),
        message: message.into(),
    }
}

fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

struct Reconciler {
    client: Client,
    target: KubeTarget,
    own_namespace: String,
    /// Content by digest, while a deployment names it.
    contents: HashMap<String, Arc<Vec<Value>>>,
    /// What the API server calls each (apiVersion, kind), and whether it is namespaced.
    kinds: HashMap<(String, String), (ApiResource, bool)>,
    /// A client acting as each namespace's executor, its account and binding in place.
    executors: HashMap<String, Client>,
    /// The last report sent for each deployment: an equal one is not sent again.
    reported: HashMap<String, BundleReport>,
}

impl Reconciler {
    /// One pass over every deployment; whether all of them are Ready and reported.
    async fn pass(&mut self, desired: &Desired) -> bool {
        let mut hub = ClusterAgentClient::new(desired.session.channel.clone());
        let inventories = match self.inventories().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "delivery: cannot read the bundles' inventories; trying again next pass");
                return false;
            }
        };
        let mut settled = true;
        let wanted: BTreeSet<&str> = desired
            .snapshot
            .deployments
            .iter()
            .map(|d| d.bundle.as_str())
            .collect();
        for deployment in &desired.snapshot.deployments {
            let report = self
                .deployment(&mut hub, deployment, inventories.get(&deployment.bundle))
                .await;
            settled &= report.error.is_empty() && report.objects.iter().all(|o| o.state == "Ready");
            if self.reported.get(&deployment.name) == Some(&report) {
                continue;
            }
            match hub.report_bundle(report.clone()).await {
                Ok(_) => {
                    self.reported.insert(deployment.name.clone(), report);
                }
                Err(status) => {
                    settled = false;
                    tracing::warn!(deployment = %deployment.name, error = %status.message(), "delivery: cannot report to the hub; trying again next pass");
                }
            }
        }
        // Bundles no longer delivered here: everything they applied goes, then the inventory.
        for (bundle, inventory) in &inventories {
            if wanted.contains(bundle.as_str()) {
                continue;
            }
            let left = self
                .prune(bundle, &inventory.objects, &BTreeSet::new())
                .await;
            settled &= left.is_empty();
            if left.is_empty() {
                let configmaps: Api<DynamicObject> = Api::namespaced_with(
                    self.client.clone(),
                    &self.own_namespace,
                    &configmap_resource(),
                );
                if let Err(e) = configmaps
                    .delete(&inventory_name(bundle), &DeleteParams::default())
                    .await
                {
                    tracing::warn!(%bundle, error = %kube_message(&e), "delivery: cannot remove a bundle's inventory");
                }
                tracing::info!(%bundle, "delivery: a bundle no longer delivered here was removed");
            }
        }
        let named: BTreeSet<&str> = desired
            .snapshot
            .deployments
            .iter()
            .map(|d| d.content.as_str())
            .collect();
        self.contents
            .retain(|digest, _| named.contains(digest.as_str()));
        let names: BTreeSet<&str> = desired
            .snapshot
            .deployments
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        self.reported
            .retain(|name, _| names.contains(name.as_str()));
        settled
    }

    /// Applies one deployment (or checks it, between revisions) and says what it found.
    async fn deployment(
        &mut self,
        hub: &mut ClusterAgentClient<tunnel::Channel>,
        deployment: &BundleDeployment,
        inventory: Option<&Inventory>,
    ) -> BundleReport {
        let failed = |error: String| BundleReport {
            name: deployment.name.clone(),
            revision: deployment.revision.clone(),
            objects: Vec::new(),
            error,
        };
        let objects = match self.content(hub, deployment).await {
            Ok(objects) => objects,
            Err(e) => return failed(format!("fetching the content: {e}")),
        };
        let mut rendered = match render::render(&objects, deployment) {
            Ok(rendered) => rendered,
            Err(e) => return failed(e),
        };
        // Namespaces first: the objects in them need them.
        rendered.sort_by_key(|o| o["kind"] != "Namespace");
        let new = inventory.is_none_or(|i| i.revision != deployment.revision);
        let refs: BTreeSet<ObjectRef> = rendered.iter().map(ref_of).collect();
        let before = inventory.map(|i| i.objects.clone()).unwrap_or_default();
        if new {
            let union = before.union(&refs).cloned().collect();
            let kept = inventory.map(|i| i.revision.clone()).unwrap_or_default();
            if let Err(e) = self
                .write_inventory(&deployment.bundle, &kept, &union)
                .await
            {
                return failed(format!("recording what the bundle applies: {e}"));
            }
        }
        let mut states = Vec::with_capacity(rendered.len());
        for object in &rendered {
            states.push(self.object(object, deployment, new).await);
        }
        if new {
            let all_applied = states.iter().all(|s| s.state != "ErrApplied");
            let left = self.prune(&deployment.bundle, &before, &refs).await;
            let objects = refs.union(&left).cloned().collect();
            let revision = if all_applied {
                deployment.revision.clone()
            } else {
                inventory.map(|i| i.revision.clone()).unwrap_or_default()
            };
            if let Err(e) = self
                .write_inventory(&deployment.bundle, &revision, &objects)
                .await
            {
                tracing::warn!(bundle = %deployment.bundle, error = %e, "delivery: cannot record what the bundle applied; it is applied again next pass");
            }
        }
        BundleReport {
            name: deployment.name.clone(),
            revision: deployment.revision.clone(),
            objects: states,
            error: String::new(),
        }
    }

    /// Applies `object` (a new revision, or drift to correct) or reads it back.
    async fn object(
        &mut self,
        object: &Value,
        deployment: &BundleDeployment,
        new: bool,
    ) -> ObjectState {
        let r = ref_of(object);
        let (resource, namespaced) = match self.kind_of(&r).await {
            Ok(found) => found,
            Err(e) => return state(&r, "ErrApplied", e),
        };
        if !new {
            let reader = api(&self.client, &resource, namespaced, &r.namespace);
            match reader.get_opt(&r.name).await {
                Ok(None) if !deployment.correct_drift => {
                    return state(
                        &r,
                        "Missing",
                        "deleted in the cluster; it comes back with the bundle's next revision, or at once with correctDrift",
                    );
                }
                Ok(Some(live)) => {
                    let live = serde_json::to_value(&live).unwrap_or_default();
                    let drift = state::drifted(object, &live);
                    if drift.is_empty() {
                        let (s, m) = state::readiness(&live);
                        return state(&r, s, m);
                    }
                    if !deployment.correct_drift {
                        let fields = drift.join(", ");
                        return state(&r, "Modified", format!("changed in the cluster: {fields}"));
                    }
                }
                Ok(None) => {}
                Err(e) => return state(&r, "ErrApplied", kube_message(&e)),
            }
        }
        let executor = match self.executor(&r, namespaced, deployment).await {
            Ok(client) => client,
            Err(e) => {
                return state(
                    &r,
                    "ErrApplied",
                    format!("setting up the namespace's executor: {e}"),
                );
            }
        };
        let writer = api(&executor, &resource, namespaced, &r.namespace);
        let params = PatchParams::apply(MANAGER).force();
        match writer.patch(&r.name, &params, &Patch::Apply(object)).await {
            Ok(live) => {
                let live = serde_json::to_value(&live).unwrap_or_default();
                let (s, m) = state::readiness(&live);
                state(&r, s, m)
            }
            Err(e) => state(&r, "ErrApplied", kube_message(&e)),
        }
    }

    /// The content of `deployment`, from memory or fetched chunk by chunk and checked.
    async fn content(
        &mut self,
        hub: &mut ClusterAgentClient<tunnel::Channel>,
        deployment: &BundleDeployment,
    ) -> Result<Arc<Vec<Value>>, String> {
        if let Some(found) = self.contents.get(&deployment.content) {
            return Ok(found.clone());
        }
        let mut text = String::new();
        for digest in &deployment.chunks {
            let chunk = hub
                .get_chunk(ChunkRequest {
                    digest: digest.clone(),
                })
                .await
                .map_err(|s| format!("chunk {digest}: {}", s.message()))?
                .into_inner();
            if proto::content_digest(chunk.data.as_bytes()) != *digest {
                return Err(format!("chunk {digest} arrived changed"));
            }
            text.push_str(&chunk.data);
        }
        if proto::content_digest(text.as_bytes()) != deployment.content {
            return Err(format!("the content is not {}", deployment.content));
        }
        let objects: Vec<Value> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let objects = Arc::new(objects);
        self.contents
            .insert(deployment.content.clone(), objects.clone());
        Ok(objects)
    }

    /// What the API server calls `r`'s kind, asked once per kind.
    async fn kind_of(&mut self, r: &ObjectRef) -> Result<(ApiResource, bool), String> {
        let key = (r.api_version.clone(), r.kind.clone());
        if let Some(found) = self.kinds.get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = r
            .api_version
            .split_once('/')
            .unwrap_or(("", r.api_version.as_str()));
        let gvk = GroupVersionKind::gvk(group, version, &r.kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                format!(
                    "the cluster does not serve {} {}: {}",
                    r.api_version,
                    r.kind,
                    kube_message(&e)
                )
            })?;
        let found = (resource, caps.scope == Scope::Namespaced);
        self.kinds.insert(key, found.clone());
        Ok(found)
    }

    /// The client that applies `r`: a namespace's executor, or the agent for a Namespace.
    async fn executor(
        &mut self,
        r: &ObjectRef,
        namespaced: bool,
        deployment: &BundleDeployment,
    ) -> Result<Client, String> {
        if r.kind == "Namespace" && !namespaced {
            return Ok(self.client.clone());
        }
        let namespace = if namespaced {
            r.namespace.clone()
        } else {
            [deployment.default_namespace.as_str(), "default"]
                .into_iter()
                .find(|n| !n.is_empty())
                .unwrap_or("default")
                .to_owned()
        };
        if let Some(client) = self.executors.get(&namespace) {
            return Ok(client.clone());
        }
        self.set_up_executor(&namespace).await?;
        let user = format!("system:serviceaccount:{namespace}:{EXECUTOR}");
        let client = crate::kube_client_as(&self.target, Some(&user))?;
        self.executors.insert(namespace, client.clone());
        Ok(client)
    }

    /// The namespace, its `drover-bundle` account, and that account's `admin` binding there.
    async fn set_up_executor(&self, namespace: &str) -> Result<(), String> {
        let labels = json!({SYNC_LABEL: "bundle-executor"});
        let objects = [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": EXECUTOR, "namespace": namespace, "labels": labels}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": EXECUTOR, "namespace": namespace, "labels": labels},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                   "subjects": [{"kind": "ServiceAccount", "name": EXECUTOR, "namespace": namespace}]}),
        ];
        for (object, plural) in
            objects
                .iter()
                .zip(["namespaces", "serviceaccounts", "rolebindings"])
        {
            let r = ref_of(object);
            let (group, version) = r.api_version.split_once('/').unwrap_or(("", "v1"));
            let gvk = GroupVersionKind::gvk(group, version, &r.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            let namespaced = r.kind != "Namespace";
            let api = api(&self.client, &resource, namespaced, &r.namespace);
            // The namespace may be the bundle's own (or another's): the agent only makes sure
            // it exists, as a separate manager, so no bundle's prune takes it.
            let params = PatchParams::apply("drover-executor");
            api.patch(&r.name, &params, &Patch::Apply(object))
                .await
                .map_err(|e| format!("{} {}: {}", r.kind, r.name, kube_message(&e)))?;
        }
        Ok(())
    }

    /// Deletes what `bundle` applied before (`before`) and applies no more (not in `now`),
    /// if it still carries the bundle's label. Returns what could not be deleted.
    async fn prune(
        &mut self,
        bundle: &str,
        before: &BTreeSet<ObjectRef>,
        now: &BTreeSet<ObjectRef>,
    ) -> BTreeSet<ObjectRef> {
        let mut left = BTreeSet::new();
        // Namespaces last: what is in them goes first.
        let mut gone: Vec<&ObjectRef> = before.difference(now).collect();
        gone.sort_by_key(|r| r.kind == "Namespace");
        for r in gone {
            let Ok((resource, namespaced)) = self.kind_of(r).await else {
                continue;
            };
            let api = api(&self.client, &resource, namespaced, &r.namespace);
            match api.get_opt(&r.name).await {
                Ok(Some(live))
                    if live
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(BUNDLE_LABEL))
                        .map(String::as_str)
                        == Some(bundle) =>
                {
                    if let Err(e) = api.delete(&r.name, &DeleteParams::default()).await {
                        tracing::warn!(%bundle, kind = %r.kind, name = %r.name, error = %kube_message(&e), "delivery: cannot prune; trying again next pass");
                        left.insert(r.clone());
                    } else {
                        tracing::info!(%bundle, kind = %r.kind, name = %r.name, "delivery: pruned what the bundle no longer holds");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%bundle, kind = %r.kind, name = %r.name, error = %kube_message(&e), "delivery: cannot read what to prune; trying again next pass");
                    left.insert(r.clone());
                }
            }
        }
        left
    }

    async fn inventories(&self) -> Result<BTreeMap<String, Inventory>, String> {
        let configmaps: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.own_namespace,
            &configmap_resource(),
        );
        let list = configmaps
            .list(&kube::api::ListParams::default().labels(&format!("{SYNC_LABEL}={INVENTORY}")))
            .await
            .map_err(|e| kube_message(&e))?;
        let mut out = BTreeMap::new();
        for cm in list {
            let data = &cm.data["data"];
            let Some(bundle) = data["bundle"].as_str() else {
                continue;
            };
            let objects = data["objects"]
                .as_str()
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default();
            out.insert(
                bundle.to_owned(),
                Inventory {
                    revision: data["revision"].as_str().unwrap_or_default().to_owned(),
                    objects,
                },
            );
        }
        Ok(out)
    }

    async fn write_inventory(
        &self,
        bundle: &str,
        revision: &str,
        objects: &BTreeSet<ObjectRef>,
    ) -> Result<(), String> {
        let configmaps: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.own_namespace,
            &configmap_resource(),
        );
        let listed = serde_json::to_string(objects).map_err(|e| e.to_string())?;
        let object = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": inventory_name(bundle), "namespace": self.own_namespace,
                         "labels": {SYNC_LABEL: INVENTORY}},
            "data": {"bundle": bundle, "revision": revision, "objects": listed},
        });
        configmaps
            .patch(
                &inventory_name(bundle),
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map(drop)
            .map_err(|e| kube_message(&e))
    }
}

fn inventory_name(bundle: &str) -> String {
    format!("drover-bundle-{bundle}")
}

fn configmap_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps")
}

fn api(
    client: &Client,
    resource: &ApiResource,
    namespaced: bool,
    namespace: &str,
) -> Api<DynamicObject> {
    if namespaced {
        Api::namespaced_with(client.clone(), namespace, resource)
    } else {
        Api::all_with(client.clone(), resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_ready_is_looked_at_again_sooner_backing_off_to_the_period() {
        let s = Duration::from_secs;
        let period = s(30);
        // (settled, recheck now) → (wait, recheck next)
        for (settled, recheck, wait, next) in [
            (false, s(1), s(1), s(2)),
            (false, s(2), s(2), s(4)),
            (false, s(16), s(16), s(30)),
            (false, s(30), s(30), s(30)),
            (true, s(8), s(30), s(1)),
        ] {
            assert_eq!(
                next_wait(settled, recheck, period),
                (wait, next),
                "settled {settled}, recheck {recheck:?}"
            );
        }
        // A period shorter than the first recheck is never exceeded.
        assert_eq!(
            next_wait(false, s(1), Duration::from_millis(500)).0,
            Duration::from_millis(500)
        );
    }
}
