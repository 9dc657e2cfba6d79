//! `/v1/recordings`: the shell sessions recorded ([`crate::recording`]), for admins (or a
//! global role that allows `get recordings`): the list, one session, and its asciicast.

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{Api, ApiError};
use crate::auth::Principal;

async fn reader(api: &Api, headers: &HeaderMap) -> Result<Principal, ApiError> {
    let principal = api.principal(headers).await?;
    may_read(&principal)?;
    Ok(principal)
}

/// Whether `principal` may read shell recordings (the API's and the dashboard's rule); the
/// refusal says what it takes.
pub(crate) fn may_read(principal: &Principal) -> Result<(), ApiError> {
    if !principal.may_hub("get", "recordings") {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "user {:?} may not read shell recordings: that is for admins, or a global role that allows get recordings ({})",
                principal.user,
                crate::model::HUB_GROUP
            ),
        ));
    }
    Ok(())
}

fn io_error(e: std::io::Error) -> ApiError {
    ApiError::internal(format!("reading the recordings: {e}"))
}

fn missing(id: &str) -> ApiError {
    ApiError::not_found(format!("recordings.drover.io {id:?} not found"))
}

pub(super) async fn list(
    State(api): State<Api>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    reader(&api, &headers).await?;
    let sessions = api.recordings.list().await.map_err(io_error)?;
    Ok(Json(json!({
        "apiVersion": super::API_VERSION,
        "kind": "RecordingList",
        "items": sessions,
    })))
}

pub(super) async fn one(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    reader(&api, &headers).await?;
    let session = api.recordings.get(&id).await.map_err(io_error)?;
    let session = session.ok_or_else(|| missing(&id))?;
    Ok(Json(json!({
        "apiVersion": super::API_VERSION,
        "kind": "Recording",
        "session": session,
    })))
}

/// The asciicast v2 file (`asciinema play` plays it).
pub(super) async fn cast(
    State(api): State<Api>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    reader(&api, &headers).await?;
    let bytes = api.recordings.cast(&id).await.map_err(io_error)?;
    let bytes = bytes.ok_or_else(|| missing(&id))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-asciicast"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        bytes,
    )
        .into_response())
}
