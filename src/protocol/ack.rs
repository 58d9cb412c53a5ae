//! Ack objects (the `/ack` body, an `/ack/batch` item, a transaction's ack operation), the
//! small JSON body helpers the routes with free-form bodies share, and an ack result on the
//! wire.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::protocol::{params, ProtocolError};
use crate::storage::acks::{Ack, AckOutcome, AckStatus};
use crate::storage::consume::QUEUE_MODE;

/// Parses a JSON request body; an empty one is `{}` when `empty_ok`, else a 400.
///
/// # Errors
///
/// [`ProtocolError`] with the protocol's texts.
pub fn json_body(bytes: &[u8], empty_ok: bool) -> Result<Value, ProtocolError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return if empty_ok {
            Ok(json!({}))
        } else {
            Err(ProtocolError("Empty request body".into()))
        };
    }
    serde_json::from_slice(bytes).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))
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
/// [`ProtocolError`] naming the missing or malformed field.
pub fn parse_ack(
    v: &Value,
    index: usize,
    group: String,
    missing_txn: &str,
    missing_partition: &str,
) -> Result<Ack, ProtocolError> {
    let transaction_id = opt_str(v, "transactionId")
        .ok_or_else(|| ProtocolError(missing_txn.into()))?
        .to_string();
    // Values PostgreSQL cannot hold are the caller's mistake: a 400 naming the field.
    params::check_value("transactionId", &transaction_id)?;
    params::check_name("consumerGroup", &group)?;
    params::check_text("error", opt_str(v, "error"))?;
    params::check_text("leaseId", opt_str(v, "leaseId"))?;
    let partition =
        opt_str(v, "partitionId").ok_or_else(|| ProtocolError(missing_partition.into()))?;
    let partition = Uuid::parse_str(partition)
        .map_err(|_| ProtocolError(format!("partitionId must be a UUID, got {partition:?}")))?;
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
