//! Consumer-group routes (reference §9.1): listing, lag, deletion, subscription start, seeks.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::ack::{json_body, opt_str};
use crate::protocol::params::{page_params, seconds_param};
use crate::protocol::time::{iso_millis, lag_measured_at, LAG_MEASURED_AT};
use crate::state::AppState;
use crate::storage::queues::groups::{self, PartitionLag, SeekTarget};
use crate::storage::queues::lag::{self, Source};

/// A group whose oldest unconsumed message is older than this is `Lagging`.
const LAGGING_AFTER_SECS: i64 = 300;

fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn delete_metadata(query: &HashMap<String, String>) -> bool {
    // Default true; only an explicit false-ish value keeps the metadata.
    !matches!(
        query.get("deleteMetadata").map(String::as_str),
        Some("false" | "0")
    )
}

/// (Group, queue) pairs per page of `GET /api/v1/consumer-groups` when `limit` is not given.
pub const GROUPS_PER_PAGE: i64 = 1000;
/// Partitions per answer of `GET /api/v1/consumer-groups/lagging` when `limit` is not given.
pub const LAGGING_PER_PAGE: i64 = 1000;
/// The largest `limit` of both.
const MAX_PER_PAGE: i64 = 10_000;

/// `GET /api/v1/consumer-groups[?limit=1000&offset=0&search=text]`: one page of the (group,
/// queue) pairs by group then queue name (`search`: group or queue names containing it, case
/// insensitive), as Queen's array; the header `X-Total-Count` says how many pairs match.
pub async fn list(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let page = page_params(&query, GROUPS_PER_PAGE, MAX_PER_PAGE)?;
    let (source, (rows, total)) = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        let source = lag::source(&mut conn, state.settings.lag_live_pairs).await?;
        let (search, limit, offset) = (page.search.as_deref(), page.limit, page.offset);
        let rows = match source {
            Source::Live => groups::list_page(&mut conn, search, limit, offset).await?,
            Source::Pass(_) => lag::list_page(&mut conn, search, limit, offset).await?,
        };
        Ok((source, rows))
    })
    .await?;
    let body: Vec<Value> = rows
        .iter()
        .map(|g| {
            json!({
                "name": g.consumer_group,
                "topics": [g.queue],
                "queueName": g.queue,
                "members": g.members,
                "partitionsWithLag": g.partitions_with_lag,
                "totalLag": null,
                "backlog": g.backlog,
                "maxTimeLag": g.max_time_lag,
                "state": if g.max_time_lag > LAGGING_AFTER_SECS { "Lagging" } else { "Stable" },
                "subscriptionMode": g.subscription_mode,
                "subscriptionTimestamp": g.subscription_from.map(iso_millis),
                "subscriptionCreatedAt": iso_millis(g.subscribed_at),
            })
        })
        .collect();
    Ok(HttpResponse::Ok()
        .insert_header(("X-Total-Count", total.to_string()))
        .insert_header((LAG_MEASURED_AT, lag_measured_at(source.measured_at())))
        .json(body))
}

/// `GET /api/v1/consumer-groups/lagging?minLagSeconds=3600[&limit=1000]`: the oldest first.
pub async fn lagging(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let min = seconds_param(
        "minLagSeconds",
        query.get("minLagSeconds").map(String::as_str),
        3600,
    )?;
    let limit = page_params(&query, LAGGING_PER_PAGE, MAX_PER_PAGE)?.limit;
    let (source, rows) = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        let source = lag::source(&mut conn, state.settings.lag_live_pairs).await?;
        let rows = match source {
            Source::Live => groups::lagging(&mut conn, min, limit).await?,
            Source::Pass(_) => lag::lagging(&mut conn, min, limit).await?,
        };
        Ok((source, rows))
    })
    .await?;
    let body: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "consumer_group": r.consumer_group,
                "queue_name": r.queue,
                "partition_name": r.partition,
                "partition_id": r.partition_uuid,
                "worker_id": r.lease_owner,
                "offset_lag": r.offset_lag,
                "time_lag_seconds": r.time_lag_seconds,
                "lag_hours": r.time_lag_seconds as f64 / 3600.0,
                "oldest_unconsumed_at": r.oldest_unconsumed_at.map(iso_millis),
                "last_consumed_at": r.last_consumed_at.map(iso_millis),
            })
        })
        .collect();
    Ok(HttpResponse::Ok()
        .insert_header((LAG_MEASURED_AT, lag_measured_at(source.measured_at())))
        .json(body))
}

fn partition_json(r: &PartitionLag) -> Value {
    json!({
        "partition": r.partition,
        "workerId": r.lease_owner,
        "lastConsumedAt": r.last_consumed_at.map(iso_millis),
        "totalConsumed": r.total_consumed,
        "offsetLag": r.offset_lag,
        "timeLagSeconds": r.time_lag_seconds,
        "leaseActive": r.lease_active,
    })
}

