//! Agents and the hub: a registration token is exchanged once (`POST /v3/register`) for a
//! credential of the agent's own; the tunnel accepts only such credentials, so a registration
//! token can be rotated or revoked without touching installed agents, and revoking one agent's
//! credential ends its session within a moment. Connected agents show on their Cluster or Host
//! as condition `Connected`.

use std::{collections::HashSet, sync::Arc};

use axum::{
    Json,
    extract::State,
    http::{HeaderMap, StatusCode},
};
use futures::StreamExt;

use proto::register::{RegisterReply, RegisterRequest};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tunnel::{
    AuthError as TunnelAuthError, AuthFuture, Authenticated, Peer, Registry, SessionEvent,
};

use crate::{
    api::{error::ApiError, state::Api},
    auth::secret::{self, TokenKind},
    identity::{Belongs, CLUSTER_AGENT, SYSTEM_AGENT, belongs, caller_of, cluster_agent_id},
    model::update_status,
    model::{AgentRef, ClusterType, Kind},
    store::{LabelSelector, Object, Op, Store, StoreError},
};

/// Whether a session may claim `claimed` under a credential issued for `issued`: the same id,
/// or (for the agents that run several copies) the issued id followed by `/name`.
fn covers(issued: &str, claimed: &str) -> bool {
    claimed == issued
        || claimed
            .strip_prefix(issued)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
}

/// The tunnel's authenticator: the bearer must be an agent credential that covers the claimed
/// identity and kind.
pub fn authenticator(
    store: Arc<dyn Store>,
) -> impl Fn(&http::request::Parts) -> AuthFuture + Send + Sync + 'static {
    move |parts| {
        let store = store.clone();
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let value = tunnel::bearer_token(&parts.headers).map(str::to_owned);
        let (claimed_id, claimed_kind) = (
            header(tunnel::AGENT_ID_HEADER),
            header(tunnel::AGENT_KIND_HEADER),
        );
        Box::pin(async move {
            let refuse = |m: &str| Err(TunnelAuthError(m.to_owned()));
            let Some(value) = value else {
                return refuse("send the agent's credential as Authorization: Bearer");
            };
            match secret::parse_token(&value) {
                Some((TokenKind::Registration, ..)) => refuse(
                    "a registration token cannot open a tunnel; exchange it for the agent's credential at POST /v3/register first",
                ),
                Some((TokenKind::Token, name, token_secret)) => {
                    let token = match store.get(Kind::Token.name(), name).await {
                        Ok(t) => t,
                        Err(StoreError::NotFound { .. }) => {
                            return refuse(
                                "unknown or revoked agent credential; register the agent again",
                            );
                        }
                        Err(e) => {
                            return refuse(&format!(
                                "the hub cannot check credentials right now: {e}"
                            ));
                        }
                    };
                    if !secret::opens(&token, token_secret) {
                        return refuse(
                            "unknown or revoked agent credential; register the agent again",
                        );
                    }
                    let Some(agent) = token
                        .spec
                        .get("agent")
                        .and_then(|a| serde_json::from_value::<AgentRef>(a.clone()).ok())
                    else {
                        return refuse("this is a user's token, not an agent credential");
                    };
                    // Issued for a cluster (and host) that still exist as those very objects:
                    // not for a deleted one whose name was given to a new one.
                    match crate::refs::Liveness::new(store.as_ref())
                        .live(&token)
                        .await
                    {
                        Ok(true) => {}
                        Ok(false) => {
                            return refuse(
                                "unknown or revoked agent credential (its cluster or host is gone); register the agent again",
                            );
                        }
                        Err(e) => {
                            return refuse(&format!(
                                "the hub cannot check credentials right now: {e}"
                            ));
                        }
                    }
                    if agent.kind != claimed_kind || !covers(&agent.id, &claimed_id) {
                        return refuse(&format!(
                            "this credential is for a {} with identity {}, not a {claimed_kind} with identity {claimed_id}",
                            agent.kind, agent.id
                        ));
                    }
                    Ok(Authenticated {
                        peer: Peer {
                            id: claimed_id,
                            kind: claimed_kind,
                        },
                        credential: Some(name.into()),
                    })
                }
                None => refuse("malformed agent credential"),
            }
        })
    }
}

