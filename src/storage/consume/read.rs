//! Reading a claimed range: its segments from the cache or PostgreSQL, opened (sealed
//! payloads) and cut to the range, deleted messages left out; and where a group starts on a
//! partition (`start_offset_sql`).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use std::sync::Arc;

use crate::storage::consume::{QueueInfo, Subscription, SubscriptionStart, QUEUE_MODE};
use crate::storage::error::StorageError;
use crate::storage::segments::cache::{CachedSegment, SegmentCache};

/// The segments holding offsets `from .. from + want` of a partition (offsets are dense, so
/// the covering segments are exactly those starting below the end, from the one holding
/// `from`), taken from `cache` where it holds them. When retention removed `from`, reading
/// resumes at the oldest segment left. Returns the segments and the first offset actually
/// present.
///
/// # Errors
///
/// Any database error.
pub async fn read_range(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    partition_id: i64,
    from: i64,
    want: i64,
    next_offset: i64,
) -> Result<(Vec<Arc<CachedSegment>>, i64), StorageError> {
    let mut from = from;
    for _ in 0..2 {
        let held = cache.from_offset(partition_id, from);
        let held_bases: Vec<i64> = held.iter().map(|s| s.base_offset).collect();
        let rows: Vec<(i64, i32, Option<Vec<u8>>)> = sqlx::query_as(
            "SELECT base_offset, msg_count,
                    CASE WHEN base_offset = ANY($4) THEN NULL ELSE frames END
               FROM queen.segments
              WHERE partition_id = $1
                AND base_offset < $3
                AND base_offset >= COALESCE((SELECT max(base_offset)
                                               FROM queen.segments
                                              WHERE partition_id = $1
                                                AND base_offset <= $2), $2)
              ORDER BY base_offset",
        )
        .bind(partition_id)
        .bind(from)
        .bind(from + want)
        .bind(&held_bases)
        .fetch_all(&mut *conn)
        .await?;
        if let Some(&(base, _, _)) = rows.first() {
            let mut segments = Vec::with_capacity(rows.len());
            for (b, count, bytes) in rows {
                segments.push(sent_or_held(
                    cache,
                    &held,
                    partition_id,
                    b,
                    count.into(),
                    bytes,
                )?);
            }
            return Ok((segments, from.max(base)));
        }
        if from >= next_offset {
            break;
        }
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT min(base_offset) FROM queen.segments WHERE partition_id = $1 AND base_offset > $2",
        )
        .bind(partition_id)
        .bind(from)
        .fetch_one(&mut *conn)
        .await?;
        match oldest {
            Some(base) => from = base,
            None => break,
        }
    }
    Ok((Vec::new(), from))
}

/// A segment of a read that skipped the frames of the segments in `held`: the frames sent
/// (kept in the cache too), or the held copy.
pub(crate) fn sent_or_held(
    cache: &SegmentCache,
    held: &[Arc<CachedSegment>],
    partition_id: i64,
    base: i64,
    count: i64,
    frames: Option<Vec<u8>>,
) -> Result<Arc<CachedSegment>, StorageError> {
    match frames {
        Some(frames) => Ok(cache.insert_read(partition_id, base, count, frames)),
        None => held
            .iter()
            .find(|s| s.base_offset == base)
            .map(|s| {
                cache.count_hit();
                s.clone()
            })
            .ok_or_else(|| {
                StorageError::Inconsistent(format!(
                    "partition {partition_id}: segment {base} was neither sent nor cached"
                ))
            }),
    }
}

/// SQL for where a group starts on a partition it has not touched yet: the beginning without a
/// subscription start (`from` NULL), else right after the last segment committed before it.
pub(crate) fn start_offset_sql(partition: &str, from: &str) -> String {
    format!(
        "CASE WHEN {from} IS NULL THEN 0
              ELSE COALESCE((SELECT sg.base_offset + sg.msg_count
                               FROM queen.segments sg
                              WHERE sg.partition_id = {partition}
                                AND sg.created_at < {from}
                              ORDER BY sg.base_offset DESC
                              LIMIT 1), 0)
         END"
    )
}

/// The queue and the group's subscription on it, recording the subscription on first contact
/// (with the conflation policy `conflation`, for a named group; the stored one wins after).
pub(crate) async fn open(
    conn: &mut PgConnection,
    queue: &str,
    group: &str,
    start: &SubscriptionStart,
    conflation: bool,
) -> Result<Option<(QueueInfo, Subscription)>, StorageError> {
    type Row = (
        i64,
        i32,
        i32,
        i32,
        Option<DateTime<Utc>>,
        Option<i64>,
        Option<i64>,
        Option<bool>,
    );
    let select = "SELECT q.id, q.lease_time, q.delayed_processing, q.window_buffer,
                         s.subscription_from, s.scan_xid, s.scan_pid, s.conflation
                    FROM queen.queues q
                    LEFT JOIN queen.consumer_subscriptions s
                      ON s.queue_id = q.id AND s.consumer_group = $2
                   WHERE q.name = $1";
    let mut row: Option<Row> = sqlx::query_as(select)
        .bind(queue)
        .bind(group)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some((queue_id, _, _, _, _, None, _, _)) = row {
        let (mode, from) = match (group == QUEUE_MODE, start) {
            (true, _) | (false, SubscriptionStart::All) => ("all", None),
            (false, SubscriptionStart::New) => ("new", None),
            (false, SubscriptionStart::From(t)) => ("timestamp", Some(*t)),
        };
        // A new group starts its scan at the current xmin: everything written before it
        // subscribed is history it does not want. Durable even on the lease pool's
        // asynchronous-commit sessions: where a group starts must not move after a crash.
        let mut tx = crate::storage::begin::begin(&mut *conn).await?;
        sqlx::query("SET LOCAL synchronous_commit = on")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO queen.consumer_subscriptions
                    (consumer_group, queue_id, subscription_mode, subscription_from, scan_xid,
                     conflation)
             VALUES ($1, $2, $3,
                     CASE $3 WHEN 'new' THEN now() ELSE $4 END,
                     CASE $3 WHEN 'new'
                          THEN pg_snapshot_xmin(pg_current_snapshot())::text::int8
                          ELSE 0 END,
                     $5)
             ON CONFLICT (consumer_group, queue_id) DO NOTHING",
        )
        .bind(group)
        .bind(queue_id)
        .bind(mode)
        .bind(from)
        .bind(conflation && group != QUEUE_MODE)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        row = sqlx::query_as(select)
            .bind(queue)
            .bind(group)
            .fetch_optional(&mut *conn)
            .await?;
    }
    Ok(row.map(
        |(id, lease_secs, delay_secs, window_secs, from, xid, pid, conflation)| {
            (
                QueueInfo {
                    id,
                    name: queue.to_string(),
                    lease_secs,
                    delay_secs,
                    window_secs,
                },
                Subscription {
                    from,
                    scan: (xid.unwrap_or(0), pid.unwrap_or(0)),
                    conflation: conflation.unwrap_or(false),
                },
            )
        },
    ))
}
