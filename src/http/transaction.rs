//! `POST /api/v1/transaction` (reference §6): push and ack operations applied in ONE database
//! transaction; any failure rolls back all of it.
//!
//! The body is parsed here; the transaction itself is `storage::transaction::apply` (pushes
//! through the same statements as `/push`, bypassing the partition actors). Decisions on the
//! open questions (§15):
//! - a push whose transactionId is already in its partition inside the dedup window is a
//!   `duplicate` result (nothing written, the transaction goes on), as on `/push`;
//! - `requiredLeases`, when given, must all be live, else the transaction fails untouched;
//! - `traceId` is any string of at most 255 characters, popped back as given.

use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::PartitionKey;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::ack::{group_of, parse_ack};
use crate::protocol::push::{mint, parse_push_body};
use crate::protocol::{Name, ProtocolError, MAX_NAME_CHARS};
use crate::state::AppState;
use crate::storage::transaction::{self, OpResult, PushOp, Request};

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    operations: Option<&'a RawValue>,
    #[serde(default, rename = "requiredLeases")]
    required_leases: Option<Value>,
}

/// An operation's type and items, the rest left unread: a push operation's payloads are kept
/// raw exactly as on `/push` (no nesting limit of a parsed JSON tree applies to them).
#[derive(Deserialize)]
struct OpHead<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct TraceOnly {
    #[serde(default, rename = "traceId")]
    trace_id: Option<Value>,
}

/// Parses the body; every push item is stamped with `producer_sub` (the caller's `sub`).
/// Public for the fuzz target `ack_transaction_body` (fuzz/).
///
/// # Errors
///
/// [`ApiError::BadRequest`] naming the operation and the broken rule.
pub fn parse(bytes: &[u8], producer_sub: Option<&str>) -> Result<Request, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("Empty request body".into()));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))?;
    let body: Body = serde_json::from_str(text)
        .map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))?;
    let required_array = || ApiError::BadRequest("operations array required".into());
    let ops: Vec<&RawValue> =
        serde_json::from_str(body.operations.ok_or_else(required_array)?.get())
            .map_err(|_| required_array())?;
    if ops.is_empty() {
        return Err(ApiError::BadRequest(
            "operations array cannot be empty".into(),
        ));
    }
    let mut plan = Request {
        pushes: Vec::new(),
        acks: Vec::new(),
        results: 0,
        required_leases: match body.required_leases {
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        },
    };
    for (n, raw) in ops.into_iter().enumerate() {
        let head: OpHead = serde_json::from_str(raw.get())
            .map_err(|e| ApiError::BadRequest(format!("operation {n}: {e}")))?;
        let kind = head
            .kind
            .and_then(|k| serde_json::from_str::<String>(k.get()).ok());
        match kind.as_deref() {
            Some("push") => {
                let at = |e: ProtocolError| ApiError::BadRequest(format!("operation {n}: {e}"));
                let mut parsed = parse_push_body(raw.get().as_bytes()).map_err(at)?;
                let items = head.items.map_or("[]", RawValue::get);
                let traces: Vec<TraceOnly> = serde_json::from_str(items)
                    .map_err(|e| ApiError::BadRequest(format!("operation {n}: {e}")))?;
                let items = mint(&mut parsed, producer_sub);
                for (i, ((p, mut item), trace)) in parsed.iter().zip(items).zip(traces).enumerate()
                {
                    item.trace_id = match trace.trace_id {
                        None | Some(Value::Null) => None,
                        Some(Value::String(t)) if Name::fits(&t) => Some(t),
                        Some(_) => {
                            return Err(ApiError::BadRequest(format!(
                                "operation {n}: item {i}: traceId must be a string of at most {MAX_NAME_CHARS} characters without NUL"
                            )))
                        }
                    };
                    plan.pushes.push(PushOp {
                        result: plan.results,
                        key: PartitionKey::new(&p.queue, &p.partition),
                        item,
                    });
                    plan.results += 1;
                }
            }
            Some("ack") => {
                let op: Value = serde_json::from_str(raw.get())
                    .map_err(|e| ApiError::BadRequest(format!("operation {n}: {e}")))?;
                let ack = parse_ack(
                    &op,
                    plan.results,
                    group_of(&op),
                    &format!("operation {n}: transactionId is required"),
                    &format!("operation {n}: partitionId is required"),
                )?;
                plan.acks.push(ack);
                plan.results += 1;
            }
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "operation {n}: type must be \"push\" or \"ack\""
                )))
            }
        }
    }
    Ok(plan)
}

/// `POST /api/v1/transaction`.
pub async fn transaction(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let plan = parse(&bytes, caller.producer_sub())?;
    drop(bytes);
    let done = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        transaction::apply(&mut conn, &state.cache, state.payload_key.as_ref(), &plan).await
    })
    .await?;
    // The commit's NOTIFY wakes this broker's pops through its own LISTEN (and hands the
    // partitions off); only while that connection is down does the route wake them itself.
    if !state.wake.listening() {
        for key in &done.woken {
            state.wake.wake(&key.queue, &key.partition);
        }
    }
    let results: Vec<Value> = done.results.iter().map(|r| result_json(&plan, r)).collect();
    let id = Uuid::now_v7();
    Ok(HttpResponse::Ok().json(match done.error {
        None => json!({ "transactionId": id, "success": true, "results": results }),
        Some(error) => json!({
            "transactionId": id, "success": false, "error": error, "results": results,
        }),
    }))
}

/// One operation's result on the wire.
fn result_json(plan: &Request, result: &OpResult) -> Value {
    match result {
        OpResult::Push {
            verdict,
            message_id,
            partition_id,
            op,
        } => {
            let push = &plan.pushes[*op];
            json!({
                "index": push.result,
                "type": "push",
                "success": true,
                "status": verdict.as_str(),
                "transactionId": push.item.transaction_id,
                "messageId": message_id,
                "partitionId": partition_id,
                "queueName": &*push.key.queue,
            })
        }
        OpResult::Ack(o) => json!({
            "index": o.index,
            "type": "ack",
            "success": o.success,
            "transactionId": o.transaction_id,
            "error": o.error,
            "dlq": o.dlq,
        }),
    }
}
