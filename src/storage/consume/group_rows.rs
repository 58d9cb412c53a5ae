//! A group's rows in `queen.partition_consumers`: the first claim of a partition the group
//! never popped, joining the partitions a new group has never touched (from where its
//! subscription starts), and clearing a row's attention once it is caught up.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::consume::read::start_offset_sql;
use crate::storage::error::StorageError;

/// The first claim of a partition by a group that has no row on it: the row is created with
/// the lease (`lease` for `owner`, `lease_secs` seconds) and the committed offset where the
/// group starts there (from the subscription start `since`). Returns the committed offset,
/// the batch retry counter and the partition's next offset; `None` when a row appeared
/// meanwhile (another claim was first).
pub(crate) async fn first_claim(
    conn: &mut PgConnection,
    partition_id: i64,
    group: &str,
    lease: Uuid,
    owner: &str,
    lease_secs: i32,
    since: Option<DateTime<Utc>>,
) -> Result<Option<(i64, i32, i64)>, StorageError> {
    Ok(sqlx::query_as(&format!(
        "INSERT INTO queen.partition_consumers
                (partition_id, consumer_group, queue_id, committed_offset, lease_id,
                 lease_owner, lease_acquired_at, lease_expires_at, attention_at)
         SELECT p.id, $2, p.queue_id,
                {start},
                $3, $4, now(),
                now() + $5 * interval '1 second',
                NULL
           FROM queen.partitions p
          WHERE p.id = $1
         ON CONFLICT (partition_id, consumer_group) DO NOTHING
         RETURNING committed_offset, batch_retry_count,
                   (SELECT next_offset FROM queen.partitions WHERE id = $1)",
        start = start_offset_sql("p.id", "$6::timestamptz")
    ))
    .bind(partition_id)
    .bind(group)
    .bind(lease)
    .bind(owner)
    .bind(lease_secs)
    .bind(since)
    .fetch_optional(conn)
    .await?)
}

/// Untouched partitions given a row per statement at most (oldest writes first).
pub(crate) const JOIN_ROWS: i64 = 1024;

/// Gives the group a row on the partitions written at or after `from_write` (a point of the
/// write order) that it has never touched and that hold messages for it ([`JOIN_ROWS`] at
/// most, oldest writes first): no lease, the committed offset where the group starts on that
/// partition (as a first claim would set it, from the subscription start `since`), and a
/// request for attention, which the one-statement pop serves in request order. A partition
/// with nothing for the group gets no row, as before: its first claim makes one. Rows are
/// inserted in partition id order, so concurrent calls never wait on each other in a cycle; a
/// row another pop created meanwhile is left as it is.
pub(crate) async fn join_untouched(
    conn: &mut PgConnection,
    queue_id: i64,
    group: &str,
    from_write: (i64, i64),
    since: Option<DateTime<Utc>>,
) -> Result<(), StorageError> {
    let joined = sqlx::query(&format!(
        "INSERT INTO queen.partition_consumers
                (partition_id, consumer_group, queue_id, committed_offset, attention_at)
         SELECT w.id, $2, w.queue_id, s.start, now()
           FROM (SELECT w.id, w.queue_id, w.next_offset
                   FROM queen.partitions w
                  WHERE w.queue_id = $1
                    AND (w.last_write_xid, w.id) >= ($3, $4)
                  ORDER BY w.last_write_xid, w.id
                  LIMIT $5) w
          CROSS JOIN LATERAL (SELECT {start} AS start) s
          WHERE s.start < w.next_offset
            AND NOT EXISTS (SELECT 1
                              FROM queen.partition_consumers c
                             WHERE c.partition_id = w.id AND c.consumer_group = $2)
          ORDER BY w.id
         ON CONFLICT (partition_id, consumer_group) DO NOTHING",
        start = start_offset_sql("w.id", "$6::timestamptz")
    ))
    .bind(queue_id)
    .bind(group)
    .bind(from_write.0)
    .bind(from_write.1)
    .bind(JOIN_ROWS)
    .bind(since)
    .execute(conn)
    .await?;
    tracing::debug!(
        queue_id,
        group,
        rows = joined.rows_affected(),
        "group joined untouched partitions"
    );
    Ok(())
}

/// Clears a caught-up row's request for attention (and its run-out lease), unless it has
/// messages again.
pub(crate) async fn clear_attention(
    conn: &mut PgConnection,
    partition_id: i64,
    group: &str,
) -> Result<(), StorageError> {
    sqlx::query(
        "UPDATE queen.partition_consumers c
            SET attention_at = NULL,
                lease_expires_at = NULL
          WHERE c.partition_id = $1
            AND c.consumer_group = $2
            AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
            AND c.committed_offset >= (SELECT next_offset FROM queen.partitions WHERE id = $1)",
    )
    .bind(partition_id)
    .bind(group)
    .execute(conn)
    .await?;
    Ok(())
}
