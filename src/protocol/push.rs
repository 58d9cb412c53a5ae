//! The push body (`POST /api/v1/push`, and each push operation of a transaction): parsing and
//! validation with the protocol's texts, the per-item result shape, and minting write-path
//! items from validated ones.

use broker_actors::Item;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::protocol::time::now_micros;
use crate::protocol::{Name, ProtocolError};

#[derive(Deserialize)]
struct RawBody<'a> {
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

/// An item with every field kept raw, so each rule can be checked and reported by index.
#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    queue: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    partition: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    #[serde(
        borrow,
        default,
        deserialize_with = "present",
        rename = "transactionId"
    )]
    transaction_id: Option<&'a RawValue>,
}

/// Maps a present key to `Some` even when its value is `null` (absent keys stay `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// One validated item of a push body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedItem {
    /// Queue name.
    pub queue: String,
    /// Partition name (`Default` when absent).
    pub partition: String,
    /// The payload's JSON text exactly as received.
    pub payload: String,
    /// The producer's key, if given (empty and `null` count as absent).
    pub transaction_id: Option<String>,
    /// The id the producer minted: only a binary push with frames carries one (reference 2.x
    /// §2.9.2, `protocol::push_binary`); `None` means the broker mints it on arrival.
    pub message_id: Option<Uuid>,
}

/// Reads an optional string field; `null` counts as absent.
fn string_field(
    raw: Option<&RawValue>,
    index: usize,
    field: &str,
    capital: &str,
) -> Result<Option<String>, ProtocolError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.get() == "null" {
        return Ok(None);
    }
    let value: String = serde_json::from_str(raw.get())
        .map_err(|_| ProtocolError(format!("item {index}: {capital} must be a string")))?;
    let value = Name::new(value)
        .map_err(|too_long| ProtocolError(format!("item {index}: {field} {too_long}")))?;
    Ok(Some(value.into_string()))
}

/// How many items a push body holds (0 when it is not a valid push body: the parser then
/// says why). Costs one pass over the bytes and 16 bytes per item, so admission can be decided
/// before any item is built.
pub fn push_item_count(bytes: &[u8]) -> usize {
    let Ok(body) = serde_json::from_slice::<RawBody>(bytes) else {
        return 0;
    };
    body.items
        .and_then(|raw| serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok())
        .map_or(0, |items| items.len())
}

/// Parses and validates a push body; the first broken rule rejects the whole request.
///
/// # Errors
///
/// [`ProtocolError`] naming the rule and the item index.
pub fn parse_push_body(bytes: &[u8]) -> Result<Vec<ParsedItem>, ProtocolError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ProtocolError("Empty request body".into()));
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))?;
    let root: &RawValue =
        serde_json::from_str(text).map_err(|e| ProtocolError(format!("Invalid JSON: {e}")))?;
    let body: RawBody = serde_json::from_str(root.get())
        .map_err(|_| ProtocolError("items array is required".into()))?;
    let items_raw = body
        .items
        .ok_or_else(|| ProtocolError("items array is required".into()))?;
    let items: Vec<&RawValue> = serde_json::from_str(items_raw.get())
        .map_err(|_| ProtocolError("items array is required".into()))?;

    let mut parsed = Vec::with_capacity(items.len());
    for (index, raw) in items.into_iter().enumerate() {
        let item: RawItem = serde_json::from_str(raw.get()).map_err(|e| {
            ProtocolError(format!(
                "item {index}: must be an object with string fields ({e})"
            ))
        })?;
        let queue = match item.queue {
            None => return Err(ProtocolError(format!("item {index}: queue is required"))),
            Some(raw) if raw.get() == "null" => {
                return Err(ProtocolError(format!(
                    "item {index}: Queue must be a string"
                )))
            }
            some => string_field(some, index, "queue", "Queue")?.expect("present and not null"),
        };
        if queue.is_empty() {
            return Err(ProtocolError(format!(
                "item {index}: queue must not be empty"
            )));
        }
        let partition = string_field(item.partition, index, "partition", "Partition")?
            .unwrap_or_else(|| "Default".into());
        if partition.is_empty() {
            return Err(ProtocolError(format!(
                "item {index}: partition must not be empty"
            )));
        }
        let transaction_id =
            string_field(item.transaction_id, index, "transactionId", "TransactionId")?
                .filter(|t| !t.is_empty());
        let payload = item
            .payload
            .ok_or_else(|| ProtocolError(format!("item {index}: payload is required")))?
            .get();
        crate::protocol::depth::check(payload, "payload")
            .map_err(|e| ProtocolError(format!("item {index}: {}", e.0)))?;
        let payload = payload.to_string();
        parsed.push(ParsedItem {
            queue,
            partition,
            payload,
            transaction_id,
            message_id: None,
        });
    }
    Ok(parsed)
}

