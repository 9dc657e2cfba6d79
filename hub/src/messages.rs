//! The hub's side of session messages (`proto::session::v1`, carried by `tunnel::messages`):
//! an agent's heartbeats go to health, a system-agent's plan watches to the plan dispatch and
//! its reports to the store. Each is taken on the task that drives its session, so nothing
//! here waits (a report is stored on a task of its own).

use std::sync::Arc;

use prost::Message as _;
use proto::session::v1::{AgentMessage, agent_message::Body};
use tunnel::{Messenger, OnMessage, SessionInfo};

use crate::{health::Health, plans};

/// Takes every session's messages (see `tunnel::AcceptorConfig::messages`).
#[derive(Debug)]
pub struct SessionMessages {
    pub health: Arc<Health>,
    pub dispatch: Arc<plans::Dispatch>,
    pub reports: Arc<plans::Reports>,
}

impl OnMessage for SessionMessages {
    fn on_message(
        &self,
        info: &SessionInfo,
        message: &[u8],
        messenger: &Messenger,
    ) -> Option<Vec<u8>> {
        let message = match AgentMessage::decode(message) {
            Ok(message) => message,
            Err(e) => {
                tracing::warn!(peer = %info.peer.id, error = %e, "a session message that is not an AgentMessage");
                return None;
            }
        };
        let answer = match message.body? {
            Body::Heartbeat(beat) => self.health.beat_message(info, beat, messenger),
            Body::WatchPlan(watch) => plans::watch_message(&self.dispatch, info, &watch, messenger),
            Body::Report(status) => {
                self.reports.take(&self.dispatch, info, status, messenger);
                None
            }
        };
        answer.map(|answer| answer.encode_to_vec())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proto::{
        health::v1::Heartbeat,
        plan::v1::{PlanStatus, WatchPlan},
        session::v1::{HubMessage, hub_message},
    };

    use super::*;

    fn session(kind: &str, peer: &str) -> SessionInfo {
        SessionInfo {
            id: 1,
            peer: tunnel::Peer {
                id: peer.into(),
                kind: kind.into(),
            },
            credential: None,
            remote_addr: None,
            connected_at: std::time::SystemTime::now(),
        }
    }

    fn handler() -> SessionMessages {
        let store: Arc<dyn crate::store::Store> = Arc::new(
            crate::store::sqlite::SqliteStore::open(std::path::Path::new(":memory:")).unwrap(),
        );
        SessionMessages {
            health: Arc::new(Health::new(store.clone(), Duration::from_secs(3))),
            dispatch: Arc::new(plans::Dispatch::default()),
            reports: Arc::new(plans::Reports::new(store)),
        }
    }

    #[tokio::test]
    async fn a_hosts_report_is_stored_then_acknowledged_and_another_agents_is_refused() {
        let handler = handler();
        let store = handler.health.store().clone();
        for kind in ["Plan", "Host"] {
            store
                .create(crate::store::Object::new(
                    kind,
                    "h-1",
                    serde_json::json!({}),
                ))
                .await
                .unwrap();
        }
        let report = |seq: u64| {
            AgentMessage {
                body: Some(Body::Report(PlanStatus {
                    seq,
                    applied_checksum: "sum".into(),
                    ..PlanStatus::default()
                })),
            }
            .encode_to_vec()
        };
        let messenger = Messenger::detached();

        // A cluster-agent may not report a host's plan: nothing stored, nothing answered.
        let agent = session(crate::identity::CLUSTER_AGENT, "cluster/c-1");
        assert!(handler.on_message(&agent, &report(7), &messenger).is_none());

        let host = session(crate::identity::SYSTEM_AGENT, "host/h-1");
        assert!(handler.on_message(&host, &report(3), &messenger).is_none());
        let ack = HubMessage::decode(messenger.next_sent().await.as_slice()).unwrap();
        let Some(hub_message::Body::ReportAck(ack)) = ack.body else {
            panic!("not an acknowledgement: {ack:?}");
        };
        assert_eq!((ack.seq, ack.slot.as_str()), (3, ""));
        // Acknowledged once stored: the plan shows the report, and only this one.
        let plan = store.get("Plan", "h-1").await.unwrap();
        assert_eq!(plan.status["seq"], 3);
        assert_eq!(plan.status["appliedChecksum"], "sum");
        assert!(messenger.take_sent().is_empty());
    }

    #[tokio::test]
    async fn beats_go_to_health_plan_watches_to_the_dispatch_and_garbage_nowhere() {
        let handler = handler();
        let messenger = Messenger::detached();
        let agent = session(crate::identity::CLUSTER_AGENT, "cluster/c-1");
        let ask = |info: &SessionInfo, body: Body| {
            let message = AgentMessage { body: Some(body) }.encode_to_vec();
            handler
                .on_message(info, &message, &messenger)
                .map(|answer| HubMessage::decode(answer.as_slice()).unwrap().body)
        };

        // The health map knows the agent once connected; its first beat there is answered
        // with the interval.
        handler.health.connected(&agent).await;
        let answer = ask(&agent, Body::Heartbeat(Heartbeat::default()));
        let Some(Some(hub_message::Body::BeatReply(reply))) = answer else {
            panic!("not a beat reply: {answer:?}");
        };
        assert_eq!(reply.interval_millis, 3000);

        // A watch is the dispatch's (here, before the store was read: answered later).
        let host = session(crate::identity::SYSTEM_AGENT, "host/h-1");
        let watch = Body::WatchPlan(WatchPlan::default());
        assert!(ask(&host, watch.clone()).is_none());
        handler.dispatch.set_ready();
        assert_eq!(messenger.take_sent().len(), 1);
        assert!(matches!(
            ask(&host, watch),
            Some(Some(hub_message::Body::Plan(_)))
        ));

        // What is not an AgentMessage, or one with no body, is answered with nothing.
        assert!(
            handler
                .on_message(&agent, b"\xff\xff\xff", &messenger)
                .is_none()
        );
        assert!(handler.on_message(&agent, b"", &messenger).is_none());
        assert!(messenger.take_sent().is_empty());
    }
}
