//! What happened to clusters, hosts and agents, as a person reads it: agents connecting and
//! going away, heartbeats missed, plans applied or failed, states changing. The last
//! [`KEEP`] events are kept in memory (like Kubernetes events, they are a recent account, not a
//! record: a hub restart starts afresh) and followers get each new one as it is recorded.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::Serialize;
use tokio::sync::broadcast;

/// Events kept for queries.
pub const KEEP: usize = 5_000;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Increases by one per event; `since=` in a query asks for the ones after it.
    pub seq: u64,
    pub time: String,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub severity: &'static str,
    /// `AgentConnected`, `AgentDisconnected`, `HeartbeatsMissed`, `HeartbeatsResumed`,
    /// `PlanApplied`, `PlanFailed` or `StateChanged`.
    pub reason: &'static str,
    /// The cluster it concerns (every event has one, so roles on clusters decide who sees it).
    pub cluster: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// A node of the cluster, for events from its node-agent.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node: String,
    pub message: String,
}

/// Where an event is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    pub cluster: String,
    pub host: String,
    pub node: String,
}

#[derive(Debug)]
pub struct Events {
    kept: Mutex<VecDeque<Event>>,
    live: broadcast::Sender<Event>,
    seq: AtomicU64,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            kept: Mutex::new(VecDeque::with_capacity(KEEP)),
            live: broadcast::channel(1024).0,
            seq: AtomicU64::new(0),
        }
    }
}

impl Events {
    pub fn warning(&self, reason: &'static str, subject: &Subject, message: impl Into<String>) {
        self.record("Warning", reason, subject, message.into());
    }

    pub fn normal(&self, reason: &'static str, subject: &Subject, message: impl Into<String>) {
        self.record("Normal", reason, subject, message.into());
    }

    fn record(
        &self,
        severity: &'static str,
        reason: &'static str,
        subject: &Subject,
        message: String,
    ) {
        tracing::info!(
            cluster = %subject.cluster,
            host = %subject.host,
            node = %subject.node,
            %reason,
            "{message}"
        );
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        // Numbered under the lock, so the kept list is in order.
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            time: crate::store::now_rfc3339(),
            severity,
            reason,
            cluster: subject.cluster.clone(),
            host: subject.host.clone(),
            node: subject.node.clone(),
            message,
        };
        if kept.len() == KEEP {
            kept.pop_front();
        }
        kept.push_back(event.clone());
        // No followers is fine.
        let _ = self.live.send(event);
    }

    /// Kept events after `since` that `keep` accepts, oldest first.
    pub fn query(&self, since: u64, keep: impl Fn(&Event) -> bool) -> Vec<Event> {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .filter(|e| e.seq > since && keep(e))
            .cloned()
            .collect()
    }

    /// New events as they are recorded.
    pub fn follow(&self) -> broadcast::Receiver<Event> {
        self.live.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(cluster: &str) -> Subject {
        Subject {
            cluster: cluster.into(),
            ..Subject::default()
        }
    }

    #[test]
    fn events_are_numbered_filtered_and_bounded() {
        let events = Events::default();
        let mut follower = events.follow();
        events.normal("AgentConnected", &subject("a"), "cluster-agent connected");
        events.warning("AgentDisconnected", &subject("b"), "gone");
        assert_eq!(follower.try_recv().unwrap().reason, "AgentConnected");
        let b = events.query(0, |e| e.cluster == "b");
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].seq, b[0].severity), (2, "Warning"));
        assert!(events.query(2, |_| true).is_empty());
        for _ in 0..KEEP {
            events.normal("StateChanged", &subject("a"), "x");
        }
        let all = events.query(0, |_| true);
        assert_eq!(all.len(), KEEP);
        assert_eq!(all[0].seq, 3);
    }
}
