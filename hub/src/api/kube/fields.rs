//! Fields a spec's kind does not know, answered as `fieldValidation` asks: what its schema
//! does not name and its parsing would drop is a typo to point out.

use axum::{http::header, response::Response};
use serde_json::Value;

use crate::{api::ApiError, model::Kind};

/// What to do about fields a spec's kind does not know (`fieldValidation`), as
/// kube-apiserver: refuse the write (`Strict`, kubectl's default), warn (`Warn`, the default
/// of other clients) or say nothing (`Ignore`). The write itself never keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Validation {
    Strict,
    Warn,
    Ignore,
}

/// The fields of `object`'s spec its kind does not know: what the schema does not name and
/// the kind's own parsing drops (both, so neither can refuse a field the other takes).
fn unknown(kind: Kind, object: &Value) -> Vec<String> {
    let Some(spec) = object.get("spec") else {
        return Vec::new();
    };
    let named = super::schema::unknown_fields(kind, spec);
    if named.is_empty() {
        return named;
    }
    let Ok(kept) = kind.validate_spec(spec) else {
        // The kind refuses it anyway (some refuse any field they do not know).
        return named;
    };
    named
        .into_iter()
        .filter(|path| {
            let pointer = path
                .trim_start_matches("spec")
                .replace(['.', '['], "/")
                .replace(']', "");
            kept.pointer(&pointer).is_none()
        })
        .collect()
}

/// Checks `object`'s fields as `validation` says; the warnings to send with the answer.
pub(super) fn check_fields(
    kind: Kind,
    object: &Value,
    validation: Validation,
) -> Result<Vec<String>, ApiError> {
    if validation == Validation::Ignore {
        return Ok(Vec::new());
    }
    let unknown: Vec<String> = unknown(kind, object)
        .into_iter()
        .map(|path| format!("unknown field \"{path}\""))
        .collect();
    if validation == Validation::Strict && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        )));
    }
    Ok(unknown)
}

/// `response` with each of `warnings` as a `Warning` header, which kubectl prints.
pub(super) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let text = format!("299 - {:?}", warning);
        if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::{http::StatusCode, response::IntoResponse};
    use serde_json::json;

    use super::*;

    #[test]
    fn an_unknown_field_is_refused_warned_of_or_passed_as_asked() {
        // A setting's spec drops what it does not know (a cluster's refuses it outright).
        let setting = json!({"spec": {"value": "x", "vlaue": "y"}});
        let refused = check_fields(Kind::Setting, &setting, Validation::Strict).unwrap_err();
        assert_eq!(
            refused.message,
            "strict decoding error: unknown field \"spec.vlaue\""
        );
        assert_eq!(
            check_fields(Kind::Setting, &setting, Validation::Warn).unwrap(),
            ["unknown field \"spec.vlaue\""]
        );
        assert!(
            check_fields(Kind::Setting, &setting, Validation::Ignore)
                .unwrap()
                .is_empty()
        );
        let fine = json!({"spec": {"value": "x"}});
        assert!(
            check_fields(Kind::Setting, &fine, Validation::Strict)
                .unwrap()
                .is_empty()
        );
        let response = with_warnings(
            StatusCode::OK.into_response(),
            &["unknown field \"spec.vlaue\"".to_owned()],
        );
        assert_eq!(
            response.headers()[header::WARNING],
            "299 - \"unknown field \\\"spec.vlaue\\\"\""
        );
    }
}
