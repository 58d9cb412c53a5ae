//! The streams runtime's routes (reference 2.x §2.11, `docs/streams.md`): `POST
//! /streams/v1/queries` (register), `/streams/v1/state/get` and `/streams/v1/cycle`.
//!
//! Bodies are parsed by `protocol::streams`; the work is `storage::streams`. Statuses, chosen so
//! the SDKs' streams client (which retries 5xx, 408 and 429, and raises any other 4xx at once)
//! never re-sends a cycle that was refused:
//! - 400 malformed body (`{"success": false, "error": "query_id is required"}` and the like);
//! - 404 `query_id` not registered;
//! - 409 register with a changed `config_hash` and no `reset`; cycle whose ack names a lease
//!   that is not live (`Invalid or expired lease`), or a message outside the group's lease
//!   (`Message not found`), or whose sink queue refused the push;
//! - 413 cycle that would take the partition's state past the query's bound;
//! - 503 PostgreSQL away (retried by the client; the cycle rolled back).
//!
//! Every refused cycle applied nothing. Its body is `{"success": false, "error": prose, "code":
//! stable id, "query_id", "partition_id"}`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::streams::{parse_cycle, parse_register, parse_state_get};
use crate::protocol::time::iso_millis;
use crate::protocol::ProtocolError;
use crate::state::AppState;
use crate::storage::push::partitions;
use crate::storage::streams::cycle::{self, Refused};
use crate::storage::streams::{self, Registered};

/// A malformed body: 400 in the streams' shape (the client reads `error`).
fn bad_request(e: ProtocolError) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({ "success": false, "error": e.0 }))
}

/// `POST /streams/v1/queries`: idempotent registration by name.
pub async fn register(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let reg = match parse_register(&bytes) {
        Ok(r) => r,
        Err(e) => return Ok(bad_request(e)),
    };
    let done = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        streams::register(&mut conn, &reg).await
    })
    .await?;
    Ok(match done {
        Registered::Ok { id, fresh, reset } => HttpResponse::Ok().json(json!({
            "success": true,
            "query_id": id,
            "name": reg.name,
            "config_hash": reg.config_hash,
            "fresh": fresh,
            "reset": reset,
        })),
        Registered::HashMismatch { id, stored } => HttpResponse::Conflict().json(json!({
            "success": false,
            "query_id": id,
            "name": reg.name,
            "code": "config_hash_mismatch",
            "error": format!(
                "config_hash mismatch: query {} is registered with {stored}, this run has {}; \
                 register with reset: true to wipe its state, or use another name",
                reg.name, reg.config_hash
            ),
        })),
    })
}

/// `POST /streams/v1/state/get`: the rows of one (query, partition), sorted by key.
pub async fn state_get(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let mut query = match parse_state_get(&bytes) {
        Ok(q) => q,
        Err(e) => return Ok(bad_request(e)),
    };
    let rows = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        if let Some(id) = query.partition_number {
            query.partition_id = partitions::uuid_by_id(&mut conn, &state.cache, id).await?;
        }
        if !streams::query_exists(&mut conn, query.query_id).await? {
            return Ok(None);
        }
        streams::get_state(&mut conn, &query).await.map(Some)
    })
    .await?;
    let Some(rows) = rows else {
        return Ok(unknown_query(&Refused::UnknownQuery(query.query_id)));
    };
    // Stored values are valid JSON text (checked when written) and go out verbatim.
    let rows: Vec<StateRowOut> = rows
        .iter()
        .map(|r| StateRowOut {
            key: &r.key,
            value: serde_json::from_str(&r.value).ok(),
            updated_at: iso_millis(r.updated_at),
        })
        .collect();
    Ok(HttpResponse::Ok().json(StateRowsOut {
        success: true,
        rows,
    }))
}

#[derive(Serialize)]
struct StateRowOut<'a> {
    key: &'a str,
    value: Option<&'a RawValue>,
    updated_at: String,
}

#[derive(Serialize)]
struct StateRowsOut<'a> {
    success: bool,
    rows: Vec<StateRowOut<'a>>,
}

fn unknown_query(refused: &Refused) -> HttpResponse {
    HttpResponse::NotFound().json(json!({
        "success": false,
        "code": "query_not_found",
        "error": refused.to_string(),
    }))
}

/// `POST /streams/v1/cycle`: state ops, sink pushes and the source ack in one transaction.
pub async fn cycle(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let mut plan = match parse_cycle(&bytes, caller.producer_sub()) {
        Ok(c) => c,
        Err(e) => return Ok(bad_request(e)),
    };
    drop(bytes);
    let done = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        if let Some(id) = plan.partition_number {
            plan.partition_id = partitions::uuid_by_id(&mut conn, &state.cache, id).await?;
        }
        cycle::run(&mut conn, &state.cache, state.payload_key.as_ref(), &plan).await
    })
    .await?;
    let committed = match done {
        Ok(c) => c,
        Err(refused) => {
            let (status, code) = match &refused {
                Refused::UnknownQuery(_) => return Ok(unknown_query(&refused)),
                Refused::StateTooLarge { .. } => {
                    (StatusCode::PAYLOAD_TOO_LARGE, "state_limit_exceeded")
                }
                Refused::SinkRefused(_) => (StatusCode::CONFLICT, "sink_refused"),
                Refused::LeaseLost { .. } => (StatusCode::CONFLICT, "lease_lost"),
                Refused::AckNotFound { .. } => (StatusCode::CONFLICT, "ack_message_not_found"),
                Refused::AckRefused(_) => (StatusCode::CONFLICT, "ack_refused"),
            };
            return Ok(HttpResponse::build(status).json(json!({
                "success": false,
                "code": code,
                "error": refused.to_string(),
                "query_id": plan.query_id,
                "partition_id": plan.partition_id,
                "state_ops_applied": 0,
                "push_results": [],
                "ack_result": null,
            })));
        }
    };
    // The commit's NOTIFY wakes the sink's long-polls through this broker's LISTEN; only while
    // that connection is down does the route wake them itself.
    if !state.wake.listening() {
        for key in &committed.woken {
            state.wake.wake(&key.queue, &key.partition);
        }
    }
    if let (Some(ack), Some((queue, partition))) = (&plan.ack, &committed.source) {
        if committed.ack.as_ref().is_some_and(|a| a.lease_released) {
            if let Some(lease) = ack
                .lease_id
                .as_deref()
                .and_then(|l| uuid::Uuid::parse_str(l).ok())
            {
                state.cache.forget_lease(lease, plan.partition_id);
            }
        }
        if committed.left_behind {
            // The released lease left messages: a waiting consumer of the group takes them now.
            state.wake.wake(queue, partition);
        }
    }
    let push_results: Vec<Value> = committed
        .pushes
        .iter()
        .enumerate()
        .map(|(index, p)| {
            json!({
                "index": index,
                "status": p.verdict.as_str(),
                "messageId": p.message_id,
                "transactionId": p.transaction_id,
                "queueName": p.queue,
                "partitionId": p.partition_id,
            })
        })
        .collect();
    let ack_result = committed.ack.as_ref().map(|a| {
        json!({
            "success": true,
            "count": a.count,
            "lease_released": a.lease_released,
            "dlq": a.dlq,
        })
    });
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "query_id": plan.query_id,
        "partition_id": plan.partition_id,
        "queueName": committed.source.as_ref().map(|(q, _)| q),
        "state_ops_applied": committed.state_ops_applied,
        "push_results": push_results,
        "ack_result": ack_result,
    })))
}
