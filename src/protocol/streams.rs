//! The streams runtime's request bodies (reference 2.x §2.11, `docs/streams.md`): parsing and
//! validation of `POST /streams/v1/queries`, `/streams/v1/state/get` and `/streams/v1/cycle`
//! into the storage types, with the texts the SDKs show. A broken rule is a [`ProtocolError`]
//! (a 400); nothing here touches the database.
//!
//! State values and sink payloads are kept as the JSON text received (never re-serialised);
//! only a state value's top-level `windowEnd` is read, for the ripe-window index.

use broker_actors::{Item, PartitionKey};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use crate::protocol::push::parse_push_body;
use crate::protocol::time::now_micros;
use crate::protocol::{depth, params, Name, ProtocolError, MAX_NAME_CHARS};
use crate::storage::consume::acks::AckStatus;
use crate::storage::consume::QUEUE_MODE;
use crate::storage::push::partitions;
use crate::storage::streams::cycle::{Cycle, SinkPush, SourceAck, StateOp};
use crate::storage::streams::{Registration, StateQuery};

/// Longest state key, in bytes (operator tag, window key and user key together). The key is
/// part of the state table's primary key, whose btree entries PostgreSQL caps near 2.7 kB: a
/// longer key would fail in the database (a 500 the client retries) instead of here (a 400).
pub const MAX_STATE_KEY_BYTES: usize = 1024;

/// Longest `config_hash`, in characters (the SDKs send 64 hex digits).
pub const MAX_CONFIG_HASH_CHARS: usize = 1024;

/// Maps a present key to `Some` even when its value is `null` (absent keys stay `None`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Parses a body that must be a JSON object.
fn object<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ProtocolError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ProtocolError::new("Empty request body"));
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))?;
    let value: &RawValue =
        serde_json::from_str(text).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))?;
    if !value.get().trim_start().starts_with('{') {
        return Err(ProtocolError::new("request body must be a JSON object"));
    }
    serde_json::from_str(value.get()).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))
}

/// A required non-empty string field, else `"<field> is required"`.
fn required(value: Option<&Value>, field: &str) -> Result<String, ProtocolError> {
    match value {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(ProtocolError(format!("{field} is required"))),
    }
}

/// An optional string field: absent, `null` and empty are `None`.
fn optional(value: Option<&Value>, field: &str) -> Result<Option<String>, ProtocolError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ProtocolError(format!("{field} must be a string"))),
    }
}

/// An id field the broker handed out: a UUID.
fn id_field(value: Option<&Value>, field: &str, what: &str) -> Result<Uuid, ProtocolError> {
    let text = required(value, field)?;
    Uuid::parse_str(&text)
        .map_err(|_| ProtocolError(format!("{field} must be {what}, got {text:?}")))
}

/// `partition_id`: the partition's UUID, or its 64-bit id as decimal text (what a framed pop
/// gives); the second is resolved to the UUID before use (nil until then).
fn partition_field(value: Option<&Value>) -> Result<(Uuid, Option<i64>), ProtocolError> {
    let text = required(value, "partition_id")?;
    if let Ok(uuid) = Uuid::parse_str(&text) {
        return Ok((uuid, None));
    }
    match partitions::id_of_text(&text) {
        Some(id) => Ok((Uuid::nil(), Some(id))),
        None => Err(ProtocolError(format!(
            "partition_id must be a partition id (a UUID, or the 64-bit id in decimal), got {text:?}"
        ))),
    }
}

#[derive(Deserialize)]
struct RegisterBody {
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    source_queue: Option<Value>,
    #[serde(default)]
    sink_queue: Option<Value>,
    #[serde(default)]
    config_hash: Option<Value>,
    #[serde(default)]
    reset: Option<Value>,
}

