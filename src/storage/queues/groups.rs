//! Consumer groups as a whole: where each group stands on each partition (lag), deleting a
//! group's state, moving its subscription start, and seeking its cursors.
//!
//! These are operator routes: they may read every partition of the queues involved. The pop
//! path never calls them.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::consume::read::start_offset_sql;
use crate::storage::error::StorageError;
use crate::storage::queues::catalog::contains_pattern;

/// Where each subscribed group stands on each partition of its queues; `$1` filters by group
/// (NULL = all). A partition the group never touched starts where its subscription says.
fn positions() -> String {
    scoped_positions("", "TRUE", "TRUE")
}

/// [`positions`] with CTEs of the caller's before `pos` (`before`: empty, or CTEs each
/// followed by a comma), a condition on the subscription `s` and queue `q`, and one on the
/// partition `p` (`p.id`), so the work is that of the pairs in scope.
fn scoped_positions(before: &str, scope: &str, partition_scope: &str) -> String {
    format!(
        "
WITH {before} pos AS (
    SELECT s.consumer_group, q.name AS queue, p.id AS partition_id, p.uuid AS partition_uuid,
           p.name AS partition, p.next_offset, c.lease_owner, c.last_consumed_at,
           COALESCE(c.total_consumed, 0) AS total_consumed,
           COALESCE(c.lease_expires_at > now(), false) AS lease_active,
           s.subscription_mode, s.subscription_from, s.created_at AS subscribed_at,
           COALESCE(c.committed_offset, {start}) AS position
      FROM queen.consumer_subscriptions s
      JOIN queen.queues q ON q.id = s.queue_id
      -- Per subscription, its queue's partitions through the (queue_id, name) index: the work
      -- is the subscribed pairs, never every partition (OFFSET 0 keeps the planner from
      -- turning this into one scan of the whole index).
      CROSS JOIN LATERAL (
           SELECT p.id, p.uuid, p.name, p.next_offset
             FROM queen.partitions p
            WHERE p.queue_id = s.queue_id AND ({partition_scope})
           OFFSET 0
      ) p
      LEFT JOIN queen.partition_consumers c
        ON c.partition_id = p.id AND c.consumer_group = s.consumer_group
     WHERE ($1::text IS NULL OR s.consumer_group = $1) AND ({scope})
), lag AS (
    SELECT pos.*,
           GREATEST(pos.next_offset - pos.position, 0) AS offset_lag,
           {oldest} AS oldest_unconsumed_at
      FROM pos
)",
        start = start_offset_sql("p.id", "s.subscription_from"),
        oldest = oldest_unconsumed_sql("pos")
    )
}

/// The arrival of the oldest message past the group's position in a row `r` with
/// `partition_id`, `position` and `next_offset` (NULL when nothing is past it): the segment
/// holding the position, or the first one after it.
pub(crate) fn oldest_unconsumed_sql(r: &str) -> String {
    format!(
        "CASE WHEN {r}.next_offset > {r}.position THEN
               COALESCE((SELECT sg.created_at
                           FROM queen.segments sg
                          WHERE sg.partition_id = {r}.partition_id
                            AND sg.base_offset <= {r}.position
                          ORDER BY sg.base_offset DESC
                          LIMIT 1),
                        (SELECT sg.created_at
                           FROM queen.segments sg
                          WHERE sg.partition_id = {r}.partition_id
                            AND sg.base_offset > {r}.position
                          ORDER BY sg.base_offset
                          LIMIT 1))
           END"
    )
}

/// One (group, queue) pair.
#[derive(Debug, sqlx::FromRow)]
pub struct GroupSummary {
    /// Group name.
    pub consumer_group: String,
    /// Queue name.
    pub queue: String,
    /// Live leases of the group on the queue.
    pub members: i64,
    /// Partitions with unconsumed messages.
    pub partitions_with_lag: i64,
    /// Messages past the group's cursors, over the queue's partitions.
    pub backlog: i64,
    /// Age in seconds of the oldest unconsumed message.
    pub max_time_lag: i64,
    /// `all`, `new` or `timestamp`.
    pub subscription_mode: String,
    /// Subscription start, if any.
    pub subscription_from: Option<DateTime<Utc>>,
    /// When the group first popped from the queue.
    pub subscribed_at: DateTime<Utc>,
}

