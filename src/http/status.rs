//! The dashboard's status and analytics routes (reference §9.6): `GET /api/v1/status`,
//! `/status/queues`, `/status/queues/{queue}`, `/status/queues/{queue}/messages`,
//! `/status/analytics`, `/status/buffers`, `GET /api/v1/analytics/{name}`, and
//! `POST /api/v1/stats/refresh`.
//!
//! No SDK reads these bodies; they are built from what the broker knows now (message counts
//! from offsets and consumer state, messages written per time bucket from the segments'
//! commit times, PostgreSQL's statistics), computed on request. Nothing keeps a history of
//! samples, so the series that Queen 0.15 samples into tables (system and worker metrics) hold
//! one point: now. `stats/refresh` has nothing to refresh and says so.
//!
//! Every read runs on the admin-read pool (`AppState::admin_pool`: few connections, a
//! statement timeout), never the shared pool `/health` and the acks use; a time series is
//! bounded to `status::MAX_BUCKETS` buckets, checked before any statement runs.

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::protocol::time::{iso_millis, lag_measured_at};
use crate::state::AppState;
use crate::storage::observe::status::{self, Interval, Scope};
use crate::storage::queues::lag::{self, Source};
use crate::storage::queues::messages::{self, Filter};
use crate::storage::queues::resources;
use crate::storage::{queues::catalog, queues::groups};

type Query = web::Query<HashMap<String, String>>;

fn text(q: &HashMap<String, String>, key: &str) -> Option<String> {
    q.get(key).filter(|v| !v.is_empty()).cloned()
}

fn int(q: &HashMap<String, String>, key: &str, default: i64) -> i64 {
    q.get(key)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|n| *n >= 0)
        .unwrap_or(default)
}

/// An ISO-8601 time parameter, or `default` when absent.
fn time(
    q: &HashMap<String, String>,
    key: &str,
    default: DateTime<Utc>,
) -> Result<DateTime<Utc>, ApiError> {
    match text(q, key) {
        None => Ok(default),
        Some(raw) => DateTime::parse_from_rfc3339(&raw)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| ApiError::BadRequest(format!("{key} must be an ISO-8601 timestamp"))),
    }
}

fn scope(q: &HashMap<String, String>) -> Scope {
    Scope {
        queue: text(q, "queue"),
        namespace: text(q, "namespace").or_else(|| text(q, "ns")),
        task: text(q, "task"),
    }
}

/// `from`/`to` (default: the last `hours` hours) and `interval` (default `default`).
fn window(
    q: &HashMap<String, String>,
    hours: i64,
    default: Interval,
) -> Result<(DateTime<Utc>, DateTime<Utc>, Interval), ApiError> {
    let now = Utc::now();
    let to = time(q, "to", now)?;
    let from = time(q, "from", to - Duration::hours(hours))?;
    if from > to {
        return Err(ApiError::BadRequest("from must not be after to".into()));
    }
    let interval = match text(q, "interval") {
        None => default,
        Some(raw) => Interval::parse(&raw).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "interval must be minute, hour, day, week or month, not {raw:?}"
            ))
        })?,
    };
    // Refused before any statement runs: a range of centuries by the minute would hold a
    // connection while PostgreSQL generates billions of buckets.
    if status::buckets_at_most(from, to, interval) > status::MAX_BUCKETS {
        return Err(too_many_buckets());
    }
    Ok((from, to, interval))
}

/// Messages written per bucket, as `[{timestamp, messages}]`.
async fn series(
    state: &AppState,
    scope: &Scope,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    interval: Interval,
) -> Result<Vec<Value>, ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let rows = status::written(&mut conn, scope, from, to, interval, false)
        .await?
        .ok_or_else(too_many_buckets)?;
    Ok(rows
        .into_iter()
        .map(|(t, _, n)| json!({"timestamp": iso_millis(t), "messages": n}))
        .collect())
}

fn too_many_buckets() -> ApiError {
    ApiError::BadRequest(format!(
        "from..to holds more than {} buckets of this interval; choose a longer interval",
        status::MAX_BUCKETS
    ))
}

/// `GET /api/v1/status?from&to&queue&namespace&task`: totals now, and messages written per
/// minute over the window (default: the last hour).
pub async fn overview(query: Query, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (from, to, interval) = window(&query, 1, Interval::Minute)?;
    let scope = scope(&query);
    let (all, tallies) = {
        let mut conn = state.admin_pool.acquire().await?;
        (
            catalog::all(&mut conn).await?,
            resources::tallies(&mut conn, None).await?,
        )
    };
    let mut partitions = 0;
    let mut counts = resources::MessageCounts::default();
    let mut queue_count = 0;
    for q in &all {
        let keep = scope.queue.as_ref().is_none_or(|n| *n == q.name)
            && scope.namespace.as_ref().is_none_or(|n| *n == q.namespace)
            && scope.task.as_ref().is_none_or(|n| *n == q.task);
        if let (true, Some((p, c))) = (keep, tallies.by_queue.get(&q.id)) {
            queue_count += 1;
            partitions += p;
            counts += *c;
        }
    }
    let throughput = series(&state, &scope, from, to, interval).await?;
    Ok(HttpResponse::Ok().json(json!({
        "timestamp": iso_millis(Utc::now()),
        "from": iso_millis(from),
        "to": iso_millis(to),
        "queues": queue_count,
        "partitions": partitions,
        "partitionsExact": tallies.partitions_exact,
        "messages": counts,
        "messagesExact": tallies.messages_exact,
        "throughput": throughput,
    })))
}

