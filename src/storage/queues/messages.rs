//! Reading messages back for operators (`/api/v1/messages`): segments in a time window, newest
//! first, decoded into their frames; and one message by (partition, transactionId).
//!
//! Reads never change anything. Segment headers are read first and frames only for the
//! segments a page needs, so a page costs what it shows, not what the window holds. Each
//! message's status comes from its partition's consumer state ([`crate::storage::queues::progress`]),
//! read once per partition, and the dead letters of the segments looked at, read in one
//! statement: nothing is read per message.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::queues::progress::{self, DeadCounts, GroupProgress, Mode, Progress};
use crate::storage::{push::dedup, segments::frames};

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
    /// The payload's JSON text exactly as pushed (sealed when `encrypted`).
    pub payload: String,
    /// The payload is sealed (`storage::segments::crypto`): its queue had `encryptionEnabled`.
    pub encrypted: bool,
}

pub use crate::storage::queues::progress::MessageStatus;

/// The status of a stored message, given its partition's consumer state and whether some group
/// dead-lettered it (the rules are in [`crate::storage::queues::progress`]).
pub fn message_status(message: &StoredMessage, progress: &Progress, dead: bool) -> MessageStatus {
    progress.status(message.offset, dead)
}

/// A listed message with what its consumers have done with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    /// The message.
    pub message: StoredMessage,
    /// Its status (`status` on the wire).
    pub status: MessageStatus,
    /// Its status by queue mode alone (`queueStatus`).
    pub queue_status: MessageStatus,
    /// Named groups of its partition that consumed it (`busStatus.consumedBy`).
    pub consumed_by: usize,
    /// Named groups of its partition (`busStatus.totalGroups`).
    pub total_groups: usize,
    /// Expiry of the live queue-mode lease it is under (`processing` only).
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// One page of the list and how its messages' partitions are consumed.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The messages, newest first.
    pub messages: Vec<Listed>,
    /// Queue mode is a group of some partition of the page.
    pub has_queue_mode: bool,
    /// Distinct named groups over the page's partitions.
    pub bus_groups: usize,
    /// Segments of the page that do not decode (logged with their partition and offset):
    /// their messages are left out, the rest of the page is listed.
    pub damaged_segments: usize,
}

impl Page {
    /// `none`, `queue`, `bus` or `hybrid`.
    pub fn mode(&self) -> Mode {
        Mode::of(self.has_queue_mode, self.bus_groups)
    }
}

/// Consumer state of the partitions a listing has met so far, and the dead-lettered offsets of
/// the segments it has looked at.
#[derive(Default)]
struct States {
    progress: HashMap<i64, Progress>,
    dead: HashMap<i64, BTreeSet<i64>>,
}

impl States {
    /// Loads what `heads` need and is not loaded yet: two statements, whatever their number.
    async fn load(
        &mut self,
        conn: &mut PgConnection,
        heads: &[SegmentHead],
    ) -> Result<(), StorageError> {
        let mut new: Vec<i64> = heads
            .iter()
            .map(|h| h.partition_id)
            .filter(|pid| !self.progress.contains_key(pid))
            .collect();
        new.sort_unstable();
        new.dedup();
        if !new.is_empty() {
            for (pid, p) in progress::of_partitions(conn, &new).await? {
                self.progress.insert(pid, p);
            }
        }
        let ranges: Vec<(i64, Range<i64>)> =
            heads.iter().map(|h| (h.partition_id, h.range())).collect();
        for (pid, offset) in progress::dead_offsets(conn, &ranges).await? {
            self.dead.entry(pid).or_default().insert(offset);
        }
        Ok(())
    }

    fn progress(&self, pid: i64) -> &Progress {
        static NONE: Progress = Progress {
            has_queue_mode: false,
            queue_consumed: 0,
            bus_groups: Vec::new(),
            bus_consumed: Vec::new(),
            lease_from: None,
            lease_to: None,
            lease_expires_at: None,
        };
        // A partition deleted between the reads: nobody consumes it any more.
        self.progress.get(&pid).unwrap_or(&NONE)
    }

    fn is_dead(&self, pid: i64, offset: i64) -> bool {
        self.dead.get(&pid).is_some_and(|d| d.contains(&offset))
    }

