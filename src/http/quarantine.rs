//! `GET /api/v1/system/quarantine?limit=100&offset=0` (admin): the spooled records PostgreSQL
//! refused on their own, moved aside by replay so they hold back nothing
//! (`broker_actors::spool::quarantine`), oldest first, with the count.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::http::error::ApiError;
use crate::state::AppState;

/// Records listed per page at most.
const MAX_LIMIT: usize = 1_000;

/// `GET /api/v1/system/quarantine`.
pub async fn list(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let number = |k: &str, default: usize| {
        query
            .get(k)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(default)
    };
    let (limit, offset) = (
        number("limit", 100).clamp(1, MAX_LIMIT),
        number("offset", 0),
    );
    let dir = state.settings.file_buffer_dir.clone();
    let records = web::block(move || broker_actors::spool::quarantine::list(&dir, offset, limit))
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))?
        .map_err(|e| ApiError::Unavailable(format!("cannot read the quarantine file: {e}")))?;
    Ok(HttpResponse::Ok().json(json!({
        "count": state.spool.state.quarantined(),
        "file": broker_actors::spool::quarantine::path(&state.settings.file_buffer_dir),
        "records": records,
        "pagination": { "limit": limit, "offset": offset },
    })))
}
