//! `POST /api/v1/kv` (reference 2.x §2.1): a batch of KV ops applied in order in ONE database
//! transaction (`storage::kv::run_batch`); `{"results": [...]}`, one per op, index-aligned.
//! A malformed call is 400 `kv_bad_request`; "no" to an op is a 200 verdict (`applied:false`).

use actix_web::{web, HttpRequest, HttpResponse};

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::kv::{batch_json, operations_of, parse_ops};
use crate::state::AppState;
use crate::storage::kv::run_batch;

/// `POST /api/v1/kv`.
pub async fn kv(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let ops =
        parse_ops(&operations_of(&bytes).map_err(ApiError::kv)?, false).map_err(ApiError::kv)?;
    drop(bytes);
    let batch = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        run_batch(&mut conn, &ops).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(batch_json(&ops, &batch)))
}