/// `GET /api/v1/status/queues?limit=100&offset=0`: each queue with its counts.
pub async fn queues_list(
    query: Query,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = int(&query, "limit", 100).clamp(1, 1000) as usize;
    let offset = int(&query, "offset", 0) as usize;
    let mut conn = state.admin_pool.acquire().await?;
    let all = catalog::all(&mut conn).await?;
    let total = all.len();
    let page: Vec<_> = all.into_iter().skip(offset).take(limit).collect();
    let ids: Vec<i64> = page.iter().map(|q| q.id).collect();
    let tallies = resources::tallies(&mut conn, Some(&ids)).await?.by_queue;
    let dead = status::dead_letters_by_queue(&mut conn).await?;
    let listed: Vec<Value> = page
        .into_iter()
        .map(|q| {
            let (partitions, counts) = tallies.get(&q.id).copied().unwrap_or_default();
            json!({
                "id": q.uuid,
                "name": q.name,
                "namespace": q.namespace,
                "task": q.task,
                "priority": q.options.priority,
                "createdAt": iso_millis(q.created_at),
                "partitions": partitions,
                "messages": counts,
                "deadLetters": dead.get(&q.name).copied().unwrap_or(0),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "queues": listed,
        "pagination": {"limit": limit, "offset": offset, "total": total},
    })))
}

/// `GET /api/v1/status/queues/{queue}`: the queue, its options and counts; 404 when unknown.
pub async fn queue_detail(
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let queue = catalog::find(&mut conn, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound("Queue not found".into()))?;
    let (partitions, counts) = resources::tallies(&mut conn, Some(&[queue.id]))
        .await?
        .by_queue
        .get(&queue.id)
        .copied()
        .unwrap_or_default();
    Ok(HttpResponse::Ok().json(json!({
        "queue": {
            "id": queue.uuid,
            "name": queue.name,
            "namespace": queue.namespace,
            "task": queue.task,
            "createdAt": iso_millis(queue.created_at),
            "options": queue.options,
        },
        "partitions": partitions,
        "messages": counts,
    })))
}

/// `GET /api/v1/status/queues/{queue}/messages?limit=50&offset=0`: newest first, with status
/// (payloads are left to the message routes).
pub async fn queue_messages(
    name: web::Path<String>,
    query: Query,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = int(&query, "limit", 50).clamp(1, 1000) as usize;
    let offset = int(&query, "offset", 0) as usize;
    let filter = Filter {
        queue: Some(name.into_inner()),
        partition: None,
        namespace: None,
        task: None,
        from: DateTime::<Utc>::UNIX_EPOCH,
        to: Utc::now() + Duration::minutes(1),
    };
    let mut conn = state.admin_pool.acquire().await?;
    let page = messages::list(&mut conn, &filter, None, offset, limit).await?;
    let listed: Vec<Value> = page
        .messages
        .iter()
        .map(|l| {
            let m = &l.message;
            json!({
                "id": m.id,
                "transactionId": m.transaction_id,
                "partitionId": m.partition_uuid,
                "queuePath": format!("{}/{}", m.queue, m.partition),
                "queue": m.queue,
                "partition": m.partition,
                "status": l.status.as_str(),
                "createdAt": iso_millis(DateTime::from_timestamp_micros(m.created_at_micros).unwrap_or_default()),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "messages": listed,
        "pagination": {"limit": limit, "offset": offset},
    })))
}

/// `GET /api/v1/status/analytics?interval=hour&from&to&queue&namespace&task`: messages written
/// per bucket (default: hourly over the last 24 hours).
pub async fn analytics(query: Query, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (from, to, interval) = window(&query, 24, Interval::Hour)?;
    let points = series(&state, &scope(&query), from, to, interval).await?;
    Ok(HttpResponse::Ok().json(json!({
        "interval": interval.as_str(),
        "from": iso_millis(from),
        "to": iso_millis(to),
        "dataPoints": points,
    })))
}

fn buffers(state: &AppState) -> Value {
    let spool = &state.spool.state;
    json!({
        "pending": spool.records(),
        "failed": 0,
        "dbHealthy": spool.db_down_for().is_none(),
        "worker": state.broker_id,
    })
}

