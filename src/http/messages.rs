//! `GET /api/v1/messages` and `GET /api/v1/messages/{partitionId}/{transactionId}` (reference
//! §9.3): messages decoded from their segments for operators. Payloads are sent exactly as they
//! were pushed (raw JSON text, never re-encoded), under `payload`; the payloads of an encrypted
//! queue are opened first. One that cannot be opened (another key, changed bytes, no key) is
//! logged with its id and shown as `null`, never as the sealed text.
//!
//! Fields that describe consumer state (`status`, `queueStatus`, `busStatus`, `leaseExpiresAt`,
//! `mode`, the detail's `consumerGroups`) come from `storage::queues::progress`, which documents the
//! rules.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Duration, DurationRound, NaiveDateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::protocol::time::iso_millis;
use crate::state::AppState;
use crate::storage::queues::messages::{self, Filter, Listed, MessageStatus, Page, StoredMessage};
use crate::storage::segments::crypto::{self, PayloadKey};
use crate::storage::{push::partitions, queues::catalog, StorageError};

/// Default and largest page of the list.
const DEFAULT_LIMIT: usize = 200;
const MAX_LIMIT: usize = 1000;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BusStatus {
    consumed_by: usize,
    total_groups: usize,
}

/// One message as the list shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageView<'a> {
    id: Uuid,
    transaction_id: &'a str,
    partition_id: Uuid,
    queue_path: String,
    queue: &'a str,
    partition: &'a str,
    namespace: &'a str,
    task: &'a str,
    status: &'static str,
    queue_status: &'static str,
    bus_status: BusStatus,
    trace_id: Option<&'a str>,
    producer_sub: Option<&'a str>,
    queue_priority: i32,
    created_at: String,
    lease_expires_at: Option<String>,
    payload: Option<Box<RawValue>>,
}

/// The payload as the producer sent it: opened when sealed; `None` (logged) when that fails.
fn payload_text(m: &StoredMessage, key: Option<&PayloadKey>) -> Option<String> {
    if !m.encrypted {
        return Some(m.payload.clone());
    }
    match crypto::open_with(key, &m.payload) {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::error!(message_id = %m.id, queue = %m.queue, partition = %m.partition,
                error = %e, "a stored payload cannot be decrypted; shown as null");
            None
        }
    }
}

impl<'a> MessageView<'a> {
    fn new(listed: &'a Listed, key: Option<&PayloadKey>) -> Result<Self, ApiError> {
        let m = &listed.message;
        let created_at = DateTime::from_timestamp_micros(m.created_at_micros).unwrap_or_default();
        Ok(Self {
            id: m.id,
            transaction_id: &m.transaction_id,
            partition_id: m.partition_uuid,
            queue_path: format!("{}/{}", m.queue, m.partition),
            queue: &m.queue,
            partition: &m.partition,
            namespace: &m.namespace,
            task: &m.task,
            status: listed.status.as_str(),
            queue_status: listed.queue_status.as_str(),
            bus_status: BusStatus {
                consumed_by: listed.consumed_by,
                total_groups: listed.total_groups,
            },
            trace_id: m.trace_id.as_deref(),
            producer_sub: m.producer_sub.as_deref(),
            queue_priority: m.priority,
            created_at: iso_millis(created_at),
            lease_expires_at: listed.lease_expires_at.map(iso_millis),
            // Validated JSON at push time; a frame that is not is corruption, not a 400.
            payload: payload_text(m, key)
                .map(|text| {
                    RawValue::from_string(text).map_err(|source| StorageError::PayloadNotJson {
                        what: format!("message {}", m.id),
                        source,
                    })
                })
                .transpose()?,
        })
    }
}

/// How the consumers of the listed messages' partitions are organised.
fn consumer_mode(page: &Page) -> serde_json::Value {
    serde_json::json!({
        "hasQueueMode": page.has_queue_mode,
        "busGroupsCount": page.bus_groups,
        "type": page.mode().as_str(),
    })
}

/// An ISO-8601 time; without an offset it is taken as UTC.
fn parse_time(name: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
    .map(|t| t.and_utc())
    .ok_or_else(|| ApiError::BadRequest(format!("{name} must be an ISO-8601 timestamp")))
}

