//! `GET /api/v1/system/undecryptable` (admin): the partitions this broker found stopped, per
//! consumer group, in front of a message of an encrypted queue its key cannot open
//! (`storage::queues::undecryptable`): queue, partition, group, offset, message id, why, since when.
//! Nothing there is lost: a broker with the right key delivers from that offset on.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::http::error::ApiError;
use crate::state::AppState;

/// `GET /api/v1/system/undecryptable`.
pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let stopped = state.undecryptable.list();
    Ok(HttpResponse::Ok().json(json!({
        "count": stopped.len(),
        "stopsTotal": state.undecryptable.total(),
        "partitions": stopped,
    })))
}
