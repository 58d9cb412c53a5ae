//! `POST /api/v1/transaction` (reference §6): push and ack operations applied in ONE database
//! transaction; any failure rolls back all of it.
//!
//! Pushes go through `storage::commit::write_segments`, the same statements as `/push`, inside
//! this request's transaction (so they bypass the partition actors; the partition row lock
//! still orders them against every other writer). Decisions on the open questions (§15):
//! - a push whose transactionId is already in its partition inside the dedup window is a
//!   `duplicate` result (nothing written, the transaction goes on), as on `/push`;
//! - `requiredLeases`, when given, must all be live, else the transaction fails untouched;
//! - `traceId` is any string of at most 255 characters, popped back as given.
//!
//! All pushes are written first (one lock pass over their partitions, in id order, so two
//! transactions never deadlock), then the acks in request order. An ack cannot name a message
//! pushed by the same transaction (it has never been leased), so the order is not observable.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::store::SegmentWrite;
use broker_actors::{Item, PartitionKey, Verdict};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::app::AppState;
use crate::auth::Caller;
use crate::http::ack::{group_of, parse_ack};
use crate::http::body::read_body;
use crate::http::error::{database_away as away, with_db, ApiError};
use crate::http::push::{mint, parse_push_body, MAX_NAME_CHARS};
use crate::storage::acks::{self, Ack, AckMode};
use crate::storage::{commit, leases};

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    operations: Option<&'a RawValue>,
    #[serde(default, rename = "requiredLeases")]
    required_leases: Option<Value>,
}

#[derive(Deserialize)]
struct TraceOnly {
    #[serde(default, rename = "traceId")]
    trace_id: Option<Value>,
}

/// One push item of the transaction, with where its result goes.
struct PushSlot {
    result: usize,
    item: Item,
    queue: String,
    key: PartitionKey,
}

/// The parsed request.
struct Plan {
    pushes: Vec<PushSlot>,
    acks: Vec<Ack>,
    /// Results in the response: one per push item and one per ack, in request order.
    results: usize,
    required: Vec<String>,
}

