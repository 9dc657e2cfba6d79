//! One error shape for the whole API, as Kubernetes answers (`kind: Status`), whose message
//! tells the caller what to fix.

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;

use crate::{
    auth::{AuthError, streams::TooManyStreams},
    store::StoreError,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    /// Seconds to wait, for 429.
    pub retry_after: Option<u64>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusBody {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub status: &'static str,
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFound", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
    }

    pub fn body(&self) -> StatusBody {
        StatusBody {
            kind: "Status",
            api_version: "v1",
            status: "Failure",
            code: self.code.as_u16(),
            reason: self.reason.to_owned(),
            message: self.message.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.code, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        if self.code == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"drover\""),
            );
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, "NotFound", message),
            StoreError::AlreadyExists { .. } => {
                Self::new(StatusCode::CONFLICT, "AlreadyExists", message)
            }
            StoreError::Conflict { .. } => Self::new(StatusCode::CONFLICT, "Conflict", message),
            StoreError::Gone { .. } => Self::new(StatusCode::GONE, "Expired", message),
            StoreError::Invalid(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
            }
            StoreError::DiskFull(detail) => {
                tracing::error!(error = %detail, "the store's disk is full; writes fail until space is freed");
                Self::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "InsufficientStorage",
                    "the hub's disk is full: nothing was changed by this request; free space where the \
                     hub keeps its data (--data-dir), then retry",
                )
            }
            // Only the leader's controllers write fenced; an API request never meets this.
            StoreError::Fenced(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                message,
            ),
            // The store took the write but its answer was lost: saying "nothing was changed"
            // would be a guess.
            StoreError::Backend(detail) if detail.contains(crate::store::MAY_HAVE_BEEN_APPLIED) => {
                tracing::error!(error = %detail, "store failure with the write's outcome unknown");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    format!(
                        "the hub's store did not answer whether this change was made; {}",
                        crate::store::MAY_HAVE_BEEN_APPLIED
                    ),
                )
            }
            StoreError::Backend(detail) => {
                tracing::error!(error = %detail, "store failure");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "the hub could not read or write its store; nothing was changed by this request; \
                     check the hub's log and disk, then retry",
                )
            }
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(m) => Self::unauthorized(m),
            AuthError::Forbidden(m) => Self::new(StatusCode::FORBIDDEN, "Forbidden", m),
            AuthError::Store(detail) => ApiError::from(StoreError::Backend(detail)),
        }
    }
}

impl From<TooManyStreams> for ApiError {
    fn from(e: TooManyStreams) -> Self {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            e.to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Nothing was changed" only when that is known: a write whose answer the store lost may
    /// have been applied, and the caller is told to read it back.
    #[test]
    fn a_store_failure_says_whether_the_change_may_have_been_made() {
        let lost = ApiError::from(StoreError::Backend(format!(
            "etcd: transport error; {}",
            crate::store::MAY_HAVE_BEEN_APPLIED
        )));
        assert_eq!(lost.code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            lost.message,
            "the hub's store did not answer whether this change was made; the change may have \
             been applied: read it back before retrying"
        );
        let refused = ApiError::from(StoreError::Backend("etcd: no leader".into()));
        assert_eq!(refused.code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(
            refused.message.contains("nothing was changed"),
            "{}",
            refused.message
        );
    }
}
