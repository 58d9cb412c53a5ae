//! Reading messages back for operators (`/api/v1/messages`): segments in a time window, newest
//! first, decoded into their frames; and one message by (partition, transactionId).
//!
//! Reads never change anything. Segment headers are read first and frames only for the
//! segments a page needs, so a page costs what it shows, not what the window holds.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::{dedup, frames};

/// Which messages to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Queue name.
    pub queue: Option<String>,
    /// Partition name.
    pub partition: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Task.
    pub task: Option<String>,
    /// Segments written at or after this time.
    pub from: DateTime<Utc>,
    /// Segments written before this time.
    pub to: DateTime<Utc>,
}

/// One stored message with where it lives.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Partition's internal id.
    pub partition_id: i64,
    /// Partition's public id.
    pub partition_uuid: Uuid,
    /// Partition name.
    pub partition: String,
    /// Queue name.
    pub queue: String,
    /// Queue namespace.
    pub namespace: String,
    /// Queue task.
    pub task: String,
    /// Queue priority.
    pub priority: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Message id.
    pub id: Uuid,
    /// Dedup key.
    pub transaction_id: String,
    /// Producer's `sub`.
    pub producer_sub: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Arrival time, microseconds since the Unix epoch.
    pub created_at_micros: i64,
    /// The payload's JSON text exactly as pushed.
    pub payload: String,
}

/// A message's state for its consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageStatus {
    /// Not consumed yet.
    Pending,
    /// Under a live lease.
    Processing,
    /// Consumed.
    Completed,
    /// Dead-lettered.
    DeadLetter,
}

impl MessageStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::DeadLetter => "dead_letter",
        }
    }
}

/// The status of a stored message.
///
/// Extend here once consumer cursors exist (`migrations/0002_consumers`, another branch):
/// completed below the queue-mode cursor, processing inside a live lease's range, dead_letter
/// when in the dead-letter table. Until then nothing can have been consumed.
pub fn message_status(_message: &StoredMessage) -> MessageStatus {
    MessageStatus::Pending
}

/// A segment's place and the queue facts every message of it shares.
#[derive(Debug, Clone, sqlx::FromRow)]
struct SegmentHead {
    partition_id: i64,
    base_offset: i64,
    msg_count: i32,
    partition_uuid: Uuid,
    partition: String,
    queue: String,
    namespace: String,
    task: String,
    priority: i32,
}

const HEAD_COLUMNS: &str = "s.partition_id, s.base_offset, s.msg_count, p.uuid AS partition_uuid, \
     p.name AS partition, q.name AS queue, q.namespace, q.task, q.priority";

/// Up to `limit` messages of the window, newest first, after skipping `skip`.
///
/// Newest means by segment commit time, then by offset downwards within a partition.
///
/// # Errors
///
/// Any database error; a segment that does not decode is a protocol error.
pub async fn list(
    conn: &mut PgConnection,
    filter: &Filter,
    skip: usize,
    limit: usize,
) -> sqlx::Result<Vec<StoredMessage>> {
    // Every segment holds at least one message, so `skip + limit` segments always suffice.
    let heads: Vec<SegmentHead> = sqlx::query_as(&format!(
        "SELECT {HEAD_COLUMNS}
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE s.created_at >= $1 AND s.created_at < $2
            AND ($3::text IS NULL OR q.name = $3)
            AND ($4::text IS NULL OR p.name = $4)
            AND ($5::text IS NULL OR q.namespace = $5)
            AND ($6::text IS NULL OR q.task = $6)
          ORDER BY s.created_at DESC, s.partition_id DESC, s.base_offset DESC
          LIMIT $7"
    ))
    .bind(filter.from)
    .bind(filter.to)
    .bind(&filter.queue)
    .bind(&filter.partition)
    .bind(&filter.namespace)
    .bind(&filter.task)
    .bind((skip + limit) as i64)
    .fetch_all(&mut *conn)
    .await?;

    // Pick the segments the page touches, and how many of each one's newest messages to skip.
    let mut wanted: Vec<(SegmentHead, usize)> = Vec::new();
    let mut seen = 0usize;
    for head in heads {
        let count = head.msg_count as usize;
        if seen + count > skip {
            wanted.push((head, skip.saturating_sub(seen)));
        }
        seen += count;
        if seen >= skip + limit {
            break;
        }
    }
    let keys: Vec<(i64, i64)> = wanted
        .iter()
        .map(|(h, _)| (h.partition_id, h.base_offset))
        .collect();
    let bytes = segment_frames(conn, &keys).await?;

    let mut out = Vec::with_capacity(limit);
    for ((head, skip_in_segment), bytes) in wanted.iter().zip(bytes) {
        let mut messages = decode(head, &bytes)?;
        messages.reverse();
        out.extend(messages.into_iter().skip(*skip_in_segment));
        if out.len() >= limit {
            break;
        }
    }
    out.truncate(limit);
    Ok(out)
}

