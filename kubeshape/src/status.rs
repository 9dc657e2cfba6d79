//! The `Status` object Kubernetes answers failures with; kubectl prints its `message`.

/// A `Status` failure as JSON text.
pub fn failure(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
    .to_string()
}