/// Parses the body; every push item is stamped with `producer_sub` (the caller's `sub`).
fn parse(bytes: &[u8], producer_sub: Option<&str>) -> Result<Plan, ApiError> {
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
    let mut plan = Plan {
        pushes: Vec::new(),
        acks: Vec::new(),
        results: 0,
        required: match body.required_leases {
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        },
    };
    for (n, raw) in ops.into_iter().enumerate() {
        let op: Value = serde_json::from_str(raw.get())
            .map_err(|e| ApiError::BadRequest(format!("operation {n}: {e}")))?;
        match op.get("type").and_then(Value::as_str) {
            Some("push") => {
                let at = |e: ApiError| ApiError::BadRequest(format!("operation {n}: {e}"));
                let parsed = parse_push_body(raw.get().as_bytes()).map_err(at)?;
                let traces: Vec<TraceOnly> = serde_json::from_value(op["items"].clone())
                    .map_err(|e| ApiError::BadRequest(format!("operation {n}: {e}")))?;
                let items = mint(&parsed, producer_sub);
                for (i, ((p, mut item), trace)) in parsed.iter().zip(items).zip(traces).enumerate()
                {
                    item.trace_id = match trace.trace_id {
                        None | Some(Value::Null) => None,
                        Some(Value::String(t)) if t.chars().count() <= MAX_NAME_CHARS => Some(t),
                        Some(_) => {
                            return Err(ApiError::BadRequest(format!(
                                "operation {n}: item {i}: traceId must be a string of at most {MAX_NAME_CHARS} characters"
                            )))
                        }
                    };
                    plan.pushes.push(PushSlot {
                        result: plan.results,
                        key: PartitionKey::new(&p.queue, &p.partition),
                        queue: p.queue.clone(),
                        item,
                    });
                    plan.results += 1;
                }
            }
            Some("ack") => {
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

/// What the transaction did, before it is turned into the response.
struct Done {
    results: Vec<Value>,
    error: Option<String>,
    woken: Vec<PartitionKey>,
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
    let done = with_db(&state, run(&state, plan)).await?;
    for key in &done.woken {
        state.wake.wake(&key.queue, &key.partition);
    }
    let id = Uuid::now_v7();
    Ok(HttpResponse::Ok().json(match done.error {
        None => json!({ "transactionId": id, "success": true, "results": done.results }),
        Some(error) => json!({
            "transactionId": id, "success": false, "error": error, "results": done.results,
        }),
    }))
}

/// Runs the plan in one transaction. Database trouble that means "PostgreSQL is away" is an
/// `Err` (503, the client retries); any other failure rolls back and is reported in `Done`.
async fn run(state: &AppState, plan: Plan) -> sqlx::Result<Done> {
    let mut conn = state.pool.acquire().await?;

    // One segment per partition, items in request order.
    let mut writes: Vec<SegmentWrite> = Vec::new();
    let mut slots: Vec<Vec<usize>> = Vec::new();
    let mut by_key: HashMap<PartitionKey, usize> = HashMap::new();
    for (n, push) in plan.pushes.iter().enumerate() {
        let w = *by_key.entry(push.key.clone()).or_insert_with(|| {
            writes.push(SegmentWrite {
                key: push.key.clone(),
                partition_id: None,
                items: Vec::new(),
            });
            slots.push(Vec::new());
            writes.len() - 1
        });
        writes[w].items.push(push.item.clone());
        slots[w].push(n);
    }
    let ids = if writes.is_empty() {
        Vec::new()
    } else {
        commit::resolve_partition_ids(&mut conn, &writes).await?
    };
    let uuids: HashMap<i64, Uuid> = if ids.is_empty() {
        HashMap::new()
    } else {
        sqlx::query_as::<_, (i64, Uuid)>("SELECT id, uuid FROM queen.partitions WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect()
    };

    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let mut results: Vec<Value> = vec![Value::Null; plan.results];
    let fail = |results: Vec<Value>, error: String| Done {
        results: results.into_iter().filter(|r| !r.is_null()).collect(),
        error: Some(error),
        woken: Vec::new(),
    };

    if !plan.required.is_empty() {
        let parsed: Vec<Uuid> = plan
            .required
            .iter()
            .filter_map(|l| Uuid::parse_str(l).ok())
            .collect();
        if parsed.len() != plan.required.len() {
            return Ok(fail(
                results,
                "requiredLeases holds a lease id that is not a UUID".into(),
            ));
        }
        let dead = leases::not_live(&mut tx, &parsed).await?;
        if let Some(lease) = dead.first() {
            return Ok(fail(results, format!("Lease {lease} is not live")));
        }
    }

    let mut woken = Vec::new();
    if !writes.is_empty() {
        let outcomes = match commit::write_segments(&mut tx, &writes, &ids)
            .await
            .map_err(sqlx::Error::from)
        {
            Ok(o) => o,
            Err(e) if !away(&e) => return Ok(fail(results, e.to_string())),
            Err(e) => return Err(e),
        };
        for ((write, outcome), members) in writes.iter().zip(&outcomes).zip(&slots) {
            let partition_uuid = uuids.get(&outcome.partition_id).copied();
            for (verdict, &n) in outcome.verdicts.iter().zip(members) {
                let push = &plan.pushes[n];
                let message_id = match verdict {
                    Verdict::Duplicate(original) => *original,
                    _ => push.item.message_id,
                };
                results[push.result] = json!({
                    "index": push.result,
                    "type": "push",
                    "success": true,
                    "status": verdict.as_str(),
                    "transactionId": push.item.transaction_id,
                    "messageId": message_id,
                    "partitionId": partition_uuid,
                    "queueName": push.queue,
                });
            }
            if outcome.verdicts.contains(&Verdict::Queued) {
                woken.push(write.key.clone());
            }
        }
    }

    if !plan.acks.is_empty() {
        let outcomes =
            match acks::apply(&mut tx, &state.cache, &plan.acks, AckMode::Transaction).await {
                Ok(o) => o,
                Err(e) if !away(&e) => return Ok(fail(results, e.to_string())),
                Err(e) => return Err(e),
            };
        let mut first_error = None;
        for o in &outcomes {
            results[o.index] = json!({
                "index": o.index,
                "type": "ack",
                "success": o.success,
                "transactionId": o.transaction_id,
                "error": o.error,
                "dlq": o.dlq,
            });
            if !o.success && first_error.is_none() {
                first_error = Some(format!(
                    "ack of {}: {}",
                    o.transaction_id,
                    o.error.as_deref().unwrap_or("unsupported status")
                ));
            }
        }
        if let Some(error) = first_error {
            return Ok(fail(results, error));
        }
    }
    match tx.commit().await {
        Ok(()) => Ok(Done {
            results,
            error: None,
            woken,
        }),
        Err(e) if !away(&e) => Ok(fail(Vec::new(), e.to_string())),
        Err(e) => Err(e),
    }
}
