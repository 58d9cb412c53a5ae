//! `POST /api/v1/ack` and `POST /api/v1/ack/batch` (reference §5.1, §5.2): validate, apply
//! every ack in one transaction (`storage::acks`), answer one result per ack. Business
//! failures are `success: false` items under 200; only a malformed request is a 400.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::app::AppState;
use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::storage::acks::{self, Ack, AckMode, AckOutcome, AckStatus};
use crate::storage::consume::QUEUE_MODE;

/// Parses a JSON request body; an empty one is `{}` when `empty_ok`, else a 400.
///
/// # Errors
///
/// [`ApiError::BadRequest`] with the protocol's texts.
pub fn json_body(bytes: &[u8], empty_ok: bool) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_ok {
            Ok(json!({}))
        } else {
            Err(ApiError::BadRequest("Empty request body".into()))
        };
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))
}

/// A string field; `null` and other types count as absent.
pub fn opt_str<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

/// The consumer group of a body: absent, `null`, empty or not a string = queue mode.
pub fn group_of(v: &Value) -> String {
    opt_str(v, "consumerGroup")
        .filter(|g| !g.is_empty())
        .unwrap_or(QUEUE_MODE)
        .to_string()
}

/// Parses one ack object (the `/ack` body, an `/ack/batch` item or a transaction op).
///
/// # Errors
///
/// [`ApiError::BadRequest`] naming the missing or malformed field.
pub fn parse_ack(
    v: &Value,
    index: usize,
    group: String,
    missing_txn: &str,
    missing_partition: &str,
) -> Result<Ack, ApiError> {
    let transaction_id = opt_str(v, "transactionId")
        .ok_or_else(|| ApiError::BadRequest(missing_txn.into()))?
        .to_string();
    let partition =
        opt_str(v, "partitionId").ok_or_else(|| ApiError::BadRequest(missing_partition.into()))?;
    let partition = Uuid::parse_str(partition).map_err(|_| {
        ApiError::BadRequest(format!("partitionId must be a UUID, got {partition:?}"))
    })?;
    let status = match v.get("status") {
        None | Some(Value::Null) => AckStatus::Completed,
        Some(Value::String(s)) => AckStatus::parse(Some(s)),
        Some(_) => AckStatus::Unknown,
    };
    Ok(Ack {
        index,
        partition,
        transaction_id,
        status,
        group,
        lease_id: opt_str(v, "leaseId").map(str::to_string),
        error: opt_str(v, "error").map(str::to_string),
    })
}

/// One ack result on the wire.
pub fn outcome_json(o: &AckOutcome) -> Value {
    json!({
        "index": o.index,
        "transactionId": o.transaction_id,
        "success": o.success,
        "error": o.error,
        "queueName": o.queue_name,
        "partitionName": o.partition_name,
        "leaseReleased": o.lease_released,
        "dlq": o.dlq,
    })
}

async fn apply(state: &AppState, list: Vec<Ack>) -> Result<HttpResponse, ApiError> {
    let outcomes = with_db(state, async {
        let mut conn = state.pool.acquire().await?;
        if let Some(done) = acks::apply_completed_fast(&mut conn, &state.cache, &list).await? {
            return Ok(done);
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let outcomes = acks::apply(&mut tx, &state.cache, &list, AckMode::Consume).await?;
        tx.commit().await?;
        Ok(outcomes)
    })
    .await?;
    let body: Vec<Value> = outcomes.iter().map(outcome_json).collect();
    Ok(HttpResponse::Ok().json(body))
}

/// `POST /api/v1/ack`.
pub async fn ack(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let v = json_body(&bytes, false)?;
    let one = parse_ack(
        &v,
        0,
        group_of(&v),
        "transactionId is required",
        "partitionId is required to ensure message uniqueness",
    )?;
    apply(&state, vec![one]).await
}

/// `POST /api/v1/ack/batch`.
pub async fn ack_batch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let v = json_body(&bytes, false)?;
    let items = v
        .get("acknowledgments")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::BadRequest("acknowledgments array is required".into()))?;
    // The top-level group applies to every item.
    let group = group_of(&v);
    let list = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse_ack(
                item,
                index,
                group.clone(),
                "Each acknowledgment must have a valid transactionId string",
                "Each acknowledgment must have a valid partitionId string to ensure message uniqueness",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    apply(&state, list).await
}
