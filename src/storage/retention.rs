//! Retention: removes whole segments by age, never part of one, for queues that ask for it.
//!
//! A segment goes when, per its queue,
//! - `retention_enabled` and `retention_seconds` > 0 and it is older than that, or
//! - `max_wait_time_seconds` > 0 and it is older than that (consumed or not), or
//! - `retention_enabled` and `completed_retention_seconds` > 0, it is older than that, and every
//!   consumer group has consumed all of it (`queen.partition_consumed`, see
//!   `migrations/0003_admin.up.sql`).
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

/// What one retention statement removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Segments deleted.
    pub segments: u64,
    /// Messages they held.
    pub messages: u64,
}

/// Removes up to `limit` expired segments (oldest first within each partition).
///
/// # Errors
///
/// Any database error.
pub async fn remove_expired(conn: &mut PgConnection, limit: i64) -> sqlx::Result<Removed> {
    // Per partition, `age_end` is the base offset of the first segment young enough to stay by
    // age (everything before it goes), `done_end` the same for completed retention, capped by
    // what every group has consumed. Both are index probes on the segments' primary key that
    // read only the segments about to be removed plus one.
    let (segments, messages): (i64, i64) = sqlx::query_as(
        "WITH limits AS (
             SELECT p.id AS partition_id, p.next_offset,
                    LEAST(CASE WHEN q.retention_enabled AND q.retention_seconds > 0
                               THEN q.retention_seconds END,
                          NULLIF(q.max_wait_time_seconds, 0)) AS age_secs,
                    CASE WHEN q.retention_enabled AND q.completed_retention_seconds > 0
                         THEN q.completed_retention_seconds END AS done_secs,
                    c.consumed_below
               FROM queen.queues q
               JOIN queen.partitions p ON p.queue_id = q.id
               LEFT JOIN queen.partition_consumed c ON c.partition_id = p.id
              WHERE (q.retention_enabled
                     AND (q.retention_seconds > 0 OR q.completed_retention_seconds > 0))
                 OR q.max_wait_time_seconds > 0
         ), bounds AS (
             SELECT l.partition_id,
                    CASE WHEN l.age_secs IS NULL THEN -1 ELSE COALESCE((
                        SELECT y.base_offset FROM queen.segments y
                         WHERE y.partition_id = l.partition_id
                           AND y.created_at >= now() - make_interval(secs => l.age_secs)
                         ORDER BY y.base_offset
                         LIMIT 1), l.next_offset) END AS age_end,
                    CASE WHEN l.done_secs IS NULL OR l.consumed_below IS NULL THEN -1
                         ELSE LEAST(l.consumed_below, COALESCE((
                        SELECT y.base_offset FROM queen.segments y
                         WHERE y.partition_id = l.partition_id
                           AND y.created_at >= now() - make_interval(secs => l.done_secs)
                         ORDER BY y.base_offset
                         LIMIT 1), l.next_offset)) END AS done_end
               FROM limits l
         ), doomed AS (
             SELECT s.partition_id, s.base_offset
               FROM bounds b
              CROSS JOIN LATERAL (
                    SELECT s.partition_id, s.base_offset
                      FROM queen.segments s
                     WHERE s.partition_id = b.partition_id
                       AND s.base_offset < GREATEST(b.age_end, b.done_end)
                       AND (s.base_offset < b.age_end
                            OR s.base_offset + s.msg_count <= b.done_end)
                     ORDER BY s.base_offset
                     LIMIT $1
              ) s
              WHERE GREATEST(b.age_end, b.done_end) > 0
              LIMIT $1
         ), removed AS (
             DELETE FROM queen.segments s
              USING doomed d
              WHERE s.partition_id = d.partition_id
                AND s.base_offset = d.base_offset
             RETURNING s.msg_count
         )
         SELECT count(*), COALESCE(sum(msg_count), 0)::int8 FROM removed",
    )
    .bind(limit)
    .fetch_one(conn)
    .await?;
    Ok(Removed {
        segments: segments as u64,
        messages: messages as u64,
    })
}

/// Runs [`remove_expired`] in batches of `batch` until nothing is left; returns the total.
///
/// # Errors
///
/// Any database error (what was removed before it stays removed).
pub async fn sweep(pool: &PgPool, batch: i64) -> sqlx::Result<Removed> {
    let mut total = Removed::default();
    loop {
        let mut conn = pool.acquire().await?;
        let removed = remove_expired(&mut conn, batch).await?;
        total.segments += removed.segments;
        total.messages += removed.messages;
        if removed.segments < batch as u64 {
            return Ok(total);
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
