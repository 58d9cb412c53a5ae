//! Timer operations on the wire (reference `queen-client-protocol-2x.md` §2.3): the one parser
//! of `schedule` / `reschedule` / `cancel` objects, shared by `POST /api/v1/timers`, the
//! cancel route and the `timers` rider of `POST /api/v1/transaction`, and the one writer of
//! their results. Choices for the reference's open points are in docs/timers.md.
//!
//! Every broken rule is a [`TimersError`] with a stable `reason` and a sentence naming the
//! operation and field; the HTTP layer answers it as 400 `timers_bad_request`.

use std::collections::HashSet;

use base64::Engine;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::protocol::time::iso_micros;
use crate::protocol::Name;
use crate::storage::timers::{Cancel, Schedule, TimerOp, TimerResult, TimerRow};

/// The partition a timer's message goes to when the operation names none (as for a push).
pub const DEFAULT_PARTITION: &str = "Default";

/// Longest `delayMs` either way: 366 days. Later than that is a calendar's job, not a queue's.
pub const MAX_DELAY_MS: i64 = 366 * 86_400 * 1000;

/// Longest timer key, in characters.
pub const MAX_KEY_CHARS: usize = 1024;

/// Most operations in one call (one transaction).
pub const MAX_OPERATIONS: usize = 1000;

/// Largest and default page of the list route (`limit` is clamped into 1..=this).
pub const MAX_LIST_LIMIT: i64 = 1000;

/// The list route's page when `limit` is absent.
pub const DEFAULT_LIST_LIMIT: i64 = 100;

/// Fields the broker owns: present in an operation they are refused, never dropped (§2.3).
pub const SERVER_OWNED: &[&str] = &[
    "producerSub",
    "producer_sub",
    "messageId",
    "message_id",
    "tenant",
    "tenantId",
    "tenant_id",
    "deliverAt",
    "deliver_at",
    "delaySeconds",
    "delay_seconds",
    "attempts",
    "claimToken",
    "claim_token",
    "claimedUntil",
];

/// A malformed timer call: 400 `timers_bad_request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct TimersError {
    /// A stable identifier of the broken rule (`duplicate_key`, `server_owned_field`, ...).
    pub reason: &'static str,
    /// The sentence a person reads.
    pub detail: String,
}

impl TimersError {
    /// An error with this reason and text.
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// Parses `POST /api/v1/timers`' body `{"operations": [...]}`.
///
/// # Errors
///
/// [`TimersError`] for a body that is not such an object or any operation that breaks a rule.
pub fn parse_body(bytes: &[u8], producer_sub: Option<&str>) -> Result<Vec<TimerOp>, TimersError> {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        operations: Option<&'a RawValue>,
    }
    let body: Body = serde_json::from_slice(bytes)
        .map_err(|e| TimersError::new("invalid_json", format!("body is not a JSON object: {e}")))?;
    let ops = body
        .operations
        .ok_or_else(|| TimersError::new("operations_required", "body needs an operations array"))?;
    let ops: Vec<Value> = serde_json::from_str(ops.get())
        .map_err(|_| TimersError::new("operations_required", "operations must be an array"))?;
    parse_ops(&ops, producer_sub)
}

