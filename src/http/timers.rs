//! The timer routes (reference `queen-client-protocol-2x.md` §2.3, docs/timers.md):
//! `POST /api/v1/timers` (schedule, reschedule and cancel in one transaction, results aligned
//! with the operations), `DELETE /api/v1/timers/{queue}/{timerKey…}` (cancel; never paused),
//! `GET /api/v1/timers/{queue}/{timerKey…}` (peek) and `GET /api/v1/timers/{queue}` (keyset
//! list). The timer key is the rest of the path, percent-decoded, and may hold `/`.
//!
//! Parsing and the answers' shapes are `protocol::timers`; the statements are
//! `storage::timers`; firing is `storage::timers::fire`, a task of its own.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::timers::{
    self as wire, check_queue, check_timer_key, list_limit, TimersError,
};
use crate::state::AppState;
use crate::storage::timers::{self, Cancel};

/// The query's `name`, if given (a malformed query string counts as empty).
fn query_value(req: &HttpRequest, name: &str) -> Option<String> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// The path's queue and key, checked.
fn queue_and_key(path: web::Path<(String, String)>) -> Result<(String, String), ApiError> {
    let (queue, key) = path.into_inner();
    check_queue(&queue).map_err(|t| TimersError::new("invalid_queue", t))?;
    check_timer_key(&key).map_err(|t| TimersError::new("invalid_timer_key", t))?;
    Ok((queue, key))
}

/// `POST /api/v1/timers`: `{"operations": [...]}` → `{"results": [...]}`.
pub async fn batch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let ops = wire::parse_body(&bytes, caller.producer_sub())?;
    drop(bytes);
    if ops.is_empty() {
        return Ok(HttpResponse::Ok().json(json!({ "results": [] })));
    }
    let results = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        timers::apply_alone(&mut conn, &ops).await
    })
    .await?;
    let results: Vec<Value> = results.iter().map(wire::result_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "results": results })))
}

/// `DELETE /api/v1/timers/{queue}/{timerKey…}[?txn=]`: `{ok, status, txn, …}`.
pub async fn cancel(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (queue, timer_key) = queue_and_key(path)?;
    let txn = query_value(&req, "txn").filter(|t| !t.is_empty());
    let op = Cancel {
        queue,
        timer_key,
        txn,
    };
    let result = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        timers::cancel(&mut conn, &op).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(wire::result_json(&result)))
}

/// `GET /api/v1/timers/{queue}/{timerKey…}`: the pending timer, or `{"found": false}`.
pub async fn peek(
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (queue, timer_key) = queue_and_key(path)?;
    let row = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        timers::peek(&mut conn, &queue, &timer_key).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(match row {
        Some(row) => wire::row_json(&row, true),
        None => json!({ "found": false }),
    }))
}

/// `GET /api/v1/timers/{queue}[?after=&limit=]`: `{rows, truncated, nextAfter}`.
pub async fn list(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let queue = path.into_inner();
    check_queue(&queue).map_err(|t| TimersError::new("invalid_queue", t))?;
    let after = query_value(&req, "after").filter(|a| !a.is_empty());
    let limit = list_limit(query_value(&req, "limit").as_deref());
    let (rows, truncated) = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        timers::list(&mut conn, &queue, after.as_deref(), limit).await
    })
    .await?;
    let next_after = if truncated {
        rows.last().map(|r| r.timer_key.clone())
    } else {
        None
    };
    let rows: Vec<Value> = rows.iter().map(|r| wire::row_json(r, false)).collect();
    Ok(HttpResponse::Ok().json(json!({
        "queue": queue,
        "rows": rows,
        "truncated": truncated,
        "nextAfter": next_after,
    })))
}
