//! `POST /api/v1/locks` (reference 2.x §2.2): acquire, renew, release and get of locks and
//! semaphores, kept as KV rows (`storage::kv::locks`). One result per op, in order; the ops
//! are independent (each its own transaction). A malformed call is 400 `lock_bad_request`;
//! "somebody else holds it" is a 200 verdict.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::kv::{lock_outcome_json, operations_of, parse_lock_ops};
use crate::state::AppState;
use crate::storage::kv::locks;

/// `POST /api/v1/locks`.
pub async fn locks(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let ops =
        parse_lock_ops(&operations_of(&bytes).map_err(ApiError::lock)?).map_err(ApiError::lock)?;
    drop(bytes);
    let mut results = Vec::with_capacity(ops.len());
    for (n, op) in ops.iter().enumerate() {
        let outcome = with_db(&state, async {
            let mut conn = state.pool.acquire().await?;
            locks::apply(&mut conn, op).await
        })
        .await?;
        results.push(lock_outcome_json(n, op, &outcome));
    }
    Ok(HttpResponse::Ok().json(json!({ "results": results })))
}
