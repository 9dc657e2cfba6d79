//! A host's spec, the registration tokens hosts and agents register with, and a host's plan.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Roles a host takes in its cluster: the ones its system-agent registers with.
pub use proto::register::HostRoles;

/// A machine running the system-agent, registered to a custom cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostSpec {
    pub cluster: String,
    #[serde(default)]
    pub roles: HostRoles,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub internal_address: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// `key=value:Effect`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[^:]+:(NoSchedule|PreferNoSchedule|NoExecute)$")))]
    pub taints: Vec<String>,
}

/// A secret that lets agents of one cluster register. Only its hash is stored; the value is
/// shown once, inside the commands returned when it is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationTokenSpec {
    pub cluster: String,
    /// RFC 3339; none means it does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// sha256 of the secret, hex. Never returned by the API.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(skip)]
    pub secret_hash: String,
}

/// What one host must look like; named after the host, pushed to its system-agent the moment
/// it is written. Written by the planner for custom clusters; an admin may write one too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanSpec {
    pub host: String,
    /// The host's cluster (for access checks).
    pub cluster: String,
    /// Which of the host's plan slots: "" (its plan) or "task" (a one-time operation, applied
    /// beside the plan; see `drover.plan.v1.Plans`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^(task)?$"))]
    pub slot: String,
    /// The plan (`drover.plan.v1.Plan` as JSON): `files`, `instructions`, `periodic`,
    /// `probes`, `maxFailures`.
    #[serde(default)]
    pub plan: Value,
}

/// Leaves out the content of a Plan spec's secret files (`secret: true`): the host receives
/// them, no reader of the API does.
pub fn redact_plan_files(spec: &mut Value) {
    if let Some(Value::Array(files)) = spec.pointer_mut("/plan/files") {
        for file in files {
            if file.get("secret").and_then(Value::as_bool) == Some(true)
                && let Value::Object(fields) = file
            {
                fields.remove("content");
            }
        }
    }
}

/// Keeps in an updated Plan spec the content of each secret file it leaves out (as a read
/// showed it), from the file of the same path in the current spec.
pub fn keep_plan_files(spec: &mut Value, current: &Value) {
    let Some(Value::Array(kept)) = current.pointer("/plan/files") else {
        return;
    };
    let Some(Value::Array(files)) = spec.pointer_mut("/plan/files") else {
        return;
    };
    for file in files {
        if file.get("secret").and_then(Value::as_bool) != Some(true)
            || file.get("content").is_some()
        {
            continue;
        }
        let content = kept
            .iter()
            .find(|k| k.get("path") == file.get("path"))
            .and_then(|k| k.get("content"));
        if let (Some(content), Value::Object(fields)) = (content, file) {
            fields.insert("content".into(), content.clone());
        }
    }
}

/// A Plan's `spec.plan` as the protocol's type; the message says what to fix.
pub fn parse_plan(plan: &Value) -> Result<proto::plan::v1::Plan, String> {
    if plan.is_null() {
        return Ok(proto::plan::v1::Plan::default());
    }
    serde_json::from_value(plan.clone()).map_err(|e| format!("spec.plan: {e}"))
}
