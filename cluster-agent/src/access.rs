//! RBAC sync: the cluster's RBAC kept in step with the hub's role bindings and projects.
//!
//! The hub sends who holds which role (`ClusterAgent.WatchAccess`, whole each time); this
//! controller works out the objects that gives and makes the cluster hold exactly those:
//!
//! | on the hub | in the cluster |
//! |---|---|
//! | `cluster-owner` | ClusterRoleBinding `drover-cluster-owner` to `cluster-admin` |
//! | `cluster-member` | RoleBinding `drover-cluster-member` to `edit` in every namespace but the agent's own; and what `read-only` has |
//! | `read-only` | ClusterRoleBindings `drover-read-only` to `view` (read everything but secrets, in every namespace) and `drover-cluster-view` to the ClusterRole of that name (nodes, namespaces) |
//! | `project-owner` / `project-member` / `project-read-only` of project P | RoleBindings `drover-project-owner` / `-member` / `-read-only` to `admin` / `edit` / `view` in each namespace labelled `drover.io/project=P` |
//! | a cluster template T of the hub's own | ClusterRole `drover-role-T` (its rules and what it inherits) and ClusterRoleBinding `drover-role-T` to it |
//! | a project template T of project P | that ClusterRole, and a RoleBinding `drover-role-T` to it in each namespace of P |
//! | a project secret of P | a Secret of that name in each namespace of P |
//!
//! Each binding lists every subject that holds the role there. Users and groups are subjects
//! alike. Every object written carries `drover.io/sync`; objects
//! without it are never changed or deleted, even under a name this controller would use. It
//! reconciles when the hub's access changes, when a namespace or one of its own objects
//! changes (so a deleted binding comes back), and every minute; an object already as wanted is
//! not written, so a steady state costs no writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    pin::Pin,
    time::Duration,
};

use futures::{Stream, StreamExt};
use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{Namespace, Secret},
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use proto::cluster::v1::{
    AccessSnapshot, Grant, WatchAccessRequest, cluster_agent_client::ClusterAgentClient,
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tunnel::AgentSession;

pub mod endpoint;

/// The label on every object this controller owns; its value says what kind of sync.
pub const SYNC_LABEL: &str = "drover.io/sync";
/// A namespace's project, and the project of a project object.
pub const PROJECT_LABEL: &str = "drover.io/project";
const RBAC: &str = "rbac";
const PROJECT_SECRET: &str = "project-secret";
const CLUSTER_VIEW: &str = "drover-cluster-view";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// A full reconcile at least this often, whatever the watches say.
const RESYNC: Duration = Duration::from_secs(60);

/// Reads the hub's access for as long as `session` lasts, into `desired`.
pub(crate) async fn follow(
    session: AgentSession,
    desired: std::sync::Arc<watch::Sender<Option<AccessSnapshot>>>,
) {
    let mut client = ClusterAgentClient::new(session.channel.clone());
    let mut stream = match client.watch_access(WatchAccessRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            tracing::warn!(error = %status.message(), "the hub does not send the cluster's access; RBAC sync waits");
            return;
        }
    };
    while let Some(message) = stream.next().await {
        match message {
            Ok(snapshot) => {
                desired.send_replace(Some(snapshot));
            }
            Err(status) => {
                tracing::info!(error = %status.message(), "the access stream ended");
                return;
            }
        }
    }
}