/// Parses `POST /streams/v1/queries`.
///
/// # Errors
///
/// [`ProtocolError`]: `name is required`, `source_queue is required`, `config_hash is
/// required`, or a field breaking the name rule.
pub fn parse_register(bytes: &[u8]) -> Result<Registration, ProtocolError> {
    let body: RegisterBody = object(bytes)?;
    let name = required(body.name.as_ref(), "name")?;
    params::check_name("name", &name)?;
    let source_queue = required(body.source_queue.as_ref(), "source_queue")?;
    params::check_name("source_queue", &source_queue)?;
    let config_hash = required(body.config_hash.as_ref(), "config_hash")?;
    if config_hash.chars().count() > MAX_CONFIG_HASH_CHARS || config_hash.contains('\0') {
        return Err(ProtocolError(format!(
            "config_hash must be at most {MAX_CONFIG_HASH_CHARS} characters without NUL"
        )));
    }
    let sink_queue = optional(body.sink_queue.as_ref(), "sink_queue")?;
    if let Some(sink) = &sink_queue {
        params::check_name("sink_queue", sink)?;
    }
    let reset = match body.reset {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(ProtocolError::new("reset must be true or false")),
    };
    Ok(Registration {
        name,
        source_queue,
        sink_queue,
        config_hash,
        reset,
    })
}

#[derive(Deserialize)]
struct StateGetBody {
    #[serde(default)]
    query_id: Option<Value>,
    #[serde(default)]
    partition_id: Option<Value>,
    #[serde(default)]
    keys: Option<Value>,
    #[serde(default)]
    key_prefix: Option<Value>,
    #[serde(default)]
    ripe_at_or_before: Option<Value>,
}

/// Parses `POST /streams/v1/state/get`.
///
/// # Errors
///
/// [`ProtocolError`] naming the missing or malformed field.
pub fn parse_state_get(bytes: &[u8]) -> Result<StateQuery, ProtocolError> {
    let body: StateGetBody = object(bytes)?;
    let query_id = id_field(
        body.query_id.as_ref(),
        "query_id",
        "the id /streams/v1/queries returned",
    )?;
    let (partition_id, partition_number) = partition_field(body.partition_id.as_ref())?;
    let keys = match body.keys {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(keys)) => keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| match k {
                Value::String(s) => Ok(s),
                _ => Err(ProtocolError(format!("keys[{i}] must be a string"))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ProtocolError::new("keys must be an array of strings")),
    };
    for key in &keys {
        params::check_text("keys", Some(key))?;
    }
    let key_prefix = optional(body.key_prefix.as_ref(), "key_prefix")?.unwrap_or_default();
    params::check_text("key_prefix", Some(&key_prefix))?;
    let ripe_at_or_before = match body.ripe_at_or_before {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_f64().filter(|f| f.is_finite()).ok_or_else(|| {
            ProtocolError::new("ripe_at_or_before must be a number (epoch milliseconds)")
        })?),
        Some(_) => {
            return Err(ProtocolError::new(
                "ripe_at_or_before must be a number (epoch milliseconds)",
            ))
        }
    };
    Ok(StateQuery {
        query_id,
        partition_id,
        partition_number,
        keys,
        key_prefix,
        ripe_at_or_before,
    })
}

#[derive(Deserialize)]
struct CycleBody<'a> {
    #[serde(default)]
    query_id: Option<Value>,
    #[serde(default)]
    partition_id: Option<Value>,
    #[serde(default)]
    consumer_group: Option<Value>,
    #[serde(borrow, default)]
    state_ops: Option<&'a RawValue>,
    #[serde(borrow, default)]
    push_items: Option<&'a RawValue>,
    #[serde(default)]
    ack: Option<Value>,
    #[serde(default)]
    release_lease: Option<Value>,
}

#[derive(Deserialize)]
struct RawStateOp<'a> {
    #[serde(default, rename = "type")]
    kind: Option<Value>,
    #[serde(default)]
    key: Option<Value>,
    #[serde(borrow, default, deserialize_with = "present")]
    value: Option<&'a RawValue>,
}

/// What a state value's top level says about its window.
#[derive(Deserialize)]
struct WindowProbe {
    #[serde(default, rename = "windowEnd")]
    window_end: Option<Value>,
}

/// The top-level `windowEnd` of a JSON value when it is a finite number.
pub fn window_end_of(value: &str) -> Option<f64> {
    serde_json::from_str::<WindowProbe>(value)
        .ok()?
        .window_end?
        .as_f64()
        .filter(|f| f.is_finite())
}

