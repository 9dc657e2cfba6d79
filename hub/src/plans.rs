//! Plan delivery and plan status. One watch on the store's Plans keeps, per host and slot (the
//! host's plan, and its task: a one-time operation beside the plan), the current plan and its
//! checksum; each connected system-agent follows its host's entries, with `WatchPlan` session
//! messages (the dispatch sends each change on the session itself) or, where either end takes
//! no messages, over the `Watch` stream, so a plan reaches its host the moment it is written
//! (and again on every reconnect). Agents
//! report status with `Report`; the hub acknowledges a status only once it is stored, on the
//! Plan (`status`) and, for the host's plan, on the Host (condition `Provisioned`).

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt};
use prost::Message as _;
use proto::plan::v1::{
    DownloadRequest, FileChunk, Plan, PlanDelivery, PlanState, PlanStatus, StatusAck, UploadAck,
    WatchPlan, checksum, plans_server,
};
use proto::session::v1::{HubMessage, hub_message::Body};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tunnel::{Messenger, SessionInfo};

mod files;

pub use files::DIR as FILES_DIR;

use crate::{
    identity::{Belongs, SYSTEM_AGENT, belongs, caller_of},
    model::{self, Kind, Status, parse_plan},
    store::{EventType, LabelSelector, Object, Store, StoreError},
};

/// A host's current plan as pushed.
#[derive(Debug, PartialEq)]
pub struct Pushed {
    pub checksum: String,
    pub plan: Plan,
}

type Current = Option<Arc<Pushed>>;

/// Largest plan delivery sent as a session message, encoded: its base64 must fit well inside
/// an agent's largest WebSocket message (1 MiB). A larger plan is announced without its body
/// and taken with the `Watch` call.
const MAX_PLAN_MESSAGE: usize = 512 * 1024;

/// Every host's current plan, kept from one watch on the store.
#[derive(Debug)]
pub struct Dispatch {
    /// By [`slot_key`].
    slots: Mutex<HashMap<String, Slot>>,
    /// True once the store's plans have been read: followers are told of them, and `Watch`
    /// calls wait on it. Set and read with `slots` locked, so that a follower is told once.
    ready: watch::Sender<bool>,
    /// The plans in `slots` by checksum, so that hosts given the same plan (a pool's hosts,
    /// a fleet-wide change) share one copy of it.
    plans: Mutex<Interned>,
}

/// Plans by checksum (sha256: equal checksums are equal plans), held weakly: a plan goes when
/// the last slot lets it go, and its entry at the next sweep.
#[derive(Debug, Default)]
struct Interned {
    by_checksum: HashMap<String, std::sync::Weak<Pushed>>,
    /// Entries after the last sweep; the next comes when there are twice as many, so sweeping
    /// costs a constant per plan taken.
    swept: usize,
}

impl Interned {
    fn get(&mut self, plan: Plan) -> Arc<Pushed> {
        let checksum = checksum(&plan);
        if let Some(shared) = self.by_checksum.get(&checksum).and_then(|w| w.upgrade()) {
            return shared;
        }
        if self.by_checksum.len() >= 2 * self.swept.max(64) {
            self.by_checksum.retain(|_, w| w.strong_count() > 0);
            self.swept = self.by_checksum.len();
        }
        let pushed = Arc::new(Pushed { checksum, plan });
        self.by_checksum
            .insert(pushed.checksum.clone(), Arc::downgrade(&pushed));
        pushed
    }
}

/// One host's slot: its plan and who follows it.
#[derive(Debug, Default)]
struct Slot {
    current: Current,
    /// The session following it with messages (the newest, when a reconnect overlaps).
    follower: Option<Follower>,
    /// For `Watch` calls (agents that follow with calls), made when the first is.
    calls: Option<watch::Sender<Current>>,
}

#[derive(Debug)]
struct Follower {
    session: u64,
    slot: String,
    messenger: Messenger,
}

impl Follower {
    /// Sends `current`; a follower whose session has ended (or ends now, not reading) is dropped.
    fn tell(&self, current: &Current) -> bool {
        let message = delivery_message(&self.slot, current).encode_to_vec();
        self.messenger.send(message).is_ok()
    }
}

/// The message that delivers `current` on `slot`.
fn delivery_message(slot: &str, current: &Current) -> HubMessage {
    let mut delivery = match current.as_deref() {
        Some(p) => PlanDelivery {
            checksum: p.checksum.clone(),
            plan: Some(p.plan.clone()),
            ..PlanDelivery::default()
        },
        None => PlanDelivery::default(),
    };
    delivery.slot = slot.to_owned();
    if delivery.encoded_len() > MAX_PLAN_MESSAGE {
        delivery.plan = None;
        delivery.too_large = true;
    }
    HubMessage {
        body: Some(Body::Plan(delivery)),
    }
}

