//! `GET /api/v1/messages` and `GET /api/v1/messages/{partitionId}/{transactionId}` (reference
//! §9.3): messages decoded from their segments for operators. Payloads are sent exactly as they
//! were pushed (raw JSON text, never re-encoded), under `payload`.
//!
//! Fields that describe consumer state come from `storage::messages::message_status` and read
//! `pending` until consumer cursors exist.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Duration, DurationRound, NaiveDateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::app::AppState;
use crate::http::error::ApiError;
use crate::http::resources::iso_millis;
use crate::storage::messages::{self, message_status, Filter, StoredMessage};
use crate::storage::queues;

/// Default and largest page of the list.
const DEFAULT_LIMIT: usize = 200;
const MAX_LIMIT: usize = 1000;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BusStatus {
    consumed_by: u32,
    total_groups: u32,
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
    payload: Box<RawValue>,
}

impl<'a> MessageView<'a> {
    fn new(m: &'a StoredMessage) -> Result<Self, ApiError> {
        let status = message_status(m).as_str();
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
            status,
            queue_status: status,
            bus_status: BusStatus {
                consumed_by: 0,
                total_groups: 0,
            },
            trace_id: m.trace_id.as_deref(),
            producer_sub: m.producer_sub.as_deref(),
            queue_priority: m.priority,
            created_at: iso_millis(created_at),
            lease_expires_at: None,
            // Validated JSON at push time; a frame that is not is corruption, not a 400.
            payload: RawValue::from_string(m.payload.clone()).map_err(|e| {
                ApiError::Database(sqlx::Error::Protocol(format!(
                    "message {} holds a payload that is not JSON: {e}",
                    m.id
                )))
            })?,
        })
    }
}

/// How the consumers of the listed messages are organised. Without consumer state: none.
fn consumer_mode() -> serde_json::Value {
    serde_json::json!({ "hasQueueMode": false, "busGroupsCount": 0, "type": "none" })
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
    let mut conn = state.pool.acquire().await?;
    let found = messages::list(&mut conn, &filter, offset, limit).await?;
    // Every message's status is derived from consumer state after reading; a status filter
    // keeps the ones that match (today only `pending` matches anything).
    let views = found
        .iter()
        .filter(|m| {
            status
                .as_deref()
                .is_none_or(|s| message_status(m).as_str() == s)
        })
        .map(MessageView::new)
        .collect::<Result<Vec<_>, _>>()?;
    // A struct, not `json!`: a `Value` would re-encode the raw payloads.
    #[derive(Serialize)]
    struct ListReply<'a> {
        messages: Vec<MessageView<'a>>,
        mode: serde_json::Value,
    }
    Ok(HttpResponse::Ok().json(ListReply {
        messages: views,
        mode: consumer_mode(),
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
    retry_count: u32,
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
    let Ok(partition) = Uuid::parse_str(&partition_id) else {
        return Err(not_found());
    };
    let mut conn = state.pool.acquire().await?;
    let message = messages::find(&mut conn, partition, &transaction_id)
        .await?
        .ok_or_else(not_found)?;
    let options = queues::find(&mut conn, &message.queue)
        .await?
        .ok_or_else(not_found)?
        .options;
    let mut mode = consumer_mode();
    mode["consumedByGroups"] = 0.into();
    let detail = MessageDetail {
        message: MessageView::new(&message)?,
        is_encrypted: false,
        error_message: None,
        retry_count: 0,
        queue_config: serde_json::json!({
            "leaseTime": options.lease_time,
            "retryLimit": options.retry_limit,
            "retryDelay": options.retry_delay,
            "ttl": options.ttl,
            "priority": options.priority,
        }),
        mode,
        consumer_groups: Vec::new(),
    };
    Ok(HttpResponse::Ok().json(detail))
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