/// One element of the push response.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq)]
pub struct PushResult {
    /// Position of the item in the request.
    pub index: usize,
    /// The new message's id, the original's for a duplicate, the minted id otherwise.
    pub message_id: Uuid,
    /// The dedup key used.
    pub transaction_id: String,
    /// The item's queue.
    #[serde(rename = "queueName")]
    pub queue_name: String,
    /// `queued`, `duplicate`, `buffered` or `failed`.
    pub status: String,
    /// Why a `failed` item was refused by its queue (`maxSize` reached, no encryption key);
    /// absent otherwise (a `failed` from a spool write has no text, as the seed says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Appends `results` to `out` as the JSON array serde writes for them (the same bytes), without
/// serde's per-field dispatch: the push answer is written once per pushed message.
pub fn write_results(results: &[PushResult], out: &mut Vec<u8>) {
    let mut index = itoa::Buffer::new();
    let mut id = Uuid::encode_buffer();
    out.reserve(results.len() * 120);
    out.push(b'[');
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"index\":");
        out.extend_from_slice(index.format(r.index).as_bytes());
        out.extend_from_slice(b",\"message_id\":\"");
        out.extend_from_slice(r.message_id.hyphenated().encode_lower(&mut id).as_bytes());
        out.extend_from_slice(b"\",\"transaction_id\":");
        put_json_str(out, &r.transaction_id);
        out.extend_from_slice(b",\"queueName\":");
        put_json_str(out, &r.queue_name);
        out.extend_from_slice(b",\"status\":");
        put_json_str(out, &r.status);
        if let Some(error) = &r.error {
            out.extend_from_slice(b",\"error\":");
            put_json_str(out, error);
        }
        out.push(b'}');
    }
    out.push(b']');
}

/// Appends `s` as a JSON string: as it is when nothing in it needs an escape, else as serde
/// escapes it.
fn put_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("a string serialises into a Vec");
    }
}

/// The answer of a push that asked for counts (`QPB1` flag 2, reference 2.x §2.9.4).
#[derive(Debug, Serialize, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushCounts {
    /// Items in the request.
    pub count: usize,
    /// Items stored.
    pub queued: usize,
    /// Items whose transactionId was already stored (nothing written).
    pub duplicate: usize,
    /// Items spooled to disk, replayed once PostgreSQL answers (not an error, not stored yet).
    pub buffered: usize,
    /// Items neither stored nor spooled (`failed`): the producer must send them again.
    pub error: usize,
}

impl PushCounts {
    /// Counts the statuses of `results`.
    pub fn of(results: &[PushResult]) -> Self {
        let mut counts = Self {
            count: results.len(),
            ..Self::default()
        };
        for r in results {
            match r.status.as_str() {
                "queued" => counts.queued += 1,
                "duplicate" => counts.duplicate += 1,
                "buffered" => counts.buffered += 1,
                _ => counts.error += 1,
            }
        }
        counts
    }
}