#[derive(Deserialize)]
struct PushExtras {
    #[serde(default, rename = "traceId")]
    trace_id: Option<Value>,
    #[serde(default, rename = "messageId")]
    message_id: Option<Value>,
}

/// An array field kept raw: absent and `null` are empty.
fn raw_list<'a>(
    raw: Option<&'a RawValue>,
    field: &str,
) -> Result<Vec<&'a RawValue>, ProtocolError> {
    match raw {
        None => Ok(Vec::new()),
        Some(r) if r.get() == "null" => Ok(Vec::new()),
        Some(r) => serde_json::from_str(r.get())
            .map_err(|_| ProtocolError(format!("{field} must be an array"))),
    }
}

/// Parses `POST /streams/v1/cycle`; sink items get the broker's UUIDv7 message id (unless the
/// item brings one) and `producer_sub` (the caller's `sub`).
///
/// # Errors
///
/// [`ProtocolError`] naming the missing or malformed field (`query_id is required`,
/// `partition_id is required`, `state_ops[2]: unknown type "merge"`, ...).
pub fn parse_cycle(bytes: &[u8], producer_sub: Option<&str>) -> Result<Cycle, ProtocolError> {
    let body: CycleBody = object(bytes)?;
    let query_id = id_field(
        body.query_id.as_ref(),
        "query_id",
        "the id /streams/v1/queries returned",
    )?;
    let (partition_id, partition_number) = partition_field(body.partition_id.as_ref())?;
    let group = optional(body.consumer_group.as_ref(), "consumer_group")?
        .unwrap_or_else(|| QUEUE_MODE.to_string());
    params::check_name("consumer_group", &group)?;

    let mut state_ops = Vec::new();
    for (i, raw) in raw_list(body.state_ops, "state_ops")?
        .into_iter()
        .enumerate()
    {
        let op: RawStateOp = serde_json::from_str(raw.get())
            .map_err(|_| ProtocolError(format!("state_ops[{i}] must be an object")))?;
        let key = match op.key {
            Some(Value::String(k)) => k,
            _ => return Err(ProtocolError(format!("state_ops[{i}]: key is required"))),
        };
        if key.len() > MAX_STATE_KEY_BYTES || key.contains('\0') {
            return Err(ProtocolError(format!(
                "state_ops[{i}]: key must be at most {MAX_STATE_KEY_BYTES} bytes without NUL"
            )));
        }
        match op.kind.as_ref().and_then(Value::as_str) {
            Some("upsert") => {
                let value = op.value.map_or("{}", RawValue::get);
                depth::check(value, &format!("state_ops[{i}]: value"))?;
                state_ops.push(StateOp {
                    window_end: window_end_of(value),
                    key,
                    value: Some(value.to_string()),
                });
            }
            Some("delete") => state_ops.push(StateOp {
                key,
                value: None,
                window_end: None,
            }),
            other => {
                return Err(ProtocolError(format!(
                    "state_ops[{i}]: unknown type {}; expected \"upsert\" or \"delete\"",
                    other.map_or_else(|| "null".to_string(), |t| format!("{t:?}"))
                )))
            }
        }
    }

    let mut pushes = Vec::new();
    let items = raw_list(body.push_items, "push_items")?;
    if !items.is_empty() {
        let raw = body.push_items.map_or("[]", RawValue::get);
        let parsed = parse_push_body(format!("{{\"items\":{raw}}}").as_bytes())
            .map_err(|e| ProtocolError(format!("push_items: {e}")))?;
        let arrived_at_micros = now_micros();
        for (i, (p, raw)) in parsed.into_iter().zip(items).enumerate() {
            let extras: PushExtras = serde_json::from_str(raw.get())
                .map_err(|e| ProtocolError(format!("push_items: item {i}: {e}")))?;
            let trace_id = match extras.trace_id {
                None | Some(Value::Null) => None,
                Some(Value::String(t)) if Name::fits(&t) => Some(t),
                Some(_) => {
                    return Err(ProtocolError(format!(
                        "push_items: item {i}: traceId must be a string of at most {MAX_NAME_CHARS} characters without NUL"
                    )))
                }
            };
            let message_id = match extras.message_id {
                None | Some(Value::Null) => Uuid::now_v7(),
                Some(Value::String(s)) if s.is_empty() => Uuid::now_v7(),
                Some(Value::String(s)) => Uuid::parse_str(&s).map_err(|_| {
                    ProtocolError(format!("push_items: item {i}: messageId must be a UUID"))
                })?,
                Some(_) => {
                    return Err(ProtocolError(format!(
                        "push_items: item {i}: messageId must be a UUID"
                    )))
                }
            };
            pushes.push(SinkPush {
                key: PartitionKey::new(&p.queue, &p.partition),
                item: Item {
                    message_id,
                    transaction_id: p.transaction_id.unwrap_or_else(|| message_id.to_string()),
                    payload: p.payload.into_boxed_str(),
                    producer_sub: producer_sub.map(str::to_string),
                    trace_id,
                    arrived_at_micros,
                },
            });
        }
    }

    let ack = match body.ack {
        None | Some(Value::Null) => None,
        Some(Value::Object(ack)) => Some(parse_ack(&ack)?),
        Some(_) => return Err(ProtocolError::new("ack must be an object or null")),
    };
    let release_lease = match body.release_lease {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(ProtocolError::new("release_lease must be true or false")),
    };
    Ok(Cycle {
        query_id,
        partition_id,
        partition_number,
        group,
        state_ops,
        pushes,
        ack,
        release_lease,
    })
}