/// Keeps the cluster's RBAC as `desired` says until `stop`. Nothing is written before the
/// first snapshot arrives: an agent that has not heard from the hub removes nothing.
pub(crate) async fn sync(
    client: Client,
    own_namespace: String,
    mut desired: watch::Receiver<Option<AccessSnapshot>>,
    stop: CancellationToken,
) {
    let changes = downstream_changes(&client);
    tokio::pin!(changes);
    loop {
        let snapshot = desired.borrow_and_update().clone();
        if let Some(snapshot) = snapshot {
            match reconcile(&client, &own_namespace, &snapshot).await {
                Ok(written) if written > 0 => {
                    tracing::info!(written, "RBAC sync: the cluster now matches the hub");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "RBAC sync failed; retrying"),
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
            Some(()) = changes.next() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
        // Let a burst (many bindings at once, a namespace and its objects) arrive whole.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while futures::FutureExt::now_or_never(changes.next())
            .flatten()
            .is_some()
        {}
    }
}

/// A signal for each change to a namespace or to an object of ours, from watches.
fn downstream_changes(client: &Client) -> impl Stream<Item = ()> + Send + 'static {
    fn signals<K>(api: Api<K>, config: watcher::Config) -> Pin<Box<dyn Stream<Item = bool> + Send>>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        // Backoff: an unreachable API server is retried calmly, not in a loop.
        Box::pin(watcher(api, config).default_backoff().map(|e| e.is_ok()))
    }
    let ours = || watcher::Config::default().labels(SYNC_LABEL);
    futures::stream::select_all([
        signals(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
        ),
        signals(Api::<RoleBinding>::all(client.clone()), ours()),
        signals(Api::<ClusterRoleBinding>::all(client.clone()), ours()),
        signals(Api::<ClusterRole>::all(client.clone()), ours()),
        signals(Api::<Secret>::all(client.clone()), ours()),
        signals(
            Api::<k8s_openapi::api::apps::v1::DaemonSet>::all(client.clone()),
            ours(),
        ),
    ])
    .filter_map(|ok| async move { ok.then_some(()) })
}

fn labels(sync: &str, project: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(SYNC_LABEL.to_owned(), sync.to_owned())]);
    if let Some(project) = project {
        labels.insert(PROJECT_LABEL.to_owned(), project.to_owned());
    }
    labels
}

fn meta(name: &str, namespace: Option<&str>, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

fn subjects<'a>(grants: impl Iterator<Item = &'a Grant>) -> Vec<Subject> {
    let set: BTreeSet<(String, String)> = grants
        .filter_map(|g| g.subject.as_ref())
        .map(|s| (s.kind.clone(), s.name.clone()))
        .collect();
    set.into_iter()
        .map(|(kind, name)| Subject {
            api_group: Some(RBAC_GROUP.to_owned()),
            kind,
            name,
            namespace: None,
        })
        .collect()
}

fn cluster_role_ref(name: &str) -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.to_owned(),
        kind: "ClusterRole".to_owned(),
        name: name.to_owned(),
    }
}

/// The ClusterRole (and its bindings' name) of a template of the hub's own.
fn template_role(template: &str) -> String {
    format!("drover-role-{template}")
}

/// The snapshot's templates of the hub's own (not builtin) of `context`.
fn defined<'a>(
    snapshot: &'a AccessSnapshot,
    context: &'a str,
) -> impl Iterator<Item = &'a proto::cluster::v1::Template> {
    snapshot
        .templates
        .iter()
        .filter(move |t| !t.builtin && t.context == context)
}

/// A template's rule as the API server keeps it (empty lists left out).
fn policy_rule(rule: &proto::cluster::v1::Rule) -> PolicyRule {
    let some = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    PolicyRule {
        api_groups: some(&rule.api_groups),
        resources: some(&rule.resources),
        resource_names: some(&rule.resource_names),
        verbs: rule.verbs.clone(),
        non_resource_urls: some(&rule.non_resource_urls),
    }
}

/// What the cluster should hold.
#[derive(Debug, Default)]
struct Desired {
    cluster_roles: Vec<ClusterRole>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    bindings: Vec<RoleBinding>,
    secrets: Vec<Secret>,
}

