//! Events for what people act on: a cluster's or host's state changing, a plan applied or
//! failed, each phase of a restore or certificate rotation, a cluster removed. Read from the
//! store's watch, so every replica's writes show.

use std::{collections::HashMap, time::Duration};

use futures::StreamExt;
use serde_json::Value;

use super::{Health, Subject};
use crate::{
    model::{Kind, Status, derive_state},
    store::EventType,
};

impl Health {
    /// An event for each phase a cluster's restore or certificate rotation enters (`listed`:
    /// the object is seen first as it was when the hub started, not as it changes).
    fn operation_events(
        &self,
        seen: &mut HashMap<(String, String), String>,
        cluster: &str,
        status: &Status,
        listed: bool,
    ) {
        for (field, what) in [
            ("restore", "restore"),
            ("certificateRotation", "certificate rotation"),
        ] {
            let Some(op) = status.extra.get(field) else {
                continue;
            };
            let phase = op["phase"].as_str().unwrap_or_default();
            let now = format!("{}|{phase}", op["generation"]);
            let key = (format!("{field}.phase"), cluster.to_owned());
            let before = seen.insert(key, now.clone());
            if before.as_deref() == Some(now.as_str()) || (listed && before.is_none()) {
                continue;
            }
            let subject = Subject {
                cluster: cluster.to_owned(),
                ..Subject::default()
            };
            let from = op["snapshot"]
                .as_str()
                .map(|s| format!(" from {s}"))
                .unwrap_or_default();
            let mut message = format!("{what} of {cluster}{from}: {phase}");
            if let Some(m) = op["message"].as_str().filter(|m| !m.is_empty()) {
                message.push_str(&format!(": {m}"));
            }
            if phase == "Failed" {
                self.events.warning("OperationFailed", &subject, message);
            } else {
                self.events.normal("Operation", &subject, message);
            }
        }
    }

    /// Records an event when a Cluster's or Host's state changes and when a Plan is applied or
    /// fails.
    pub(super) async fn watch_states(&self) {
        // Last seen: (kind, name) → (state and message, or a plan's condition reason).
        let mut seen: HashMap<(String, String), String> = HashMap::new();
        let mut host_cluster: HashMap<String, String> = HashMap::new();
        let mut following = crate::store::Following::new("state-change events");
        loop {
            let mut watch = match self.store.watch(None, None).await {
                Ok(w) => {
                    self.following.send_replace(true);
                    following.resumed(None);
                    w
                }
                Err(e) => {
                    following.broke(Some(&e));
                    tracing::warn!(error = %e, "cannot watch for state changes; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            loop {
                let event = match watch.next().await {
                    Some(Ok(event)) => event,
                    end => {
                        following.broke(end.and_then(Result::err).as_ref());
                        break;
                    }
                };
                let object = &event.object;
                let Some(kind) = Kind::from_name(&object.kind) else {
                    continue;
                };
                let key = (object.kind.clone(), object.metadata.name.clone());
                if event.kind == EventType::Deleted {
                    seen.remove(&key);
                    // What stays on the hub of a removed cluster.
                    if kind == Kind::Cluster {
                        let subject = Subject {
                            cluster: object.metadata.name.clone(),
                            ..Subject::default()
                        };
                        let message = format!(
                            "cluster {} removed; its agents' credentials are revoked",
                            object.metadata.name
                        );
                        self.events.normal("Removed", &subject, message);
                        // Removed anyway: what was not cleaned, as a warning that stays.
                        let anyway = Status::of(object).conditions.into_iter().find(|c| {
                            c.kind == "Removed" && c.reason == crate::model::REMOVED_ANYWAY
                        });
                        if let Some(condition) = anyway {
                            self.events.warning(
                                crate::model::REMOVED_ANYWAY,
                                &subject,
                                format!("cluster {}: {}", object.metadata.name, condition.message),
                            );
                        }
                    }
                    continue;
                }
                let status = Status::of(object);
                let name = &object.metadata.name;
                let cluster = object.spec["cluster"].as_str().unwrap_or_default();
                match kind {
                    Kind::Cluster | Kind::Host => {
                        if kind == Kind::Host {
                            host_cluster.insert(name.clone(), cluster.to_owned());
                        }
                        if kind == Kind::Cluster {
                            let listed = event.kind == EventType::Added;
                            self.operation_events(&mut seen, name, &status, listed);
                        }
                        let state = derive_state(kind, &object.metadata, &status, &object.spec);
                        let now = format!("{}|{}", state.state, state.message);
                        let before = seen.insert(key, now.clone());
                        let Some(before) = before.filter(|b| *b != now) else {
                            continue;
                        };
                        let was = before.split('|').next().unwrap_or_default();
                        if was == state.state {
                            continue; // only the message moved
                        }
                        let subject = match kind {
                            Kind::Cluster => Subject {
                                cluster: name.clone(),
                                ..Subject::default()
                            },
                            _ => Subject {
                                cluster: cluster.to_owned(),
                                host: name.clone(),
                                node: String::new(),
                            },
                        };
                        let detail = if state.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", state.message)
                        };
                        let message = format!(
                            "{} {name} is {} (was {was}){detail}",
                            kind.name(),
                            state.state
                        );
                        if state.error || state.state == "disconnected" {
                            self.events.warning("StateChanged", &subject, message);
                        } else {
                            self.events.normal("StateChanged", &subject, message);
                        }
                    }
                    Kind::Plan => {
                        let Some(c) = status.condition("Provisioned") else {
                            continue;
                        };
                        let now = format!(
                            "{}|{}",
                            c.reason,
                            status.extra.get("appliedChecksum").unwrap_or(&Value::Null)
                        );
                        let before = seen.insert(key, now.clone());
                        if before.as_deref() == Some(now.as_str())
                            || event.kind == EventType::Added && before.is_none()
                        {
                            continue;
                        }
                        let subject = Subject {
                            cluster: cluster.to_owned(),
                            host: name.clone(),
                            node: String::new(),
                        };
                        let sum = status
                            .extra
                            .get("appliedChecksum")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        let short = sum.get(..12).unwrap_or(sum);
                        match c.reason.as_str() {
                            "Applied" => self.events.normal(
                                "PlanApplied",
                                &subject,
                                format!("host {name} applied plan {short}"),
                            ),
                            "PlanFailed" => self.events.warning(
                                "PlanFailed",
                                &subject,
                                format!("host {name}: plan failed: {}", c.message),
                            ),
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
            // Fell behind or the store hiccuped: watch again; what is seen is kept, so a
            // change made meanwhile still shows.
            self.following.send_replace(false);
        }
    }
}
