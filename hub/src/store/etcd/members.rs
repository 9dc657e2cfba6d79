//! The etcd members the store talks to, as etcd's own clients treat them: every request goes
//! to one member, the current one; a member that cannot be reached is left for the next at
//! once, and the request runs again there when that is safe — a read always, a write only if
//! it cannot have reached etcd (the connection was refused) or etcd refused it before any
//! member took it up (no leader). A write whose answer was lost is never sent again: it may
//! have been applied, and the caller is told so. Every member is also health-checked in the
//! background, so a current member that died is usually left before a request finds out.

use std::{
    future::Future,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use proto::etcd::{
    CompactionRequest, CompactionResponse, MemberListRequest, PutRequest, PutResponse,
    RangeRequest, RangeResponse, TxnRequest, TxnResponse, cluster_client::ClusterClient,
    kv_client::KvClient, lease_client::LeaseClient, request_op, watch_client::WatchClient,
};
use tonic::transport::{Channel, Endpoint};

use super::MAX_MESSAGE;
use crate::store::StoreError;

/// How long a request is tried on one member after another before its error is returned.
const RETRY_FOR: Duration = Duration::from_secs(10);
/// The pause after every member was tried once.
const ROUND_PAUSE: Duration = Duration::from_millis(200);
/// How often every member is health-checked, and how long a check waits for an answer.
pub(super) const HEALTH_EVERY: Duration = Duration::from_secs(2);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// The members, one lazily connected channel each, and which one is current.
#[derive(Debug)]
pub(super) struct Members {
    /// By client address (`HOST:PORT`): those given, then those learnt from the cluster.
    channels: std::sync::RwLock<Vec<(String, Channel)>>,
    current: AtomicUsize,
}

/// A lazily connected channel to the member at `host` (`HOST:PORT`).
fn channel_to(host: &str) -> Result<Channel, StoreError> {
    Ok(Endpoint::from_shared(format!("http://{host}"))
        .map_err(|e| StoreError::Invalid(format!("etcd endpoint {host:?}: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        // A member that stops answering is noticed within seconds, watches included.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// How a failed request ended, as far as the client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// A member answered (a compare failed, a request too large, …): another would say the same.
    Answered,
    /// It never reached a member that could act on it: safe to send again, elsewhere.
    NotTaken,
    /// It may have reached etcd and been applied; the answer did not come back.
    Unknown,
}

/// What `status` says of a failed request.
pub(super) fn ended(status: &tonic::Status) -> Ended {
    let message = status.message();
    match status.code() {
        tonic::Code::Unavailable
            if message.contains("tcp connect error")
                || message.contains("error trying to connect")
                || message.contains("Connection refused")
                || message.contains("no leader") =>
        {
            Ended::NotTaken
        }
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Cancelled
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Internal
            if !message.starts_with("etcdserver: mvcc") =>
        {
            Ended::Unknown
        }
        _ => Ended::Answered,
    }
}

impl Members {
    pub(super) fn new(hosts: &[String]) -> Result<Self, StoreError> {
        let mut channels = Vec::new();
        for host in hosts {
            channels.push((host.clone(), channel_to(host)?));
        }
        Ok(Self {
            channels: std::sync::RwLock::new(channels),
            current: AtomicUsize::new(0),
        })
    }

    /// The members as they are now.
    fn all(&self) -> Vec<(String, Channel)> {
        self.channels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn len(&self) -> usize {
        self.channels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Asks the current member for the cluster's members and adds those not known yet (by
    /// their plain-HTTP client URLs), so a member the hub was not told of serves it too.
    pub(super) async fn learn(&self) {
        let (_, channel) = self.pick();
        let listed = tokio::time::timeout(
            HEALTH_TIMEOUT,
            ClusterClient::new(channel).member_list(MemberListRequest {
                linearizable: false,
            }),
        )
        .await;
        let Ok(Ok(listed)) = listed else {
            return;
        };
        let hosts: Vec<String> = listed
            .into_inner()
            .members
            .into_iter()
            .filter(|m| !m.is_learner)
            .filter_map(|m| {
                m.client_ur_ls.iter().find_map(|u| {
                    u.strip_prefix("http://")
                        .map(|h| h.trim_end_matches('/').to_owned())
                })
            })
            .collect();
        let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
        for host in hosts {
            if channels.iter().any(|(known, _)| *known == host) {
                continue;
            }
            if let Ok(channel) = channel_to(&host) {
                tracing::info!(member = %host, "an etcd member learnt from the cluster");
                channels.push((host, channel));
            }
        }
    }

    /// The current member: its index and channel.
    fn pick(&self) -> (usize, Channel) {
        let channels = self.channels.read().unwrap_or_else(|p| p.into_inner());
        let i = self.current.load(Ordering::Relaxed) % channels.len();
        (i, channels[i].1.clone())
    }

    /// Member `i` could not serve a request: the next becomes current (unless another request
    /// moved on already).
    pub(super) fn lost(&self, i: usize, why: &str) {
        let channels = self.all();
        let next = (i + 1) % channels.len();
        if self
            .current
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && next != i
        {
            tracing::warn!(
                member = %channels[i].0,
                next = %channels[next].0,
                %why,
                "an etcd member cannot serve; using the next"
            );
        }
    }

    /// Asks every member a linearizable read of `key` (answered only by a member in a quorum
    /// with a leader); if the current one does not answer within a second and another does,
    /// that one becomes current — before a request has to find out.
    pub(super) async fn check(&self, key: &[u8]) {
        let channels = self.all();
        let probes = channels.iter().map(|(_, channel)| {
            let mut kv = KvClient::new(channel.clone());
            let request = RangeRequest {
                key: key.to_vec(),
                count_only: true,
                ..RangeRequest::default()
            };
            async move {
                match tokio::time::timeout(HEALTH_TIMEOUT, kv.range(request)).await {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(e.message().to_owned()),
                    Err(_) => Some(format!("no answer within {HEALTH_TIMEOUT:?}")),
                }
            }
        });
        let failed = futures::future::join_all(probes).await;
        let current = self.current.load(Ordering::Relaxed) % channels.len();
        let Some(why) = &failed[current] else {
            return;
        };
        let n = channels.len();
        if let Some(next) = (1..n)
            .map(|k| (current + k) % n)
            .find(|i| failed[*i].is_none())
            && self
                .current
                .compare_exchange(current, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                member = %channels[current].0,
                next = %channels[next].0,
                why = %why,
                "an etcd member fails its health check; using the next"
            );
        }
    }

    /// The member requests go to now (its URL).
    #[cfg(test)]
    pub(super) fn current(&self) -> String {
        let channels = self.all();
        channels[self.current.load(Ordering::Relaxed) % channels.len()]
            .0
            .clone()
    }

    /// The KV service, on the member current at each call.
    pub(super) fn kv(&self) -> Kv<'_> {
        Kv { members: self }
    }

    /// The lease service on the current member, and which one that is (for [`Members::lost`]).
    pub(super) fn lease(&self) -> (usize, LeaseClient<Channel>) {
        let (i, channel) = self.pick();
        (i, LeaseClient::new(channel))
    }

    /// The watch service on the current member, and which one that is.
    pub(super) fn watch(&self) -> (usize, WatchClient<Channel>) {
        let (i, channel) = self.pick();
        (
            i,
            WatchClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
    }

    /// Runs `call` on the current member, and again on the next ones while it may (`write`:
    /// only if it was not taken) for up to [`RETRY_FOR`] — long enough for the members that
    /// stay to elect a leader — pausing after each round of every member.
    async fn run<T, F, Fut>(
        &self,
        write: bool,
        call: F,
    ) -> Result<tonic::Response<T>, tonic::Status>
    where
        F: Fn(KvClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = std::time::Instant::now() + RETRY_FOR;
        let mut last = None;
        for attempt in 1.. {
            if attempt > 1 && (attempt - 1) % self.len() == 0 {
                if std::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(ROUND_PAUSE).await;
            }
            let (i, channel) = self.pick();
            let client = KvClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE);
            let status = match call(client).await {
                Ok(answer) => return Ok(answer),
                Err(status) => status,
            };
            match ended(&status) {
                Ended::Answered => return Err(status),
                Ended::NotTaken => self.lost(i, status.message()),
                Ended::Unknown if !write => self.lost(i, status.message()),
                Ended::Unknown => {
                    self.lost(i, status.message());
                    return Err(tonic::Status::new(
                        status.code(),
                        format!(
                            "{}; {}",
                            status.message(),
                            crate::store::MAY_HAVE_BEEN_APPLIED
                        ),
                    ));
                }
            }
            last = Some(status);
        }
        Err(last.unwrap_or_else(|| tonic::Status::unavailable("no etcd member is configured")))
    }
}

/// The KV calls the store makes, each on the current member with [`Members`]' failover.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kv<'a> {
    members: &'a Members,
}

impl Kv<'_> {
    pub(super) async fn range(
        self,
        request: RangeRequest,
    ) -> Result<tonic::Response<RangeResponse>, tonic::Status> {
        self.members
            .run(false, |mut kv| {
                let request = request.clone();
                async move { kv.range(request).await }
            })
            .await
    }

    pub(super) async fn txn(
        self,
        request: TxnRequest,
    ) -> Result<tonic::Response<TxnResponse>, tonic::Status> {
        let reads_only = request
            .success
            .iter()
            .chain(&request.failure)
            .all(|op| matches!(op.request, Some(request_op::Request::RequestRange(_))));
        self.members
            .run(!reads_only, |mut kv| {
                let request = request.clone();
                async move { kv.txn(request).await }
            })
            .await
    }

    pub(super) async fn put(
        self,
        request: PutRequest,
    ) -> Result<tonic::Response<PutResponse>, tonic::Status> {
        self.members
            .run(true, |mut kv| {
                let request = request.clone();
                async move { kv.put(request).await }
            })
            .await
    }

    pub(super) async fn compact(
        self,
        request: CompactionRequest,
    ) -> Result<tonic::Response<CompactionResponse>, tonic::Status> {
        // Compacting twice to the same revision is harmless: a read as far as retries go.
        self.members
            .run(false, |mut kv| async move { kv.compact(request).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_whether_the_request_may_have_been_applied() {
        let table = [
            (
                tonic::Code::Unavailable,
                "error trying to connect: tcp connect error: Connection refused (os error 111)",
                Ended::NotTaken,
            ),
            (
                tonic::Code::Unavailable,
                "etcdserver: no leader",
                Ended::NotTaken,
            ),
            (
                tonic::Code::Unavailable,
                "error reading a body from connection: connection reset",
                Ended::Unknown,
            ),
            (tonic::Code::Unknown, "transport error", Ended::Unknown),
            (
                tonic::Code::Unavailable,
                "etcdserver: request timed out",
                Ended::Unknown,
            ),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
                Ended::Answered,
            ),
            (
                tonic::Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
                Ended::Answered,
            ),
        ];
        for (code, message, wanted) in table {
            assert_eq!(
                ended(&tonic::Status::new(code, message)),
                wanted,
                "{code:?} {message}"
            );
        }
    }
}

/// Against a real three-member etcd (Debian's `etcd-server`).
#[cfg(test)]
mod cluster_tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize},
    };

    use serde_json::json;

    use crate::store::{Object, Op, Store, etcd::EtcdStore, local_etcd::LocalEtcd};

    /// A current member that dies is left by the background health check, before any request
    /// has to find out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_member_is_left_before_a_request_finds_out() {
        let dir = std::env::temp_dir().join(format!("drover-health-{}", std::process::id()));
        let mut cluster = LocalEtcd::start_cluster(&dir, 3).unwrap();
        let store = EtcdStore::connect(&LocalEtcd::cluster_url(&cluster))
            .await
            .unwrap();
        let dead = store.inner.members.current().to_owned();
        let victim = cluster
            .iter_mut()
            .find(|m| LocalEtcd::cluster_url(std::slice::from_ref(*m)).ends_with(&dead))
            .unwrap();
        victim.kill();
        let killed = std::time::Instant::now();
        // Polled without a request to the store: only the health check can move it.
        while store.inner.members.current() == dead {
            assert!(
                killed.elapsed() < std::time::Duration::from_secs(10),
                "still on {dead} 10 s after it died"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        eprintln!(
            "left the dead member {dead} {:?} after it died, with no request",
            killed.elapsed()
        );
        store.get("Thing", "none").await.unwrap_err();
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Given one member's URL, the store learns the others from the cluster, and carries on
    /// when the one it was given dies.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_members_not_named_are_learnt_from_the_cluster() {
        let dir = std::env::temp_dir().join(format!("drover-learn-{}", std::process::id()));
        let mut cluster = LocalEtcd::start_cluster(&dir, 3).unwrap();
        let store = EtcdStore::connect(&LocalEtcd::cluster_url(&cluster[..1]))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        while store.inner.members.len() < 3 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "the other members were not learnt"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        cluster[0].kill();
        let made = Object::new("Thing", "after", json!({}));
        store.transact(vec![Op::Create(made)]).await.unwrap();
        store.get("Thing", "after").await.unwrap();
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Each member killed in turn (quorum kept) while a client writes and reads through the
    /// store without pause: no request fails beyond the one in flight at each kill, and every
    /// acknowledged write is there afterwards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn losing_a_member_while_quorum_holds_costs_no_request() {
        let dir = std::env::temp_dir().join(format!("drover-members-{}", std::process::id()));
        let mut cluster = LocalEtcd::start_cluster(&dir, 3).unwrap();
        let store = EtcdStore::connect(&LocalEtcd::cluster_url(&cluster))
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (store, stop, failed) = (store.clone(), stop.clone(), failed.clone());
            tokio::spawn(async move {
                let mut written = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let name = format!("t-{i}");
                    let made = Object::new("Thing", &name, json!({"n": i}));
                    match store.transact(vec![Op::Create(made)]).await {
                        Ok(_) => written.push(name.clone()),
                        Err(e) => {
                            eprintln!("write {name}: {e}");
                            failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    if let Err(e) = store.get("Thing", &name).await
                        && written.last() == Some(&name)
                    {
                        eprintln!("read {name}: {e}");
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                written
            })
        };
        for victim in &mut cluster {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            victim.kill();
            // Longer than a leader election takes.
            tokio::time::sleep(std::time::Duration::from_secs(4)).await;
            tokio::task::block_in_place(|| victim.restart()).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = writer.await.unwrap();
        let failed = failed.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "{} writes acknowledged, {failed} requests failed, with each of 3 members killed in turn",
            written.len()
        );
        assert!(failed <= cluster.len(), "{failed} requests failed");
        for name in &written {
            store.get("Thing", name).await.unwrap();
        }
        drop(cluster);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