fn desired(snapshot: &AccessSnapshot, namespaces: &[Namespace], own_namespace: &str) -> Desired {
    let mut want = Desired::default();
    let with = |role: &'static str| {
        snapshot
            .cluster_grants
            .iter()
            .filter(move |g| g.role == role)
    };
    let cluster_binding = |name: &str, role: &str, subjects: Vec<Subject>| ClusterRoleBinding {
        metadata: meta(name, None, labels(RBAC, None)),
        role_ref: cluster_role_ref(role),
        subjects: Some(subjects),
    };
    let owners = subjects(with("cluster-owner"));
    if !owners.is_empty() {
        want.cluster_bindings.push(cluster_binding(
            "drover-cluster-owner",
            "cluster-admin",
            owners,
        ));
    }
    // Members read what readers read (`kubectl get pods -A`); they write per namespace.
    let viewers = subjects(with("read-only").chain(with("cluster-member")));
    if !viewers.is_empty() {
        want.cluster_bindings
            .push(cluster_binding("drover-read-only", "view", viewers.clone()));
        want.cluster_roles.push(ClusterRole {
            metadata: meta(CLUSTER_VIEW, None, labels(RBAC, None)),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["nodes".into(), "namespaces".into()]),
                verbs: vec!["get".into(), "list".into(), "watch".into()],
                ..PolicyRule::default()
            }]),
            ..ClusterRole::default()
        });
        want.cluster_bindings
            .push(cluster_binding(CLUSTER_VIEW, CLUSTER_VIEW, viewers));
    }
    // Each template of the hub's own: one ClusterRole with its rules (and what it inherits),
    // bound once cluster-wide with every subject that holds it, or once in each namespace of
    // each project where someone holds it.
    for template in snapshot.templates.iter().filter(|t| !t.builtin) {
        let name = template_role(&template.name);
        want.cluster_roles.push(ClusterRole {
            metadata: meta(&name, None, labels(RBAC, None)),
            rules: Some(template.rules.iter().map(policy_rule).collect()),
            ..ClusterRole::default()
        });
    }
    for template in defined(snapshot, "cluster") {
        let holders = subjects(
            snapshot
                .cluster_grants
                .iter()
                .filter(|g| g.role == template.name),
        );
        if !holders.is_empty() {
            let name = template_role(&template.name);
            want.cluster_bindings
                .push(cluster_binding(&name, &name, holders));
        }
    }
    let members = subjects(with("cluster-member"));
    for ns in namespaces {
        let name = ns.name_any();
        if ns.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if !members.is_empty() && name != own_namespace {
            want.bindings.push(RoleBinding {
                metadata: meta("drover-cluster-member", Some(&name), labels(RBAC, None)),
                role_ref: cluster_role_ref("edit"),
                subjects: Some(members.clone()),
            });
        }
        let Some(project) = ns
            .labels()
            .get(PROJECT_LABEL)
            .and_then(|p| snapshot.projects.iter().find(|sp| &sp.name == p))
        else {
            continue;
        };
        for (role, binding, cluster_role) in [
            ("project-owner", "drover-project-owner", "admin"),
            ("project-member", "drover-project-member", "edit"),
            ("project-read-only", "drover-project-read-only", "view"),
        ] {
            // A hub of the release before templates called the project's `read-only` so.
            let named = |g: &&Grant| {
                g.role == role || (role == "project-read-only" && g.role == "read-only")
            };
            let subjects = subjects(project.grants.iter().filter(named));
            if !subjects.is_empty() {
                want.bindings.push(RoleBinding {
                    metadata: meta(binding, Some(&name), labels(RBAC, Some(&project.name))),
                    role_ref: cluster_role_ref(cluster_role),
                    subjects: Some(subjects),
                });
            }
        }
        for template in defined(snapshot, "project") {
            let subjects = subjects(project.grants.iter().filter(|g| g.role == template.name));
            if !subjects.is_empty() {
                let role = template_role(&template.name);
                want.bindings.push(RoleBinding {
                    metadata: meta(&role, Some(&name), labels(RBAC, Some(&project.name))),
                    role_ref: cluster_role_ref(&role),
                    subjects: Some(subjects),
                });
            }
        }
        for secret in &project.secrets {
            want.secrets.push(Secret {
                metadata: meta(
                    &secret.name,
                    Some(&name),
                    labels(PROJECT_SECRET, Some(&project.name)),
                ),
                type_: Some(if secret.r#type.is_empty() {
                    "Opaque".to_owned()
                } else {
                    secret.r#type.clone()
                }),
                data: Some(
                    secret
                        .data
                        .iter()
                        .map(|(k, v)| (k.clone(), ByteString(v.clone())))
                        .collect(),
                ),
                ..Secret::default()
            });
        }
    }
    want
}

/// The parts of an object this controller decides; equal parts mean no write.
trait Owned:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug
{
    fn same(&self, other: &Self) -> bool;
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self>;
}

impl Owned for ClusterRoleBinding {
    fn same(&self, other: &Self) -> bool {
        self.role_ref == other.role_ref && self.subjects == other.subjects
    }
    fn api(client: &Client, _: Option<&str>) -> Api<Self> {
        Api::all(client.clone())
    }
}

