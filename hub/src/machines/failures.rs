//! Failing gently: a failed step is recorded on its Machine with when it is tried next
//! (or, refused, that it waits for a change of its settings), and only changes other than the
//! controller's own status writes start a pass.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Controller, decide};
use crate::{
    model::{Kind, Status, update_status},
    store::{LabelSelector, StoreError},
};

/// Why a machine's step failed, and whether retrying the same settings can help.
#[derive(Debug)]
pub(super) struct Failure {
    pub why: String,
    /// The provider (or the settings themselves) refused it as asked.
    pub refused: bool,
}

impl Failure {
    /// Settings that cannot work as they are: only a change of them helps.
    pub(super) fn settings(why: String) -> Self {
        Self { why, refused: true }
    }
}

impl From<drivers::DriverError> for Failure {
    fn from(e: drivers::DriverError) -> Self {
        Self {
            refused: matches!(e, drivers::DriverError::Refused(_)),
            why: e.to_string(),
        }
    }
}

/// Clears what [`Controller::failed`] recorded: the step went through.
pub(super) fn recovered(s: &mut Status) {
    for field in [
        decide::FAILED_FOR,
        decide::FAILURES,
        decide::NEXT_ATTEMPT,
        decide::REFUSED,
    ] {
        s.extra.remove(field);
    }
    s.conditions.retain(|c| c.kind != "Ready");
}

impl Controller {
    /// Each template's version with its credential's, for [`decide::fingerprint`].
    pub(super) async fn versions(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let everything = LabelSelector::everything();
        let (templates, _) = self
            .store
            .list(Kind::MachineTemplate.name(), &everything)
            .await?;
        let (credentials, _) = self
            .store
            .list(Kind::CloudCredential.name(), &everything)
            .await?;
        Ok(templates
            .iter()
            .map(|t| {
                let credential = t.spec.get("credential").and_then(Value::as_str);
                let of_credential = credentials
                    .iter()
                    .find(|c| Some(c.metadata.name.as_str()) == credential)
                    .map_or("", |c| c.metadata.resource_version.as_str());
                (
                    t.metadata.name.clone(),
                    format!("{}/{of_credential}", t.metadata.resource_version),
                )
            })
            .collect())
    }

    /// Records a failed step of machine `name` (in `phase`): how many in a row for these
    /// settings (`fingerprint`), and when it is tried next — not before a change of them if
    /// the provider refused it as asked — in its message and its `Ready` condition.
    pub(super) async fn failed(
        &self,
        name: &str,
        to: &str,
        step: &str,
        failure: Failure,
        fingerprint: &str,
    ) -> Result<(), StoreError> {
        let (to, fingerprint) = (to.to_owned(), fingerprint.to_owned());
        let step = step.to_owned();
        let now = time::OffsetDateTime::now_utc();
        update_status(self.store.as_ref(), Kind::Machine, name, move |s| {
            let same = s.extra.get(decide::FAILED_FOR).and_then(Value::as_str)
                == Some(fingerprint.as_str());
            let failures = if same {
                s.extra
                    .get(decide::FAILURES)
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0)
                    .saturating_add(1)
            } else {
                1
            };
            let (reason, then) = if failure.refused {
                s.extra.remove(decide::NEXT_ATTEMPT);
                (
                    "Refused",
                    "refused as asked: not tried again until the pool, its template or the template's credential changes".to_owned(),
                )
            } else {
                let delay = decide::retry_delay(failures);
                let next = now + delay;
                let at = crate::model::format_time(next);
                s.extra.insert(decide::NEXT_ATTEMPT.into(), json!(at));
                (
                    "RetryBackoff",
                    format!(
                        "failed {failures} time(s) in a row; next attempt at {at} (in {}s)",
                        delay.as_secs()
                    ),
                )
            };
            let message = format!("{step}: {}; {then}", failure.why);
            s.extra.insert(decide::FAILED_FOR.into(), json!(fingerprint));
            s.extra.insert(decide::FAILURES.into(), json!(failures));
            s.extra
                .insert(decide::REFUSED.into(), json!(failure.refused));
            s.extra.insert("phase".into(), json!(to));
            s.extra.insert("message".into(), json!(message));
            s.set_condition("Ready", false, reason, &message);
        })
        .await
    }
}
