//! What a host's agent last reported about its plan, read from the Plan's status.

use std::collections::HashMap;

use serde_json::Value;

use crate::{model::Status, store::Object};

/// What a host's agent last reported about its plan.
#[derive(Debug, Default)]
pub(super) struct PlanReport {
    /// The status's plan and the last plan applied.
    pub(super) checksum: String,
    pub(super) applied: String,
    pub(super) state: String,
    pub(super) healthy: Vec<String>,
    /// Why the status's plan failed (see [`PlanReport::failure`]).
    pub(super) failed: Option<String>,
    /// That plan failed as many times as it allows: the agent tries no more.
    pub(super) out_of_attempts: bool,
    /// The one-time instructions' results (name, exit code, stdout, finished at).
    pub(super) results: Vec<Value>,
    /// The instruction running now and since when.
    pub(super) current: Option<(String, String)>,
}

impl PlanReport {
    pub(super) fn of(plan: &Object) -> PlanReport {
        let s = Status::of(plan).extra;
        let text = |k: &str| {
            s.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (count, max) = (
            s.get("failureCount").and_then(Value::as_u64).unwrap_or(0),
            s.get("maxFailures").and_then(Value::as_u64).unwrap_or(0),
        );
        let failure = (text("state") == "failed").then(|| {
            if count >= max {
                format!("{} (gave up after {count} attempts)", text("message"))
            } else {
                format!("{} (attempt {count} of {max}; retrying)", text("message"))
            }
        });
        PlanReport {
            checksum: text("checksum"),
            applied: text("appliedChecksum"),
            state: text("state"),
            healthy: s
                .get("probes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|p| p["healthy"] == true)
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect(),
            out_of_attempts: text("state") == "failed" && count >= max,
            failed: failure,
            results: s
                .get("results")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            current: s.get("current").and_then(|c| {
                let name = c.get("name")?.as_str()?.to_owned();
                let since = c.get("startedAt")?.as_str().unwrap_or_default().to_owned();
                Some((name, since))
            }),
        }
    }

    /// The `key=value` lines instruction `name` printed (with `saveOutput`).
    pub(super) fn output(&self, name: &str) -> HashMap<String, String> {
        self.results
            .iter()
            .filter(|r| r["name"] == name)
            .filter_map(|r| r["stdout"].as_str())
            .flat_map(str::lines)
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    /// When instruction `name` finished (RFC 3339), or "".
    pub(super) fn finished(&self, name: &str) -> String {
        self.results
            .iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["finishedAt"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// Why plan `sum` failed, if it did: a status still about an earlier plan in the slot says
    /// nothing about this one.
    pub(super) fn failure(&self, sum: &str) -> Option<&str> {
        self.failed.as_deref().filter(|_| self.checksum == sum)
    }

    /// Plan `sum` failed for good: the agent tries it no more.
    pub(super) fn gave_up(&self, sum: &str) -> bool {
        self.out_of_attempts && self.checksum == sum
    }

    /// Applied at `sum` with every one of its `probes` healthy.
    pub(super) fn ready(&self, sum: &str, probes: usize) -> bool {
        self.applied == sum
            && self.state == "applied"
            && self.checksum == sum
            && self.healthy.len() >= probes
    }

    /// Where plan `sum` is, for the cluster's condition: taken or not, the step running and
    /// since when, or the probes that pass so far. Nothing in it moves by itself (no elapsed
    /// time, no output): the planner writes it when it changes.
    pub(super) fn progress(&self, sum: &str) -> String {
        if self.checksum != sum {
            "waiting for the system-agent to take its plan".into()
        } else if self.applied != sum {
            let done = self.results.len();
            match &self.current {
                Some((name, since)) => format!(
                    "applying its plan: step {} {name:?} running since {since}",
                    done + 1
                ),
                None => format!("applying its plan ({done} instructions done)"),
            }
        } else if self.healthy.is_empty() {
            "waiting for its probes to pass (none yet)".into()
        } else {
            format!(
                "waiting for its probes to pass ({} passing so far)",
                self.healthy.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reported(status: Value) -> PlanReport {
        let mut plan = Object::new("Plan", "h-1", json!({}));
        plan.status = status;
        PlanReport::of(&plan)
    }

    #[test]
    fn progress_says_the_step_running_since_when_and_the_probes_passing() {
        let cases = [
            (
                json!({"checksum": "old"}),
                "waiting for the system-agent to take its plan",
            ),
            (
                json!({"checksum": "a", "results": [{"name": "x"}],
                       "current": {"name": "install", "startedAt": "2026-12-02T12:00:00Z", "output": "[INFO] y"}}),
                "applying its plan: step 2 \"install\" running since 2026-12-02T12:00:00Z",
            ),
            (
                json!({"checksum": "a", "results": [{"name": "x"}], "current": null}),
                "applying its plan (1 instructions done)",
            ),
            (
                json!({"checksum": "a", "appliedChecksum": "a", "probes": [{"name": "kubelet", "healthy": true}, {"name": "etcd"}]}),
                "waiting for its probes to pass (kubelet passing so far)",
            ),
            (
                json!({"checksum": "a", "appliedChecksum": "a"}),
                "waiting for its probes to pass (none yet)",
            ),
        ];
        for (status, said) in cases {
            assert_eq!(reported(status.clone()).progress("a"), said, "{status}");
        }
    }
}