impl Owned for ClusterRole {
    fn same(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
    fn api(client: &Client, _: Option<&str>) -> Api<Self> {
        Api::all(client.clone())
    }
}

impl Owned for RoleBinding {
    fn same(&self, other: &Self) -> bool {
        self.role_ref == other.role_ref && self.subjects == other.subjects
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self> {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

impl Owned for Secret {
    fn same(&self, other: &Self) -> bool {
        let opaque = |t: &Option<String>| t.clone().unwrap_or_else(|| "Opaque".into());
        opaque(&self.type_) == opaque(&other.type_)
            && self.data.clone().unwrap_or_default() == other.data.clone().unwrap_or_default()
    }
    fn api(client: &Client, namespace: Option<&str>) -> Api<Self> {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

fn key<K: Resource>(object: &K) -> (String, String) {
    (
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// Makes the objects of kind `K` labelled `sync` exactly `wanted`; returns the writes made.
async fn converge<K: Owned>(client: &Client, sync: &str, wanted: Vec<K>) -> Result<usize, String> {
    let listed = K::api(client, None)
        .list(&ListParams::default().labels(&format!("{SYNC_LABEL}={sync}")))
        .await
        .map_err(|e| format!("listing {}: {e}", K::plural(&())))?;
    let mut current: BTreeMap<(String, String), K> =
        listed.items.into_iter().map(|o| (key(&o), o)).collect();
    let mut written = 0;
    for want in wanted {
        let (namespace, name) = key(&want);
        let api = K::api(
            client,
            Some(&namespace)
                .filter(|ns| !ns.is_empty())
                .map(String::as_str),
        );
        match current.remove(&(namespace.clone(), name.clone())) {
            Some(have) if have.same(&want) && have.labels() == want.labels() => {}
            Some(have) => {
                let mut replacement = want;
                replacement.meta_mut().resource_version = have.resource_version();
                api.replace(&name, &PostParams::default(), &replacement)
                    .await
                    .map_err(|e| format!("updating {} {namespace}/{name}: {e}", K::kind(&())))?;
                written += 1;
            }
            None => match api.create(&PostParams::default(), &want).await {
                Ok(_) => written += 1,
                // Someone else's object under this name: never ours to change.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::warn!(kind = %K::kind(&()), namespace, name, "an object not made by Drover has this name; leaving it alone");
                }
                Err(e) => {
                    return Err(format!("creating {} {namespace}/{name}: {e}", K::kind(&())));
                }
            },
        }
    }
    for ((namespace, name), _) in current {
        let api = K::api(
            client,
            Some(&namespace)
                .filter(|ns| !ns.is_empty())
                .map(String::as_str),
        );
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => written += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(format!("deleting {} {namespace}/{name}: {e}", K::kind(&()))),
        }
    }
    Ok(written)
}

/// One pass: read the namespaces, work out what should be, and converge each kind.
async fn reconcile(
    client: &Client,
    own_namespace: &str,
    snapshot: &AccessSnapshot,
) -> Result<usize, String> {
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing namespaces: {e}"))?
        .items;
    let want = desired(snapshot, &namespaces, own_namespace);
    // Roles before the bindings that name them; secrets last.
    let mut written = converge(client, RBAC, want.cluster_roles).await?;
    written += converge(client, RBAC, want.cluster_bindings).await?;
    written += converge(client, RBAC, want.bindings).await?;
    written += converge(client, PROJECT_SECRET, want.secrets).await?;
    // The authorized endpoint: its authenticator's account and role before the DaemonSet;
    // the token copies it reads.
    let endpoint = endpoint::desired(snapshot.endpoint.as_ref(), own_namespace);
    use endpoint::{AUTHENTICATOR, TOKENS};
    written += converge(client, AUTHENTICATOR, endpoint.accounts).await?;
    written += converge(client, AUTHENTICATOR, endpoint.roles).await?;
    written += converge(client, AUTHENTICATOR, endpoint.bindings).await?;
    written += converge(client, AUTHENTICATOR, endpoint.daemon_sets).await?;
    written += converge(client, TOKENS, endpoint.tokens).await?;
    Ok(written)
}

#[cfg(test)]
mod tests;
