//! What a write's body is: JSON (axum's extractor, its errors said the API's way), or YAML for a
//! create, as the dashboard's YAML editors send it.

use axum::{Json, http::StatusCode};
use serde_json::Value;

use super::ApiError;

/// A body past the API's limit.
fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "RequestEntityTooLarge",
        "the request body is larger than the API takes (2 MiB); a list: send fewer items in each",
    )
}

pub(super) type JsonBody = Result<Json<Value>, axum::extract::rejection::JsonRejection>;

pub(super) fn body(body: JsonBody) -> Result<Value, ApiError> {
    let Json(value) = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::bad_request(format!("request body: {e}"))
        }
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object with metadata and spec",
        ));
    }
    Ok(value)
}

/// A body to create from: JSON, or YAML when the request says `Content-Type:
/// application/yaml` (as the dashboard's YAML editors send it).
pub(super) struct Body(pub(super) Result<Value, ApiError>);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = std::convert::Infallible;

    async fn from_request(
        request: axum::extract::Request,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let yaml = request
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/yaml"));
        if !yaml {
            return Ok(Body(body(
                Json::<Value>::from_request(request, state).await,
            )));
        }
        let parsed = match axum::body::Bytes::from_request(request, state).await {
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(too_large()),
            Err(e) => Err(ApiError::bad_request(format!(
                "request body: {}",
                e.body_text()
            ))),
            Ok(bytes) => std::str::from_utf8(&bytes)
                .map_err(|_| ApiError::bad_request("request body: YAML must be UTF-8"))
                .and_then(|text| {
                    serde_saphyr::from_str::<Value>(text)
                        .map_err(|e| ApiError::bad_request(format!("request body: {e}")))
                })
                .and_then(|value| {
                    if value.is_object() {
                        Ok(value)
                    } else {
                        Err(ApiError::bad_request(
                            "the body must be an object with metadata and spec",
                        ))
                    }
                }),
        };
        Ok(Body(parsed))
    }
}
