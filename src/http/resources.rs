//! The resource routes (reference §9.5): queues (list, detail, delete), namespaces, tasks and
//! the overview. Values are computed on request from the partitions' offsets, first/last
//! segments (primary-key probes) and consumer state (`storage::queues::progress`), not from a
//! periodically refreshed stats table, so they are never stale (`statsAge` is 0).

use std::collections::{BTreeMap, HashMap};

use actix_web::{web, HttpResponse};
use chrono::Utc;
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::protocol::time::iso_millis;
use crate::state::AppState;
use crate::storage::queues::catalog::{self, Queue};
use crate::storage::queues::groups;
use crate::storage::queues::resources::{self, message_counts, MessageCounts, PartitionRow};

/// A queue's partition count and summed message counts.
#[derive(Default, Clone, Copy)]
struct Tally {
    partitions: i64,
    messages: MessageCounts,
}

/// Every queue with its partitions' tally, in listing order (priority, then name).
async fn tallied_queues(state: &AppState) -> Result<Vec<(Queue, Tally)>, ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let all = catalog::all(&mut conn).await?;
    let mut tallies: HashMap<i64, Tally> = HashMap::new();
    for p in resources::partitions(&mut conn, None).await? {
        let t = tallies.entry(p.queue_id).or_default();
        t.partitions += 1;
        t.messages += message_counts(&p);
    }
    Ok(all
        .into_iter()
        .map(|q| {
            let t = tallies.get(&q.id).copied().unwrap_or_default();
            (q, t)
        })
        .collect())
}

/// `GET /api/v1/resources/queues`.
pub async fn list_queues(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let queues: Vec<Value> = tallied_queues(&state)
        .await?
        .into_iter()
        .map(|(q, t)| {
            json!({
                "id": q.uuid,
                "name": q.name,
                "namespace": q.namespace,
                "task": q.task,
                "priority": q.options.priority,
                "createdAt": iso_millis(q.created_at),
                "partitions": t.partitions,
                "messages": {
                    "total": t.messages.total,
                    "pending": t.messages.pending,
                    "processing": t.messages.processing,
                },
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "queues": queues })))
}

fn partition_json(p: &PartitionRow) -> Value {
    json!({
        "id": p.uuid,
        "name": p.name,
        "createdAt": iso_millis(p.created_at),
        "stats": message_counts(p),
        "oldestMessage": p.oldest_at.map(iso_millis),
        "newestMessage": p.newest_at.map(iso_millis),
    })
}

/// `GET /api/v1/resources/queues/{queue}`: 404 `Queue not found` when unknown.
pub async fn queue_detail(
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let queue = catalog::find(&mut conn, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound("Queue not found".into()))?;
    let partitions = resources::partitions(&mut conn, Some(queue.id)).await?;
    let mut totals = MessageCounts::default();
    for p in &partitions {
        totals += message_counts(p);
    }
    Ok(HttpResponse::Ok().json(json!({
        "id": queue.uuid,
        "name": queue.name,
        "namespace": queue.namespace,
        "task": queue.task,
        "priority": queue.options.priority,
        "createdAt": iso_millis(queue.created_at),
        "options": queue.options,
        "partitions": partitions.iter().map(partition_json).collect::<Vec<_>>(),
        "totals": totals,
    })))
}

/// `DELETE /api/v1/resources/queues/{queue}`: the queue with its partitions, messages and
/// dedup keys. Answers 200 whether or not it existed.
pub async fn delete_queue(
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let existed = catalog::delete(&mut conn, &name).await?;
    Ok(HttpResponse::Ok().json(json!({
        "deleted": true,
        "queue": name.into_inner(),
        "existed": existed,
    })))
}

/// Queues grouped by namespace or task (queues without one are left out).
fn grouped(queues: &[(Queue, Tally)], key: impl Fn(&Queue) -> &str, label: &str) -> Vec<Value> {
    let mut groups: BTreeMap<&str, (i64, Tally)> = BTreeMap::new();
    for (q, t) in queues {
        let k = key(q);
        if k.is_empty() {
            continue;
        }
        let g = groups.entry(k).or_default();
        g.0 += 1;
        g.1.partitions += t.partitions;
        g.1.messages += t.messages;
    }
    groups
        .into_iter()
        .map(|(k, (count, t))| {
            json!({
                label: k,
                "queues": count,
                "partitions": t.partitions,
                "messages": { "total": t.messages.total, "pending": t.messages.pending },
            })
        })
        .collect()
}

/// `GET /api/v1/resources/namespaces`.
pub async fn namespaces(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let queues = tallied_queues(&state).await?;
    Ok(HttpResponse::Ok()
        .json(json!({ "namespaces": grouped(&queues, |q| &q.namespace, "namespace") })))
}

/// `GET /api/v1/resources/tasks`.
pub async fn tasks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let queues = tallied_queues(&state).await?;
    Ok(HttpResponse::Ok().json(json!({ "tasks": grouped(&queues, |q| &q.task, "task") })))
}

/// `GET /api/v1/resources/overview`. Lag is over every (subscribed group, partition) pair
/// with something unconsumed (`storage::queues::groups::lag_summary`), computed on request like the
/// counts. `processedPerSecond` is always 0: consumer state keeps cursors and totals, not a
/// history of when messages were consumed, so there is no rate to read.
pub async fn overview(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let queues = tallied_queues(&state).await?;
    let (ingested, (time_lag, offset_lag)) = {
        let mut conn = state.admin_pool.acquire().await?;
        (
            resources::ingested_per_second(&mut conn).await?,
            groups::lag_summary(&mut conn).await?,
        )
    };
    let mut messages = MessageCounts::default();
    let mut partitions = 0;
    for (_, t) in &queues {
        messages += t.messages;
        partitions += t.partitions;
    }
    Ok(HttpResponse::Ok().json(json!({
        "queues": queues.len(),
        "partitions": partitions,
        "namespaces": grouped(&queues, |q| &q.namespace, "namespace").len(),
        "tasks": grouped(&queues, |q| &q.task, "task").len(),
        "messages": messages,
        "lag": { "time": time_lag, "offset": offset_lag },
        "throughput": { "ingestedPerSecond": ingested, "processedPerSecond": 0 },
        "timestamp": iso_millis(Utc::now()),
        "statsAge": 0,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_timestamps_have_milliseconds_and_z() {
        let t = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        assert_eq!(iso_millis(t), "2023-11-14T22:13:20.123Z");
    }
}