impl Default for Dispatch {
    fn default() -> Self {
        Self {
            slots: Mutex::default(),
            ready: watch::Sender::new(false),
            plans: Mutex::default(),
        }
    }
}

impl Dispatch {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        // Each change to a slot is whole before the lock is let go.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows a host's slot with a `Watch` call (see [`slot_key`]; waits until the store has
    /// been read).
    pub async fn subscribe(&self, key: &str) -> watch::Receiver<Current> {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
        let mut slots = self.slots();
        let slot = slots.entry(key.to_owned()).or_default();
        let current = slot.current.clone();
        slot.calls
            .get_or_insert_with(|| watch::Sender::new(current))
            .subscribe()
    }

    /// Follows a host's slot with session messages: the session `session` is sent every
    /// change of `host`'s `slot` from now on, until it ends; the current plan is returned to
    /// send at once (`None` while the store has not been read: it is sent once it has).
    pub fn follow(
        &self,
        session: u64,
        host: &str,
        slot: &str,
        messenger: &Messenger,
    ) -> Option<HubMessage> {
        let mut slots = self.slots();
        let ready = *self.ready.borrow();
        let entry = slots.entry(slot_key(host, slot)).or_default();
        // A reconnect can overlap the session it replaces; the older one is on its way out.
        if entry
            .follower
            .as_ref()
            .is_some_and(|f| f.session > session && !f.messenger.is_closed())
        {
            return None;
        }
        entry.follower = Some(Follower {
            session,
            slot: slot.to_owned(),
            messenger: messenger.clone(),
        });
        ready.then(|| delivery_message(slot, &entry.current))
    }

    /// A host's slot's current plan (see [`slot_key`]).
    pub fn current(&self, key: &str) -> Current {
        self.slots().get(key).and_then(|s| s.current.clone())
    }

    /// The checksum of `host`'s current plan (empty: none).
    pub fn checksum(&self, host: &str) -> String {
        self.current(host)
            .map(|p| p.checksum.clone())
            .unwrap_or_default()
    }

    /// Sets `host`'s plan; followers hear of it only if its checksum changed (a status write
    /// on the Plan is not a new plan).
    fn set(&self, key: &str, current: Current) {
        let mut slots = self.slots();
        let ready = *self.ready.borrow();
        if current.is_none() && !slots.contains_key(key) {
            return;
        }
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.current.as_ref().map(|p| &p.checksum) == current.as_ref().map(|p| &p.checksum) {
            return;
        }
        slot.current = current;
        if let Some(calls) = &slot.calls {
            calls.send_replace(slot.current.clone());
            if calls.receiver_count() == 0 {
                slot.calls = None;
            }
        }
        if ready
            && let Some(follower) = &slot.follower
            && !follower.tell(&slot.current)
        {
            slot.follower = None;
        }
        if slot.current.is_none() && slot.follower.is_none() && slot.calls.is_none() {
            slots.remove(key);
        }
    }

    /// The store's plans have been read: followers waiting for them are told theirs.
    pub(crate) fn set_ready(&self) {
        let mut slots = self.slots();
        if self.ready.send_replace(true) {
            return;
        }
        for slot in slots.values_mut() {
            if let Some(follower) = &slot.follower
                && !follower.tell(&slot.current)
            {
                slot.follower = None;
            }
        }
    }

    fn take(&self, object: &Object) {
        let host = &plan_key(object);
        match parse_plan(object.spec.get("plan").unwrap_or(&Value::Null)) {
            Ok(plan) => {
                let pushed = self
                    .plans
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(plan);
                self.set(host, Some(pushed));
            }
            // The API refuses such plans; one in the store anyway is not pushed.
            Err(e) => tracing::error!(%host, error = %e, "a stored plan does not parse"),
        }
    }

    /// Takes every stored plan, and forgets the slots of those no longer stored. The objects
    /// go when it returns: the watch that follows lasts as long as the hub.
    fn take_all(&self, plans: Vec<Object>) {
        let names: std::collections::HashSet<String> = plans.iter().map(plan_key).collect();
        let gone: Vec<String> = self
            .slots()
            .keys()
            .filter(|h| !names.contains(*h))
            .cloned()
            .collect();
        for host in gone {
            self.set(&host, None);
        }
        for plan in &plans {
            self.take(plan);
        }
    }

