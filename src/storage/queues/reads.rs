//! Reads without a lease: records by offset (`POST /api/v1/fetch`), the partitions written
//! since a time (`POST /api/v1/partitions/changed`) and a consumer group's backlog per
//! partition (`GET /api/v1/resources/queues/{queue}/depth`).
//!
//! None of these takes a lease, writes a row or moves a cursor: they only read. Every
//! statement here serves a whole call (up to 1 024 fetch entries, one page of partitions) in
//! one round trip, and each is an index scan bounded by what it returns (see
//! docs/reads-and-ephemeral.md for the plans).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// Segments read for one fetch entry in one call at most (a segment holds one commit's
/// messages of a partition; the client asks again from where the answer stopped).
pub const SEGMENTS_PER_ENTRY: i64 = 64;

/// Where one fetch entry's partition stands.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Head {
    /// Position of the entry in the request (0-based).
    pub ord: i64,
    /// Partition database id.
    pub partition_id: i64,
    /// The next offset the partition will assign (the high watermark).
    pub next_offset: i64,
    /// The oldest offset retention kept (= `next_offset` when no segment is left).
    pub log_start: i64,
    /// The queue seals its payloads.
    pub encrypted: bool,
}

/// The heads of the partitions named by `(queue, partition)` pairs, one statement for all;
/// entries whose queue or partition does not exist are absent from the answer.
///
/// # Errors
///
/// Any database error.
pub async fn heads(
    conn: &mut PgConnection,
    queues: &[&str],
    partitions: &[&str],
) -> Result<Vec<Head>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT (r.ord - 1)::int8 AS ord,
                p.id AS partition_id,
                p.next_offset,
                COALESCE((SELECT s.base_offset
                            FROM queen.segments s
                           WHERE s.partition_id = p.id
                           ORDER BY s.base_offset
                           LIMIT 1), p.next_offset) AS log_start,
                q.encryption_enabled AS encrypted
           FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r(queue, partition, ord)
           JOIN queen.queues q ON q.name = r.queue
           JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition
          ORDER BY r.ord",
    )
    .bind(queues)
    .bind(partitions)
    .fetch_all(conn)
    .await?)
}

/// What one entry asks the segment read for.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    /// Position of the entry in the request.
    pub ord: i64,
    /// Partition database id.
    pub partition_id: i64,
    /// First offset wanted.
    pub from: i64,
    /// Bytes of segments worth reading for this entry.
    pub budget: i64,
}

/// One segment read for an entry.
#[derive(Debug, sqlx::FromRow)]
pub struct ReadSegment {
    /// Position of the entry in the request.
    pub ord: i64,
    /// Offset of the segment's first message.
    pub base_offset: i64,
    /// Messages in the segment.
    pub msg_count: i32,
    /// The encoded frames (`storage::segments::frames`).
    pub frames: Vec<u8>,
}

/// The segments covering each want from its `from` offset on, in (entry, offset) order: per
/// entry at most [`SEGMENTS_PER_ENTRY`], and only while the segment bytes before one stay
/// under the entry's budget; over the whole call only while the bytes before one stay under
/// `call_budget`. So the first segment of an entry is read whenever the call still has
/// room, however large it is (the caller then answers at least its first record).
///
/// Segment sizes are taken from the stored length (`octet_length` reads it from the TOAST
/// pointer; frames that are not returned are never decompressed).
///
/// # Errors
///
/// Any database error.
pub async fn segments(
    conn: &mut PgConnection,
    wants: &[Want],
    call_budget: i64,
) -> Result<Vec<ReadSegment>, StorageError> {
    if wants.is_empty() {
        return Ok(Vec::new());
    }
    let ords: Vec<i64> = wants.iter().map(|w| w.ord).collect();
    let pids: Vec<i64> = wants.iter().map(|w| w.partition_id).collect();
    let froms: Vec<i64> = wants.iter().map(|w| w.from).collect();
    let budgets: Vec<i64> = wants.iter().map(|w| w.budget).collect();
    Ok(sqlx::query_as(
        "SELECT t.ord, t.base_offset, t.msg_count, t.frames
           FROM (SELECT r.ord, s.base_offset, s.msg_count, s.frames,
                        sum(s.len) OVER (ORDER BY r.ord, s.base_offset) - s.len AS call_before
                   FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[])
                            AS r(ord, pid, from_offset, budget)
                  CROSS JOIN LATERAL (
                        SELECT x.base_offset, x.msg_count, x.frames, x.len,
                               sum(x.len) OVER (ORDER BY x.base_offset) - x.len AS before
                          FROM (SELECT g.base_offset, g.msg_count, g.frames,
                                       octet_length(g.frames)::int8 AS len
                                  FROM queen.segments g
                                 WHERE g.partition_id = r.pid
                                   AND g.base_offset >= COALESCE(
                                         (SELECT max(h.base_offset)
                                            FROM queen.segments h
                                           WHERE h.partition_id = r.pid
                                             AND h.base_offset <= r.from_offset),
                                         r.from_offset)
                                 ORDER BY g.base_offset
                                 LIMIT $5) x) s
                  WHERE s.before < r.budget) t
          WHERE t.call_before < $6
          ORDER BY t.ord, t.base_offset",
    )
    .bind(&ords)
    .bind(&pids)
    .bind(&froms)
    .bind(&budgets)
    .bind(SEGMENTS_PER_ENTRY)
    .bind(call_budget)
    .fetch_all(conn)
    .await?)
}

