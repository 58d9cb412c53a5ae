//! `GET /health` (readiness: a real database round trip) and `GET /health/live` (liveness:
//! never touches the database, so a probe wired to it does not kill a broker that is spooling).

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::state::AppState;
use crate::storage::cluster::system;

/// Readiness: 200 when `SELECT 1` answers within `QUEEN_HEALTH_TIMEOUT_MS` (2 s), else 503.
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let round_trip = tokio::time::timeout(
        state.settings.health_timeout,
        system::round_trip(&state.pool),
    )
    .await;
    let healthy = matches!(round_trip, Ok(Ok(true)));
    let body = json!({
        "status": if healthy { "healthy" } else { "unhealthy" },
        "database": if healthy { "connected" } else { "disconnected" },
        "server": "queen-broker",
        "worker_id": 0,
        "version": env!("CARGO_PKG_VERSION"),
        "shared_state": { "enabled": false },
        "queen": { "worker_id": 0, "status": if healthy { "healthy" } else { "unhealthy" } },
    });
    if healthy {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Liveness: the process answers HTTP.
pub async fn live() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "alive" }))
}
