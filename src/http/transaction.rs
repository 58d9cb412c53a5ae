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
//!
//! 2.x riders (reference 2.x §2.4, `docs/kv.md`):
//! - `kv`: KV ops applied in the same transaction; their results follow the push and ack
//!   results (one flat index space); `getPrefix` is refused (400 `kv_bad_request`);
//!   `operations: []` is accepted when a rider is present;
//! - a lost `required` KV precondition answers 200 `{"success": false, "reason":
//!   "kv_precondition", "failedIndex", "kvReason", "version", "value"}` and nothing applies;
//! - `timers`: schedule, reschedule and cancel ops (`protocol::timers`, one parser with the
//!   timers route), applied in the same transaction; a malformed op is 400 `timers_bad_request`;
//! - lease fencing: an ack with `leaseId` is fenced by it; an ack without one borrows the lease
//!   of `requiredLeases` when exactly one is named. Any refusal (a lease that expired and was
//!   taken over, a failed ack) is 200 `{"success": false, "error": "transaction rolled back:
//!   ..."}`: a definite "no" the client raises at once, never a 5xx it would send again.
//!
//! `QTB1` (reference 2.x §2.9.5, `Content-Type: application/x-queen-push`): a JSON head (the
//! bundle minus its pushes, read by the rules above) and the pushes as compressed frame groups
//! (`protocol::push_binary`), parsed into the same [`Request`]; results are numbered head
//! operations first, then the pushed items in wire order, then the riders. Flag 2 answers
//! `pushed`, `duplicate` and `acked` counts instead of the pushes' and acks' results.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::{PartitionKey, Verdict};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::ack::{group_of, parse_ack};
use crate::protocol::kv::{list_of, outcome_json, parse_ops};
use crate::protocol::push::{mint, parse_push_body, ParsedItem};
use crate::protocol::push_binary::{self, decode_transaction};
use crate::protocol::timers;
use crate::protocol::{Name, ProtocolError, MAX_NAME_CHARS};
use crate::state::AppState;
use crate::storage::kv::Outcome as KvOutcome;
use crate::storage::transaction::{self, OpResult, PushOp, Request, TimersRider};

#[derive(Deserialize, Default)]
struct Body<'a> {
    #[serde(borrow, default)]
    operations: Option<&'a RawValue>,
    #[serde(default, rename = "requiredLeases")]
    required_leases: Option<Value>,
    #[serde(borrow, default)]
    kv: Option<&'a RawValue>,
    #[serde(borrow, default)]
    timers: Option<&'a RawValue>,
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
    build(body, ops, producer_sub, Vec::new())
}

/// Parses a `QTB1` body (reference 2.x §2.9.5): its JSON head is the bundle minus its pushes
/// and is read by the same rules as the JSON body (`operations` may be left out, and the
/// whole head may be empty), its groups are pushed items. Results are numbered head operations
/// first, then the pushed items in wire order, then the riders. Returns the plan and whether
/// the answer counts (flag 2). Public for the fuzz target `transaction_binary` (fuzz/).
///
/// # Errors
///
/// [`ApiError::BadRequest`] naming the byte offset and field (layout) or the head's bytes
/// and the broken rule; [`ApiError::TooLarge`] when it inflates past `max_decoded`.
pub fn parse_binary(
    bytes: &[u8],
    producer_sub: Option<&str>,
    max_decoded: usize,
) -> Result<(Request, bool), ApiError> {
    let decoded = decode_transaction(bytes, max_decoded).map_err(ApiError::binary)?;
    let pushes: Vec<(ParsedItem, Option<String>)> = decoded
        .items
        .into_iter()
        .zip(decoded.trace_ids.iter().map(|t| t.map(|t| t.to_string())))
        .collect();
    let in_head = |e: String| {
        ApiError::BadRequest(format!(
            "QTB1 body: head (bytes {}..{}): {e}",
            decoded.head_at,
            decoded.head_at + decoded.head.len()
        ))
    };
    if decoded.head.iter().all(u8::is_ascii_whitespace) {
        return Ok((
            build(Body::default(), Vec::new(), producer_sub, pushes)?,
            decoded.counts,
        ));
    }
    let text =
        std::str::from_utf8(decoded.head).map_err(|e| in_head(format!("Invalid JSON: {e}")))?;
    let body: Body =
        serde_json::from_str(text).map_err(|e| in_head(format!("Invalid JSON: {e}")))?;
    let ops: Vec<&RawValue> = match body.operations {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Option<Vec<&RawValue>>>(raw.get())
            .map_err(|_| in_head("operations must be an array".into()))?
            .unwrap_or_default(),
    };
    let plan = build(body, ops, producer_sub, pushes).map_err(|e| match e {
        ApiError::BadRequest(text) => in_head(text),
        other => other,
    })?;
    Ok((plan, decoded.counts))
}