    /// How many messages of the segment have `status`.
    fn matching(&self, head: &SegmentHead, status: MessageStatus) -> i64 {
        let p = self.progress(head.partition_id);
        let range = head.range();
        let done = p.completed_below();
        let processing = p.processing();
        let mut dead = DeadCounts::default();
        if let Some(offsets) = self.dead.get(&head.partition_id) {
            for &o in offsets.range(range.clone()) {
                dead.total += 1;
                if o < done {
                    dead.completed += 1;
                } else if processing.contains(&o) {
                    dead.processing += 1;
                }
            }
        }
        let t = p.tally(range, &dead);
        match status {
            MessageStatus::Pending => t.pending,
            MessageStatus::Processing => t.processing,
            MessageStatus::Completed => t.completed,
            MessageStatus::DeadLetter => t.dead_letter,
        }
    }

    fn listed(&self, message: StoredMessage) -> Listed {
        let p = self.progress(message.partition_id);
        let dead = self.is_dead(message.partition_id, message.offset);
        Listed {
            status: message_status(&message, p, dead),
            queue_status: p.queue_status(message.offset, dead),
            consumed_by: p.consumed_by(message.offset),
            total_groups: p.bus_groups.len(),
            lease_expires_at: p.lease_expiry(message.offset),
            message,
        }
    }
}

/// A segment's place and the queue facts every message of it shares.
#[derive(Debug, Clone, sqlx::FromRow)]
struct SegmentHead {
    partition_id: i64,
    base_offset: i64,
    msg_count: i32,
    created_at: DateTime<Utc>,
    partition_uuid: Uuid,
    partition: String,
    queue: String,
    namespace: String,
    task: String,
    priority: i32,
}

impl SegmentHead {
    /// The offsets it holds.
    fn range(&self) -> Range<i64> {
        self.base_offset..self.base_offset + i64::from(self.msg_count)
    }
}

const HEAD_COLUMNS: &str = "s.partition_id, s.base_offset, s.msg_count, s.created_at, \
     p.uuid AS partition_uuid, \
     p.name AS partition, q.name AS queue, q.namespace, q.task, q.priority";

/// Segments read per statement while looking for messages of one status (doubling up to
/// [`MAX_HEAD_CHUNK`]).
const FIRST_HEAD_CHUNK: usize = 256;
const MAX_HEAD_CHUNK: usize = 16_384;

