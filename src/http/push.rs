//! `POST /api/v1/push`: validate the whole body, group items by (queue, partition) in body
//! order, hand each group to its partition actor, and answer one verdict per item in request
//! order. Nothing is written when any item is invalid.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::{Item, PartitionKey, Verdict};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::app::AppState;
use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::ApiError;

/// Longest queue, partition or transactionId, in characters.
pub const MAX_NAME_CHARS: usize = 255;

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
}

/// Reads an optional string field; `null` counts as absent.
fn string_field(
    raw: Option<&RawValue>,
    index: usize,
    field: &str,
    capital: &str,
) -> Result<Option<String>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.get() == "null" {
        return Ok(None);
    }
    let value: String = serde_json::from_str(raw.get())
        .map_err(|_| ApiError::BadRequest(format!("item {index}: {capital} must be a string")))?;
    if value.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::BadRequest(format!(
            "item {index}: {field} is longer than {MAX_NAME_CHARS} characters"
        )));
    }
    Ok(Some(value))
}

/// Parses and validates a push body; the first broken rule rejects the whole request.
///
/// # Errors
///
/// [`ApiError::BadRequest`] naming the rule and the item index.
pub fn parse_push_body(bytes: &[u8]) -> Result<Vec<ParsedItem>, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("Empty request body".into()));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))?;
    let root: &RawValue = serde_json::from_str(text)
        .map_err(|e| ApiError::BadRequest(format!("Invalid JSON: {e}")))?;
    let body: RawBody = serde_json::from_str(root.get())
        .map_err(|_| ApiError::BadRequest("items array is required".into()))?;
    let items_raw = body
        .items
        .ok_or_else(|| ApiError::BadRequest("items array is required".into()))?;
    let items: Vec<&RawValue> = serde_json::from_str(items_raw.get())
        .map_err(|_| ApiError::BadRequest("items array is required".into()))?;

    let mut parsed = Vec::with_capacity(items.len());
    for (index, raw) in items.into_iter().enumerate() {
        let item: RawItem = serde_json::from_str(raw.get()).map_err(|e| {
            ApiError::BadRequest(format!(
                "item {index}: must be an object with string fields ({e})"
            ))
        })?;
        let queue = match item.queue {
            None => {
                return Err(ApiError::BadRequest(format!(
                    "item {index}: queue is required"
                )))
            }
            Some(raw) if raw.get() == "null" => {
                return Err(ApiError::BadRequest(format!(
                    "item {index}: Queue must be a string"
                )))
            }
            some => string_field(some, index, "queue", "Queue")?.expect("present and not null"),
        };
        if queue.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "item {index}: queue must not be empty"
            )));
        }
        let partition = string_field(item.partition, index, "partition", "Partition")?
            .unwrap_or_else(|| "Default".into());
        if partition.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "item {index}: partition must not be empty"
            )));
        }
        let transaction_id =
            string_field(item.transaction_id, index, "transactionId", "TransactionId")?
                .filter(|t| !t.is_empty());
        let payload = item
            .payload
            .ok_or_else(|| ApiError::BadRequest(format!("item {index}: payload is required")))?
            .get()
            .to_string();
        parsed.push(ParsedItem {
            queue,
            partition,
            payload,
            transaction_id,
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
}

/// Holds request bytes against `QUEEN_MAX_INFLIGHT_BYTES` until dropped.
struct Admission {
    state: Arc<crate::app::Inflight>,
    bytes: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

fn admit(inflight: &Arc<crate::app::Inflight>, bytes: usize, limit: usize) -> Option<Admission> {
    let before = inflight.bytes.fetch_add(bytes, Ordering::Relaxed);
    let admission = Admission {
        state: inflight.clone(),
        bytes,
    };
    // A request larger than the limit alone is still served when nothing else is in flight.
    (before == 0 || before + bytes <= limit).then_some(admission)
}

/// Current time in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Turns validated items into write-path items, minting ids; `producer_sub` is stamped on all.
pub fn mint(parsed: &[ParsedItem], producer_sub: Option<&str>) -> Vec<Item> {
    let arrived_at_micros = now_micros();
    parsed
        .iter()
        .map(|p| {
            let message_id = Uuid::now_v7();
            Item {
                message_id,
                transaction_id: p
                    .transaction_id
                    .clone()
                    .unwrap_or_else(|| message_id.to_string()),
                payload: p.payload.clone().into_boxed_str(),
                producer_sub: producer_sub.map(str::to_string),
                trace_id: None,
                arrived_at_micros,
            }
        })
        .collect()
}

/// Pushes minted items (one per parsed item, same order) and returns one verdict per item.
///
/// # Errors
///
/// [`ApiError`] when a partition's write path refused or failed.
pub async fn push_items(
    state: &AppState,
    parsed: &[ParsedItem],
    items: Vec<Item>,
) -> Result<Vec<PushResult>, ApiError> {
    // Group by partition, keeping body order inside each group.
    let mut order: Vec<PartitionKey> = Vec::new();
    let mut groups: HashMap<PartitionKey, (Vec<usize>, Vec<Item>)> = HashMap::new();
    for (index, (p, item)) in parsed.iter().zip(items).enumerate() {
        let key = PartitionKey::new(&p.queue, &p.partition);
        let group = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            (Vec::new(), Vec::new())
        });
        group.0.push(index);
        group.1.push(item);
    }
    let mut slots: Vec<Option<PushResult>> = vec![None; parsed.len()];
    let mut pending = Vec::with_capacity(order.len());
    for key in order {
        let (indexes, items) = groups.remove(&key).expect("every key has a group");
        let meta: Vec<(Uuid, String)> = items
            .iter()
            .map(|i| (i.message_id, i.transaction_id.clone()))
            .collect();
        let registry = state.registry.clone();
        pending.push(async move {
            let verdicts = registry.push(&key, items).await;
            (key, indexes, meta, verdicts)
        });
    }
    for (key, indexes, meta, verdicts) in join_all(pending).await {
        let verdicts = verdicts?;
        if verdicts.contains(&Verdict::Queued) {
            state.wake.wake(&key.queue, &key.partition);
        }
        for ((index, (minted, transaction_id)), verdict) in
            indexes.into_iter().zip(meta).zip(verdicts)
        {
            let message_id = match verdict {
                Verdict::Duplicate(original) => original,
                _ => minted,
            };
            slots[index] = Some(PushResult {
                index,
                message_id,
                transaction_id,
                queue_name: parsed[index].queue.clone(),
                status: verdict.as_str().to_string(),
            });
        }
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("every item got a verdict"))
        .collect())
}

/// `POST /api/v1/push`.
///
/// `producerSub` is the verified token's `sub` ([`Caller`], set by the auth gate), never a
/// field of the body.
pub async fn push(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let parsed = parse_push_body(&bytes)?;
    if parsed.is_empty() {
        return Ok(HttpResponse::Created().json(Vec::<PushResult>::new()));
    }
    let Some(_admission) = admit(
        &state.inflight,
        bytes.len(),
        state.settings.max_inflight_bytes,
    ) else {
        return Err(ApiError::Overloaded {
            retry_after_secs: 1,
        });
    };
    drop(bytes);
    let items = mint(&parsed, caller.producer_sub());
    let results = push_items(&state, &parsed, items).await?;
    // The one push whose trouble shows in the status: maintenance mode with a failed spool write.
    if state.spool.state.maintenance() && results.iter().any(|r| r.status == "failed") {
        return Ok(HttpResponse::InternalServerError().json(results));
    }
    Ok(HttpResponse::Created().json(results))
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
}