/// The plan of a bundle: its operations, then `pushes` (the items of a `QTB1`'s groups, with
/// their trace ids), then the riders.
fn build(
    body: Body<'_>,
    ops: Vec<&RawValue>,
    producer_sub: Option<&str>,
    pushes: Vec<(ParsedItem, Option<String>)>,
) -> Result<Request, ApiError> {
    let kv_raws = match body.kv {
        None => Vec::new(),
        Some(raw) if raw.get() == "null" => Vec::new(),
        Some(raw) => list_of(raw, "kv").map_err(ApiError::kv)?,
    };
    let kv_ops = parse_ops(&kv_raws, true).map_err(ApiError::kv)?;
    let timer_values: Vec<Value> = match body.timers {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Option<Vec<Value>>>(raw.get())
            .map_err(|_| ApiError::Named {
                code: "timers_bad_request",
                reason: "bad_operations",
                detail: "timers must be an array of timer ops".into(),
            })?
            .unwrap_or_default(),
    };
    let timer_ops = timers::parse_ops(&timer_values, producer_sub)?;
    if ops.is_empty() && pushes.is_empty() && kv_ops.is_empty() && timer_ops.is_empty() {
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
        kv: kv_ops,
        timers: None,
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
    // A `QTB1`'s pushes: after the head's operations, in wire order.
    let (mut parsed, traces): (Vec<ParsedItem>, Vec<Option<String>>) = pushes.into_iter().unzip();
    let items = mint(&mut parsed, producer_sub);
    for ((p, mut item), trace) in parsed.iter().zip(items).zip(traces) {
        item.trace_id = trace;
        plan.pushes.push(PushOp {
            result: plan.results,
            key: PartitionKey::new(&p.queue, &p.partition),
            item,
        });
        plan.results += 1;
    }
    // An ack without its own lease is fenced by the bundle's lease when it names exactly one;
    // with several it is applied unfenced (reference 2.x §2.4).
    if let [only] = plan.required_leases.as_slice() {
        for ack in &mut plan.acks {
            if ack.lease_id.is_none() {
                ack.lease_id = Some(only.clone());
            }
        }
    }
    if !timer_ops.is_empty() {
        plan.timers = Some(TimersRider {
            ops: timer_ops,
            first_index: plan.results + plan.kv.len(),
        });
    }
    Ok(plan)
}

/// `POST /api/v1/transaction`: a JSON body, or with `Content-Type: application/x-queen-push`
/// a `QTB1` body ([`parse_binary`]).
pub async fn transaction(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let binary = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(push_binary::is_binary);
    let (mut plan, counts) = if binary {
        parse_binary(&bytes, caller.producer_sub(), state.settings.max_body_bytes)?
    } else {
        (parse(&bytes, caller.producer_sub())?, false)
    };
    drop(bytes);
    let done = with_db(&state, async {
        crate::storage::consume::acks::resolve_partition_ids(
            &state.pool,
            &state.cache,
            &mut plan.acks,
        )
        .await?;
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
    let id = Uuid::now_v7();
    if let Some(failed) = &done.kv_failed {
        let (kv_reason, value, version) = match &failed.outcome {
            KvOutcome::Refused {
                reason,
                value,
                version,
            } => (
                reason.as_str(),
                value
                    .as_deref()
                    .and_then(|v| serde_json::from_str::<Value>(v).ok())
                    .unwrap_or(Value::Null),
                *version,
            ),
            _ => ("version", Value::Null, 0),
        };
        return Ok(HttpResponse::Ok().json(json!({
            "transactionId": id,
            "success": false,
            "reason": "kv_precondition",
            "failedIndex": failed.index,
            "kvReason": kv_reason,
            "version": version,
            "value": value,
            "error": format!("{}: kv op at index {} lost its precondition ({kv_reason})",
                transaction::ROLLED_BACK, failed.index),
            "results": [],
        })));
    }
    let mut results: Vec<Value> = if counts {
        Vec::new()
    } else {
        done.results.iter().map(|r| result_json(&plan, r)).collect()
    };
    for (i, outcome) in done.kv_results.iter().enumerate() {
        let mut r = outcome_json(plan.results + i, outcome);
        r["type"] = "kv".into();
        r["success"] = (!matches!(outcome, KvOutcome::Refused { .. })).into();
        results.push(r);
    }
    let first_timer = plan.results + plan.kv.len();
    for (i, outcome) in done.timer_results.iter().enumerate() {
        let mut r = timers::result_json(outcome);
        r["index"] = (first_timer + i).into();
        r["type"] = "timer".into();
        r["success"] = true.into();
        results.push(r);
    }
    let mut answer = match done.error {
        None => json!({ "transactionId": id, "success": true, "results": results }),
        Some(error) => json!({
            "transactionId": id, "success": false, "error": error, "results": results,
        }),
    };
    if counts {
        // `QTB1` flag 2: the pushes' and acks' results counted, the riders' listed (their
        // `index` stays the flat one).
        let (mut pushed, mut duplicate, mut acked) = (0, 0, 0);
        for r in &done.results {
            match r {
                OpResult::Push {
                    verdict: Verdict::Duplicate(_),
                    ..
                } => duplicate += 1,
                OpResult::Push { .. } => pushed += 1,
                OpResult::Ack(o) if o.success => acked += 1,
                OpResult::Ack(_) => {}
            }
        }
        answer["pushed"] = pushed.into();
        answer["duplicate"] = duplicate.into();
        answer["acked"] = acked.into();
    }
    Ok(HttpResponse::Ok().json(answer))
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
