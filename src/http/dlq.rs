//! `GET /api/v1/dlq` (reference §9.2): dead letters, newest failure first. `partition`, `from`
//! and `to` are ignored as 0.15 ignores them (the SDK always sends `partition=Default`).

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::http::error::{with_db, ApiError};
use crate::protocol::time::{iso_micros, iso_millis};
use crate::state::AppState;
use crate::storage::{consume::dlq, segments::crypto, StorageError};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Letter<'a> {
    id: Uuid,
    transaction_id: &'a str,
    partition_id: Uuid,
    queue: &'a str,
    partition: &'a str,
    consumer_group: &'a str,
    error_message: Option<&'a str>,
    retry_count: i32,
    data: &'a RawValue,
    producer_sub: Option<&'a str>,
    trace_id: Option<&'a str>,
    created_at: String,
    failed_at: String,
}

#[derive(Serialize)]
struct Pagination {
    limit: i64,
    offset: i64,
}

#[derive(Serialize)]
struct Body<'a> {
    messages: Vec<Letter<'a>>,
    pagination: Pagination,
    total: i64,
}

/// `GET /api/v1/dlq?queue&consumerGroup&limit=100&offset=0`.
pub async fn list(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let text = |k: &str| query.get(k).filter(|v| !v.is_empty()).cloned();
    let number = |k: &str, default: i64| {
        query
            .get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .unwrap_or(default)
    };
    let (queue, group) = (text("queue"), text("consumerGroup"));
    let (limit, offset) = (number("limit", 100).min(10_000), number("offset", 0));
    let (rows, total) = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        dlq::list(&mut conn, queue.as_deref(), group.as_deref(), limit, offset).await
    })
    .await?;
    // A sealed payload is opened; one that does not open is logged and shown as null.
    let opened: Vec<Option<String>> = rows
        .iter()
        .map(|r| {
            if !r.payload_sealed {
                return Some(r.payload.clone());
            }
            crypto::open_with(state.payload_key.as_ref(), &r.payload)
                .map_err(|e| {
                    tracing::error!(message_id = %r.message_id, queue = %r.queue, error = %e,
                        "a dead letter's payload cannot be decrypted; shown as null");
                })
                .ok()
        })
        .collect();
    let mut messages = Vec::with_capacity(rows.len());
    for (r, text) in rows.iter().zip(&opened) {
        let data: &RawValue =
            serde_json::from_str(text.as_deref().unwrap_or("null")).map_err(|source| {
                StorageError::PayloadNotJson {
                    what: format!("dead letter {}", r.message_id),
                    source,
                }
            })?;
        messages.push(Letter {
            id: r.message_id,
            transaction_id: &r.transaction_id,
            partition_id: r.partition_uuid,
            queue: &r.queue,
            partition: &r.partition,
            consumer_group: &r.consumer_group,
            error_message: r.error_message.as_deref(),
            retry_count: r.retry_count,
            data,
            producer_sub: r.producer_sub.as_deref(),
            trace_id: r.trace_id.as_deref(),
            created_at: iso_micros(r.created_at),
            failed_at: iso_millis(r.failed_at),
        });
    }
    Ok(HttpResponse::Ok().json(Body {
        messages,
        pagination: Pagination { limit, offset },
        total,
    }))
}