/// Parses a list of timer operations (the route's `operations`, or a transaction's `timers`):
/// each must keep the rules of §2.3, and one (queue, timerKey) may appear at most once.
/// `producer_sub` (the caller's `sub`) becomes the delivered messages' `producerSub`; every
/// schedule gets the message id it will be delivered with, and a `txn` when it has none.
///
/// # Errors
///
/// [`TimersError`] naming the first operation and field that break a rule.
pub fn parse_ops(ops: &[Value], producer_sub: Option<&str>) -> Result<Vec<TimerOp>, TimersError> {
    if ops.len() > MAX_OPERATIONS {
        return Err(TimersError::new(
            "too_many_operations",
            format!(
                "{} operations in one call; at most {MAX_OPERATIONS}",
                ops.len()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(ops.len());
    let mut seen: HashSet<(&str, &str)> = HashSet::with_capacity(ops.len());
    for (n, op) in ops.iter().enumerate() {
        let op = parse_op(n, op, producer_sub)?;
        parsed.push(op);
    }
    for (n, op) in parsed.iter().enumerate() {
        let (queue, key) = op.key();
        if !seen.insert((queue, key)) {
            return Err(TimersError::new(
                "duplicate_key",
                format!(
                    "operation {n}: queue {queue:?} timerKey {key:?} appears more than once in one call"
                ),
            ));
        }
    }
    Ok(parsed)
}

/// One operation.
fn parse_op(n: usize, op: &Value, producer_sub: Option<&str>) -> Result<TimerOp, TimersError> {
    let bad = |reason: &'static str, text: String| {
        TimersError::new(reason, format!("operation {n}: {text}"))
    };
    let Value::Object(fields) = op else {
        return Err(bad("invalid_operation", "must be a JSON object".into()));
    };
    for field in fields.keys() {
        if SERVER_OWNED.contains(&field.as_str()) || field.starts_with('_') {
            return Err(bad(
                "server_owned_field",
                format!("{field} is set by the broker and cannot be supplied (use delayMs for the delivery time)"),
            ));
        }
    }
    let kind = match fields.get("op") {
        Some(Value::String(s)) => s.as_str(),
        _ => "",
    };
    let queue = queue_field(fields, "queue").map_err(|t| bad("invalid_queue", t))?;
    let timer_key = timer_key(fields.get("timerKey")).map_err(|t| bad("invalid_timer_key", t))?;
    let txn = optional_name(fields, "txn").map_err(|t| bad("invalid_txn", t))?;
    match kind {
        "schedule" | "reschedule" => {
            if let Some(flag) = fields.get("payloadZstd") {
                if flag != &Value::Bool(false) && !flag.is_null() {
                    return Err(bad(
                        "payload_zstd_unsupported",
                        "payloadZstd is not supported by this broker; send the payload uncompressed".into(),
                    ));
                }
            }
            let payload = payload(fields.get("payload")).map_err(|t| bad("invalid_payload", t))?;
            let delay_ms = delay(fields.get("delayMs")).map_err(|t| bad("invalid_delay", t))?;
            let partition = optional_name(fields, "partition")
                .map_err(|t| bad("invalid_partition", t))?
                .unwrap_or_else(|| DEFAULT_PARTITION.to_string());
            Ok(TimerOp::Schedule(Schedule {
                queue,
                timer_key,
                partition,
                payload,
                delay_ms,
                txn: txn.unwrap_or_else(|| Uuid::now_v7().to_string()),
                producer_sub: producer_sub.map(str::to_string),
                message_id: Uuid::now_v7(),
            }))
        }
        "cancel" => Ok(TimerOp::Cancel(Cancel {
            queue,
            timer_key,
            txn,
        })),
        _ => Err(bad(
            "invalid_op",
            "op must be \"schedule\", \"reschedule\" or \"cancel\"".into(),
        )),
    }
}

/// A required queue name.
fn queue_field(fields: &Map<String, Value>, field: &str) -> Result<String, String> {
    match fields.get(field) {
        Some(Value::String(s)) => check_queue(s).map(|()| s.clone()),
        _ => Err(format!("{field} is required (a non-empty string)")),
    }
}

/// The queue rule: non-empty and the name rule.
///
/// # Errors
///
/// The sentence naming the broken rule.
pub fn check_queue(queue: &str) -> Result<(), String> {
    if queue.is_empty() {
        return Err("queue is required (a non-empty string)".into());
    }
    Name::check(queue).map_err(|e| format!("queue {e}"))
}

/// A timer key: non-empty, at most [`MAX_KEY_CHARS`] characters, no NUL.
fn timer_key(value: Option<&Value>) -> Result<String, String> {
    match value {
        Some(Value::String(s)) => check_timer_key(s).map(|()| s.clone()),
        _ => Err("timerKey is required (a non-empty string)".into()),
    }
}

/// The timer key rule.
///
/// # Errors
///
/// The sentence naming the broken rule.
pub fn check_timer_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("timerKey is required (a non-empty string)".into());
    }
    if key.chars().take(MAX_KEY_CHARS + 1).count() > MAX_KEY_CHARS {
        return Err(format!(
            "timerKey is longer than {MAX_KEY_CHARS} characters"
        ));
    }
    if key.contains('\0') {
        return Err("timerKey must not contain NUL characters".into());
    }
    Ok(())
}

/// An optional name field (`txn`, `partition`): absent, null or a non-empty name.
fn optional_name(fields: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match fields.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => {
            Err(format!("{field}, when given, must not be empty"))
        }
        Some(Value::String(s)) => Name::check(s)
            .map(|()| Some(s.clone()))
            .map_err(|e| format!("{field} {e}")),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

/// The payload: standard base64 (padded or not) of JSON text.
fn payload(value: Option<&Value>) -> Result<String, String> {
    let Some(Value::String(text)) = value else {
        return Err("payload is required (base64 of the JSON message data)".into());
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let bytes = engine
        .decode(text)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
        .map_err(|e| format!("payload is not base64: {e}"))?;
    let json = String::from_utf8(bytes)
        .map_err(|_| "payload does not decode to UTF-8 JSON text".to_string())?;
    serde_json::from_str::<&RawValue>(&json)
        .map_err(|e| format!("payload does not decode to JSON: {e}"))?;
    Ok(json)
}

/// `delayMs`: an integer (a whole-valued number is accepted) within ±[`MAX_DELAY_MS`].
fn delay(value: Option<&Value>) -> Result<i64, String> {
    let Some(Value::Number(n)) = value else {
        return Err("delayMs is required (milliseconds from now, may be negative)".into());
    };
    let ms = match (n.as_i64(), n.as_f64()) {
        (Some(i), _) => i,
        (None, Some(f)) if f.fract() == 0.0 && f.abs() <= MAX_DELAY_MS as f64 => f as i64,
        _ => return Err("delayMs must be a whole number of milliseconds".into()),
    };
    if ms.abs() > MAX_DELAY_MS {
        return Err(format!(
            "delayMs {ms} is beyond ±{MAX_DELAY_MS} ms (366 days)"
        ));
    }
    Ok(ms)
}

/// One operation's result on the wire (`POST /api/v1/timers`' `results`, the cancel route).
pub fn result_json(result: &TimerResult) -> Value {
    match result {
        TimerResult::Scheduled {
            rescheduled,
            queue,
            timer_key,
            txn,
            message_id,
            deliver_at,
        } => json!({
            "ok": true,
            "status": if *rescheduled { "rescheduled" } else { "scheduled" },
            "queue": queue,
            "timerKey": timer_key,
            "txn": txn,
            "messageId": message_id,
            "deliverAt": iso_micros(*deliver_at),
        }),
        TimerResult::Cancelled {
            status,
            queue,
            timer_key,
            txn,
        } => json!({
            "ok": *status == crate::storage::timers::CancelStatus::Cancelled,
            "status": status.as_str(),
            "queue": queue,
            "timerKey": timer_key,
            "txn": txn,
        }),
    }
}

/// A stored timer on the wire: the list's row (without the payload) or, with it, the peek.
pub fn row_json(row: &TimerRow, with_payload: bool) -> Value {
    let mut out = json!({
        "queue": row.queue,
        "timerKey": row.timer_key,
        "partition": row.partition_name,
        "txn": row.txn,
        "messageId": row.message_id,
        "deliverAt": iso_micros(row.deliver_at),
        "attempts": row.attempts,
        "lastError": row.last_error,
        "createdAt": iso_micros(row.created_at),
        "updatedAt": iso_micros(row.updated_at),
    });
    if with_payload {
        out["found"] = Value::Bool(true);
        out["payload"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(row.payload.as_bytes()));
        // Stored in the clear until the fire (which seals it when the queue encrypts).
        out["encrypted"] = Value::Bool(false);
    }
    out
}

/// The list route's `limit`: absent → [`DEFAULT_LIST_LIMIT`], else clamped into
/// 1..=[`MAX_LIST_LIMIT`] (never refused; a value that is not a number counts as absent).
pub fn list_limit(limit: Option<&str>) -> i64 {
    match limit.map(|l| l.trim().parse::<i64>()) {
        Some(Ok(n)) => n.clamp(1, MAX_LIST_LIMIT),
        Some(Err(_)) => match limit.and_then(|l| l.trim().parse::<f64>().ok()) {
            Some(f) if f.is_finite() => (f as i64).clamp(1, MAX_LIST_LIMIT),
            Some(f) if f > 0.0 => MAX_LIST_LIMIT,
            Some(_) => 1,
            None => DEFAULT_LIST_LIMIT,
        },
        None => DEFAULT_LIST_LIMIT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(json: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    fn schedule(key: &str) -> Value {
        json!({"op": "schedule", "queue": "q", "timerKey": key, "payload": b64("{\"a\":1}"),
               "delayMs": 500, "txn": "t1"})
    }

    #[test]
    fn a_schedule_parses_with_defaults() {
        let ops = parse_ops(&[schedule("k")], Some("svc")).expect("valid");
        let TimerOp::Schedule(s) = &ops[0] else {
            panic!("a schedule")
        };
        assert_eq!(s.partition, "Default");
        assert_eq!(s.payload, "{\"a\":1}");
        assert_eq!(s.delay_ms, 500);
        assert_eq!(s.producer_sub.as_deref(), Some("svc"));
        assert_eq!(s.message_id.get_version_num(), 7);
    }

    #[test]
    fn server_owned_and_underscore_fields_are_refused() {
        for field in ["producerSub", "deliverAt", "claimedUntil", "_private"] {
            let mut op = schedule("k");
            op[field] = json!("x");
            let e = parse_ops(&[op], None).expect_err(field);
            assert_eq!(e.reason, "server_owned_field", "{field}");
            assert!(e.detail.contains(field), "{}", e.detail);
        }
    }

    #[test]
    fn one_key_twice_is_refused() {
        let e = parse_ops(&[schedule("k"), schedule("k")], None).expect_err("duplicate");
        assert_eq!(e.reason, "duplicate_key");
        assert!(parse_ops(&[schedule("k"), schedule("l")], None).is_ok());
    }

    #[test]
    fn payloads_delays_and_zstd_are_checked() {
        let mut op = schedule("k");
        op["payload"] = json!(b64("not json"));
        assert_eq!(
            parse_ops(&[op], None).unwrap_err().reason,
            "invalid_payload"
        );
        let mut op = schedule("k");
        op["delayMs"] = json!(MAX_DELAY_MS + 1);
        assert_eq!(parse_ops(&[op], None).unwrap_err().reason, "invalid_delay");
        let mut op = schedule("k");
        op["delayMs"] = json!(-10_000);
        assert!(parse_ops(&[op], None).is_ok());
        let mut op = schedule("k");
        op["delayMs"] = json!(1.5);
        assert_eq!(parse_ops(&[op], None).unwrap_err().reason, "invalid_delay");
        let mut op = schedule("k");
        op["payloadZstd"] = json!(true);
        assert_eq!(
            parse_ops(&[op], None).unwrap_err().reason,
            "payload_zstd_unsupported"
        );
    }

    #[test]
    fn list_limits_are_clamped() {
        assert_eq!(list_limit(None), DEFAULT_LIST_LIMIT);
        assert_eq!(list_limit(Some("0")), 1);
        assert_eq!(list_limit(Some("99999999999999999999")), MAX_LIST_LIMIT);
        assert_eq!(list_limit(Some("7")), 7);
    }
}
