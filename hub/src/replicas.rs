//! Several hub replicas on one etcd store: each holds an etcd lease while it lives; one of
//! them leads (holds the `leader` key under its lease) and runs the planner and controllers
//! with writes fenced by that key; every replica records under its lease where each agent of
//! its own is connected, so a dead replica's records expire with it and the others can find
//! an agent's replica to forward a request to. With the SQLite store there is one replica,
//! which always leads.
//!
//! Keys, under the store's prefix: `replicas/<id>` = the replica's URL for its peers,
//! `leader` = the leading replica's id, `sessions/<agent kind>/<cluster|host>/<name>/<agent id
//! in hex>` = the id of the replica the agent is connected to.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use ring::rand::{SecureRandom, SystemRandom};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tunnel::{Registry, SessionEvent, SessionInfo};

use crate::{
    identity::{self, Belongs},
    store::{
        Store, StoreError,
        etcd::{EtcdStore, Fence},
    },
};

/// Seconds a replica's lease lives without renewal: a dead leader is replaced, and its agents'
/// records expire, within this (plus a campaign interval).
pub const LEASE_TTL: i64 = 10;

/// How often a follower tries to become the leader, and the leader checks it still is.
const CAMPAIGN_EVERY: Duration = Duration::from_secs(1);

/// This replica among its peers.
#[derive(Debug)]
pub struct Replicas {
    /// Random per process: a restarted replica is a new one.
    id: String,
    /// Where peers reach this replica.
    url: String,
    etcd: Option<EtcdStore>,
    lease: AtomicI64,
    /// `Some` while this replica leads (with the fence its writes carry in etcd).
    leading: watch::Sender<Option<Lead>>,
}

/// Leadership, as the leader's controllers need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lead {
    /// `None` with a single replica: nothing to fence against.
    pub fence: Option<Fence>,
}