/// Every (group, queue) pair with its lag.
///
/// # Errors
///
/// Any database error.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<GroupSummary>, StorageError> {
    let positions = positions();
    sqlx::query_as(&format!(
        "{positions}
         SELECT consumer_group, queue,
                count(*) FILTER (WHERE lease_active) AS members,
                count(*) FILTER (WHERE offset_lag > 0) AS partitions_with_lag,
                COALESCE(sum(offset_lag), 0)::int8 AS backlog,
                COALESCE(max(extract(epoch FROM now() - oldest_unconsumed_at))::int8, 0)
                    AS max_time_lag,
                min(subscription_mode) AS subscription_mode,
                min(subscription_from) AS subscription_from,
                min(subscribed_at) AS subscribed_at
           FROM lag
          GROUP BY consumer_group, queue
          ORDER BY consumer_group, queue"
    ))
    .bind(None::<String>)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// The subscriptions `s` (with their queue `q`) whose group or queue name matches the pattern
/// parameter `p` (NULL: all): the FROM and WHERE of the paged group lists.
pub(crate) fn matching_pairs(p: &str) -> String {
    format!(
        "FROM queen.consumer_subscriptions s
           JOIN queen.queues q ON q.id = s.queue_id
          WHERE {p}::text IS NULL OR s.consumer_group ILIKE {p} OR q.name ILIKE {p}"
    )
}

/// One page of the (group, queue) pairs, by group then queue name, of those whose group or
/// queue name contains `search` (`storage::queues::catalog::contains_pattern`), with their
/// lag, and how many pairs match in all. The lag is read for the page's pairs only.
///
/// # Errors
///
/// Any database error.
pub async fn list_page(
    conn: &mut PgConnection,
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<GroupSummary>, i64), StorageError> {
    let pattern = search.map(contains_pattern);
    let matching = |p: &str| {
        format!(
            "SELECT s.consumer_group, s.queue_id, q.name AS queue_name {}",
            matching_pairs(p)
        )
    };
    let positions = scoped_positions(
        &format!(
            "page AS ({}
                ORDER BY consumer_group, queue_name
                LIMIT $3 OFFSET $4),",
            matching("$2")
        ),
        "(s.consumer_group, s.queue_id) IN (SELECT consumer_group, queue_id FROM page)",
        "TRUE",
    );
    let rows = sqlx::query_as(&format!(
        "{positions}
         SELECT consumer_group, queue,
                count(*) FILTER (WHERE lease_active) AS members,
                count(*) FILTER (WHERE offset_lag > 0) AS partitions_with_lag,
                COALESCE(sum(offset_lag), 0)::int8 AS backlog,
                COALESCE(max(extract(epoch FROM now() - oldest_unconsumed_at))::int8, 0)
                    AS max_time_lag,
                min(subscription_mode) AS subscription_mode,
                min(subscription_from) AS subscription_from,
                min(subscribed_at) AS subscribed_at
           FROM lag
          GROUP BY consumer_group, queue
          ORDER BY consumer_group, queue"
    ))
    .bind(None::<String>)
    .bind(&pattern)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*)::int8 FROM ({}) m",
        matching("$1")
    ))
    .bind(&pattern)
    .fetch_one(conn)
    .await?;
    Ok((rows, total))
}

/// One partition of a group.
#[derive(Debug, sqlx::FromRow)]
pub struct PartitionLag {
    /// Group name.
    pub consumer_group: String,
    /// Queue name.
    pub queue: String,
    /// Partition name.
    pub partition: String,
    /// Partition id on the wire.
    pub partition_uuid: Uuid,
    /// Owner of the current or last lease.
    pub lease_owner: Option<String>,
    /// Unconsumed messages.
    pub offset_lag: i64,
    /// Age in seconds of the oldest unconsumed message (0 when none).
    pub time_lag_seconds: i64,
    /// Arrival of the oldest unconsumed message's segment.
    pub oldest_unconsumed_at: Option<DateTime<Utc>>,
    /// Last time the group's cursor moved here.
    pub last_consumed_at: Option<DateTime<Utc>>,
    /// Messages consumed here.
    pub total_consumed: i64,
    /// Whether a lease is live.
    pub lease_active: bool,
}

const PARTITION_COLUMNS: &str = "consumer_group, queue, partition, partition_uuid, lease_owner,
    offset_lag,
    COALESCE(extract(epoch FROM now() - oldest_unconsumed_at)::int8, 0) AS time_lag_seconds,
    oldest_unconsumed_at, last_consumed_at, total_consumed, lease_active";