/// Offsets deleted one by one (`DELETE /api/v1/messages/...`) at or after each want's
/// `from`, as (entry position, offset), in that order: a read leaves them out like a pop.
///
/// # Errors
///
/// Any database error.
pub async fn deleted(
    conn: &mut PgConnection,
    wants: &[Want],
) -> Result<Vec<(i64, i64)>, StorageError> {
    if wants.is_empty() {
        return Ok(Vec::new());
    }
    let ords: Vec<i64> = wants.iter().map(|w| w.ord).collect();
    let pids: Vec<i64> = wants.iter().map(|w| w.partition_id).collect();
    let froms: Vec<i64> = wants.iter().map(|w| w.from).collect();
    Ok(sqlx::query_as(
        "SELECT r.ord, d.msg_offset
           FROM unnest($1::int8[], $2::int8[], $3::int8[]) AS r(ord, pid, from_offset)
           JOIN queen.deleted_messages d
             ON d.partition_id = r.pid AND d.msg_offset >= r.from_offset
          ORDER BY r.ord, d.msg_offset",
    )
    .bind(&ords)
    .bind(&pids)
    .bind(&froms)
    .fetch_all(conn)
    .await?)
}

/// A partition as `partitions/changed` lists it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Changed {
    /// Partition database id (the page cursor).
    pub id: i64,
    /// Partition id on the wire.
    pub uuid: Uuid,
    /// Partition name.
    pub name: String,
    /// The next offset the partition will assign.
    pub next_offset: i64,
    /// The oldest offset retention kept.
    pub log_start: i64,
    /// Time of the last commit that wrote it (`None`: never written).
    pub last_write_at: Option<DateTime<Utc>>,
}

/// The queue's id, if it exists.
///
/// # Errors
///
/// Any database error.
pub async fn queue_id(conn: &mut PgConnection, queue: &str) -> Result<Option<i64>, StorageError> {
    Ok(
        sqlx::query_scalar("SELECT id FROM queen.queues WHERE name = $1")
            .bind(queue)
            .fetch_optional(conn)
            .await?,
    )
}

/// The time up to which every write is visible to a statement run after this one: now,
/// less `margin`, and no later than the start of any transaction open in this database
/// (a commit stamps `last_write_at` with its transaction's start time, so a transaction
/// still open might yet show a write stamped at its start). Must run before the listing it
/// vouches for, in a statement of its own (the listing then takes a later snapshot).
///
/// # Errors
///
/// Any database error.
pub async fn safe_time(
    conn: &mut PgConnection,
    margin: std::time::Duration,
) -> Result<DateTime<Utc>, StorageError> {
    let margin_micros = i64::try_from(margin.as_micros()).unwrap_or(i64::MAX);
    Ok(sqlx::query_scalar(
        "SELECT LEAST(clock_timestamp() - make_interval(secs => $1::float8 / 1e6),
                      (SELECT min(a.xact_start)
                         FROM pg_stat_activity a
                        WHERE a.datname = current_database()
                          AND a.pid <> pg_backend_pid()
                          AND a.backend_type = 'client backend'
                          AND a.xact_start IS NOT NULL))",
    )
    .bind(margin_micros as f64)
    .fetch_one(conn)
    .await?)
}

/// SQL of one page of `partitions/changed` written at or after `$2`, after partition id
/// `$3`, in creation (id) order: an index range scan of `partitions_changed` over the
/// partitions written since `$2`, ordered by id for the page.
pub const CHANGED_SINCE_SQL: &str = "SELECT p.id, p.uuid, p.name, p.next_offset,
        COALESCE((SELECT s.base_offset
                    FROM queen.segments s
                   WHERE s.partition_id = p.id
                   ORDER BY s.base_offset
                   LIMIT 1), p.next_offset) AS log_start,
        p.last_write_at
   FROM queen.partitions p
  WHERE p.queue_id = $1
    AND p.last_write_at >= $2
    AND p.id > $3
  ORDER BY p.id
  LIMIT $4";

