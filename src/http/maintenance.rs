//! `/api/v1/system/maintenance` (push maintenance: every push spooled, replay paused),
//! `/api/v1/system/maintenance/pop` (every pop answers 204) and `/api/v1/system/shared-state`.
//! The flags live in PostgreSQL so every broker follows them; each broker keeps the last known
//! state when the database is away.

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use crate::http::body::read_body;
use crate::http::error::ApiError;
use crate::state::AppState;
use crate::storage::cluster::system;

const DB_WAIT: Duration = Duration::from_secs(2);

fn buffer_stats(state: &AppState, db_healthy: bool) -> Value {
    let spool = &state.spool.state;
    let bytes = spool.bytes();
    json!({
        "pendingCount": spool.records(),
        "failedCount": 0,
        "dbHealthy": db_healthy,
        "failedFiles": {
            "count": 0,
            "totalBytes": bytes,
            "totalMB": (bytes as f64) / 1_048_576.0,
            "failoverCount": spool.records(),
            "qos0Count": 0,
        },
    })
}

/// Reads both flags from the database (the poller alone updates the broker's own copy),
/// falling back to the last known state when the database does not answer.
async fn read_flags(state: &AppState) -> (bool, bool, bool) {
    match tokio::time::timeout(DB_WAIT, crate::state::read_flags(&state.pool)).await {
        Ok(Ok((push, pop))) => (push, pop, true),
        _ => (
            state.spool.state.maintenance(),
            state.flags.pop_maintenance(),
            false,
        ),
    }
}

/// Parses `{"enabled": bool}`.
async fn enabled_body(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<bool, ApiError> {
    let bytes = read_body(req, payload, state.settings.max_body_bytes).await?;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    body.get("enabled")
        .and_then(Value::as_bool)
        .ok_or_else(|| ApiError::BadRequest("enabled (boolean) is required".into()))
}

async fn store_flag(state: &AppState, key: &str, enabled: bool) -> Result<(), ApiError> {
    match tokio::time::timeout(DB_WAIT, system::set_flag(&state.pool, key, enabled)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ApiError::Unavailable(format!("cannot store {key}: {e}"))),
        Err(_) => Err(ApiError::Unavailable(format!(
            "cannot store {key}: database did not answer"
        ))),
    }
}

/// `GET /api/v1/system/maintenance`.
pub async fn get(state: web::Data<AppState>) -> HttpResponse {
    let (push, pop, db_healthy) = read_flags(&state).await;
    HttpResponse::Ok().json(json!({
        "maintenanceMode": push,
        "popMaintenanceMode": pop,
        "bufferedMessages": state.spool.state.records(),
        "bufferHealthy": true,
        "bufferStats": buffer_stats(&state, db_healthy),
    }))
}

/// `POST /api/v1/system/maintenance` with `{"enabled": bool}`.
pub async fn set(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let enabled = enabled_body(&req, payload, &state).await?;
    store_flag(&state, system::MAINTENANCE, enabled).await?;
    // After the write, before the local change: a poll that read the old value is discarded.
    state.flags.changed();
    state.spool.state.set_maintenance(enabled);
    tracing::info!(enabled, "maintenance mode changed");
    Ok(HttpResponse::Ok().json(json!({
        "maintenanceMode": enabled,
        "bufferedMessages": state.spool.state.records(),
        "bufferHealthy": true,
        "message": if enabled {
            "Maintenance mode enabled: every push is spooled to disk and replay is paused"
        } else {
            "Maintenance mode disabled: the spool drains into PostgreSQL"
        },
    })))
}

/// `GET /api/v1/system/maintenance/pop`.
pub async fn get_pop(state: web::Data<AppState>) -> HttpResponse {
    let (_, pop, _) = read_flags(&state).await;
    HttpResponse::Ok().json(json!({
        "popMaintenanceMode": pop,
        "message": if pop { "Pop maintenance mode is on" } else { "Pop maintenance mode is off" },
    }))
}

/// `POST /api/v1/system/maintenance/pop` with `{"enabled": bool}`.
pub async fn set_pop(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let enabled = enabled_body(&req, payload, &state).await?;
    store_flag(&state, system::POP_MAINTENANCE, enabled).await?;
    state.flags.changed();
    state.flags.set_pop_maintenance(enabled);
    Ok(HttpResponse::Ok().json(json!({
        "popMaintenanceMode": enabled,
        "message": if enabled { "Pop maintenance mode enabled: pops answer 204" } else { "Pop maintenance mode disabled" },
    })))
}

/// `GET /api/v1/system/shared-state`: brokers share nothing but PostgreSQL.
pub async fn shared_state() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "enabled": false }))
}