/// Partitions per answer of `GET /api/v1/consumer-groups/{group}` when `limit` is not given.
pub const GROUP_PARTITIONS_PER_PAGE: i64 = 1000;

/// `GET /api/v1/consumer-groups/{group}[?queue=name][&limit=1000&offset=0]`: `{queue:
/// {partitions: [...]}}`, `{}` if unknown; with `queue`, that queue's partitions only (what a
/// queue's page reads). One page of partitions by queue then partition name; the header
/// `X-Next-Offset` gives the next page's `offset` when the page was full.
pub async fn get(
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let queue = query.get("queue").filter(|q| !q.is_empty()).cloned();
    let page = page_params(&query, GROUP_PARTITIONS_PER_PAGE, MAX_PER_PAGE)?;
    let rows = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        groups::partitions(&mut conn, &group, queue.as_deref(), page.limit, page.offset).await
    })
    .await?;
    let full = rows.len() as i64 == page.limit;
    let mut body = Map::new();
    for r in &rows {
        let entry = body
            .entry(r.queue.clone())
            .or_insert_with(|| json!({ "partitions": [] }));
        entry["partitions"]
            .as_array_mut()
            .expect("built as an array")
            .push(partition_json(r));
    }
    let mut answer = HttpResponse::Ok();
    if full {
        answer.insert_header(("X-Next-Offset", (page.offset + page.limit).to_string()));
    }
    Ok(answer.json(Value::Object(body)))
}

/// `DELETE /api/v1/consumer-groups/{group}?deleteMetadata=true`.
pub async fn delete(
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let metadata = delete_metadata(&query);
    let (rows, _) = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        groups::delete(&mut conn, &group, None, metadata).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "consumerGroup": group,
        "deletedPartitions": rows,
        "metadataDeleted": metadata,
    })))
}

/// `DELETE /api/v1/consumer-groups/{group}/queues/{queue}?deleteMetadata=true`.
pub async fn delete_for_queue(
    path: web::Path<(String, String)>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (group, queue) = path.into_inner();
    let metadata = delete_metadata(&query);
    let (rows, _) = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        groups::delete(&mut conn, &group, Some(&queue), metadata).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "consumerGroup": group,
        "queueName": queue,
        "deletedPartitions": rows,
        "metadataDeleted": metadata,
    })))
}

/// `POST /api/v1/consumer-groups/{group}/subscription` `{"subscriptionTimestamp": ISO}`.
pub async fn subscription(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let group = path.into_inner();
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = json_body(&bytes, true)?;
    let text = opt_str(&body, "subscriptionTimestamp").ok_or_else(|| {
        ApiError::BadRequest("Missing subscriptionTimestamp in request body".into())
    })?;
    let from = parse_time(text).ok_or_else(|| {
        ApiError::BadRequest(format!("subscriptionTimestamp is not ISO-8601: {text:?}"))
    })?;
    let rows = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        groups::set_subscription(&mut conn, &group, from).await
    })
    .await?;
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "consumerGroup": group,
        "newTimestamp": iso_millis(from),
        "rowsUpdated": rows,
    })))
}

/// `POST /api/v1/consumer-groups/{group}/queues/{queue}/seek` `{"toEnd": true}` or
/// `{"timestamp": ISO}`.
pub async fn seek_queue(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (group, queue) = path.into_inner();
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = json_body(&bytes, true)?;
    let missing =
        || ApiError::BadRequest("Must specify either 'toEnd': true or 'timestamp'".into());
    let target = if body.get("toEnd").and_then(Value::as_bool) == Some(true) {
        SeekTarget::End
    } else {
        let text = opt_str(&body, "timestamp").ok_or_else(missing)?;
        SeekTarget::At(parse_time(text).ok_or_else(missing)?)
    };
    let moved = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        groups::seek_queue(&mut conn, &group, &queue, target).await
    })
    .await?;
    let (to_end, at) = match target {
        SeekTarget::End => (true, None),
        SeekTarget::At(t) => (false, Some(iso_millis(t))),
    };
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "consumerGroup": group,
        "queueName": queue,
        "seekToEnd": to_end,
        "targetTimestamp": at,
        "partitionsUpdated": moved,
    })))
}

/// `POST /api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek` (no
/// body): the group's cursor on that partition moves past its newest message.
pub async fn seek_partition(
    path: web::Path<(String, String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (group, queue, partition) = path.into_inner();
    let moved = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        groups::seek_partition_to_end(&mut conn, &group, &queue, &partition).await
    })
    .await?;
    Ok(match moved {
        Some(offset) => HttpResponse::Ok().json(json!({
            "success": true,
            "consumerGroup": group,
            "queueName": queue,
            "partitionName": partition,
            "updated": true,
            "cursorMovedTo": offset,
        })),
        None => HttpResponse::InternalServerError().json(json!({
            "success": false,
            "error": "Partition not found",
        })),
    })
}