/// SQL of one page of every partition of queue `$1` after partition id `$2`, in creation
/// order (the primary key, from the cursor on).
pub const CHANGED_ALL_SQL: &str = "SELECT p.id, p.uuid, p.name, p.next_offset,
        COALESCE((SELECT s.base_offset
                    FROM queen.segments s
                   WHERE s.partition_id = p.id
                   ORDER BY s.base_offset
                   LIMIT 1), p.next_offset) AS log_start,
        p.last_write_at
   FROM queen.partitions p
  WHERE p.queue_id = $1
    AND p.id > $2
  ORDER BY p.id
  LIMIT $3";

/// One page (at most `limit` rows) of the queue's partitions written at or after `since`
/// (all of them without), after partition id `after`, in creation order.
///
/// # Errors
///
/// Any database error.
pub async fn changed(
    conn: &mut PgConnection,
    queue_id: i64,
    since: Option<DateTime<Utc>>,
    after: i64,
    limit: i64,
) -> Result<Vec<Changed>, StorageError> {
    let rows = match since {
        Some(since) => {
            sqlx::query_as(CHANGED_SINCE_SQL)
                .bind(queue_id)
                .bind(since)
                .bind(after)
                .bind(limit)
                .fetch_all(conn)
                .await?
        }
        None => {
            sqlx::query_as(CHANGED_ALL_SQL)
                .bind(queue_id)
                .bind(after)
                .bind(limit)
                .fetch_all(conn)
                .await?
        }
    };
    Ok(rows)
}

/// One partition's backlog for a group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PartitionDepth {
    /// Partition name.
    pub name: String,
    /// Offsets not yet consumed by the group.
    pub pending: i64,
}

/// The backlog of a queue for a consumer group.
#[derive(Debug, Clone, Default)]
pub struct Depth {
    /// Offsets not yet consumed, over the partitions examined.
    pub pending: i64,
    /// Partitions with `pending > 0`, over the partitions examined.
    pub partitions_pending: i64,
    /// Partitions with a backlog, in creation order, at most the `list` asked for.
    pub partitions: Vec<PartitionDepth>,
    /// Partitions examined (at most the `scan` asked for).
    pub examined: i64,
}

/// The backlog of queue `queue_id` for `group` (`__QUEUE_MODE__` for queue mode): per
/// partition, the offsets from the group's committed offset (or, for a partition the group
/// never touched, the oldest kept offset) to the next offset to be assigned. Examines at most
/// `scan` partitions in creation order and lists at most `list` of those with a backlog, so a
/// queue with a million partitions costs a bounded read.
///
/// # Errors
///
/// Any database error.
pub async fn depth(
    conn: &mut PgConnection,
    queue_id: i64,
    group: &str,
    scan: i64,
    list: i64,
) -> Result<Depth, StorageError> {
    let rows: Vec<(i32, String, i64, i64)> = sqlx::query_as(
        "WITH examined AS (
             SELECT p.id, p.name, p.next_offset
               FROM queen.partitions p
              WHERE p.queue_id = $1
              ORDER BY p.id
              LIMIT $3),
         per AS (
             SELECT e.id, e.name,
                    GREATEST(e.next_offset - GREATEST(
                        COALESCE(c.committed_offset, 0),
                        COALESCE((SELECT s.base_offset
                                    FROM queen.segments s
                                   WHERE s.partition_id = e.id
                                   ORDER BY s.base_offset
                                   LIMIT 1), e.next_offset)), 0)::int8 AS pending
               FROM examined e
               LEFT JOIN queen.partition_consumers c
                 ON c.partition_id = e.id AND c.consumer_group = $2)
         SELECT 0, ''::text, count(*)::int8, COALESCE(sum(pending), 0)::int8 FROM per
         UNION ALL
         SELECT 1, ''::text, count(*) FILTER (WHERE pending > 0)::int8, 0::int8 FROM per
         UNION ALL
         (SELECT 2, name::text, id, pending FROM per WHERE pending > 0 ORDER BY id LIMIT $4)",
    )
    .bind(queue_id)
    .bind(group)
    .bind(scan)
    .bind(list)
    .fetch_all(conn)
    .await?;
    let mut depth = Depth::default();
    let mut listed = Vec::new();
    for (kind, name, a, b) in rows {
        match kind {
            0 => {
                depth.examined = a;
                depth.pending = b;
            }
            1 => depth.partitions_pending = a,
            _ => listed.push((a, PartitionDepth { name, pending: b })),
        }
    }
    listed.sort_by_key(|(id, _)| *id);
    depth.partitions = listed.into_iter().map(|(_, p)| p).collect();
    Ok(depth)
}
