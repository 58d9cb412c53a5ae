//! Reading request bodies under `QUEEN_MAX_BODY_BYTES`: a declared or actual size above the
//! limit is a 413 with the protocol's JSON error body.

use actix_web::{web, HttpRequest};
use bytes::BytesMut;
use futures_util::StreamExt;

use crate::http::error::ApiError;

/// Reads the whole body, refusing more than `limit` bytes.
///
/// # Errors
///
/// [`ApiError::TooLarge`] above the limit; [`ApiError::BadRequest`] when the stream breaks.
pub async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::TooLarge { limit });
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::BadRequest(format!("could not read request body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Parses a whole body as one JSON value, with the protocol's texts for an empty body
/// (`Empty request body`) and a broken one (`Invalid JSON: ...`).
///
/// # Errors
///
/// [`ApiError::BadRequest`] with one of those texts.
pub fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("Empty request body".into()));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))
}