/// Partitions whose oldest unconsumed message is at least `min_lag_secs` old, the oldest
/// first, at most `limit` of them.
///
/// # Errors
///
/// Any database error.
pub async fn lagging(
    conn: &mut PgConnection,
    min_lag_secs: i64,
    limit: i64,
) -> Result<Vec<PartitionLag>, StorageError> {
    let positions = positions();
    sqlx::query_as(&format!(
        "{positions}
         SELECT {PARTITION_COLUMNS}
           FROM lag
          WHERE oldest_unconsumed_at <= now() - $2 * interval '1 second'
          ORDER BY oldest_unconsumed_at, consumer_group, queue, partition
          LIMIT $3"
    ))
    .bind(None::<String>)
    .bind(min_lag_secs as f64)
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// One page of the partitions of every queue the group subscribed to (of `queue` only, when
/// given), by queue then partition name: the lag is measured for the page's partitions only.
///
/// # Errors
///
/// Any database error.
pub async fn partitions(
    conn: &mut PgConnection,
    group: &str,
    queue: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<PartitionLag>, StorageError> {
    let positions = scoped_positions(
        "page AS (
             SELECT p.id
               FROM queen.consumer_subscriptions s
               JOIN queen.queues q ON q.id = s.queue_id
               JOIN queen.partitions p ON p.queue_id = s.queue_id
              WHERE s.consumer_group = $1 AND ($2::text IS NULL OR q.name = $2)
              ORDER BY q.name, p.name
              LIMIT $3 OFFSET $4),",
        "$2::text IS NULL OR q.name = $2",
        "p.id IN (SELECT id FROM page)",
    );
    sqlx::query_as(&format!(
        "{positions}
         SELECT {PARTITION_COLUMNS}
           FROM lag
          ORDER BY queue, partition"
    ))
    .bind(group)
    .bind(queue)
    .bind(limit)
    .bind(offset)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// Avg, median, min and max of one lag measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Mean.
    pub avg: f64,
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

/// Lag over every (subscribed group, partition) pair that has something unconsumed: in
/// seconds (age of the oldest unconsumed message) and in messages. All zero when every group
/// is caught up.
///
/// # Errors
///
/// Any database error.
pub async fn lag_summary(conn: &mut PgConnection) -> Result<(Spread, Spread), StorageError> {
    let positions = positions();
    type Row = (f64, f64, f64, f64, f64, f64, f64, f64);
    let r: Row = sqlx::query_as(&format!(
        "{positions}
         SELECT COALESCE(avg(t), 0)::float8,
                COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY t), 0)::float8,
                COALESCE(min(t), 0)::float8, COALESCE(max(t), 0)::float8,
                COALESCE(avg(o), 0)::float8,
                COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY o), 0)::float8,
                COALESCE(min(o), 0)::float8, COALESCE(max(o), 0)::float8
           FROM (SELECT GREATEST(extract(epoch FROM now() - oldest_unconsumed_at), 0)::float8 AS t,
                        offset_lag::float8 AS o
                   FROM lag
                  WHERE offset_lag > 0) x"
    ))
    .bind(None::<String>)
    .fetch_one(conn)
    .await?;
    Ok(spreads(r))
}

/// The time and offset [`Spread`]s of a row of eight: avg, median, min, max of each.
pub(crate) fn spreads(r: (f64, f64, f64, f64, f64, f64, f64, f64)) -> (Spread, Spread) {
    (
        Spread {
            avg: r.0,
            median: r.1,
            min: r.2,
            max: r.3,
        },
        Spread {
            avg: r.4,
            median: r.5,
            min: r.6,
            max: r.7,
        },
    )
}

/// The backlog of one (queue, consumer group) pair.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct PairBacklog {
    /// Queue name.
    pub queue: String,
    /// Consumer group (`__QUEUE_MODE__` for queue mode).
    pub consumer_group: String,
    /// Messages past the group's cursor, over the queue's partitions.
    pub backlog: i64,
    /// Age in seconds of the oldest of them (0 when none).
    pub oldest_seconds: f64,
}