fn random_id() -> String {
    let mut bytes = [0u8; 8];
    let _ = SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

impl Replicas {
    /// The only replica (SQLite store): it leads from the start.
    pub fn single() -> Arc<Self> {
        Arc::new(Self {
            id: random_id(),
            url: String::new(),
            etcd: None,
            lease: AtomicI64::new(0),
            leading: watch::channel(Some(Lead { fence: None })).0,
        })
    }

    /// Joins the replicas on `etcd` as the one peers reach at `url`; keeps its lease, campaigns
    /// for leadership and records its agents' sessions until `shutdown`, then gives the lease
    /// up so its records go at once.
    pub async fn join(
        etcd: EtcdStore,
        url: String,
        registry: Registry,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, StoreError> {
        let replicas = Arc::new(Self {
            id: random_id(),
            url,
            lease: AtomicI64::new(etcd.grant(LEASE_TTL).await?),
            etcd: Some(etcd),
            leading: watch::channel(None).0,
        });
        replicas.announce().await?;
        tracing::info!(replica = %replicas.id, url = %replicas.url, "joined the hub replicas");
        tokio::spawn(replicas.clone().maintain(registry, shutdown));
        Ok(replicas)
    }

    /// Leadership as it changes.
    pub fn leading(&self) -> watch::Receiver<Option<Lead>> {
        self.leading.subscribe()
    }

    /// `store` for the leader's controllers: with etcd, fenced by the leader key.
    pub fn store_for(&self, lead: &Lead, store: Arc<dyn Store>) -> Arc<dyn Store> {
        match (&self.etcd, &lead.fence) {
            (Some(etcd), Some(fence)) => Arc::new(etcd.fenced(fence.clone())),
            _ => store,
        }
    }

    /// Runs `controllers` (given the store to write with and a token cancelled when the lead is
    /// lost) whenever this replica leads, until `shutdown`.
    pub async fn lead<F, Fut>(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        controllers: F,
        shutdown: CancellationToken,
    ) where
        F: Fn(Arc<dyn Store>, CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut leading = self.leading();
        loop {
            let lead = leading.borrow_and_update().clone();
            if let Some(lead) = lead {
                let stop = shutdown.child_token();
                let task = tokio::spawn(controllers(
                    self.store_for(&lead, store.clone()),
                    stop.clone(),
                ));
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    _ = leading.wait_for(|now| now.as_ref() != Some(&lead)) => {}
                }
                stop.cancel();
                let _ = task.await;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    }

    fn lease(&self) -> i64 {
        self.lease.load(Ordering::SeqCst)
    }

    async fn announce(&self) -> Result<(), StoreError> {
        let Some(etcd) = self.etcd.as_ref() else {
            return Ok(());
        };
        etcd.put_raw(
            &etcd.meta_key(&format!("replicas/{}", self.id)),
            &self.url,
            self.lease(),
        )
        .await
    }

    /// The key recording where `info`'s agent is connected, if it is an agent of a cluster or
    /// host.
    fn session_key(etcd: &EtcdStore, info: &SessionInfo) -> Option<String> {
        let (what, name) = match identity::belongs(&info.peer.id)? {
            Belongs::Cluster(c) => ("cluster", c),
            Belongs::Host(h) => ("host", h),
        };
        Some(etcd.meta_key(&format!(
            "sessions/{}/{what}/{name}/{}",
            info.peer.kind,
            hex(&info.peer.id)
        )))
    }

    async fn record(&self, info: &SessionInfo) -> Result<(), StoreError> {
        let Some(etcd) = self.etcd.as_ref() else {
            return Ok(());
        };
        match Self::session_key(etcd, info) {
            Some(key) => etcd.put_raw(&key, &self.id, self.lease()).await,
            None => Ok(()),
        }
    }

    /// Writes this replica's URL and where each of its agents is connected again, and drops
    /// its records of agents no longer here (a disconnect whose record could not be removed
    /// while the store was away): how many it recorded and dropped.
    async fn resync(&self, registry: &Registry) -> Result<(usize, usize), StoreError> {
        let Some(etcd) = self.etcd.as_ref() else {
            return Ok((0, 0));
        };
        self.announce().await?;
        let here: std::collections::HashSet<String> = registry
            .sessions()
            .iter()
            .filter_map(|s| Self::session_key(etcd, s.info()))
            .collect();
        let mut dropped = 0;
        for (key, replica, _) in etcd.list_raw(&etcd.meta_key("sessions/")).await? {
            if replica == self.id && !here.contains(&key) {
                etcd.delete_raw_if(&key, &self.id).await?;
                dropped += 1;
            }
        }
        for session in registry.sessions() {
            self.record(session.info()).await?;
        }
        Ok((here.len(), dropped))
    }

    async fn forget(&self, info: &SessionInfo) -> Result<(), StoreError> {
        let Some(etcd) = self.etcd.as_ref() else {
            return Ok(());
        };
        match Self::session_key(etcd, info) {
            // Only this replica's record: the agent may already be connected to another.
            Some(key) => etcd.delete_raw_if(&key, &self.id).await,
            None => Ok(()),
        }
    }

    /// The URL of another replica an agent of `kind` of `cluster` is connected to (the newest
    /// such connection), if any.
    pub async fn locate(&self, kind: &str, cluster: &str) -> Option<String> {
        let etcd = self.etcd.as_ref()?;
        let prefix = etcd.meta_key(&format!("sessions/{kind}/cluster/{cluster}/"));
        let records = etcd.list_raw(&prefix).await.ok()?;
        let (_, replica, _) = records
            .into_iter()
            .filter(|(_, replica, _)| *replica != self.id)
            .max_by_key(|(_, _, created)| *created)?;
        let (url, _) = etcd
            .get_raw(&etcd.meta_key(&format!("replicas/{replica}")))
            .await
            .ok()??;
        Some(url)
    }

    /// Keeps the lease, campaigns and records sessions until `shutdown`.
    async fn maintain(self: Arc<Self>, registry: Registry, shutdown: CancellationToken) {
        let Some(etcd) = self.etcd.clone() else {
            return;
        };
        let mut events = registry.subscribe();
        let mut campaign = tokio::time::interval(CAMPAIGN_EVERY);
        campaign.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ttl = Duration::from_secs(LEASE_TTL as u64);
        let renew = |lease| etcd.keep_alive(lease, ttl / 3, ttl);
        let keep_alive = renew(self.lease());
        tokio::pin!(keep_alive);
        // Set when a record may be missing or stale (a new lease, a failed record or removal):
        // the records are written again at the next campaign tick until that succeeds.
        // Sessions that connected before this task subscribed are recorded at the first tick.
        let mut resync = !registry.sessions().is_empty();
        // False from the loss of the lease until a new one is granted: the old one is never
        // renewed again (etcd may have kept it through its own outage) and nothing is written
        // under it.
        let mut leased = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                lost = &mut keep_alive, if leased => {
                    // The lease is gone (expired, or no member renewed it for its TTL): so are
                    // the leadership and the session records. Start over with a new lease.
                    tracing::warn!(error = %lost, "this replica's etcd lease was lost; rejoining");
                    self.leading.send_replace(None);
                    leased = false;
                }
                _ = campaign.tick() => {
                    if !leased {
                        match etcd.grant(LEASE_TTL).await {
                            Ok(lease) => {
                                // etcd may have kept the old lease through its own outage
                                // (leases restart their TTL with it): given up, it frees the
                                // lead now rather than a TTL later.
                                etcd.revoke(self.lease.swap(lease, Ordering::SeqCst)).await;
                                tracing::info!(replica = %self.id, lease, "this replica has a new etcd lease");
                                keep_alive.set(renew(lease));
                                leased = true;
                                resync = true;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot get a new etcd lease; retrying in 1 s");
                                continue;
                            }
                        }
                    }
                    if resync {
                        match self.resync(&registry).await {
                            Ok((recorded, dropped)) => {
                                resync = false;
                                tracing::info!(replica = %self.id, url = %self.url, recorded, dropped, "rewrote this replica's address and where its agents are connected, for its peers to forward to");
                            }
                            Err(e) => tracing::warn!(error = %e, "cannot record this replica's address and agents for its peers; retrying in 1 s"),
                        }
                    }
                    self.campaign(&etcd).await;
                }
                event = events.recv() => match event {
                    // Without a lease, recorded with the next one.
                    Ok(SessionEvent::Connected(_) | SessionEvent::Disconnected { .. }) if !leased => resync = true,
                    Ok(SessionEvent::Connected(info)) => {
                        if let Err(e) = self.record(&info).await {
                            tracing::warn!(agent = %info.peer.id, error = %e, "cannot record where an agent is connected; retrying in 1 s");
                            resync = true;
                        }
                    }
                    Ok(SessionEvent::Disconnected { info, .. }) => {
                        let still = registry.sessions().iter().any(|s| s.info().peer.id == info.peer.id);
                        if !still && let Err(e) = self.forget(&info).await {
                            tracing::warn!(agent = %info.peer.id, error = %e, "cannot remove the record of a disconnected agent; retrying in 1 s");
                            resync = true;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => resync = true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        self.leading.send_replace(None);
        etcd.revoke(self.lease()).await;
    }

    /// Becomes the leader if no replica is; notices when this one no longer is.
    async fn campaign(&self, etcd: &EtcdStore) {
        let key = etcd.meta_key("leader");
        let held = self.leading.borrow().clone();
        match held.and_then(|lead| lead.fence) {
            Some(fence) => {
                let still = matches!(etcd.get_raw(&key).await, Ok(Some((ref id, created))) if *id == self.id && created == fence.revision);
                if !still {
                    tracing::warn!(replica = %self.id, "this replica no longer leads");
                    self.leading.send_replace(None);
                }
            }
            None => {
                if let Ok(Some(revision)) = etcd.create_raw(&key, &self.id, self.lease()).await {
                    tracing::info!(replica = %self.id, "this replica leads");
                    self.leading.send_replace(Some(Lead {
                        fence: Some(Fence { key, revision }),
                    }));
                }
            }
        }
    }
}