/// The header with which a registered host proves itself when it registers again.
pub const HOST_CREDENTIAL_HEADER: &str = "x-drover-host-credential";

/// The annotation on a Host naming the Token its system-agent was last issued.
pub const CREDENTIAL_ANNOTATION: &str = "drover.io/credential";

/// The credential a host's system-agent was last issued, if it is still stored (and is that
/// host's: the annotation is not taken on trust).
pub(crate) async fn host_credential(
    store: &dyn Store,
    host: &Object,
) -> Result<Option<Object>, StoreError> {
    let Some(name) = host.metadata.annotations.get(CREDENTIAL_ANNOTATION) else {
        return Ok(None);
    };
    let id = format!("host/{}", host.metadata.name);
    match store.get(Kind::Token.name(), name).await {
        Ok(token) if token.spec.pointer("/agent/id").and_then(Value::as_str) == Some(&id) => {
            Ok(Some(token))
        }
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `POST /v3/register`: registration token in, agent credential and identity out.
pub async fn register(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Result<Json<RegisterRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<RegisterReply>), ApiError> {
    let Json(request) =
        body.map_err(|e| ApiError::bad_request(format!("registration body: {e}")))?;
    let value = tunnel::bearer_token(&headers).unwrap_or_default();
    let (cluster_name, cluster_spec) = crate::registration::verify(&api, value).await?;

    let credential = secret::new_token(TokenKind::Token);
    let mut ops = Vec::new();
    let id = match request.kind.as_str() {
        SYSTEM_AGENT => {
            if cluster_spec.cluster_type != ClusterType::Custom {
                return Err(ApiError::invalid(format!(
                    "cluster {cluster_name:?} is imported; system-agents register only to custom clusters"
                )));
            }
            let host_id = request.host_id.clone().unwrap_or_default();
            if host_id.len() < 8
                || !host_id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
            {
                return Err(ApiError::invalid(
                    "hostId: the host's stable id (8 or more letters, digits or '-') is required",
                ));
            }
            let host_name = format!(
                "h-{}",
                host_id
                    .to_ascii_lowercase()
                    .chars()
                    .take(20)
                    .collect::<String>()
            );
            let host = request.host.unwrap_or_default();
            let spec = json!({
                "cluster": cluster_name,
                "roles": host.roles,
                "nodeName": host.node_name,
                "address": host.address,
                "internalAddress": host.internal_address,
                "nodeLabels": host.node_labels,
                "taints": host.taints,
            });
            let spec = Kind::Host.validate_spec(&spec).map_err(ApiError::invalid)?;
            let id = format!("host/{host_name}");
            // One credential per host: the earlier one goes. The host names its credential, so
            // this is a lookup, not a scan of every credential (quadratic over a fleet).
            match api.store.get(Kind::Host.name(), &host_name).await {
                // A host registers once. Registering it again (to replace a lost credential)
                // takes the credential it holds now: a registration token alone, which every
                // installer of the cluster carries, must not take over a registered host, and
                // no token moves a host to another cluster.
                Ok(mut existing) => {
                    let taken = |why: &str| {
                        ApiError::new(
                            StatusCode::CONFLICT,
                            "Conflict",
                            format!(
                                "host {host_name} is already registered{why}; an admin or the cluster's owner deletes Host {host_name} first (DELETE /v1/hosts/{host_name}; it runs its uninstall plan), then install again"
                            ),
                        )
                    };
                    let same_cluster = existing.spec.get("cluster").and_then(Value::as_str)
                        == Some(cluster_name.as_str())
                        && crate::refs::Liveness::new(api.store.as_ref())
                            .live(&existing)
                            .await?;
                    if !same_cluster {
                        return Err(taken(" to another cluster"));
                    }
                    let earlier = host_credential(api.store.as_ref(), &existing).await?;
                    let presented = headers
                        .get(HOST_CREDENTIAL_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(secret::parse_token);
                    let proven = match (&earlier, presented) {
                        (Some(token), Some((TokenKind::Token, name, token_secret))) => {
                            token.metadata.name == name && secret::opens(token, token_secret)
                        }
                        _ => false,
                    };
                    if !proven {
                        return Err(taken(&format!(
                            " and this request does not carry its credential ({HOST_CREDENTIAL_HEADER})"
                        )));
                    }
                    if let Some(token) = earlier {
                        ops.push(Op::Delete {
                            kind: Kind::Token.name().into(),
                            name: token.metadata.name,
                            resource_version: None,
                        });
                    }
                    existing.spec = spec;
                    existing
                        .metadata
                        .annotations
                        .insert(CREDENTIAL_ANNOTATION.into(), credential.name.clone());
                    ops.push(Op::Update(existing));
                }
                Err(StoreError::NotFound { .. }) => {
                    let mut host = Object::new(Kind::Host.name(), &host_name, spec);
                    host.metadata
                        .annotations
                        .insert(CREDENTIAL_ANNOTATION.into(), credential.name.clone());
                    ops.push(Op::Create(host));
                }
                Err(e) => return Err(e.into()),
            }
            id
        }
        other => cluster_agent_id(other, &cluster_name).ok_or_else(|| {
            ApiError::invalid(format!(
                "kind: {other:?} is not an agent kind (cluster-agent, node-agent, system-agent)"
            ))
        })?,
    };
    ops.push(Op::Create(Object::new(
        Kind::Token.name(),
        &credential.name,
        json!({
            "agent": {"kind": request.kind, "id": id, "cluster": cluster_name},
            "description": format!("{} credential", request.kind),
            "secretHash": credential.hash,
        }),
    )));
    crate::refs::stamp_all(api.store.as_ref(), &mut ops).await?;
    api.store.transact(ops).await?;
    tracing::info!(kind = %request.kind, %id, cluster = %cluster_name, "agent registered");
    Ok((
        StatusCode::CREATED,
        Json(RegisterReply {
            credential: credential.value,
            id,
            cluster: cluster_name,
        }),
    ))
}

/// Keeps each Cluster's and Host's `Connected` condition true to the registry, and ends the
/// session of any agent whose credential is revoked. Runs until `shutdown`.
pub async fn run_controllers(
    store: Arc<dyn Store>,
    registry: Registry,
    health: Arc<crate::health::Health>,
    shutdown: CancellationToken,
) {
    tokio::join!(
        connected_conditions(store.clone(), registry.clone(), health, shutdown.clone()),
        revocations(store, registry, shutdown),
    );
}

/// Writes of `Connected` conditions in flight at once: a fleet reconnecting together is
/// thousands of them, and SQLite commits writers that wait together in one transaction.
/// (256 were tried, with the store's single committer: a hub restarted under 10,000
/// system-agents then held about 1 KiB more per agent, 19.7-20.3 KiB against 18.6-19.6, and
/// connected them no faster that could be told from noise.)
const CONDITION_WRITERS: usize = 16;

async fn connected_conditions(
    store: Arc<dyn Store>,
    registry: Registry,
    health: Arc<crate::health::Health>,
    shutdown: CancellationToken,
) {
    let mut events = registry.subscribe();
    // Clusters and hosts whose condition is to be brought in line with the registry, with why
    // their agent's last session ended (if one did). Events for one target coalesce, so the
    // loop keeps up with the registry however slow the store is.
    let mut dirty: std::collections::HashMap<Belongs, Option<String>> = Default::default();
    let mut writing = tokio::task::JoinSet::new();
    loop {
        while writing.len() < CONDITION_WRITERS {
            let Some(target) = dirty.keys().next().cloned() else {
                break;
            };
            let reason = dirty.remove(&target).flatten();
            let (store, registry) = (store.clone(), registry.clone());
            writing
                .spawn(async move { record_connected(&*store, &registry, target, reason).await });
        }
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            Some(_) = writing.join_next(), if !writing.is_empty() => continue,
            event = events.recv() => event,
        };
        let (info, reason) = match event {
            Ok(SessionEvent::Connected(info)) => (info, None),
            Ok(SessionEvent::Disconnected { info, reason }) => (info, Some(reason)),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                // Events were lost: every live session counts as connected again.
                for session in registry.sessions() {
                    let info = session.info();
                    health.connected(info).await;
                    if let Some(target) = condition_target(info) {
                        dirty.entry(target).or_insert(None);
                    }
                }
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        match &reason {
            None => health.connected(&info).await,
            Some(reason) => {
                health.disconnected(&info, reason, registry.get(&info.peer.id).is_some());
            }
        }
        if let Some(target) = condition_target(&info) {
            let last = dirty.entry(target).or_insert(None);
            if reason.is_some() {
                *last = reason;
            }
        }
    }
}

/// The Cluster or Host whose `Connected` condition a session of this agent counts for.
fn condition_target(info: &tunnel::SessionInfo) -> Option<Belongs> {
    match belongs(&info.peer.id)? {
        target @ Belongs::Cluster(_) if info.peer.kind == CLUSTER_AGENT => Some(target),
        target @ Belongs::Host(_) if info.peer.kind == SYSTEM_AGENT => Some(target),
        _ => None,
    }
}

/// Sets `target`'s `Connected` condition from the registry as it is when written (another copy
/// of the agent may still be connected), with `reason` if its last session ended.
async fn record_connected(
    store: &dyn Store,
    registry: &Registry,
    target: Belongs,
    reason: Option<String>,
) {
    let (kind, name, agent, home) = match &target {
        Belongs::Cluster(c) => (Kind::Cluster, c, CLUSTER_AGENT, format!("cluster/{c}")),
        Belongs::Host(h) => (Kind::Host, h, SYSTEM_AGENT, format!("host/{h}")),
    };
    // Looks at this agent's copies only, not every session: a fleet connecting at once would
    // make a scan quadratic.
    let registry = registry.clone();
    let written = update_status(store, kind, name, move |status| {
        if registry.any_of(&home, |s| s.peer.kind == agent) {
            let message = format!("{agent} connected");
            status.set_condition("Connected", true, "AgentConnected", &message);
        } else {
            let why = reason.as_deref().unwrap_or("its session ended");
            let message = format!("{agent} disconnected: {why}");
            status.set_condition("Connected", false, "Disconnected", &message);
        }
    })
    .await;
    if let Err(e) = written {
        tracing::warn!(%name, error = %e, "cannot record the agent's connection");
    }
}

/// The gRPC service cluster-agents report their cluster's facts to (on the control channel).
#[derive(Debug, Clone)]
pub struct FactsService {
    pub store: Arc<dyn Store>,
    /// Every cluster's bundle deployments, for their agents' streams and chunk checks.
    pub bundles: Arc<crate::delivery::index::Index>,
    /// What wakes the agents' access streams.
    pub access: Arc<crate::access::Changes>,
}

/// The cluster of the cluster-agent whose session `request` came on; no other agent may
/// report a cluster's facts or follow its access.
fn cluster_agent_of<T>(request: &tonic::Request<T>) -> Result<String, tonic::Status> {
    match caller_of(request)? {
        (kind, Some(Belongs::Cluster(cluster))) if kind == CLUSTER_AGENT => Ok(cluster),
        _ => Err(tonic::Status::permission_denied(
            "only cluster-agents report cluster facts and follow its access and bundles",
        )),
    }
}

#[tonic::async_trait]
impl proto::cluster::v1::cluster_agent_server::ClusterAgent for FactsService {
    type WatchAccessStream = crate::access::Snapshots;
    type WatchBundlesStream = crate::delivery::follow::Snapshots;

    async fn watch_bundles(
        &self,
        request: tonic::Request<proto::cluster::v1::WatchBundlesRequest>,
    ) -> Result<tonic::Response<Self::WatchBundlesStream>, tonic::Status> {
        let cluster = cluster_agent_of(&request)?;
        Ok(tonic::Response::new(crate::delivery::follow::follow(
            self.bundles.clone(),
            cluster,
        )))
    }

    async fn get_chunk(
        &self,
        request: tonic::Request<proto::cluster::v1::ChunkRequest>,
    ) -> Result<tonic::Response<proto::cluster::v1::Chunk>, tonic::Status> {
        let cluster = cluster_agent_of(&request)?;
        let digest = request.into_inner().digest;
        let data =
            crate::delivery::follow::chunk(self.store.as_ref(), &self.bundles, &cluster, &digest)
                .await?;
        Ok(tonic::Response::new(proto::cluster::v1::Chunk { data }))
    }

    async fn report_bundle(
        &self,
        request: tonic::Request<proto::cluster::v1::BundleReport>,
    ) -> Result<tonic::Response<proto::cluster::v1::BundleAck>, tonic::Status> {
        let cluster = cluster_agent_of(&request)?;
        crate::delivery::follow::report(self.store.as_ref(), &cluster, request.into_inner())
            .await?;
        Ok(tonic::Response::new(proto::cluster::v1::BundleAck {}))
    }

    async fn watch_access(
        &self,
        request: tonic::Request<proto::cluster::v1::WatchAccessRequest>,
    ) -> Result<tonic::Response<Self::WatchAccessStream>, tonic::Status> {
        let cluster = cluster_agent_of(&request)?;
        Ok(tonic::Response::new(crate::access::follow(
            self.store.clone(),
            &self.access,
            cluster,
        )))
    }

    async fn report_facts(
        &self,
        request: tonic::Request<proto::cluster::v1::ClusterFacts>,
    ) -> Result<tonic::Response<proto::cluster::v1::FactsAck>, tonic::Status> {
        let cluster = cluster_agent_of(&request)?;
        let facts = request.into_inner();
        update_status(
            self.store.as_ref(),
            Kind::Cluster,
            &cluster,
            move |status| {
                status
                    .extra
                    .insert("kubernetesVersion".into(), json!(facts.kubernetes_version));
                status.extra.insert(
                    "nodes".into(),
                    json!({"total": facts.nodes_total, "ready": facts.nodes_ready}),
                );
                status.extra.insert(
                "capacity".into(),
                json!({"cpuMillicores": facts.cpu_millicores, "memoryBytes": facts.memory_bytes}),
            );
                // Shown beside the agent's connection (an agent older than the field sends none).
                if !facts.agent_version.is_empty() {
                    status
                        .extra
                        .insert("agentVersion".into(), json!(facts.agent_version));
                }
                // The cluster's own CA, for the authorized endpoint's kubeconfig contexts.
                if !facts.ca_pem.is_empty() {
                    status
                        .extra
                        .insert("apiServerCA".into(), json!(facts.ca_pem));
                }
                // The cluster is only as well as its nodes: one not ready makes it `unavailable`.
                if facts.nodes_ready >= facts.nodes_total {
                    status.set_condition("NodesReady", true, "NodesReady", "");
                } else {
                    status.set_condition(
                        "NodesReady",
                        false,
                        "NodesNotReady",
                        &format!(
                            "{} of {} nodes are ready",
                            facts.nodes_ready, facts.nodes_total
                        ),
                    );
                }
            },
        )
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        Ok(tonic::Response::new(proto::cluster::v1::FactsAck {}))
    }
}

async fn revocations(store: Arc<dyn Store>, registry: Registry, shutdown: CancellationToken) {
    // Whether the watch is started again after it fell behind (or failed): deletions in the
    // gap were missed, so the stored credentials are compared with the sessions.
    let mut again = false;
    let mut following = crate::store::Following::new("credential revocations");
    loop {
        // Only deletions matter: the watch starts now, without replaying every credential.
        let (watch, now) = match store.revision().await {
            Ok(now) => (store.watch(Some(Kind::Token.name()), Some(now)).await, now),
            Err(e) => (Err(e), 0),
        };
        let swept = match watch {
            // Listed after the watch starts: a deletion is in the list or in the watch.
            Ok(w) if again => sweep(store.as_ref(), &registry).await.map(|()| w),
            other => other,
        };
        again = true;
        let mut watch = match swept {
            Ok(w) => w,
            Err(e) => {
                following.broke(Some(&e));
                tracing::warn!(error = %e, "cannot watch credentials; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        following.resumed(now);
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = watch.next() => event,
            };
            match event {
                // Users' tokens (login sessions expire all day) open no session: no pass over
                // every session for them.
                Some(Ok(event))
                    if event.kind == crate::store::EventType::Deleted
                        && event.object.spec.get("agent").is_some() =>
                {
                    // The sessions this very credential opened: not those of another
                    // credential for the same agent (one issued when it registered again).
                    let name = event.object.metadata.name.as_str();
                    for session in registry.sessions() {
                        if session.info().credential.as_deref() == Some(name) {
                            tracing::info!(peer = %session.info().peer.id, "credential revoked; closing its session");
                            session.close();
                        }
                    }
                }
                Some(Ok(_)) => {}
                // Fell behind or the store hiccuped: watch again from the current state.
                end => {
                    following.broke(end.and_then(Result::err).as_ref());
                    break;
                }
            }
        }
    }
}

/// Closes the sessions whose own credential is no longer stored (whatever other credentials
/// the same agent holds).
async fn sweep(store: &dyn Store, registry: &Registry) -> Result<(), StoreError> {
    let (credentials, _) = store
        .list(Kind::Token.name(), &LabelSelector::everything())
        .await?;
    let stored: HashSet<&str> = credentials
        .iter()
        .map(|c| c.metadata.name.as_str())
        .collect();
    for session in registry.sessions() {
        let info = session.info();
        if info
            .credential
            .as_deref()
            .is_some_and(|name| !stored.contains(name))
        {
            tracing::info!(peer = %info.peer.id, "credential revoked while the revocation watch was behind; closing its session");
            session.close();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose first watch falls behind at once, as a watch does under a burst.
    #[derive(Debug)]
    struct BehindOnce {
        inner: Arc<dyn Store>,
        fell_behind: std::sync::atomic::AtomicBool,
    }

    impl Store for BehindOnce {
        fn get(
            &self,
            kind: &str,
            name: &str,
        ) -> crate::store::BoxFuture<'_, Result<Object, StoreError>> {
            self.inner.get(kind, name)
        }

        fn list(
            &self,
            kind: &str,
            selector: &LabelSelector,
        ) -> crate::store::BoxFuture<'_, Result<(Vec<Object>, u64), StoreError>> {
            self.inner.list(kind, selector)
        }

        fn transact(
            &self,
            ops: Vec<Op>,
        ) -> crate::store::BoxFuture<'_, Result<Vec<Object>, StoreError>> {
            self.inner.transact(ops)
        }

        fn watch(
            &self,
            kind: Option<&str>,
            from: Option<u64>,
        ) -> crate::store::BoxFuture<'_, Result<crate::store::WatchStream, StoreError>> {
            if self
                .fell_behind
                .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                return self.inner.watch(kind, from);
            }
            let gone = StoreError::Gone {
                requested: from.unwrap_or_default(),
                oldest: from.unwrap_or_default() + 1,
            };
            let stream: crate::store::WatchStream = Box::pin(futures::stream::iter([Err(gone)]));
            Box::pin(async move { Ok(stream) })
        }

        fn revision(&self) -> crate::store::BoxFuture<'_, Result<u64, StoreError>> {
            self.inner.revision()
        }
    }

    /// Revoking a credential closes the sessions it opened, and no other: not those of
    /// another credential the same agent holds (as after it registered again). Both when the
    /// deletion is seen by the watch and when it went while the watch was behind.
    #[tokio::test]
    async fn revoking_a_credential_closes_exactly_the_sessions_it_opened() {
        use tunnel::testing::{KIND, TestHub, agent_config};
        let sqlite =
            crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap();
        let inner: Arc<dyn Store> = Arc::new(sqlite);
        // Two credentials for cluster a's agent and for b's; one for c's.
        let mut ops: Vec<Op> = ["a", "b", "c"]
            .into_iter()
            .map(|c| Op::Create(Object::new("Cluster", c, json!({}))))
            .collect();
        let mut credentials = Vec::new();
        for cluster in ["a", "a", "b", "b", "c"] {
            let token = secret::new_token(TokenKind::Token);
            let agent =
                json!({"kind": KIND, "id": format!("cluster/{cluster}"), "cluster": cluster});
            ops.push(Op::Create(Object::new(
                "Token",
                &token.name,
                json!({"secretHash": token.hash, "agent": agent}),
            )));
            credentials.push(token);
        }
        crate::refs::stamp_all(inner.as_ref(), &mut ops)
            .await
            .unwrap();
        inner.transact(ops).await.unwrap();
        let [a_used, _a_other, b_used, b_other, c_used] = credentials.as_slice() else {
            unreachable!()
        };
        let store: Arc<dyn Store> = Arc::new(BehindOnce {
            inner: inner.clone(),
            fell_behind: std::sync::atomic::AtomicBool::new(false),
        });
        let hub = TestHub::start_with(
            "127.0.0.1:0".parse().unwrap(),
            tunnel::AcceptorConfig::default(),
            authenticator(store.clone()),
        )
        .await;
        let connect = |id: &str, credential: &secret::NewToken| {
            let mut config = agent_config(&hub, id);
            config.credential = tunnel::Secret::new(credential.value.clone());
            async move {
                tunnel::Connector::new(config)
                    .unwrap()
                    .connect()
                    .await
                    .unwrap()
            }
        };
        let a = connect("cluster/a", a_used).await;
        let b = connect("cluster/b", b_used).await;
        let c = connect("cluster/c", c_used).await;
        for id in ["cluster/a", "cluster/b", "cluster/c"] {
            hub.session(id).await;
        }
        let delete = |token: &secret::NewToken| {
            let (inner, name) = (inner.clone(), token.name.clone());
            async move { inner.delete("Token", &name, None).await.unwrap() }
        };
        // Bounded, so that a hub that never closes a session fails here rather than hangs.
        let ends = |agent: &tunnel::AgentSession| {
            let session = agent.session.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_secs(30), session.ended())
                    .await
                    .is_ok()
            }
        };

        // While the watch is behind (before it runs, and its first attempt falls behind):
        // `cluster/a`'s credential in use goes, its other one stays.
        delete(a_used).await;
        let shutdown = CancellationToken::new();
        let controller = tokio::spawn(revocations(store, hub.registry.clone(), shutdown.clone()));
        assert!(
            ends(&a).await,
            "the session of the revoked credential is still open after 30 s"
        );
        assert!(!b.session.is_ended() && !c.session.is_ended());

        // The watch runs again (it started before the sweep that closed `a`): `cluster/b`'s
        // unused credential goes, then `cluster/c`'s in use. The watch sees them in that order,
        // so once `c` is closed the first deletion has been handled too.
        delete(b_other).await;
        delete(c_used).await;
        assert!(
            ends(&c).await,
            "the session of the revoked credential is still open after 30 s"
        );
        assert!(!b.session.is_ended());
        assert!(hub.registry.get("cluster/b").is_some());

        shutdown.cancel();
        controller.await.unwrap();
        b.session.close();
        hub.stop().await;
    }

    #[test]
    fn identities_map_to_what_they_belong_to() {
        assert_eq!(
            belongs("cluster/prod"),
            Some(Belongs::Cluster("prod".into()))
        );
        assert_eq!(
            belongs("cluster/prod/pod-1"),
            Some(Belongs::Cluster("prod".into()))
        );
        assert_eq!(
            belongs("node/prod/n1"),
            Some(Belongs::Cluster("prod".into()))
        );
        assert_eq!(belongs("host/h-abc"), Some(Belongs::Host("h-abc".into())));
        assert_eq!(belongs("cluster/"), None);
        assert_eq!(belongs("other/x"), None);
    }

    #[test]
    fn a_credential_covers_its_id_and_named_copies_only() {
        assert!(covers("cluster/a", "cluster/a"));
        assert!(covers("cluster/a", "cluster/a/pod-1"));
        assert!(!covers("cluster/a", "cluster/ab"));
        assert!(!covers("cluster/a", "cluster/a/"));
        assert!(!covers("cluster/a", "cluster/b"));
    }
}
