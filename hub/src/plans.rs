//! Plan delivery and plan status. One watch on the store's Plans keeps, per host and slot (the
//! host's plan, and its task: a one-time operation beside the plan), the current plan and its
//! checksum; each connected system-agent follows its host's entries over the `Watch` stream, so
//! a plan reaches its host the moment it is written (and again on every reconnect). Agents
//! report status with `Report`; the hub acknowledges a status only once it is stored, on the
//! Plan (`status`) and, for the host's plan, on the Host (condition `Provisioned`).

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt};
use proto::plan::v1::{
    DownloadRequest, FileChunk, Plan, PlanDelivery, PlanState, PlanStatus, StatusAck, UploadAck,
    WatchPlan, checksum, plans_server,
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod files;

pub use files::DIR as FILES_DIR;

use crate::{
    identity::{Belongs, SYSTEM_AGENT, caller_of},
    model::update_status,
    model::{Kind, Status, parse_plan},
    store::{EventType, LabelSelector, Object, Store},
};

/// A host's current plan as pushed.
#[derive(Debug, PartialEq)]
pub struct Pushed {
    pub checksum: String,
    pub plan: Plan,
}

type Current = Option<Arc<Pushed>>;

/// Every host's current plan, kept from one watch on the store.
#[derive(Debug)]
pub struct Dispatch {
    hosts: Mutex<HashMap<String, watch::Sender<Current>>>,
    /// True once the store's plans have been read.
    ready: watch::Sender<bool>,
}

impl Default for Dispatch {
    fn default() -> Self {
        Self {
            hosts: Mutex::default(),
            ready: watch::Sender::new(false),
        }
    }
}

impl Dispatch {
    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Current>>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows a host's slot (see [`slot_key`]; waits until the store has been read).
    pub async fn subscribe(&self, host: &str) -> watch::Receiver<Current> {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
        self.hosts()
            .entry(host.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
            .subscribe()
    }

    /// A host's slot's current plan (see [`slot_key`]).
    pub fn current(&self, key: &str) -> Current {
        self.hosts().get(key).and_then(|s| s.borrow().clone())
    }

    /// The checksum of `host`'s current plan (empty: none).
    pub fn checksum(&self, host: &str) -> String {
        self.current(host)
            .map(|p| p.checksum.clone())
            .unwrap_or_default()
    }

    /// Sets `host`'s plan; followers hear of it only if its checksum changed (a status write
    /// on the Plan is not a new plan).
    fn set(&self, host: &str, current: Current) {
        let mut hosts = self.hosts();
        let sender = hosts
            .entry(host.to_owned())
            .or_insert_with(|| watch::Sender::new(None));
        sender.send_if_modified(|now| {
            let same = now.as_ref().map(|p| &p.checksum) == current.as_ref().map(|p| &p.checksum);
            if !same {
                *now = current;
            }
            !same
        });
    }

    fn take(&self, object: &Object) {
        let host = &plan_key(object);
        match parse_plan(object.spec.get("plan").unwrap_or(&Value::Null)) {
            Ok(plan) => self.set(
                host,
                Some(Arc::new(Pushed {
                    checksum: checksum(&plan),
                    plan,
                })),
            ),
            // The API refuses such plans; one in the store anyway is not pushed.
            Err(e) => tracing::error!(%host, error = %e, "a stored plan does not parse"),
        }
    }

    /// Keeps the dispatch true to the store until `shutdown`.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, shutdown: CancellationToken) {
        loop {
            let listed = store
                .list(Kind::Plan.name(), &LabelSelector::everything())
                .await;
            let (plans, revision) = match listed {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read plans; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let names: Vec<String> = plans.iter().map(plan_key).collect();
            let gone: Vec<String> = self
                .hosts()
                .keys()
                .filter(|h| !names.contains(h))
                .cloned()
                .collect();
            for host in gone {
                self.set(&host, None);
            }
            for plan in &plans {
                self.take(plan);
            }
            self.ready.send_replace(true);
            let mut changes = match store.watch(Some(Kind::Plan.name()), Some(revision)).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch plans; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
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
                    Some(Err(_)) | None => break,
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
        Ok(tonic::Response::new(StatusAck { seq }))
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
        return (Some(true), "NoPlan", String::new());
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
        _ => {
            let done = status.results.len();
            (
                None,
                "Applying",
                format!("applying the plan ({done} instructions done)"),
            )
        }
    }
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
    let mut stale = false;
    let plan = if slot.is_empty() {
        host.to_owned()
    } else {
        task_plan_name(host)
    };
    update_status(store, Kind::Plan, &plan, |s: &mut Status| {
        // Reports can cross on a reconnect; an older one never overwrites a newer.
        let kept = s.extra.get("seq").and_then(Value::as_u64).unwrap_or(0);
        if kept > status.seq {
            stale = true;
            return;
        }
        if let Value::Object(fields) = &body {
            for (k, v) in fields {
                s.extra.insert(k.clone(), v.clone());
            }
        }
        s.set_condition_to("Provisioned", ok, reason, &message);
    })
    .await?;
    if stale || !slot.is_empty() {
        return Ok(());
    }
    // The host shows the same (written only when it changes: hosts are read by many).
    update_status(store, Kind::Host, host, |s| {
        s.set_condition_to("Provisioned", ok, reason, &message)
    })
    .await
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
    fn plan_status_becomes_the_provisioned_condition() {
        let mut applied = status("a", PlanState::Applied, 0);
        applied.applied_checksum = "a".into();
        assert_eq!(provisioned("a", &applied).0, Some(true));
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
}