/// Up to `limit` messages of the window, newest first, after skipping `skip`; with `status`,
/// only messages with that status count (for the skip as well).
///
/// Newest means by segment commit time, then by offset downwards within a partition.
///
/// Statuses come from consumer state by offset range, so a segment's number of messages with
/// a status is known without decoding it: only the segments the page shows are read whole.
/// Without a status every segment holds at least one message, so `skip + limit` segment heads
/// are one statement; with one, heads are read in growing chunks until the page is full or the
/// window ends.
///
/// # Errors
///
/// Any database error (a segment that does not decode is left out and counted in
/// [`Page::damaged_segments`]).
pub async fn list(
    conn: &mut PgConnection,
    filter: &Filter,
    status: Option<MessageStatus>,
    skip: usize,
    limit: usize,
) -> Result<Page, StorageError> {
    let want = skip + limit;
    let mut states = States::default();
    // The segments the page touches, and how many of each one's newest matching messages to
    // skip.
    let mut wanted: Vec<(SegmentHead, usize)> = Vec::new();
    let mut seen = 0usize;
    let mut after: Option<(DateTime<Utc>, i64, i64)> = None;
    let mut chunk = if status.is_some() {
        FIRST_HEAD_CHUNK.max(want).min(MAX_HEAD_CHUNK)
    } else {
        want
    };
    'chunks: loop {
        let heads = heads(&mut *conn, filter, after, chunk).await?;
        let exhausted = heads.len() < chunk;
        states.load(&mut *conn, &heads).await?;
        for head in heads {
            after = Some((head.created_at, head.partition_id, head.base_offset));
            let count = match status {
                Some(s) => states.matching(&head, s) as usize,
                None => head.msg_count as usize,
            };
            if count > 0 && seen + count > skip {
                wanted.push((head, skip.saturating_sub(seen)));
            }
            seen += count;
            if seen >= want {
                break 'chunks;
            }
        }
        if exhausted {
            break;
        }
        chunk = (chunk * 2).min(MAX_HEAD_CHUNK);
    }

    let keys: Vec<(i64, i64)> = wanted
        .iter()
        .map(|(h, _)| (h.partition_id, h.base_offset))
        .collect();
    let bytes = segment_frames(conn, &keys).await?;
    let mut page = Page::default();
    for ((head, skip_in_segment), bytes) in wanted.iter().zip(bytes) {
        // One damaged segment must not hide every other message of the listing.
        let mut messages = match decode(head, &bytes) {
            Ok(messages) => messages,
            Err(e) => {
                tracing::error!(queue = %head.queue, partition = %head.partition,
                    base_offset = head.base_offset, error = %e,
                    "a stored segment does not decode; its messages are left out of the listing");
                page.damaged_segments += 1;
                continue;
            }
        };
        messages.reverse();
        let listed = messages
            .into_iter()
            .map(|m| states.listed(m))
            .filter(|l| status.is_none_or(|s| l.status == s))
            .skip(*skip_in_segment);
        page.messages.extend(listed);
        if page.messages.len() >= limit {
            break;
        }
    }
    page.messages.truncate(limit);
    // Messages deleted one by one stay in their segments; the page leaves them out (so a page
    // may come back shorter than `limit`).
    let keys: Vec<(i64, i64)> = page
        .messages
        .iter()
        .map(|l| (l.message.partition_id, l.message.offset))
        .collect();
    let gone = deleted(&mut *conn, &keys).await?;
    if !gone.is_empty() {
        page.messages
            .retain(|l| !gone.contains(&(l.message.partition_id, l.message.offset)));
    }

    let mut partitions: Vec<i64> = page
        .messages
        .iter()
        .map(|l| l.message.partition_id)
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    let mut groups: BTreeSet<&str> = BTreeSet::new();
    for pid in partitions {
        let p = states.progress(pid);
        page.has_queue_mode |= p.has_queue_mode;
        groups.extend(p.bus_groups.iter().map(String::as_str));
    }
    page.bus_groups = groups.len();
    Ok(page)
}

