//! The resource routes (reference §9.5): queues (list, detail, delete), namespaces, tasks and
//! the overview. Values are computed on request from the partitions' offsets, first/last
//! segments (primary-key probes) and consumer state (`storage::queues::progress`), not from a
//! periodically refreshed stats table, so they are never stale (`statsAge` is 0).
//!
//! What a request reads is bounded (docs/operations.md, "Views at scale"): the queue list
//! reads one page of queues (`limit`, default [`QUEUES_PER_PAGE`]); a queue's detail one page
//! of its partitions; the overview counts partitions exactly up to [`EXACT_PARTITIONS`] and
//! message counts over at most [`OVERVIEW_PARTITIONS`] partitions holding messages, and says
//! when a figure is an estimate or partial; the namespaces and tasks are summed the same way.

use std::collections::{BTreeMap, HashMap};

use actix_web::{web, HttpResponse};
use chrono::Utc;
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::protocol::params::page_params;
use crate::protocol::time::{iso_millis, lag_measured_at, LAG_MEASURED_AT};
use crate::state::AppState;
use crate::storage::queues::catalog::{self, Queue};
use crate::storage::queues::groups;
use crate::storage::queues::lag::{self, Source};
use crate::storage::queues::resources::{self, message_counts, MessageCounts, PartitionRow, Scope};

/// Queues per page of `GET /api/v1/resources/queues` when `limit` is not given.
pub const QUEUES_PER_PAGE: i64 = 100;
/// The largest `limit` of the queue list.
const MAX_QUEUES_PER_PAGE: i64 = 1000;
/// Partitions per page of a queue's detail when `limit` is not given.
pub const PARTITIONS_PER_PAGE: i64 = 1000;
/// The largest `limit` of a queue's partitions.
const MAX_PARTITIONS_PER_PAGE: i64 = 10_000;
/// The overview counts partitions exactly up to this many, then takes PostgreSQL's estimate.
pub const EXACT_PARTITIONS: i64 = resources::EXACT_PARTITIONS;
/// The overview's message counts read at most this many partitions holding messages.
pub const OVERVIEW_PARTITIONS: i64 = resources::TALLIED_PARTITIONS;

/// A queue's partition count and summed message counts.
#[derive(Default, Clone, Copy)]
struct Tally {
    partitions: i64,
    messages: MessageCounts,
}

/// Every queue with its partitions' tally, in listing order (priority, then name), bounded as
/// the overview is (`storage::queues::resources::tallies`); with whether the partitions and the
/// messages are whole.
async fn tallied_queues(state: &AppState) -> Result<(Vec<(Queue, Tally)>, bool, bool), ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let all = catalog::all(&mut conn).await?;
    let tallies = resources::tallies(&mut conn, None).await?;
    let queues = all
        .into_iter()
        .map(|q| {
            let (partitions, messages) = tallies.by_queue.get(&q.id).copied().unwrap_or_default();
            (
                q,
                Tally {
                    partitions,
                    messages,
                },
            )
        })
        .collect();
    Ok((queues, tallies.partitions_exact, tallies.messages_exact))
}

/// The tally of these queues: partition counts (an index-only count) and the message counts
/// of their partitions that hold messages.
async fn tally_of(state: &AppState, queues: &[Queue]) -> Result<HashMap<i64, Tally>, ApiError> {
    let ids: Vec<i64> = queues.iter().map(|q| q.id).collect();
    let mut conn = state.admin_pool.acquire().await?;
    Ok(resources::tallies(&mut conn, Some(&ids))
        .await?
        .by_queue
        .into_iter()
        .map(|(id, (partitions, messages))| {
            (
                id,
                Tally {
                    partitions,
                    messages,
                },
            )
        })
        .collect())
}