/// Query parameters: unknown ones are ignored, integers that do not parse take the default.
fn list_params(
    q: &HashMap<String, String>,
) -> Result<(Filter, Option<String>, usize, usize), ApiError> {
    let text = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
    let now = Utc::now();
    let to = match text("to") {
        Some(raw) => parse_time("to", &raw)?,
        // Now, rounded up to the next minute (as Queen does).
        None => now.duration_trunc(Duration::minutes(1)).unwrap_or(now) + Duration::minutes(1),
    };
    let from = match text("from") {
        Some(raw) => parse_time("from", &raw)?,
        None => now - Duration::hours(1),
    };
    let int = |k: &str, default: usize| {
        q.get(k)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(default)
    };
    let filter = Filter {
        queue: text("queue"),
        partition: text("partition"),
        namespace: text("ns").or_else(|| text("namespace")),
        task: text("task"),
        from,
        to,
    };
    let limit = int("limit", DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    Ok((filter, text("status"), int("offset", 0), limit))
}

/// `GET /api/v1/messages?queue&partition&ns&task&status&from&to&limit&offset`: newest first.
pub async fn list(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (filter, status, offset, limit) = list_params(&query)?;
    let page = match status.as_deref().map(MessageStatus::parse) {
        // A status no message can have (Queen: an empty list).
        Some(None) => Page::default(),
        status => {
            let mut conn = state.admin_pool.acquire().await?;
            messages::list(&mut conn, &filter, status.flatten(), offset, limit).await?
        }
    };
    let views = page
        .messages
        .iter()
        .map(|listed| MessageView::new(listed, state.payload_key.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    // A struct, not `json!`: a `Value` would re-encode the raw payloads.
    #[derive(Serialize)]
    struct ListReply<'a> {
        messages: Vec<MessageView<'a>>,
        mode: serde_json::Value,
        /// Segments left out because they do not decode (see the broker's log).
        #[serde(rename = "damagedSegments")]
        damaged_segments: usize,
    }
    Ok(HttpResponse::Ok().json(ListReply {
        messages: views,
        mode: consumer_mode(&page),
        damaged_segments: page.damaged_segments,
    }))
}

/// One message with its queue's settings, as the detail route shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageDetail<'a> {
    #[serde(flatten)]
    message: MessageView<'a>,
    is_encrypted: bool,
    error_message: Option<String>,
    retry_count: i32,
    queue_config: serde_json::Value,
    mode: serde_json::Value,
    consumer_groups: Vec<serde_json::Value>,
}

/// `GET /api/v1/messages/{partitionId}/{transactionId}`: 404 `Message not found` when unknown.
pub async fn detail(
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (partition_id, transaction_id) = path.into_inner();
    let not_found = || ApiError::NotFound("Message not found".into());
    let mut conn = state.admin_pool.acquire().await?;
    let Some(partition) = partitions::uuid_of_text(&mut conn, &partition_id).await? else {
        return Err(not_found());
    };
    let found = messages::detail(&mut conn, partition, &transaction_id)
        .await?
        .ok_or_else(not_found)?;
    let options = catalog::find(&mut conn, &found.listed.message.queue)
        .await?
        .ok_or_else(not_found)?
        .options;
    let offset = found.listed.message.offset;
    let mode = serde_json::json!({
        "hasQueueMode": found.progress.has_queue_mode,
        "busGroupsCount": found.progress.bus_groups.len(),
        "consumedByGroups": found.listed.consumed_by,
        "type": found.progress.mode().as_str(),
    });
    let consumer_groups = found
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "name": g.consumer_group,
                "consumed": g.consumed_below > offset,
                "leaseExpiresAt": g.lease_expires_at.map(iso_millis),
            })
        })
        .collect();
    let (error_message, retry_count) = found.dead_letter.clone().unwrap_or((None, 0));
    let detail = MessageDetail {
        message: MessageView::new(&found.listed, state.payload_key.as_ref())?,
        is_encrypted: found.listed.message.encrypted,
        error_message,
        retry_count,
        queue_config: serde_json::json!({
            "leaseTime": options.lease_time,
            "retryLimit": options.retry_limit,
            "retryDelay": options.retry_delay,
            "ttl": options.ttl,
            "priority": options.priority,
        }),
        mode,
        consumer_groups,
    };
    Ok(HttpResponse::Ok().json(detail))
}

/// `DELETE /api/v1/messages/{partitionId}/{transactionId}`: always 200 with `success`.
///
/// Segments never change once committed (every broker caches them), so the message is not cut
/// out of its segment: its offset is recorded as deleted (`storage::queues::messages::delete`). From
/// then on no pop hands it out, on any broker (the claim statements read the deleted offsets
/// of the range they lease), and the message routes do not show it; a lease that already holds
/// it keeps it. An unknown or already deleted message: `success: false`, `Message not found`.
pub async fn delete(
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (partition_id, transaction_id) = path.into_inner();
    let mut conn = state.pool.acquire().await?;
    let deleted = match partitions::uuid_of_text(&mut conn, &partition_id).await? {
        Some(partition) => messages::delete(&mut conn, partition, &transaction_id).await?,
        None => None,
    };
    if let Some(m) = &deleted {
        tracing::info!(queue = %m.queue, partition = %m.partition, offset = m.offset,
            message_id = %m.id, transaction_id = %m.transaction_id, "message deleted");
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "success": deleted.is_some(),
        "partitionId": partition_id,
        "transactionId": transaction_id,
        "message": if deleted.is_some() { "Message deleted" } else { "Message not found" },
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_with_or_without_an_offset() {
        let z = parse_time("from", "2026-01-02T03:04:05.5Z").unwrap();
        assert_eq!(iso_millis(z), "2026-01-02T03:04:05.500Z");
        let plus = parse_time("from", "2026-01-02T04:04:05+01:00").unwrap();
        assert_eq!(iso_millis(plus), "2026-01-02T03:04:05.000Z");
        let naive = parse_time("from", "2026-01-02T03:04").unwrap();
        assert_eq!(iso_millis(naive), "2026-01-02T03:04:00.000Z");
        assert_eq!(
            parse_time("to", "yesterday").unwrap_err().to_string(),
            "to must be an ISO-8601 timestamp"
        );
    }

    #[test]
    fn list_defaults_are_queens() {
        let (filter, status, offset, limit) = list_params(&HashMap::new()).unwrap();
        assert_eq!((status, offset, limit), (None, 0, 200));
        assert!(filter.to > Utc::now() && filter.to - filter.from > Duration::hours(1));
        let q: HashMap<String, String> = [("limit", "x"), ("offset", "5"), ("ns", "billing")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (filter, _, offset, limit) = list_params(&q).unwrap();
        assert_eq!((offset, limit), (5, 200));
        assert_eq!(filter.namespace.as_deref(), Some("billing"));
    }
}
