//! The system-agent's side of a session with the hub: for each plan slot (the host's plan and
//! its task) it takes the hub's plans into the slot's record and sends the record's status
//! until the hub acknowledges it (both as session messages, or where the hub takes none with
//! the `Watch` stream and `Report` calls); and it beats, with the host's facts and usage.

use std::{sync::Arc, time::Duration};

use agentkit::heartbeat::PlanMessage;
use proto::plan::v1::{PlanDelivery, PlanStatus, WatchPlan, checksum, plans_client::PlansClient};
use tokio::sync::watch;
use tunnel::AgentSession;

use crate::record::Record;

/// The records of the host's two plan slots.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    pub plan: Arc<Record>,
    pub task: Arc<Record>,
}

/// The task slot's name on the wire.
pub(crate) const TASK: &str = "task";

/// Serves one session until it ends.
pub(crate) async fn serve(session: AgentSession, slots: Slots, sampler: Option<agentkit::Sampler>) {
    let client = PlansClient::new(session.channel.clone());
    if let Some(conversation) = &session.messages {
        // Plans come as messages beside the hub's answers to beats, and reports go as
        // messages: no stream or call is held open or opened for them on either end.
        let (plan, plans) = watch::channel(None);
        let (task, tasks) = watch::channel(None);
        // The highest seq the hub acknowledged, per slot.
        let (plan_ack, plan_acks) = watch::channel(0);
        let (task_ack, task_acks) = watch::channel(0);
        for slot in ["", TASK] {
            if agentkit::heartbeat::follow_plan(conversation, slot).is_err() {
                return;
            }
        }
        let sort = |message: PlanMessage| {
            let slot = match &message {
                PlanMessage::Delivery(delivery) => &delivery.slot,
                PlanMessage::ReportAck(ack) => &ack.slot,
            };
            let (deliveries, acks) = match slot.as_str() {
                "" => (&plan, &plan_ack),
                TASK => (&task, &task_ack),
                other => {
                    tracing::warn!(slot = %other, "the hub sent a message about a slot this agent does not have");
                    return;
                }
            };
            match message {
                PlanMessage::Delivery(delivery) => {
                    deliveries.send_replace(Some(delivery));
                }
                PlanMessage::ReportAck(ack) => {
                    acks.send_if_modified(|acked| {
                        let newer = ack.seq > *acked;
                        *acked = (*acked).max(ack.seq);
                        newer
                    });
                }
            }
        };
        tokio::select! {
            _ = session.session.ended() => {}
            () = take_delivered(client.clone(), "", plans, &slots.plan) => {}
            () = take_delivered(client, TASK, tasks, &slots.task) => {}
            () = report_by_messages(conversation, "", &slots.plan, plan_acks) => {}
            () = report_by_messages(conversation, TASK, &slots.task, task_acks) => {}
            () = agentkit::heartbeat::beat_and_take_plans(&session, sampler.as_ref(), sort) => {}
        }
        return;
    }
    tokio::select! {
        _ = session.session.ended() => {}
        () = take_plans(client.clone(), "", &slots.plan) => {}
        () = take_plans(client.clone(), TASK, &slots.task) => {}
        () = report(client.clone(), "", &slots.plan) => {}
        () = report(client, TASK, &slots.task) => {}
        () = agentkit::beat(&session, sampler.as_ref()) => {}
    }
}