/// The cycle's `ack` object.
fn parse_ack(ack: &serde_json::Map<String, Value>) -> Result<SourceAck, ProtocolError> {
    let transaction_id = required(ack.get("transactionId"), "ack.transactionId")?;
    params::check_name("ack.transactionId", &transaction_id)?;
    let lease_id = optional(ack.get("leaseId"), "ack.leaseId")?;
    params::check_text("ack.leaseId", lease_id.as_deref())?;
    let status = match ack.get("status") {
        None | Some(Value::Null) => AckStatus::Completed,
        Some(Value::String(s)) => match AckStatus::parse(Some(s)) {
            s @ (AckStatus::Completed | AckStatus::Failed | AckStatus::Dlq) => s,
            _ => {
                return Err(ProtocolError(format!(
                "ack.status must be \"completed\", \"success\", \"failed\" or \"dlq\", got {s:?}"
            )))
            }
        },
        Some(_) => return Err(ProtocolError::new("ack.status must be a string")),
    };
    let count = match ack.get("count") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|c| *c >= 0)
            .ok_or_else(|| ProtocolError::new("ack.count must be a whole number, 0 or more"))?,
        Some(_) => {
            return Err(ProtocolError::new(
                "ack.count must be a whole number, 0 or more",
            ))
        }
    };
    let error = optional(ack.get("error"), "ack.error")?;
    params::check_text("ack.error", error.as_deref())?;
    Ok(SourceAck {
        transaction_id,
        lease_id,
        status,
        count,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycle(body: &str) -> Result<Cycle, String> {
        parse_cycle(body.as_bytes(), None).map_err(|e| e.0)
    }

    const Q: &str = "0190f3c8-0000-7000-8000-000000000001";
    const P: &str = "0190f3c8-0000-7000-8000-000000000002";

    #[test]
    fn a_cycle_needs_its_ids() {
        assert_eq!(cycle("{}").unwrap_err(), "query_id is required");
        assert_eq!(
            cycle(&format!(r#"{{"query_id":"{Q}"}}"#)).unwrap_err(),
            "partition_id is required"
        );
        assert!(
            cycle(&format!(r#"{{"query_id":"{Q}","partition_id":"p"}}"#))
                .unwrap_err()
                .starts_with("partition_id must be a partition id")
        );
        assert_eq!(
            cycle("[]").unwrap_err(),
            "request body must be a JSON object"
        );
    }

    #[test]
    fn state_ops_keep_values_verbatim_and_read_window_end() {
        let c = cycle(&format!(
            r#"{{"query_id":"{Q}","partition_id":"{P}","state_ops":[
                {{"type":"upsert","key":"w","value":{{"acc":1, "windowEnd":1700000000000}}}},
                {{"type":"upsert","key":"n","value":7}},
                {{"type":"delete","key":"w"}}],"push_items":[],"ack":null}}"#
        ))
        .expect("valid");
        assert_eq!(c.group, QUEUE_MODE);
        assert!(c.release_lease);
        assert_eq!(
            c.state_ops[0].value.as_deref(),
            Some(r#"{"acc":1, "windowEnd":1700000000000}"#)
        );
        assert_eq!(c.state_ops[0].window_end, Some(1.7e12));
        assert_eq!(c.state_ops[1].window_end, None);
        assert_eq!(c.state_ops[2].value, None);
        let bad = cycle(&format!(
            r#"{{"query_id":"{Q}","partition_id":"{P}","state_ops":[{{"type":"merge","key":"k"}}]}}"#
        ));
        assert_eq!(
            bad.unwrap_err(),
            "state_ops[0]: unknown type \"merge\"; expected \"upsert\" or \"delete\""
        );
        let long = "k".repeat(MAX_STATE_KEY_BYTES + 1);
        let too_long = cycle(&format!(
            r#"{{"query_id":"{Q}","partition_id":"{P}","state_ops":[{{"type":"delete","key":"{long}"}}]}}"#
        ));
        assert!(too_long.unwrap_err().contains("at most 1024 bytes"));
    }

    #[test]
    fn sink_items_get_monotonic_ids_in_emit_order() {
        let items: Vec<String> = (0..50)
            .map(|n| format!(r#"{{"queue":"sink","payload":{{"n":{n}}}}}"#))
            .collect();
        let c = cycle(&format!(
            r#"{{"query_id":"{Q}","partition_id":"{P}","push_items":[{}]}}"#,
            items.join(",")
        ))
        .expect("valid");
        let ids: Vec<Uuid> = c.pushes.iter().map(|p| p.item.message_id).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids rise in emit order"
        );
        assert_eq!(&*c.pushes[0].key.partition, "Default");
        assert_eq!(c.pushes[3].item.transaction_id, ids[3].to_string());
    }

    #[test]
    fn acks_are_checked() {
        let with = |ack: &str| {
            cycle(&format!(
                r#"{{"query_id":"{Q}","partition_id":"{P}","consumer_group":"streams.q","ack":{ack},"release_lease":false}}"#
            ))
        };
        let ok = with(r#"{"transactionId":"t","leaseId":"","status":"completed","count":3}"#)
            .expect("valid");
        let ack = ok.ack.expect("ack");
        assert_eq!((ack.lease_id, ack.count), (None, 3));
        assert!(!ok.release_lease);
        assert_eq!(ok.group, "streams.q");
        assert_eq!(
            with(r#"{"leaseId":"l"}"#).unwrap_err(),
            "ack.transactionId is required"
        );
        assert!(with(r#"{"transactionId":"t","status":"retry"}"#)
            .unwrap_err()
            .starts_with("ack.status must be"));
    }

    #[test]
    fn state_get_filters_parse() {
        let q = parse_state_get(
            format!(
                r#"{{"query_id":"{Q}","partition_id":"{P}","keys":[],"key_prefix":"t\u001f","ripe_at_or_before":1700000000000}}"#
            )
            .as_bytes(),
        )
        .expect("valid");
        assert_eq!(q.key_prefix, "t\u{1f}");
        assert_eq!(q.ripe_at_or_before, Some(1.7e12));
        assert!(parse_state_get(
            format!(r#"{{"query_id":"{Q}","partition_id":"{P}","ripe_at_or_before":"soon"}}"#)
                .as_bytes()
        )
        .is_err());
    }

    #[test]
    fn register_needs_name_source_and_hash() {
        let err = |b: &str| parse_register(b.as_bytes()).unwrap_err().0;
        assert_eq!(err("{}"), "name is required");
        assert_eq!(err(r#"{"name":"q"}"#), "source_queue is required");
        assert_eq!(
            err(r#"{"name":"q","source_queue":"s"}"#),
            "config_hash is required"
        );
        let r = parse_register(
            br#"{"name":"q","source_queue":"s","config_hash":"h","reset":true,"sink_queue":"out"}"#,
        )
        .expect("valid");
        assert!(r.reset);
        assert_eq!(r.sink_queue.as_deref(), Some("out"));
    }
}
