//! The status every kind shares (conditions, kept as Kubernetes shapes them), the `state` an
//! object shows, derived from them as Rancher's API derives it, and status writes that retry.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Kind;
use crate::store::{Modifier, Object, ObjectMeta, Op, Store, StoreError};

/// A condition, as Kubernetes shapes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
}

/// The status every kind shares: conditions, plus kind-specific fields kept as given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Status {
    pub fn of(object: &Object) -> Status {
        // Read from the value in place: a status is read far more often than written.
        Status::deserialize(&object.status).unwrap_or_default()
    }

    /// Sets a condition; `lastTransitionTime` moves only when the status changes.
    pub fn set_condition(&mut self, kind: &str, status: bool, reason: &str, message: &str) {
        self.set_condition_to(kind, Some(status), reason, message);
    }

    /// The condition of type `kind`, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// As [`Status::set_condition`], with `None` for "Unknown" (on its way; not a failure).
    pub fn set_condition_to(
        &mut self,
        kind: &str,
        status: Option<bool>,
        reason: &str,
        message: &str,
    ) {
        let status = match status {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .to_owned();
        let now = crate::store::now_rfc3339();
        match self.conditions.iter_mut().find(|c| c.kind == kind) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status;
                c.reason = reason.to_owned();
                c.message = message.to_owned();
            }
            None => self.conditions.push(Condition {
                kind: kind.to_owned(),
                status,
                reason: reason.to_owned(),
                message: message.to_owned(),
                last_transition_time: now,
            }),
        }
    }
}

/// What an object shows as its state, as Rancher's API summarises it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct State {
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// True when the state is an error the user should look at.
    #[serde(default)]
    pub error: bool,
    /// True while the object is on its way somewhere (provisioning, updating, removing).
    #[serde(default)]
    pub transitioning: bool,
}

impl State {
    fn new(state: &str, message: impl Into<String>, error: bool, transitioning: bool) -> Self {
        Self {
            state: state.to_owned(),
            message: message.into(),
            error,
            transitioning,
        }
    }
}

/// Derives the state from metadata and conditions. In order: being removed; an error; cut off;
/// still provisioning or updating; active when every condition holds.
pub fn derive_state(kind: Kind, meta: &ObjectMeta, status: &Status, spec: &Value) -> State {
    if meta.deletion_timestamp.is_some() {
        // What the removal itself says it waits on, else whose finalizers are left.
        let said = status
            .conditions
            .iter()
            .find(|c| c.kind == "Removed" && c.status != "True" && !c.message.is_empty());
        let message = match said {
            Some(c) => c.message.clone(),
            None => format!("waiting for {}", meta.finalizers.join(", ")),
        };
        return State::new("removing", message, false, true);
    }
    let failed = |c: &Condition| {
        c.status == "False" && (c.reason.contains("Error") || c.reason.contains("Failed"))
    };
    if let Some(c) = status.conditions.iter().find(|c| failed(c)) {
        return State::new("error", c.message.clone(), true, false);
    }
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.kind == "Connected" && c.status == "False")
    {
        return State::new("disconnected", c.message.clone(), false, false);
    }
    for (condition, state) in [
        ("Provisioned", "provisioning"),
        ("Updated", "updating"),
        ("Restored", "restoring"),
        ("CertificatesRotated", "rotating"),
        ("Saved", "saving"),
    ] {
        if let Some(c) = status
            .conditions
            .iter()
            .find(|c| c.kind == condition && c.status != "True")
        {
            return State::new(state, c.message.clone(), false, true);
        }
    }
    if let Some(c) = status.conditions.iter().find(|c| c.status != "True") {
        return State::new(
            "unavailable",
            format!("{}: {}", c.kind, c.message),
            false,
            false,
        );
    }
    match kind {
        Kind::Cluster | Kind::Host if !status.conditions.iter().any(|c| c.kind == "Connected") => {
            let who = if kind == Kind::Cluster {
                "the cluster-agent"
            } else {
                "the system-agent"
            };
            State::new(
                "pending",
                format!("waiting for {who} to connect"),
                false,
                true,
            )
        }
        Kind::EtcdSnapshot if !status.conditions.iter().any(|c| c.kind == "Saved") => State::new(
            "pending",
            "waiting for the planner to take it (on the cluster's init host)",
            false,
            true,
        ),
        Kind::User if spec.get("disabled").and_then(Value::as_bool) == Some(true) => {
            State::new("inactive", "this user is disabled", false, false)
        }
        Kind::Token | Kind::RegistrationToken if expired(spec) => {
            State::new("expired", "this token has expired", false, false)
        }
        _ => State::new("active", "", false, false),
    }
}

/// Whether `spec.expiresAt` lies in the past.
pub fn expired(spec: &Value) -> bool {
    spec.get("expiresAt")
        .and_then(Value::as_str)
        .and_then(parse_time)
        .is_some_and(|t| t <= time::OffsetDateTime::now_utc())
}

/// A time as objects hold them (RFC 3339, as [`crate::store::now_rfc3339`] writes them), if
/// `text` is one.
pub fn parse_time(text: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// `at` as objects hold times: RFC 3339, UTC, to the second.
pub fn format_time(at: time::OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Sets one condition on an object (see [`update_status`]).
pub async fn set_condition(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    condition: &str,
    value: bool,
    reason: &str,
    message: &str,
) -> Result<(), StoreError> {
    let (condition, reason, message) =
        (condition.to_owned(), reason.to_owned(), message.to_owned());
    update_status(store, kind, name, move |status| {
        status.set_condition(&condition, value, &reason, &message)
    })
    .await
}

/// Changes an object's status as stored (in the transaction that writes it, so there is no
/// conflict to retry); a missing object is left alone, and so is one the change leaves as it
/// was (no write, so no watch event: controllers that watch what they write do not wake
/// themselves).
pub async fn update_status(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    change: impl Fn(&mut Status) + Send + Sync + 'static,
) -> Result<(), StoreError> {
    unless_gone(store, vec![modify_status(kind, name, change)]).await
}

/// Commits `ops`, or nothing if an object they change is gone (not an error: a status for an
/// object deleted meanwhile has nowhere to go).
pub async fn unless_gone(store: &dyn Store, ops: Vec<Op>) -> Result<(), StoreError> {
    match store.transact(ops).await {
        Err(StoreError::NotFound { .. }) => Ok(()),
        other => other.map(drop),
    }
}

/// The op that changes an object's status as stored, for a transaction with other ops (a
/// missing object fails it with `NotFound`).
pub fn modify_status(
    kind: Kind,
    name: &str,
    change: impl Fn(&mut Status) + Send + Sync + 'static,
) -> Op {
    Op::Modify {
        kind: kind.name().to_owned(),
        name: name.to_owned(),
        change: Modifier::new(move |object| {
            let before = Status::of(object);
            let mut status = before.clone();
            change(&mut status);
            if status != before
                && let Ok(value) = serde_json::to_value(status)
            {
                object.status = value;
            }
        }),
    }
}