/// `GET /api/v1/status/buffers`: this broker's spool.
pub async fn buffers_route(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(buffers(&state))
}

/// `GET /api/v1/analytics/{name}`: `system-metrics`, `worker-metrics`, `queue-lag`,
/// `queue-ops`, `queue-parked-replicas`, `retention`, `postgres-stats`; any other name is 404.
pub async fn named(
    name: web::Path<String>,
    query: Query,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let now = iso_millis(Utc::now());
    let body = match name.as_str() {
        "system-metrics" | "worker-metrics" => {
            // A snapshot of this broker; no samples are stored.
            let pool = &state.pool;
            json!({
                "replicas": [{
                    "workerId": state.broker_id,
                    "timeSeries": [{
                        "timestamp": now,
                        "metrics": {
                            "database": {
                                "pool_size": pool.size(),
                                "pool_idle": pool.num_idle(),
                                "pool_active": pool.size() as usize - pool.num_idle(),
                            },
                            "spool": buffers(&state),
                        },
                    }],
                }],
            })
        }
        "queue-lag" => {
            let mut conn = state.admin_pool.acquire().await?;
            let source = lag::source(&mut conn, state.settings.lag_live_pairs).await?;
            let rows = match source {
                Source::Live => groups::list(&mut conn).await?,
                Source::Pass(_) => lag::list(&mut conn).await?,
            };
            let lag: Vec<Value> = rows
                .into_iter()
                .map(|g| {
                    json!({
                        "queue": g.queue,
                        "consumerGroup": g.consumer_group,
                        "partitionsWithLag": g.partitions_with_lag,
                        "maxTimeLagSeconds": g.max_time_lag,
                        "members": g.members,
                    })
                })
                .collect();
            json!({
                "timestamp": now,
                "queues": lag,
                "lagMeasuredAt": lag_measured_at(source.measured_at()),
            })
        }
        "queue-ops" => {
            let (from, to, interval) = window(&query, 1, Interval::Minute)?;
            let mut conn = state.admin_pool.acquire().await?;
            let rows = status::written(&mut conn, &scope(&query), from, to, interval, true)
                .await?
                .ok_or_else(too_many_buckets)?;
            let points: Vec<Value> = rows
                .into_iter()
                .filter_map(|(t, q, n)| {
                    q.map(|q| json!({"timestamp": iso_millis(t), "queue": q, "pushed": n}))
                })
                .collect();
            json!({"interval": interval.as_str(), "from": iso_millis(from), "to": iso_millis(to),
                   "dataPoints": points})
        }
        // Queen 1.x parks replicas of a clustered deployment; brokers here share PostgreSQL
        // and park nothing.
        "queue-parked-replicas" => json!({"timestamp": now, "replicas": []}),
        "retention" => {
            let mut conn = state.admin_pool.acquire().await?;
            let list: Vec<Value> = catalog::all(&mut conn)
                .await?
                .into_iter()
                .map(|q| {
                    json!({
                        "queue": q.name,
                        "retentionEnabled": q.options.retention_enabled,
                        "retentionSeconds": q.options.retention_seconds,
                        "completedRetentionSeconds": q.options.completed_retention_seconds,
                        "maxWaitTimeSeconds": q.options.max_wait_time_seconds,
                    })
                })
                .collect();
            json!({"timestamp": now, "queues": list})
        }
        "postgres-stats" => {
            let mut conn = state.admin_pool.acquire().await?;
            let s = status::postgres(&mut conn).await?;
            let ratio = if s.blocks_hit + s.blocks_read > 0 {
                s.blocks_hit as f64 / (s.blocks_hit + s.blocks_read) as f64
            } else {
                1.0
            };
            json!({
                "timestamp": now,
                "database": {
                    "sizeBytes": s.database_bytes,
                    "connections": s.connections,
                    "commits": s.commits,
                    "rollbacks": s.rollbacks,
                    "cacheHitRatio": ratio,
                    "deadlocks": s.deadlocks,
                },
                "tables": s.tables.iter().map(|(name, bytes, rows)| {
                    json!({"table": name, "totalBytes": bytes, "rows": rows})
                }).collect::<Vec<_>>(),
            })
        }
        other => {
            return Err(ApiError::NotFound(format!(
                "no analytics named {other:?} (system-metrics, worker-metrics, queue-lag, \
                 queue-ops, queue-parked-replicas, retention, postgres-stats)"
            )))
        }
    };
    Ok(HttpResponse::Ok().json(body))
}

/// `POST /api/v1/stats/refresh` (body optional): statistics here are computed on every read,
/// so there is nothing to refresh; the answer says so.
pub async fn refresh() -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "success": true,
        "refreshed": false,
        "message": "statistics are computed on every read; nothing to refresh",
    }))
}