    /// Keeps the dispatch true to the store until `shutdown`.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, shutdown: CancellationToken) {
        let mut following = crate::store::Following::new("plan dispatch");
        loop {
            let listed = store
                .list(Kind::Plan.name(), &LabelSelector::everything())
                .await;
            let (plans, revision) = match listed {
                Ok(listed) => listed,
                Err(e) => {
                    following.broke(Some(&e));
                    tracing::warn!(error = %e, "cannot read plans; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            self.take_all(plans);
            self.set_ready();
            let mut changes = match store.watch(Some(Kind::Plan.name()), Some(revision)).await {
                Ok(w) => w,
                Err(e) => {
                    following.broke(Some(&e));
                    tracing::warn!(error = %e, "cannot watch plans; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            following.resumed(revision);
            loop {
                let change = tokio::select! {
                    () = shutdown.cancelled() => return,
                    change = changes.next() => change,
                };
                match change {
                    Some(Ok(event)) if event.kind == EventType::Deleted => {
                        self.set(&plan_key(&event.object), None);
                    }
                    Some(Ok(event)) => self.take(&event.object),
                    // Fell behind or the store hiccuped: read everything again.
                    end => {
                        following.broke(end.and_then(Result::err).as_ref());
                        break;
                    }
                }
            }
        }
    }
}

/// The task slot's name, on the wire and in a Plan's `spec.slot`.
pub const TASK: &str = "task";

/// The dispatch's key for a host's slot: the host for its plan, `host/task` for its task.
pub fn slot_key(host: &str, slot: &str) -> String {
    if slot.is_empty() {
        host.to_owned()
    } else {
        format!("{host}/{slot}")
    }
}

/// The key of a stored Plan: its `spec.host` (its name, for one written without) and slot.
fn plan_key(object: &Object) -> String {
    let host = object
        .spec
        .get("host")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .unwrap_or(&object.metadata.name);
    let slot = object
        .spec
        .get("slot")
        .and_then(Value::as_str)
        .unwrap_or_default();
    slot_key(host, slot)
}

/// The name of the Plan object holding a host's task (a host's plan is named as the host).
pub fn task_plan_name(host: &str) -> String {
    format!("task-{host}")
}

/// The slot a request names: "" or "task".
fn slot_of(slot: &str) -> Result<&str, tonic::Status> {
    match slot {
        "" | TASK => Ok(slot),
        other => Err(tonic::Status::invalid_argument(format!(
            "slot {other:?}: a host's slots are \"\" (its plan) and \"task\""
        ))),
    }
}

/// The gRPC service system-agents follow plans, report status and move files on.
#[derive(Debug, Clone)]
pub struct PlansService {
    pub store: Arc<dyn Store>,
    pub dispatch: Arc<Dispatch>,
    /// Where files from and for plans are kept (`<data dir>/files`).
    pub files: std::path::PathBuf,
}

impl PlansService {
    /// Whether `host`'s current plan or task names file `name` (in its uploads or downloads).
    fn declares(&self, host: &str, name: &str, upload: bool) -> Result<(), tonic::Status> {
        let declared = ["", TASK].iter().any(|slot| {
            self.dispatch
                .current(&slot_key(host, slot))
                .is_some_and(|p| {
                    if upload {
                        p.plan.uploads.iter().any(|u| u.name == name)
                    } else {
                        p.plan.downloads.iter().any(|d| d.name == name)
                    }
                })
        });
        if declared {
            Ok(())
        } else {
            Err(tonic::Status::permission_denied(format!(
                "no current plan of this host names {name:?} in its {}",
                if upload { "uploads" } else { "downloads" }
            )))
        }
    }
}

/// A `WatchPlan` sent as a session message (see `crate::messages`): the session follows its
/// host's slot; the answer to send at once is its current plan. Only a system-agent's session
/// may; a refused one is logged and not answered.
pub fn watch_message(
    dispatch: &Dispatch,
    info: &SessionInfo,
    watch: &WatchPlan,
    messenger: &Messenger,
) -> Option<HubMessage> {
    let host = session_host(info, "a plan watch")?;
    match slot_of(&watch.slot) {
        Ok(slot) => dispatch.follow(info.id, &host, slot, messenger),
        Err(e) => {
            tracing::warn!(peer = %info.peer.id, error = %e.message(), "a plan watch refused");
            None
        }
    }
}

/// Reports a session may have waiting on the store at once: an agent keeps one in flight per
/// slot (two, if it sent one again while the hub was slow); more are dropped unacknowledged,
/// so an agent that floods the hub only has its own reports wait (it sends them again).
const REPORTS_IN_FLIGHT: usize = 4;

/// Stores the status reports system-agents send as session messages.
#[derive(Debug)]
pub struct Reports {
    store: Arc<dyn Store>,
    /// Reports being stored, per session.
    in_flight: Mutex<HashMap<u64, usize>>,
}

impl Reports {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            in_flight: Mutex::default(),
        }
    }

    /// Stores a report as `Plans.Report` stores it, on a task of its own (the session's driver
    /// does not wait on the store), then acknowledges it on the session. One that cannot be
    /// stored, or finds too many of its session's before it, is not acknowledged: the agent
    /// sends it again.
    pub fn take(
        self: &Arc<Self>,
        dispatch: &Dispatch,
        info: &SessionInfo,
        status: PlanStatus,
        messenger: &Messenger,
    ) {
        let Some(host) = session_host(info, "a plan report") else {
            return;
        };
        let slot = match slot_of(&status.slot) {
            Ok(slot) => slot.to_owned(),
            Err(e) => {
                tracing::warn!(peer = %info.peer.id, error = %e.message(), "a plan report refused");
                return;
            }
        };
        if !self.count(info.id, true) {
            tracing::warn!(%host, "too many plan reports at once from one session; dropped one");
            return;
        }
        let desired = dispatch.checksum(&slot_key(&host, &slot));
        let (reports, messenger, session) = (self.clone(), messenger.clone(), info.id);
        tokio::spawn(async move {
            let seq = status.seq;
            let stored = record(reports.store.as_ref(), &host, &slot, &desired, status).await;
            reports.count(session, false);
            if let Err(e) = stored {
                tracing::warn!(%host, error = %e, "cannot store a plan report; the agent sends it again");
                return;
            }
            let ack = HubMessage {
                body: Some(Body::ReportAck(StatusAck { seq, slot })),
            };
            // A session gone meanwhile: its agent reports again on the next.
            let _ = messenger.send(ack.encode_to_vec());
        });
    }

    /// One more (`start`) or one fewer report of `session` in flight; false if there is no
    /// room for one more.
    fn count(&self, session: u64, start: bool) -> bool {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = in_flight.entry(session).or_default();
        if start {
            if *n >= REPORTS_IN_FLIGHT {
                return false;
            }
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                in_flight.remove(&session);
            }
        }
        true
    }
}

/// The host whose system-agent `info`'s session is; others may not follow or report plans.
fn session_host(info: &SessionInfo, what: &str) -> Option<String> {
    match (info.peer.kind.as_str(), belongs(&info.peer.id)) {
        (SYSTEM_AGENT, Some(Belongs::Host(host))) => Some(host),
        _ => {
            tracing::warn!(peer = %info.peer.id, "{what} from an agent that is not a host's system-agent");
            None
        }
    }
}

/// The host a request's session belongs to; only system-agents have one.
fn host_of<T>(request: &tonic::Request<T>) -> Result<String, tonic::Status> {
    match caller_of(request)? {
        (kind, Some(Belongs::Host(host))) if kind == SYSTEM_AGENT => Ok(host),
        _ => Err(tonic::Status::permission_denied(
            "only system-agents follow plans",
        )),
    }
}

type Deliveries = Pin<Box<dyn Stream<Item = Result<PlanDelivery, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl plans_server::Plans for PlansService {
    type WatchStream = Deliveries;

    async fn watch(
        &self,
        request: tonic::Request<WatchPlan>,
    ) -> Result<tonic::Response<Deliveries>, tonic::Status> {
        let host = host_of(&request)?;
        let slot = slot_of(&request.get_ref().slot)?;
        let receiver = self.dispatch.subscribe(&slot_key(&host, slot)).await;
        let deliveries = futures::stream::unfold((receiver, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let delivery = match rx.borrow_and_update().as_deref() {
                Some(p) => PlanDelivery {
                    checksum: p.checksum.clone(),
                    plan: Some(p.plan.clone()),
                    ..PlanDelivery::default()
                },
                None => PlanDelivery::default(),
            };
            Some((Ok(delivery), (rx, false)))
        });
        Ok(tonic::Response::new(Box::pin(deliveries)))
    }

    async fn report(
        &self,
        request: tonic::Request<PlanStatus>,
    ) -> Result<tonic::Response<StatusAck>, tonic::Status> {
        let host = host_of(&request)?;
        let status = request.into_inner();
        let seq = status.seq;
        let slot = slot_of(&status.slot)?.to_owned();
        let desired = self.dispatch.checksum(&slot_key(&host, &slot));
        record(self.store.as_ref(), &host, &slot, &desired, status)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        Ok(tonic::Response::new(StatusAck { seq, slot }))
    }

    async fn upload(
        &self,
        request: tonic::Request<tonic::Streaming<FileChunk>>,
    ) -> Result<tonic::Response<UploadAck>, tonic::Status> {
        let host = host_of(&request)?;
        let mut chunks = request.into_inner();
        let first = chunks
            .next()
            .await
            .ok_or_else(|| tonic::Status::invalid_argument("an upload with no chunk"))??;
        let name = first.name.clone();
        self.declares(&host, &name, true)?;
        let path = files::path_of(&self.files, &name)?;
        let ack = files::receive(&path, &name, first, chunks).await?;
        tracing::info!(%host, file = %name, size = ack.size, "received a file from a host");
        Ok(tonic::Response::new(ack))
    }

    type DownloadStream = Pin<Box<dyn Stream<Item = Result<FileChunk, tonic::Status>> + Send>>;

    async fn download(
        &self,
        request: tonic::Request<DownloadRequest>,
    ) -> Result<tonic::Response<Self::DownloadStream>, tonic::Status> {
        let host = host_of(&request)?;
        let name = request.into_inner().name;
        self.declares(&host, &name, false)?;
        let path = files::path_of(&self.files, &name)?;
        let chunks = files::send(path, name).await?;
        Ok(tonic::Response::new(Box::pin(chunks)))
    }
}

/// The `Provisioned` condition a host's plan status amounts to: (status, reason, message).
fn provisioned(desired: &str, status: &PlanStatus) -> (Option<bool>, &'static str, String) {
    let state = PlanState::try_from(status.state).unwrap_or_default();
    if desired.is_empty() {
        // Registered, and not given a plan yet: the planner plans a cluster's hosts in order
        // (the first server, the other etcd hosts, the control plane, the workers), or the
        // cluster is paused. Not "active": it runs nothing yet.
        return (
            None,
            "Waiting",
            "waiting for its plan: the planner gives the cluster's hosts theirs in order (the cluster's state says what it waits on)".into(),
        );
    }
    if status.applied_checksum == desired && state != PlanState::InProgress {
        return (Some(true), "Applied", String::new());
    }
    if status.checksum != desired {
        return (
            None,
            "Waiting",
            "waiting for the system-agent to take the new plan".into(),
        );
    }
    match state {
        PlanState::Failed if status.failure_count >= status.max_failures => (
            Some(false),
            "PlanFailed",
            format!(
                "gave up after {} failures: {}",
                status.failure_count, status.message
            ),
        ),
        PlanState::Failed => (
            Some(false),
            "PlanFailed",
            format!(
                "{} (attempt {} of {}; retrying)",
                status.message, status.failure_count, status.max_failures
            ),
        ),
        // A retry is running: still not provisioned, and the failure that led to it stays
        // in sight beside what runs now.
        _ if status.failure_count > 0 && !status.message.is_empty() => (
            Some(false),
            "Retrying",
            format!(
                "{}; attempt {} of {} after: {}",
                applying(status),
                status.failure_count + 1,
                status.max_failures,
                status.message
            ),
        ),
        _ => (None, "Applying", applying(status)),
    }
}

/// Where a plan being applied is: the step running now, since when, and the last line it
/// wrote (what a person watching wants; the whole tail is on the Plan).
fn applying(status: &PlanStatus) -> String {
    let done = status.results.len();
    let Some(current) = &status.current else {
        return format!("applying the plan ({done} instructions done)");
    };
    let last = current
        .output
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty());
    format!(
        "applying the plan: step {} {:?} running since {}{}",
        done + 1,
        current.name,
        current.started_at,
        last.map(|l| format!(": {l}")).unwrap_or_default()
    )
}

/// Stores a host's plan status on its Plan and, for the host's plan, its Host: what the
/// `Report` call does with a system-agent's status (`desired`: the checksum of the host's
/// current plan). Public for `bench planner`, whose hosts report without a tunnel.
pub async fn record(
    store: &dyn Store,
    host: &str,
    slot: &str,
    desired: &str,
    status: PlanStatus,
) -> Result<(), crate::store::StoreError> {
    let (ok, reason, message) = provisioned(desired, &status);
    let body = serde_json::to_value(&status).unwrap_or(Value::Null);
    let plan = if slot.is_empty() {
        host.to_owned()
    } else {
        task_plan_name(host)
    };
    // Whether the report is newer than the one the Plan keeps: set by the Plan's change, read
    // by the Host's after it in the same transaction (each run of them, if the store retries).
    let fresh = Arc::new(AtomicBool::new(false));
    let seq = status.seq;
    let plan_op = {
        let (fresh, message) = (fresh.clone(), message.clone());
        model::modify_status(Kind::Plan, &plan, move |s: &mut Status| {
            // Reports can cross on a reconnect; an older one never overwrites a newer.
            let kept = s.extra.get("seq").and_then(Value::as_u64).unwrap_or(0);
            fresh.store(kept <= seq, Ordering::Relaxed);
            if kept > seq {
                return;
            }
            if let Value::Object(fields) = &body {
                for (k, v) in fields {
                    s.extra.insert(k.clone(), v.clone());
                }
            }
            s.set_condition_to("Provisioned", ok, reason, &message);
        })
    };
    if !slot.is_empty() {
        return model::unless_gone(store, vec![plan_op]).await;
    }
    // The host shows the same, in the same transaction (written only when it changes: hosts
    // are read by many).
    let host_op = model::modify_status(Kind::Host, host, move |s| {
        if fresh.load(Ordering::Relaxed) {
            s.set_condition_to("Provisioned", ok, reason, &message);
        }
    });
    match store.transact(vec![plan_op.clone(), host_op.clone()]).await {
        // One of the two is gone (a host being removed): the other is still kept.
        Err(StoreError::NotFound { .. }) => {
            model::unless_gone(store, vec![plan_op]).await?;
            model::unless_gone(store, vec![host_op]).await
        }
        other => other.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(checksum: &str, state: PlanState, failures: u32) -> PlanStatus {
        PlanStatus {
            checksum: checksum.into(),
            state: state as i32,
            failure_count: failures,
            max_failures: 3,
            message: "instruction \"install\" exited with 1: no disk".into(),
            ..PlanStatus::default()
        }
    }

    #[test]
    fn hosts_given_the_same_plan_share_one_copy_and_a_plan_no_host_has_is_forgotten() {
        let plan = |command: &str| Plan {
            instructions: vec![proto::plan::v1::Instruction {
                name: "install".into(),
                command: command.into(),
                ..Default::default()
            }],
            ..Plan::default()
        };
        let mut interned = Interned::default();
        let a = interned.get(plan("/bin/true"));
        let b = interned.get(plan("/bin/true"));
        let c = interned.get(plan("/bin/false"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(a.checksum, checksum(&plan("/bin/true")));
        drop((a, b, c));
        for i in 0..1000 {
            drop(interned.get(plan(&format!("/bin/step-{i}"))));
        }
        assert!(
            interned.by_checksum.len() <= 128,
            "{} entries kept for plans no one holds",
            interned.by_checksum.len()
        );
    }

    #[test]
    fn a_session_has_a_few_reports_in_flight_and_no_more() {
        let store: Arc<dyn Store> = Arc::new(
            crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap(),
        );
        let reports = Reports::new(store);
        for _ in 0..REPORTS_IN_FLIGHT {
            assert!(reports.count(1, true));
        }
        assert!(!reports.count(1, true), "a fifth while four are stored");
        assert!(reports.count(2, true), "another session's own room");
        reports.count(1, false);
        assert!(reports.count(1, true), "room again once one is stored");
        for _ in 0..REPORTS_IN_FLIGHT {
            reports.count(1, false);
        }
        reports.count(2, false);
        assert!(
            reports.in_flight.lock().unwrap().is_empty(),
            "ended sessions leave nothing"
        );
    }

    #[test]
    fn plan_status_becomes_the_provisioned_condition() {
        let mut applied = status("a", PlanState::Applied, 0);
        applied.applied_checksum = "a".into();
        assert_eq!(provisioned("a", &applied).0, Some(true));
        // No plan for it yet: waiting, not provisioned.
        let (ok, reason, message) = provisioned("", &PlanStatus::default());
        assert_eq!((ok, reason), (None, "Waiting"));
        assert!(message.starts_with("waiting for its plan"), "{message}");
        // Applied an older plan; the new one has not arrived.
        assert_eq!(provisioned("b", &applied).1, "Waiting");
        assert_eq!(
            provisioned("a", &status("a", PlanState::InProgress, 0)).1,
            "Applying"
        );
        let (ok, reason, message) = provisioned("a", &status("a", PlanState::Failed, 1));
        assert_eq!((ok, reason), (Some(false), "PlanFailed"));
        assert!(
            message.contains("no disk") && message.contains("retrying"),
            "{message}"
        );
        let (_, _, message) = provisioned("a", &status("a", PlanState::Failed, 3));
        assert!(message.starts_with("gave up after 3"), "{message}");
        // A retry: what runs now, and the failure it follows.
        let (ok, reason, message) = provisioned("a", &status("a", PlanState::InProgress, 1));
        assert_eq!((ok, reason), (Some(false), "Retrying"));
        assert_eq!(
            message,
            "applying the plan (0 instructions done); attempt 2 of 3 after: instruction \"install\" exited with 1: no disk"
        );
        // While a step runs: which, since when, and the last line it wrote.
        let mut running = status("a", PlanState::InProgress, 0);
        running.results.push(Default::default());
        running.current = Some(proto::plan::v1::InstructionProgress {
            name: "install".into(),
            started_at: "2026-12-02T12:00:00Z".into(),
            output: "[INFO] Downloading\n[INFO] Starting k3s\n\n".into(),
        });
        assert_eq!(
            provisioned("a", &running).2,
            "applying the plan: step 2 \"install\" running since 2026-12-02T12:00:00Z: [INFO] Starting k3s"
        );
    }

    #[test]
    fn a_host_moves_only_the_files_its_own_current_plans_name() {
        let dispatch = Arc::new(Dispatch::default());
        let task = Plan {
            uploads: vec![proto::plan::v1::Upload {
                path: "/var/lib/rancher/k3s/server/db/snapshots/s1-*".into(),
                name: "etcd-snapshots/edge/s1".into(),
            }],
            downloads: vec![proto::plan::v1::Download {
                name: "etcd-snapshots/edge/s0".into(),
                path: "/tmp/s0".into(),
                ..Default::default()
            }],
            ..Plan::default()
        };
        dispatch.set(
            &slot_key("h-a", TASK),
            Some(Arc::new(Pushed {
                checksum: checksum(&task),
                plan: task,
            })),
        );
        let service = PlansService {
            store: Arc::new(
                crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap(),
            ),
            dispatch,
            files: std::path::PathBuf::from("/nonexistent"),
        };
        assert!(
            service
                .declares("h-a", "etcd-snapshots/edge/s1", true)
                .is_ok()
        );
        assert!(
            service
                .declares("h-a", "etcd-snapshots/edge/s0", false)
                .is_ok()
        );
        // Not the other way round, not another name, not for another host.
        assert!(
            service
                .declares("h-a", "etcd-snapshots/edge/s0", true)
                .is_err()
        );
        assert!(
            service
                .declares("h-a", "etcd-snapshots/edge/s1", false)
                .is_err()
        );
        assert!(
            service
                .declares("h-a", "etcd-snapshots/edge/s2", true)
                .is_err()
        );
        assert!(
            service
                .declares("h-b", "etcd-snapshots/edge/s1", true)
                .is_err()
        );
        // And never a path out of the hub's directory.
        let root = std::path::Path::new("/data/files");
        assert!(files::path_of(root, "etcd-snapshots/edge/s1").is_ok());
        for bad in [
            "../state.db",
            "etcd-snapshots/../../x",
            "/etc/passwd",
            "a//b",
            "",
        ] {
            assert!(files::path_of(root, bad).is_err(), "{bad}");
        }
    }

    fn pushed(instruction: &str) -> Current {
        let plan = Plan {
            instructions: vec![proto::plan::v1::Instruction {
                name: instruction.into(),
                command: "/bin/true".into(),
                ..Default::default()
            }],
            ..Plan::default()
        };
        Some(Arc::new(Pushed {
            checksum: checksum(&plan),
            plan,
        }))
    }

    fn system_agent(session: u64, host: &str) -> SessionInfo {
        SessionInfo {
            id: session,
            peer: tunnel::Peer {
                id: format!("host/{host}"),
                kind: SYSTEM_AGENT.into(),
            },
            credential: None,
            remote_addr: None,
            connected_at: std::time::SystemTime::now(),
        }
    }

    fn watch(slot: &str) -> WatchPlan {
        WatchPlan { slot: slot.into() }
    }

    /// The deliveries a messenger was sent: (slot, checksum, first instruction's name).
    fn delivered(messenger: &Messenger) -> Vec<(String, String, String)> {
        messenger
            .take_sent()
            .iter()
            .map(|bytes| deliveries_of(HubMessage::decode(bytes.as_slice()).unwrap()))
            .collect()
    }

    fn deliveries_of(message: HubMessage) -> (String, String, String) {
        let Some(Body::Plan(delivery)) = message.body else {
            panic!("not a plan delivery: {message:?}");
        };
        let first = delivery
            .plan
            .and_then(|p| p.instructions.first().map(|i| i.name.clone()))
            .unwrap_or_default();
        (delivery.slot, delivery.checksum, first)
    }

    fn sum(current: &Current) -> String {
        current.as_ref().unwrap().checksum.clone()
    }

    #[test]
    fn a_session_following_a_slot_by_messages_is_sent_its_plan_and_every_change() {
        let dispatch = Dispatch::default();
        let (one, two) = (pushed("install"), pushed("upgrade"));
        let messenger = Messenger::detached();
        let agent = system_agent(7, "h-a");

        // Before the store has been read nothing is said; once it has, the plan read is sent.
        assert!(watch_message(&dispatch, &agent, &watch(""), &messenger).is_none());
        dispatch.set("h-a", one.clone());
        assert!(messenger.take_sent().is_empty());
        dispatch.set_ready();
        assert_eq!(
            delivered(&messenger),
            [("".into(), sum(&one), "install".into())]
        );

        // Later watches are answered at once; a slot with no plan gets an empty delivery.
        let now = watch_message(&dispatch, &agent, &watch(TASK), &messenger).unwrap();
        assert_eq!(deliveries_of(now), (TASK.into(), "".into(), "".into()));

        // A rewrite of the same plan (a status update) says nothing; a new plan is sent, to
        // its slot only; a deleted one is an empty delivery.
        dispatch.set("h-a", one.clone());
        assert!(messenger.take_sent().is_empty());
        dispatch.set("h-a", two.clone());
        dispatch.set(&slot_key("h-a", TASK), one.clone());
        dispatch.set("h-b", one.clone());
        dispatch.set("h-a", None);
        assert_eq!(
            delivered(&messenger),
            [
                ("".into(), sum(&two), "upgrade".into()),
                (TASK.into(), sum(&one), "install".into()),
                ("".into(), "".into(), "".into()),
            ]
        );
    }

    #[test]
    fn the_newest_session_of_a_host_follows_its_plan_and_an_ended_one_is_forgotten() {
        let dispatch = Dispatch::default();
        dispatch.set_ready();
        let (old, new) = (Messenger::detached(), Messenger::detached());
        let watched = |session, messenger: &Messenger| {
            watch_message(
                &dispatch,
                &system_agent(session, "h-a"),
                &watch(""),
                messenger,
            )
        };
        assert!(watched(9, &new).is_some());
        // The session it replaced, its watch late: not answered, and not sent the next plan.
        assert!(watched(8, &old).is_none());
        dispatch.set("h-a", pushed("install"));
        assert!(old.take_sent().is_empty());
        assert_eq!(delivered(&new).len(), 1);
        // Once the newest has ended, another session follows (and the ended one is sent no more).
        new.close();
        assert!(watched(8, &old).is_some());
        dispatch.set("h-a", pushed("upgrade"));
        assert_eq!(delivered(&old).len(), 1);
        assert!(new.take_sent().is_empty());
    }

    #[test]
    fn only_a_hosts_system_agent_follows_its_plans_and_a_plan_too_large_for_a_message_is_announced()
    {
        let dispatch = Dispatch::default();
        dispatch.set_ready();
        let messenger = Messenger::detached();
        let mut node = system_agent(3, "h-a");
        node.peer = tunnel::Peer {
            id: "node/c-1/h-a".into(),
            kind: crate::identity::NODE_AGENT.into(),
        };
        assert!(watch_message(&dispatch, &node, &watch(""), &messenger).is_none());
        let agent = system_agent(4, "h-a");
        assert!(watch_message(&dispatch, &agent, &watch("kubelet"), &messenger).is_none());
        dispatch.set("h-a", pushed("install"));
        assert!(messenger.take_sent().is_empty(), "nobody may follow");

        // A plan past the limit: its checksum is sent, without the plan, to take by call.
        let big = Plan {
            files: vec![proto::plan::v1::File {
                path: "/etc/big".into(),
                content: vec![7; MAX_PLAN_MESSAGE],
                ..Default::default()
            }],
            ..Plan::default()
        };
        let big = Some(Arc::new(Pushed {
            checksum: checksum(&big),
            plan: big,
        }));
        dispatch.set("h-a", big.clone());
        let Some(Body::Plan(delivery)) = watch_message(&dispatch, &agent, &watch(""), &messenger)
            .unwrap()
            .body
        else {
            panic!("not a delivery");
        };
        assert!(delivery.too_large && delivery.plan.is_none());
        assert_eq!(delivery.checksum, sum(&big));
    }
}