/// `GET /api/v1/resources/queues[?limit=100&offset=0&search=text]`: one page of the queues
/// (highest priority first, then by name; `search`: names containing it, case insensitive)
/// with `total` (queues matching), `limit` and `offset`.
pub async fn list_queues(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let page = page_params(&query, QUEUES_PER_PAGE, MAX_QUEUES_PER_PAGE)?;
    let (queues, total) = {
        let mut conn = state.admin_pool.acquire().await?;
        catalog::page(&mut conn, page.search.as_deref(), page.limit, page.offset).await?
    };
    let tallies = tally_of(&state, &queues).await?;
    let queues: Vec<Value> = queues
        .into_iter()
        .map(|q| {
            let t = tallies.get(&q.id).copied().unwrap_or_default();
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
    Ok(HttpResponse::Ok().json(json!({
        "queues": queues,
        "total": total,
        "limit": page.limit,
        "offset": page.offset,
    })))
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

/// `GET /api/v1/resources/queues/{queue}[?limit=1000&offset=0]`: the queue, one page of its
/// partitions by name, `partitionCount` and the totals over all of them; 404 `Queue not
/// found` when unknown.
pub async fn queue_detail(
    name: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let page = page_params(&query, PARTITIONS_PER_PAGE, MAX_PARTITIONS_PER_PAGE)?;
    let mut conn = state.admin_pool.acquire().await?;
    let queue = catalog::find(&mut conn, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound("Queue not found".into()))?;
    let ids = resources::partition_page(&mut conn, queue.id, page.limit, page.offset).await?;
    let partitions = resources::partitions_in(&mut conn, Scope::Ids(&ids)).await?;
    let count = resources::partition_counts(&mut conn, &[queue.id])
        .await?
        .get(&queue.id)
        .copied()
        .unwrap_or(0);
    let mut totals = MessageCounts::default();
    for p in resources::partitions_in(&mut conn, Scope::HeldIn(&[queue.id])).await? {
        totals += message_counts(&p);
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
        "partitionCount": count,
        "limit": page.limit,
        "offset": page.offset,
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

/// `GET /api/v1/resources/namespaces`: per namespace its queues, partitions and messages,
/// bounded as the overview is (`partitionsExact`, `messagesExact` say whether the sums are
/// whole; without, partitions are not counted and messages are summed over the first
/// [`OVERVIEW_PARTITIONS`] partitions holding some).
pub async fn namespaces(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (queues, partitions_exact, messages_exact) = tallied_queues(&state).await?;
    Ok(HttpResponse::Ok().json(json!({
        "namespaces": grouped(&queues, |q| &q.namespace, "namespace"),
        "partitionsExact": partitions_exact,
        "messagesExact": messages_exact,
    })))
}

/// `GET /api/v1/resources/tasks`: as the namespaces, per task.
pub async fn tasks(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (queues, partitions_exact, messages_exact) = tallied_queues(&state).await?;
    Ok(HttpResponse::Ok().json(json!({
        "tasks": grouped(&queues, |q| &q.task, "task"),
        "partitionsExact": partitions_exact,
        "messagesExact": messages_exact,
    })))
}

/// `GET /api/v1/resources/overview`. Lag is over every (subscribed group, partition) pair
/// with something unconsumed (`storage::queues::groups::lag_summary`), computed on request
/// while the pairs are at most `QUEEN_LAG_LIVE_PAIRS`, else the last background lag pass's
/// (`lag.measuredAt` says which). `processedPerSecond` is always 0: consumer state keeps cursors and totals, not a
/// history of when messages were consumed, so there is no rate to read.
///
/// Bounded: `partitions` is exact up to [`EXACT_PARTITIONS`] (`partitionsExact`), else
/// PostgreSQL's estimate; `messages` sums the partitions holding messages, at most
/// [`OVERVIEW_PARTITIONS`] of them (`messagesExact` false when there are more,
/// `messagesPartitions` how many were read).
pub async fn overview(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut conn = state.admin_pool.acquire().await?;
    let (queues, namespaces, tasks) = catalog::counts(&mut conn).await?;
    let (partitions, partitions_exact) =
        resources::partition_total(&mut conn, EXACT_PARTITIONS).await?;
    let mut held = resources::held_partitions(&mut conn, OVERVIEW_PARTITIONS + 1).await?;
    let messages_exact = held.len() as i64 <= OVERVIEW_PARTITIONS;
    held.truncate(OVERVIEW_PARTITIONS as usize);
    let mut messages = MessageCounts::default();
    for p in resources::partitions_in(&mut conn, Scope::Ids(&held)).await? {
        messages += message_counts(&p);
    }
    let ingested = resources::ingested_per_second(&mut conn).await?;
    let source = lag::source(&mut conn, state.settings.lag_live_pairs).await?;
    let (time_lag, offset_lag) = match source {
        Source::Live => groups::lag_summary(&mut conn).await?,
        Source::Pass(_) => lag::lag_summary(&mut conn).await?,
    };
    let measured = lag_measured_at(source.measured_at());
    Ok(HttpResponse::Ok()
        .insert_header((LAG_MEASURED_AT, measured.clone()))
        .json(json!({
            "queues": queues,
            "partitions": partitions,
            "partitionsExact": partitions_exact,
            "namespaces": namespaces,
            "tasks": tasks,
            "messages": messages,
            "messagesExact": messages_exact,
            "messagesPartitions": held.len(),
            "lag": { "time": time_lag, "offset": offset_lag, "measuredAt": measured },
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
