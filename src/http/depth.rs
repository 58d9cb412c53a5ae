//! `GET /api/v1/resources/queues/{queue}/depth[?group=<g>]` (reference §2.8): a consumer
//! group's backlog on a queue.
//!
//! `{queue, group, pending, partitionsPending, conflation, effectivePending, partitions:
//! [{partition, pending}]}`; `pending` counts offsets past the group's committed offset (for a
//! partition the group never touched: past the oldest kept offset), `effectivePending` is
//! `partitionsPending` for a conflating group and `pending` otherwise.
//!
//! Bounded: the first [`DEPTH_SCAN`] partitions of the queue (creation order) are examined
//! and at most `limit` (default and ceiling [`DEPTH_LIST`]) of those with a backlog are listed;
//! `truncated: true` says a bound was reached (the totals then cover the examined partitions).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use crate::http::error::{with_db, ApiError};
use crate::state::AppState;
use crate::storage::consume::conflate;
use crate::storage::queues::reads;

/// Partitions examined at most by one depth answer.
pub const DEPTH_SCAN: i64 = 100_000;
/// Partitions listed at most (default of `limit`).
pub const DEPTH_LIST: i64 = 1000;

/// The group name of queue mode (no group).
const QUEUE_MODE: &str = "__QUEUE_MODE__";

/// Query of the depth route.
#[derive(Debug, Deserialize)]
pub struct DepthQuery {
    group: Option<String>,
    limit: Option<String>,
}

/// The stored conflation policy of (queue, group) (reference §2.8, "Conflation";
/// `storage::consume::conflate`): false without a group, and for a group that has not
/// registered on the queue.
///
/// # Errors
///
/// When PostgreSQL does not answer.
pub async fn group_conflates(
    state: &AppState,
    queue: &str,
    group: Option<&str>,
) -> Result<bool, ApiError> {
    let Some(group) = group else {
        return Ok(false);
    };
    with_db(state, async {
        let mut conn = state.admin_pool.acquire().await?;
        conflate::stored_policy(&mut conn, queue, group).await
    })
    .await
}

/// `GET /api/v1/resources/queues/{queue}/depth`.
pub async fn depth(
    queue: web::Path<String>,
    query: web::Query<DepthQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let group = query.group.as_deref().filter(|g| !g.is_empty());
    let limit = match query.limit.as_deref() {
        None => DEPTH_LIST,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| ApiError::BadRequest("limit must be a non-negative integer".into()))?
            .min(DEPTH_LIST),
    };
    let depth = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        let Some(queue_id) = reads::queue_id(&mut conn, &queue).await? else {
            return Ok(None);
        };
        reads::depth(
            &mut conn,
            queue_id,
            group.unwrap_or(QUEUE_MODE),
            DEPTH_SCAN,
            limit,
        )
        .await
        .map(Some)
    })
    .await?
    .ok_or_else(|| ApiError::NotFound("Queue not found".into()))?;
    let conflation = group_conflates(&state, &queue, group).await?;
    let truncated =
        depth.examined >= DEPTH_SCAN || (depth.partitions.len() as i64) < depth.partitions_pending;
    Ok(HttpResponse::Ok().json(json!({
        "queue": queue.as_str(),
        "group": group,
        "pending": depth.pending,
        "partitionsPending": depth.partitions_pending,
        "conflation": conflation,
        "effectivePending": if conflation { depth.partitions_pending } else { depth.pending },
        "partitions": depth.partitions.iter().map(|p| json!({
            "partition": p.name,
            "pending": p.pending,
        })).collect::<Vec<_>>(),
        "truncated": truncated,
    })))
}