/// Takes the plans the hub sends for `slot` as session messages (the newest, if several came
/// while one was being kept); one too large for a message is taken with the `Watch` call.
async fn take_delivered(
    mut client: PlansClient<tunnel::Channel>,
    slot: &str,
    mut deliveries: watch::Receiver<Option<PlanDelivery>>,
    record: &Record,
) {
    while deliveries.changed().await.is_ok() {
        let Some(mut delivery) = deliveries.borrow_and_update().clone() else {
            continue;
        };
        while delivery.too_large {
            // The Watch call's first delivery is the current plan.
            let first = match client.watch(WatchPlan { slot: slot.into() }).await {
                Ok(stream) => stream.into_inner().message().await,
                Err(e) => Err(e),
            };
            match first {
                Ok(Some(current)) => delivery = current,
                Ok(None) => tracing::warn!(%slot, "the hub's plan stream ended before its plan"),
                Err(e) => {
                    tracing::warn!(%slot, error = %e, "cannot take a large plan from the hub")
                }
            }
            if delivery.too_large {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        keep(slot, record, delivery).await;
    }
}

/// Follows the hub's plan for this host's `slot` with the `Watch` call, where the hub takes no
/// session messages; a broken stream is opened again after a pause.
async fn take_plans(mut client: PlansClient<tunnel::Channel>, slot: &str, record: &Record) {
    loop {
        let watch = WatchPlan {
            slot: slot.to_owned(),
        };
        match client.watch(watch).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(delivery)) => keep(slot, record, delivery).await,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "the plan stream broke");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot follow the hub's plan"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Keeps the hub's plan for `slot` as the one to apply, writing it until the disk takes it
/// (after 1, 2, 4 … up to 60 s: `tunnel::Backoff`'s windows): the hub counts a plan as
/// delivered once sent, so one dropped here would never run. A plan the hub sends meanwhile
/// waits for this one (on the session's watch it replaces what came between).
async fn keep(slot: &str, record: &Record, delivery: PlanDelivery) {
    let backoff = tunnel::Backoff::default();
    let mut attempt = 0;
    while let Err(e) = take(slot, record, &delivery) {
        let pause = backoff.window(attempt);
        tracing::error!(%slot, error = %e, retry_in = ?pause, "cannot keep the hub's plan on disk; it is held and written again");
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

/// Sets the hub's plan for `slot` as the one to apply.
fn take(slot: &str, record: &Record, delivery: &PlanDelivery) -> std::io::Result<()> {
    let plan = delivery.plan.clone().unwrap_or_default();
    let (sum, plan) = if delivery.checksum.is_empty() {
        (String::new(), None)
    } else {
        // The agent's own sum is the plan's identity; a different one from the hub means the
        // two builds encode differently.
        let sum = checksum(&plan);
        if sum != delivery.checksum {
            tracing::warn!(hub = %delivery.checksum, agent = %sum, "the hub and this agent compute different plan checksums");
        }
        (sum, Some(plan))
    };
    let kept = (!sum.is_empty()).then(|| sum.get(..12).unwrap_or(&sum).to_owned());
    let changed = record.set_desired(sum, plan)?;
    // Said, because it is why nothing runs after a restart.
    if let (false, Some(plan)) = (changed, kept) {
        tracing::info!(%slot, %plan, "the hub's plan is the one this agent already has");
    }
    Ok(())
}

/// How long a status sent as a message waits for the hub's acknowledgement before it is sent
/// again (the hub could not store it, or the acknowledgement was lost with a session).
const RESEND_AFTER: Duration = Duration::from_secs(10);

/// What became of one status sent to the hub.
enum Sent {
    /// The hub acknowledged statuses up to this seq.
    Acked(u64),
    /// Not taken, or not acknowledged in time: it is sent again.
    Again,
    /// The session is over; the next one sends it.
    Ended,
}

/// Sends each new status of `slot` with `send`, one at a time (statuses recorded meanwhile go
/// as the newest of them), each until the hub acknowledges it.
async fn send_statuses<F, Fut>(slot: &str, record: &Record, mut send: F)
where
    F: FnMut(PlanStatus) -> Fut,
    Fut: Future<Output = Sent>,
{
    let mut changes = record.watch_status();
    loop {
        changes.borrow_and_update();
        if let Some(mut status) = record.unacked() {
            status.slot = slot.to_owned();
            match send(status).await {
                Sent::Acked(seq) => {
                    if let Err(e) = record.ack(seq) {
                        tracing::warn!(error = %e, "cannot record the hub's acknowledgement");
                    }
                }
                Sent::Again => {}
                Sent::Ended => return,
            }
            continue;
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Reports `slot`'s statuses as session messages; the hub's acknowledgements come in `acks`.
async fn report_by_messages(
    conversation: &tunnel::Conversation,
    slot: &str,
    record: &Record,
    acks: watch::Receiver<u64>,
) {
    send_statuses(slot, record, |status| {
        let seq = status.seq;
        let sent = agentkit::heartbeat::report(conversation, status);
        let mut acks = acks.clone();
        async move {
            if sent.is_err() {
                return Sent::Ended;
            }
            tokio::select! {
                acked = acks.wait_for(|acked| *acked >= seq) => match acked {
                    Ok(_) => Sent::Acked(seq),
                    Err(_) => Sent::Ended,
                },
                () = tokio::time::sleep(RESEND_AFTER) => {
                    tracing::warn!(%slot, seq, "the hub did not acknowledge the plan's status; sending it again");
                    Sent::Again
                }
            }
        }
    })
    .await;
}

/// Reports `slot`'s statuses with `Report` calls (a hub without session messages).
async fn report(client: PlansClient<tunnel::Channel>, slot: &str, record: &Record) {
    send_statuses(slot, record, |status| {
        let mut client = client.clone();
        async move {
            match client.report(status).await {
                Ok(ack) => Sent::Acked(ack.into_inner().seq),
                Err(e) => {
                    tracing::warn!(error = %e, "the hub did not take the plan's status; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Sent::Again
                }
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use proto::plan::v1::Plan;

    use super::*;

    /// A plan the disk refuses is held and written once the disk takes it, not dropped: the
    /// hub sends it once.
    #[tokio::test(start_paused = true)]
    async fn a_plan_the_disk_refuses_is_written_once_it_can_be() {
        let dir = crate::testing::tempdir();
        let record = Record::open(&dir.join("plan.json")).unwrap();
        // The record's temporary file cannot be created while a directory holds its name.
        let blocker = dir.join(".plan.json.drover-tmp");
        std::fs::create_dir(&blocker).unwrap();
        let plan = Plan::default();
        let delivery = PlanDelivery {
            checksum: checksum(&plan),
            plan: Some(plan),
            ..PlanDelivery::default()
        };
        let mut desired = record.watch_desired();
        let kept = {
            let record = record.clone();
            tokio::spawn(async move { keep("", &record, delivery).await })
        };
        // The paused clock runs ahead while every task waits: several attempts fail meanwhile.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!kept.is_finished(), "the plan was given up on");
        assert_eq!(record.desired().0, "");

        std::fs::remove_dir(&blocker).unwrap();
        tokio::time::timeout(Duration::from_secs(600), desired.changed())
            .await
            .expect("the plan was never written")
            .unwrap();
        kept.await.unwrap();
        assert_eq!(record.desired().0, checksum(&Plan::default()));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