/// Turns validated items into write-path items, minting ids (keeping one the producer minted);
/// `producer_sub` is stamped on all.
/// The payloads move into the items (the parsed items keep their names, with empty payloads),
/// so a body's payload bytes are held once, not twice.
pub fn mint(parsed: &mut [ParsedItem], producer_sub: Option<&str>) -> Vec<Item> {
    let arrived_at_micros = now_micros();
    parsed
        .iter_mut()
        .map(|p| {
            let message_id = p.message_id.unwrap_or_else(Uuid::now_v7);
            Item {
                message_id,
                transaction_id: p
                    .transaction_id
                    .clone()
                    .unwrap_or_else(|| message_id.to_string()),
                payload: std::mem::take(&mut p.payload).into_boxed_str(),
                producer_sub: producer_sub.map(str::to_string),
                trace_id: None,
                arrived_at_micros,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse_push_body(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn rejects_what_the_contract_rejects() {
        assert_eq!(err(""), "Empty request body");
        assert!(err("{").starts_with("Invalid JSON"));
        assert_eq!(err("{}"), "items array is required");
        assert_eq!(err(r#"{"items": 3}"#), "items array is required");
        assert_eq!(err("[]"), "items array is required");
        assert_eq!(
            err(r#"{"items":[{"payload":1}]}"#),
            "item 0: queue is required"
        );
        assert_eq!(
            err(r#"{"items":[{"queue":"q","payload":1},{"queue":"q"}]}"#),
            "item 1: payload is required"
        );
        assert_eq!(
            err(r#"{"items":[{"queue":5,"payload":1}]}"#),
            "item 0: Queue must be a string"
        );
        assert_eq!(
            err(r#"{"items":[{"queue":"q","partition":1,"payload":1}]}"#),
            "item 0: Partition must be a string"
        );
        assert_eq!(
            err(r#"{"items":[{"queue":"q","transactionId":[],"payload":1}]}"#),
            "item 0: TransactionId must be a string"
        );
        let long = "x".repeat(256);
        assert!(err(&format!(
            r#"{{"items":[{{"queue":"{long}","payload":1}}]}}"#
        ))
        .contains("longer than 255"));
        assert!(err(r#"{"items":[7]}"#).starts_with("item 0: must be an object"));
    }

    #[test]
    fn keeps_payload_bytes_and_defaults() {
        let body = r#"{"items":[{"queue":"q","payload": {"b":1, "a":1.10,"n":12345678901234567890123}},
                                {"queue":"q","partition":null,"transactionId":"","payload":null}]}"#;
        let items = parse_push_body(body.as_bytes()).unwrap();
        assert_eq!(
            items[0].payload,
            r#"{"b":1, "a":1.10,"n":12345678901234567890123}"#
        );
        assert_eq!(items[0].partition, "Default");
        assert_eq!(items[1].payload, "null");
        assert_eq!(items[1].transaction_id, None);
    }

    #[test]
    fn a_name_of_255_characters_is_fine() {
        let name = "é".repeat(255);
        let body = format!(r#"{{"items":[{{"queue":"{name}","payload":1}}]}}"#);
        assert_eq!(parse_push_body(body.as_bytes()).unwrap()[0].queue, name);
    }

    #[test]
    fn the_written_answer_is_what_serde_writes() {
        let texts = [
            "",
            "txn-1",
            "q\"uote",
            "back\\slash",
            "tab\there",
            "\u{1}",
            "é ü 漢",
            "\u{7f}",
            "a/b",
        ];
        let mut results = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            for error in [None, Some(format!("full {t}"))] {
                results.push(PushResult {
                    index: i * 1000,
                    message_id: Uuid::now_v7(),
                    transaction_id: (*t).to_string(),
                    queue_name: format!("queue{t}"),
                    status: if error.is_some() { "failed" } else { "queued" }.to_string(),
                    error,
                });
            }
        }
        for n in [0, 1, results.len()] {
            let mut out = Vec::new();
            write_results(&results[..n], &mut out);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(&results[..n]).unwrap()
            );
        }
    }
}