/// The message with `transaction_id` in the partition with public id `partition`, if stored.
///
/// The dedup sidecar finds it at once while its key is inside the window; otherwise (dedup
/// off, or older) the partition's segments are read newest first until it turns up, which
/// costs up to the whole partition: this is an operator's lookup, not a hot path.
///
/// # Errors
///
/// Any database error; a segment that does not decode is a protocol error.
pub async fn find(
    conn: &mut PgConnection,
    partition: Uuid,
    transaction_id: &str,
) -> sqlx::Result<Option<StoredMessage>> {
    const CHUNK: i64 = 64;
    let head_sql = format!(
        "SELECT {HEAD_COLUMNS}
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.uuid = $1"
    );
    // Sidecar first: the segments that hold offsets filed under this key's hash.
    let hinted: Vec<SegmentHead> = sqlx::query_as(&format!(
        "{head_sql}
            AND s.base_offset = ANY (ARRAY(
                SELECT (SELECT y.base_offset FROM queen.segments y
                         WHERE y.partition_id = d.partition_id AND y.base_offset <= d.msg_offset
                         ORDER BY y.base_offset DESC LIMIT 1)
                  FROM queen.dedup_keys d
                 WHERE d.partition_id = p.id AND d.key_hash = $2))"
    ))
    .bind(partition)
    .bind(dedup::key_hash(transaction_id))
    .fetch_all(&mut *conn)
    .await?;
    if let Some(found) = search(conn, &hinted, transaction_id).await? {
        return Ok(Some(found));
    }
    let mut below = i64::MAX;
    loop {
        let chunk: Vec<SegmentHead> = sqlx::query_as(&format!(
            "{head_sql}
                AND s.base_offset < $2
              ORDER BY s.base_offset DESC
              LIMIT $3"
        ))
        .bind(partition)
        .bind(below)
        .bind(CHUNK)
        .fetch_all(&mut *conn)
        .await?;
        let Some(last) = chunk.last() else {
            return Ok(None);
        };
        below = last.base_offset;
        if let Some(found) = search(conn, &chunk, transaction_id).await? {
            return Ok(Some(found));
        }
    }
}

/// The newest message with `transaction_id` among these segments.
async fn search(
    conn: &mut PgConnection,
    heads: &[SegmentHead],
    transaction_id: &str,
) -> sqlx::Result<Option<StoredMessage>> {
    if heads.is_empty() {
        return Ok(None);
    }
    let keys: Vec<(i64, i64)> = heads
        .iter()
        .map(|h| (h.partition_id, h.base_offset))
        .collect();
    let mut best: Option<StoredMessage> = None;
    for (head, bytes) in heads.iter().zip(segment_frames(conn, &keys).await?) {
        for m in decode(head, &bytes)? {
            if m.transaction_id == transaction_id
                && best.as_ref().is_none_or(|b| b.offset < m.offset)
            {
                best = Some(m);
            }
        }
    }
    Ok(best)
}

/// The `frames` of these segments, in the order asked.
async fn segment_frames(
    conn: &mut PgConnection,
    keys: &[(i64, i64)],
) -> sqlx::Result<Vec<Vec<u8>>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let pids: Vec<i64> = keys.iter().map(|k| k.0).collect();
    let bases: Vec<i64> = keys.iter().map(|k| k.1).collect();
    let rows: Vec<(i64, i64, Vec<u8>)> = sqlx::query_as(
        "SELECT s.partition_id, s.base_offset, s.frames
           FROM unnest($1::int8[], $2::int8[]) AS x(partition_id, base_offset)
           JOIN queen.segments s
             ON s.partition_id = x.partition_id AND s.base_offset = x.base_offset",
    )
    .bind(&pids)
    .bind(&bases)
    .fetch_all(conn)
    .await?;
    let mut by_key: std::collections::HashMap<(i64, i64), Vec<u8>> = rows
        .into_iter()
        .map(|(pid, base, bytes)| ((pid, base), bytes))
        .collect();
    // A segment removed by retention between the two reads shows as empty.
    Ok(keys
        .iter()
        .map(|k| by_key.remove(k).unwrap_or_default())
        .collect())
}

/// Decodes a segment's frames into messages, oldest first.
fn decode(head: &SegmentHead, bytes: &[u8]) -> sqlx::Result<Vec<StoredMessage>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let decoded = frames::decode(bytes).map_err(|e| {
        sqlx::Error::Protocol(format!(
            "partition {} segment {}: {e}",
            head.partition_id, head.base_offset
        ))
    })?;
    Ok(decoded
        .into_iter()
        .enumerate()
        .map(|(n, f)| StoredMessage {
            partition_id: head.partition_id,
            partition_uuid: head.partition_uuid,
            partition: head.partition.clone(),
            queue: head.queue.clone(),
            namespace: head.namespace.clone(),
            task: head.task.clone(),
            priority: head.priority,
            offset: head.base_offset + n as i64,
            id: f.id,
            transaction_id: f.transaction_id.to_string(),
            producer_sub: f.producer_sub.map(str::to_string),
            trace_id: f.trace_id.map(str::to_string),
            created_at_micros: f.created_at_micros,
            payload: f.payload.to_string(),
        })
        .collect())
}