/// Up to `limit` segment heads of the window, newest first, after `after` (exclusive).
async fn heads(
    conn: &mut PgConnection,
    filter: &Filter,
    after: Option<(DateTime<Utc>, i64, i64)>,
    limit: usize,
) -> Result<Vec<SegmentHead>, StorageError> {
    let (at, pid, base) = after.map_or((None, None, None), |(a, p, b)| (Some(a), Some(p), Some(b)));
    sqlx::query_as(&format!(
        "SELECT {HEAD_COLUMNS}
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE s.created_at >= $1 AND s.created_at < $2
            AND ($3::text IS NULL OR q.name = $3)
            AND ($4::text IS NULL OR p.name = $4)
            AND ($5::text IS NULL OR q.namespace = $5)
            AND ($6::text IS NULL OR q.task = $6)
            AND ($8::timestamptz IS NULL
                 OR (s.created_at, s.partition_id, s.base_offset) < ($8, $9, $10))
          ORDER BY s.created_at DESC, s.partition_id DESC, s.base_offset DESC
          LIMIT $7"
    ))
    .bind(filter.from)
    .bind(filter.to)
    .bind(&filter.queue)
    .bind(&filter.partition)
    .bind(&filter.namespace)
    .bind(&filter.task)
    .bind(limit as i64)
    .bind(at)
    .bind(pid)
    .bind(base)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// A found message with what its consumers have done with it, as the detail route shows it.
#[derive(Debug, Clone)]
pub struct Detail {
    /// The message and its statuses.
    pub listed: Listed,
    /// Its partition's consumer state.
    pub progress: Progress,
    /// Every group of the partition (queue mode included), by name.
    pub groups: Vec<GroupProgress>,
    /// Why and after how many retries it was dead-lettered, if it was.
    pub dead_letter: Option<(Option<String>, i32)>,
}

/// [`find`] plus the message's consumer state.
///
/// # Errors
///
/// Any database error; a segment that does not decode is a protocol error.
pub async fn detail(
    conn: &mut PgConnection,
    partition: Uuid,
    transaction_id: &str,
) -> Result<Option<Detail>, StorageError> {
    let Some(message) = find(&mut *conn, partition, transaction_id).await? else {
        return Ok(None);
    };
    let pid = message.partition_id;
    let offset = message.offset;
    let progress = progress::of_partitions(&mut *conn, &[pid])
        .await?
        .pop()
        .map(|(_, p)| p)
        .unwrap_or_default();
    let dead_letter = progress::dead_letter_of(&mut *conn, pid, offset).await?;
    let groups = progress::groups_of(&mut *conn, pid).await?;
    let mut states = States::default();
    states.progress.insert(pid, progress.clone());
    if dead_letter.is_some() {
        states.dead.entry(pid).or_default().insert(offset);
    }
    Ok(Some(Detail {
        listed: states.listed(message),
        progress,
        groups,
        dead_letter,
    }))
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
) -> Result<Option<StoredMessage>, StorageError> {
    match find_stored(&mut *conn, partition, transaction_id).await? {
        Some(m)
            if deleted(&mut *conn, &[(m.partition_id, m.offset)])
                .await?
                .is_empty() =>
        {
            Ok(Some(m))
        }
        _ => Ok(None),
    }
}

/// Deletes the message with `transaction_id` in the partition with public id `partition`:
/// records its offset as deleted, so no pop hands it out from now on (a lease already holding
/// it keeps it) and the message routes no longer show it, and removes its dedup key, so its
/// transactionId may be pushed again. `None` when there is no such message
/// (or it was deleted already).
///
/// # Errors
///
/// Any database error; a segment that does not decode is a protocol error.
pub async fn delete(
    conn: &mut PgConnection,
    partition: Uuid,
    transaction_id: &str,
) -> Result<Option<StoredMessage>, StorageError> {
    let Some(m) = find_stored(&mut *conn, partition, transaction_id).await? else {
        return Ok(None);
    };
    let inserted = sqlx::query(
        "INSERT INTO queen.deleted_messages (partition_id, msg_offset) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(m.partition_id)
    .bind(m.offset)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        // A deleted message frees its transactionId: pushing it again stores a new message
        // (docs/operations.md, "Deleting a message").
        let secret = crate::storage::push::dedup::secret(&mut *conn).await?;
        sqlx::query(
            "DELETE FROM queen.dedup_keys
              WHERE partition_id = $1 AND key_hash = $2 AND msg_offset = $3",
        )
        .bind(m.partition_id)
        .bind(crate::storage::push::dedup::key_hash(
            &secret,
            transaction_id,
        ))
        .bind(m.offset)
        .execute(&mut *conn)
        .await?;
    }
    Ok((inserted == 1).then_some(m))
}

/// Which of these (partition id, offset) pairs are deleted messages.
async fn deleted(
    conn: &mut PgConnection,
    keys: &[(i64, i64)],
) -> Result<std::collections::HashSet<(i64, i64)>, StorageError> {
    if keys.is_empty() {
        return Ok(Default::default());
    }
    let (pids, offsets): (Vec<i64>, Vec<i64>) = keys.iter().copied().unzip();
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT d.partition_id, d.msg_offset
           FROM queen.deleted_messages d
           JOIN unnest($1::int8[], $2::int8[]) AS k(pid, off)
             ON d.partition_id = k.pid AND d.msg_offset = k.off",
    )
    .bind(&pids)
    .bind(&offsets)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// [`find`], deleted messages included.
async fn find_stored(
    conn: &mut PgConnection,
    partition: Uuid,
    transaction_id: &str,
) -> Result<Option<StoredMessage>, StorageError> {
    const CHUNK: i64 = 64;
    let head_sql = format!(
        "SELECT {HEAD_COLUMNS}
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.uuid = $1"
    );
    // Sidecar first: the segments that hold offsets filed under this key's hash.
    let secret = dedup::secret(&mut *conn).await?;
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
    .bind(dedup::key_hash(&secret, transaction_id))
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
) -> Result<Option<StoredMessage>, StorageError> {
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
) -> Result<Vec<Vec<u8>>, StorageError> {
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
fn decode(head: &SegmentHead, bytes: &[u8]) -> Result<Vec<StoredMessage>, StorageError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let decoded = frames::decode(bytes).map_err(|source| StorageError::CorruptSegment {
        partition: head.partition_id,
        source,
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
            encrypted: f.encrypted,
        })
        .collect())
}
