//! Retention: removes whole segments by age, never part of one, for queues that ask for it.
//!
//! A segment goes when, per its queue,
//! - `retention_enabled` and `retention_seconds` > 0 and it is older than that, or
//! - `max_wait_time_seconds` > 0 and it is older than that (consumed or not), or
//! - `retention_enabled` and `completed_retention_seconds` > 0, it is older than that, and every
//!   consumer group of its partition has consumed all of it (`queen.partition_consumed`, see
//!   `migrations/0004_completed_retention.up.sql`: the groups are those subscribed to the queue,
//!   queue mode included, plus any with a cursor on the partition; a group without a cursor on
//!   the partition has consumed nothing of it, and a partition without groups nothing at all).
//!
//! Only a prefix of each partition is removed: the scan stops at the first segment that must
//! stay, so a partition's segments always cover `[first base_offset, next_offset)` without holes
//! and "how many messages does it hold" is `next_offset - first base_offset`.
//!
//! The dedup sidecar rows of removed messages are left alone: inside the window they are what
//! makes a later duplicate answer the all-zero UUID ("original unknown") instead of storing the
//! message again, and past the window `dedup::sweep_expired` removes them.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};

use crate::storage::error::StorageError;

/// What one retention statement removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Segments deleted.
    pub segments: u64,
    /// Messages they held.
    pub messages: u64,
}

/// Removes up to `limit` expired segments, walking partitions in id order from `from_partition`
/// (oldest segments first within each). When it stopped at the limit, the answer names the
/// partition to resume from, so a sweep visits every partition once however much it removes.
///
/// # Errors
///
/// Any database error.
pub async fn remove_expired(
    conn: &mut PgConnection,
    limit: i64,
    from_partition: i64,
) -> Result<(Removed, Option<i64>), StorageError> {
    // Per partition, `age_end` is the base offset of the first segment young enough to stay by
    // age (everything before it goes), `done_end` the same for completed retention, capped by
    // what every group has consumed. Both are index probes on the segments' primary key that
    // read only the segments about to be removed plus one; `OFFSET 0` keeps the planner from
    // inlining (and so repeating) them and the consumer state. The consumer state is a subquery per visited partition
    // of a queue with completed retention, not a join: joined, the view may be evaluated for
    // every partition below the resume point too.
    let (segments, messages, last): (i64, i64, Option<i64>) = sqlx::query_as(REMOVE_SQL)
        .bind(limit)
        .bind(from_partition)
        .fetch_one(conn)
        .await?;
    let removed = Removed {
        segments: segments as u64,
        messages: messages as u64,
    };
    Ok((removed, last.filter(|_| segments >= limit)))
}

/// The statement of [`remove_expired`]: `$1` the limit, `$2` the partition to start from.
/// Public so tests can EXPLAIN it.
pub const REMOVE_SQL: &str = "WITH doomed AS (
             SELECT s.partition_id, s.base_offset
               FROM queen.partitions p
               JOIN queen.queues q ON q.id = p.queue_id
              CROSS JOIN LATERAL (
                    SELECT CASE WHEN k.age_secs IS NULL THEN -1 ELSE COALESCE((
                               SELECT y.base_offset FROM queen.segments y
                                WHERE y.partition_id = p.id
                                  AND y.created_at >= now() - make_interval(secs => k.age_secs)
                                ORDER BY y.base_offset
                                LIMIT 1), p.next_offset) END AS age_end,
                           CASE WHEN k.done_secs IS NULL OR k.consumed_below IS NULL THEN -1
                                ELSE LEAST(k.consumed_below, COALESCE((
                               SELECT y.base_offset FROM queen.segments y
                                WHERE y.partition_id = p.id
                                  AND y.created_at >= now() - make_interval(secs => k.done_secs)
                                ORDER BY y.base_offset
                                LIMIT 1), p.next_offset)) END AS done_end
                      FROM (SELECT LEAST(CASE WHEN q.retention_enabled AND q.retention_seconds > 0
                                              THEN q.retention_seconds END,
                                         NULLIF(q.max_wait_time_seconds, 0)) AS age_secs,
                                   CASE WHEN q.retention_enabled
                                         AND q.completed_retention_seconds > 0
                                        THEN q.completed_retention_seconds END AS done_secs,
                                   CASE WHEN q.retention_enabled
                                         AND q.completed_retention_seconds > 0
                                        THEN (SELECT c.consumed_below
                                                FROM queen.partition_consumed c
                                               WHERE c.partition_id = p.id) END
                                       AS consumed_below
                            OFFSET 0) k
                    OFFSET 0
              ) b
              CROSS JOIN LATERAL (
                    SELECT s.partition_id, s.base_offset
                      FROM queen.segments s
                     WHERE s.partition_id = p.id
                       AND s.base_offset < GREATEST(b.age_end, b.done_end)
                       AND (s.base_offset < b.age_end
                            OR s.base_offset + s.msg_count <= b.done_end)
                     ORDER BY s.base_offset
                     LIMIT $1
              ) s
              WHERE p.id >= $2
                AND ((q.retention_enabled
                      AND (q.retention_seconds > 0 OR q.completed_retention_seconds > 0))
                     OR q.max_wait_time_seconds > 0)
              ORDER BY p.id
              LIMIT $1
         ), removed AS (
             DELETE FROM queen.segments s
              USING doomed d
              WHERE s.partition_id = d.partition_id
                AND s.base_offset = d.base_offset
             RETURNING s.partition_id, s.msg_count
         )
         SELECT count(*), COALESCE(sum(msg_count), 0)::int8, max(partition_id) FROM removed";

/// Runs [`remove_expired`] in batches of `batch` until nothing is left; returns the total.
///
/// # Errors
///
/// Any database error (what was removed before it stays removed).
pub async fn sweep(pool: &PgPool, batch: i64) -> Result<Removed, StorageError> {
    let mut total = Removed::default();
    // No queue with a retention or a maximum wait: nothing to walk (the walk goes through
    // every partition in id order, seconds with a million of them).
    let any: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1
                          FROM queen.queues q
                         WHERE (q.retention_enabled
                                AND (q.retention_seconds > 0 OR q.completed_retention_seconds > 0))
                            OR q.max_wait_time_seconds > 0)",
    )
    .fetch_one(pool)
    .await?;
    if !any {
        return Ok(total);
    }
    let mut from = i64::MIN;
    loop {
        let mut conn = pool.acquire().await?;
        let (removed, resume) = remove_expired(&mut conn, batch, from).await?;
        total.segments += removed.segments;
        total.messages += removed.messages;
        match resume {
            Some(partition) => from = partition,
            None => return Ok(total),
        }
    }
}

/// The background task: a [`sweep`] every `every`.
pub async fn sweep_loop(pool: PgPool, every: Duration, batch: i64) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sweep(&pool, batch).await {
            Ok(r) if r.segments > 0 => tracing::info!(
                segments = r.segments,
                messages = r.messages,
                "retention removed expired segments"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "retention sweep failed; retrying at the next interval");
            }
        }
    }
}