/// The `limit` (queue, group) pairs with the largest backlog (then the oldest unconsumed
/// message), for the history sampler. Pairs with nothing unconsumed are left out. One
/// statement over the subscribed groups' partitions, like [`lag_summary`].
///
/// # Errors
///
/// Any database error.
pub async fn largest_backlogs(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<PairBacklog>, StorageError> {
    let positions = positions();
    sqlx::query_as(&format!(
        "{positions}
         SELECT queue, consumer_group, sum(offset_lag)::int8 AS backlog,
                COALESCE(max(GREATEST(extract(epoch FROM now() - oldest_unconsumed_at), 0)), 0)::float8
                    AS oldest_seconds
           FROM lag
          WHERE offset_lag > 0
          GROUP BY queue, consumer_group
          ORDER BY backlog DESC, oldest_seconds DESC, queue, consumer_group
          LIMIT $2"
    ))
    .bind(None::<String>)
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// Deletes the group's cursors and leases (on one queue, or all); with `metadata` also its
/// subscriptions, so its next pop chooses a start again. Without, the kept subscriptions scan
/// from the beginning again. Returns (consumer rows deleted, subscriptions deleted).
///
/// # Errors
///
/// Any database error.
pub async fn delete(
    conn: &mut PgConnection,
    group: &str,
    queue: Option<&str>,
    metadata: bool,
) -> Result<(u64, u64), StorageError> {
    let rows = sqlx::query(
        "DELETE FROM queen.partition_consumers c
          WHERE c.queue_id IN (SELECT q.id
                                 FROM queen.queues q
                                WHERE $2::text IS NULL OR q.name = $2)
            AND c.consumer_group = $1",
    )
    .bind(group)
    .bind(queue)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let subs = if metadata {
        sqlx::query(
            "DELETE FROM queen.consumer_subscriptions s
              WHERE s.consumer_group = $1
                AND ($2::text IS NULL
                     OR s.queue_id = (SELECT id FROM queen.queues WHERE name = $2))",
        )
        .bind(group)
        .bind(queue)
        .execute(&mut *conn)
        .await?
        .rows_affected()
    } else {
        sqlx::query(
            "UPDATE queen.consumer_subscriptions s
                SET scan_xid = 0, scan_pid = 0
              WHERE s.consumer_group = $1
                AND ($2::text IS NULL
                     OR s.queue_id = (SELECT id FROM queen.queues WHERE name = $2))",
        )
        .bind(group)
        .bind(queue)
        .execute(&mut *conn)
        .await?;
        0
    };
    Ok((rows, subs))
}

/// Moves the subscription start of every queue of the group to `from` (partitions the group
/// has not touched yet start there). Returns the subscriptions updated.
///
/// # Errors
///
/// Any database error.
pub async fn set_subscription(
    conn: &mut PgConnection,
    group: &str,
    from: DateTime<Utc>,
) -> Result<u64, StorageError> {
    Ok(sqlx::query(
        "UPDATE queen.consumer_subscriptions
            SET subscription_mode = 'timestamp', subscription_from = $2,
                scan_xid = 0, scan_pid = 0
          WHERE consumer_group = $1",
    )
    .bind(group)
    .bind(from)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Where a seek moves a cursor.
#[derive(Debug, Clone, Copy)]
pub enum SeekTarget {
    /// Past the newest message.
    End,
    /// Past the last message that arrived at or before this time.
    At(DateTime<Utc>),
}

/// Moves the group's cursors on the queue's partitions it has state for, releasing their
/// leases; returns how many moved. Timestamps resolve to segment boundaries (a segment's time
/// is its commit's).
///
/// # Errors
///
/// Any database error.
pub async fn seek_queue(
    conn: &mut PgConnection,
    group: &str,
    queue: &str,
    target: SeekTarget,
) -> Result<u64, StorageError> {
    let at = match target {
        SeekTarget::End => None,
        SeekTarget::At(t) => Some(t),
    };
    Ok(sqlx::query(
        "UPDATE queen.partition_consumers c
            SET committed_offset = CASE
                    WHEN $3::timestamptz IS NULL THEN p.next_offset
                    ELSE COALESCE((SELECT s.base_offset
                                     FROM queen.segments s
                                    WHERE s.partition_id = p.id AND s.created_at > $3
                                    ORDER BY s.base_offset
                                    LIMIT 1), p.next_offset)
                END,
                lease_expires_at = NULL,
                batch_retry_count = 0,
                retry_lease_id = NULL,
                attention_at = now()
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE c.partition_id = p.id
            AND c.consumer_group = $1
            AND q.name = $2",
    )
    .bind(group)
    .bind(queue)
    .bind(at)
    .execute(conn)
    .await?
    .rows_affected())
}

/// Moves the group's cursor on one partition past its newest message (creating the group's
/// state there if needed) and releases its lease. `None` when the partition does not exist;
/// else the new committed offset.
///
/// # Errors
///
/// Any database error.
pub async fn seek_partition_to_end(
    conn: &mut PgConnection,
    group: &str,
    queue: &str,
    partition: &str,
) -> Result<Option<i64>, StorageError> {
    sqlx::query_scalar(
        "INSERT INTO queen.partition_consumers (partition_id, consumer_group, queue_id, committed_offset)
         SELECT p.id, $1, p.queue_id, p.next_offset
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $2 AND p.name = $3
         ON CONFLICT (partition_id, consumer_group) DO UPDATE
            SET committed_offset = EXCLUDED.committed_offset,
                lease_expires_at = NULL,
                batch_retry_count = 0,
                retry_lease_id = NULL,
                attention_at = now()
         RETURNING committed_offset",
    )
    .bind(group)
    .bind(queue)
    .bind(partition)
    .fetch_optional(conn)
    .await
    .map_err(StorageError::from)
}
