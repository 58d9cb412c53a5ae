//! Acks: an ack is an offset commit of a consumer group on a partition.
//!
//! An ack names (partition, transactionId). The message is found inside the offset range of
//! the group's last lease on that partition (its segments), never through a global index, so
//! this works with dedup off. `completed` moves the committed offset past the message (never
//! backwards); `failed` releases the lease for a redelivery, counting one retry per batch,
//! until the queue's retry limit, then dead-letters; `retry` releases without counting; `dlq`
//! dead-letters at once. When the committed offset reaches the end of the leased range, the
//! lease is released and the retry counter resets.
//!
//! The ack window (reference §2.5, docs/consuming-2x.md): the acks of one call are applied in
//! offset order, and a nack that asks for a redelivery (`retry`, or `failed` within the retry
//! budget) stops the cursor there: a later `completed` ack of the same call is not committed
//! (it is answered `success: false` and redelivered), so a nack is never swallowed by a later
//! success. On `/ack` and `/ack/batch` a `failed` or `retry` ends the lease (a `failed` past
//! the retry limit too), so the rest of the batch is delivered again at once; a `dlq` sets its
//! message aside and keeps the lease. An ack of a message below the committed offset the call
//! found is a no-op: `completed` answers `success: true, noop: true`, a nack is refused (it can
//! no longer be honoured). An ack whose transactionId is not among the messages of the group's
//! last lease on the partition is refused as unresolvable and changes nothing.
//!
//! Every function here runs inside the caller's transaction and locks the (partition, group)
//! rows in (partition id, group) order, so concurrent ack batches never deadlock.

use std::collections::{BTreeMap, HashMap};

use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::consume::dlq::{self, DeadLetter};
use crate::storage::consume::read::read_range;
use crate::storage::error::StorageError;
use crate::storage::segments::cache::{CachedSegment, SegmentCache};
use crate::storage::segments::frames;

/// What the consumer says about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// `completed` or `success`.
    Completed,
    /// `failed`: retry, or dead-letter once retries are exhausted.
    Failed,
    /// `dlq`: dead-letter now.
    Dlq,
    /// `retry`: release the lease, redeliver, no retry counted.
    Retry,
    /// Anything else.
    Unknown,
}

impl AckStatus {
    /// Parses the wire value (absent = `completed`).
    pub fn parse(status: Option<&str>) -> Self {
        match status {
            None | Some("completed") | Some("success") => Self::Completed,
            Some("failed") => Self::Failed,
            Some("dlq") => Self::Dlq,
            Some("retry") => Self::Retry,
            Some(_) => Self::Unknown,
        }
    }
}

/// How failures are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// `/ack`, `/ack/batch`: `failed` retries up to the queue's retry limit.
    Consume,
    /// `/transaction`: `failed` and `dlq` dead-letter at once (no retry budget).
    Transaction,
}

/// One ack.
#[derive(Debug, Clone)]
pub struct Ack {
    /// Position in the request.
    pub index: usize,
    /// Partition id on the wire (its UUID; filled in by [`resolve_partition_ids`] when the
    /// ack named the partition by its 64-bit id).
    pub partition: Uuid,
    /// The partition's 64-bit id (`queen.partitions.id`), when the ack named it so (decimal
    /// text, as a framed pop gives it); resolved to `partition` before the ack is applied.
    pub partition_number: Option<i64>,
    /// The message's transactionId.
    pub transaction_id: String,
    /// Status.
    pub status: AckStatus,
    /// Consumer group.
    pub group: String,
    /// Lease the consumer claims to hold (checked when given).
    pub lease_id: Option<String>,
    /// Reason, stored with a dead letter.
    pub error: Option<String>,
}

/// The result of one ack.
#[derive(Debug, Clone, PartialEq)]
pub struct AckOutcome {
    /// Position in the request.
    pub index: usize,
    /// The message's transactionId.
    pub transaction_id: String,
    /// Whether the ack was applied.
    pub success: bool,
    /// Why not.
    pub error: Option<String>,
    /// Queue of the partition, when it exists.
    pub queue_name: Option<String>,
    /// Partition name, when it exists.
    pub partition_name: Option<String>,
    /// This ack released the lease.
    pub lease_released: bool,
    /// This ack dead-lettered the message.
    pub dlq: bool,
    /// The message was already below the committed offset: nothing changed.
    pub noop: bool,
}

/// Text of an ack whose message is not in the lease's range (the 2.x client looks for
/// "unresolv").
pub const NOT_FOUND: &str =
    "Message not found: transactionId unresolvable among the messages of the group's last lease on this partition";
/// Text of an ack naming a lease that is not the live one.
pub const BAD_LEASE: &str = "Invalid or expired lease";

struct PartitionInfo {
    id: i64,
    name: String,
    queue: String,
    retry_limit: i32,
    next_offset: i64,
}

#[derive(sqlx::FromRow)]
struct ConsumerRow {
    committed_offset: i64,
    lease_id: Option<Uuid>,
    live: Option<bool>,
    leased_from: Option<i64>,
    leased_to: Option<i64>,
    batch_retry_count: i32,
    retry_lease_id: Option<Uuid>,
}

/// Applies `acks` inside the caller's transaction; one outcome per ack, in `acks` order.
///
/// # Errors
///
/// Any database error (the caller rolls back).
pub async fn apply(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    acks: &[Ack],
    mode: AckMode,
) -> Result<Vec<AckOutcome>, StorageError> {
    let mut outcomes: Vec<AckOutcome> = acks
        .iter()
        .map(|a| AckOutcome {
            index: a.index,
            transaction_id: a.transaction_id.clone(),
            success: false,
            error: Some(NOT_FOUND.into()),
            queue_name: None,
            partition_name: None,
            lease_released: false,
            dlq: false,
            noop: false,
        })
        .collect();
    let mut uuids: Vec<Uuid> = acks.iter().map(|a| a.partition).collect();
    uuids.sort_unstable();
    uuids.dedup();
    let rows: Vec<(Uuid, i64, String, String, i32, i64)> = sqlx::query_as(
        "SELECT p.uuid, p.id, p.name, q.name, q.retry_limit, p.next_offset
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.uuid = ANY($1)",
    )
    .bind(&uuids)
    .fetch_all(&mut *conn)
    .await?;
    let ids: HashMap<Uuid, i64> = rows.iter().map(|r| (r.0, r.1)).collect();
    let partitions: HashMap<i64, PartitionInfo> = rows
        .into_iter()
        .map(|(_, id, name, queue, retry_limit, next_offset)| {
            (
                id,
                PartitionInfo {
                    id,
                    name,
                    queue,
                    retry_limit,
                    next_offset,
                },
            )
        })
        .collect();

    // (partition id, group) → positions in `acks`; BTreeMap = the lock order.
    let mut groups: BTreeMap<(i64, &str), Vec<usize>> = BTreeMap::new();
    for (n, ack) in acks.iter().enumerate() {
        if let Some(p) = ids.get(&ack.partition).map(|id| &partitions[id]) {
            outcomes[n].queue_name = Some(p.queue.clone());
            outcomes[n].partition_name = Some(p.name.clone());
            groups.entry((p.id, &ack.group)).or_default().push(n);
        }
    }
    for ((pid, group), members) in groups {
        let info = &partitions[&pid];
        apply_group(
            conn,
            cache,
            info,
            group,
            acks,
            &members,
            mode,
            &mut outcomes,
        )
        .await?;
    }
    Ok(outcomes)
}

#[allow(clippy::too_many_arguments)]
async fn apply_group(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    info: &PartitionInfo,
    group: &str,
    acks: &[Ack],
    members: &[usize],
    mode: AckMode,
    outcomes: &mut [AckOutcome],
) -> Result<(), StorageError> {
    let row: Option<ConsumerRow> = sqlx::query_as(
        "SELECT committed_offset, lease_id, lease_expires_at > now() AS live,
                leased_from, leased_to, batch_retry_count, retry_lease_id
           FROM queen.partition_consumers
          WHERE partition_id = $1 AND consumer_group = $2
            FOR UPDATE",
    )
    .bind(info.id)
    .bind(group)
    .fetch_optional(&mut *conn)
    .await?;
    // A group that never received anything from this partition has nothing to ack.
    let Some(row) = row else { return Ok(()) };
    let (Some(from), Some(to)) = (row.leased_from, row.leased_to) else {
        return Ok(());
    };

    // The messages of the last lease, by transactionId (first occurrence wins). Acks mostly
    // arrive in order, so the segment holding the committed offset is read first, and the
    // whole leased range only when some acked message is not in it.
    let first_unacked = row.committed_offset.clamp(from, (to - 1).max(from));
    let (mut segments, _) =
        read_range(conn, cache, info.id, first_unacked, 1, info.next_offset).await?;
    let wanted: Vec<&str> = members
        .iter()
        .map(|&n| acks[n].transaction_id.as_str())
        .collect();
    if !holds_all(&segments, from, to, &wanted, info.id)? {
        segments = read_range(conn, cache, info.id, from, to - from, info.next_offset)
            .await?
            .0;
    }
    let mut decoded = Vec::with_capacity(segments.len());
    for seg in &segments {
        let frames =
            frames::decode(&seg.frames).map_err(|source| StorageError::CorruptSegment {
                partition: info.id,
                source,
            })?;
        decoded.push((seg.base_offset, frames));
    }
    let mut by_txn: HashMap<&str, (i64, &frames::Frame<'_>)> = HashMap::new();
    for (base, frames) in &decoded {
        for (n, frame) in frames.iter().enumerate() {
            let offset = base + n as i64;
            if offset >= from && offset < to {
                by_txn
                    .entry(frame.transaction_id)
                    .or_insert((offset, frame));
            }
        }
    }

    let live = row.live == Some(true);
    let mut committed = row.committed_offset;
    let mut retry_count = row.batch_retry_count;
    let mut retry_lease = row.retry_lease_id;
    let mut release = false;
    let mut released_by: Option<usize> = None;
    let mut dead = Vec::new();

    let mut located: Vec<(i64, usize)> = Vec::with_capacity(members.len());
    for &n in members {
        let ack = &acks[n];
        if let Some(claimed) = &ack.lease_id {
            let holds = live && row.lease_id.is_some_and(|l| l.to_string() == *claimed);
            if !holds {
                outcomes[n].error = Some(BAD_LEASE.into());
                continue;
            }
        }
        match by_txn.get(ack.transaction_id.as_str()) {
            Some(&(offset, _)) => located.push((offset, n)),
            None => outcomes[n].error = Some(NOT_FOUND.into()),
        }
    }
    // Oldest first, so the committed offset only moves forward.
    located.sort_unstable();

    // Where the cursor stood when the call came: an ack below it changes nothing.
    let below = row.committed_offset;
    // The offset of this call's first nack that asks for a redelivery: the cursor stops there,
    // and nothing at or after it is committed by this call.
    let mut stop: Option<i64> = None;
    for (offset, n) in located {
        let ack = &acks[n];
        let out = &mut outcomes[n];
        out.error = None;
        if offset < below {
            match ack.status {
                AckStatus::Completed => {
                    out.success = true;
                    out.noop = true;
                }
                AckStatus::Unknown => out.success = false,
                _ => {
                    out.success = false;
                    out.error = Some(format!(
                        "already committed: the message (offset {offset}) is below the group's committed offset {below}, a nack can no longer be honoured"
                    ));
                }
            }
            continue;
        }
        if let Some(stop) = stop.filter(|&s| offset >= s) {
            match (ack.status, mode) {
                // Delivered again, as the nack asks (its batch's retry is counted once).
                (AckStatus::Failed | AckStatus::Retry, AckMode::Consume) => out.success = true,
                (AckStatus::Unknown, _) => out.success = false,
                _ => {
                    out.success = false;
                    out.error = Some(format!(
                        "not applied: a nack of an earlier message (offset {stop}) in this call stops the cursor there; this message will be delivered again"
                    ));
                }
            }
            continue;
        }
        out.success = true;
        let dead_letter = match (ack.status, mode) {
            (AckStatus::Completed, _) => {
                committed = committed.max(offset + 1);
                false
            }
            (AckStatus::Retry, AckMode::Consume) => {
                release = true;
                released_by.get_or_insert(n);
                stop = Some(offset);
                false
            }
            (AckStatus::Failed, AckMode::Consume) => {
                if retry_lease.is_some() && retry_lease == row.lease_id {
                    // This batch's failure was already counted.
                    release = true;
                    released_by.get_or_insert(n);
                    stop = Some(offset);
                    false
                } else if retry_count < info.retry_limit {
                    retry_count += 1;
                    retry_lease = row.lease_id;
                    release = true;
                    released_by.get_or_insert(n);
                    stop = Some(offset);
                    false
                } else {
                    true
                }
            }
            (AckStatus::Dlq, _) | (AckStatus::Failed, AckMode::Transaction) => true,
            (AckStatus::Retry | AckStatus::Unknown, _) => {
                out.success = false;
                false
            }
        };
        if dead_letter {
            let (_, frame) = by_txn[ack.transaction_id.as_str()];
            dead.push(DeadLetter {
                partition_id: info.id,
                group: group.to_string(),
                offset,
                message_id: frame.id,
                transaction_id: frame.transaction_id.to_string(),
                trace_id: frame.trace_id.map(str::to_string),
                producer_sub: frame.producer_sub.map(str::to_string),
                payload: frame.payload.to_string(),
                created_at_micros: frame.created_at_micros,
                error: Some(
                    ack.error
                        .clone()
                        .unwrap_or_else(|| "Retries exhausted".to_string()),
                ),
                retry_count,
            });
            out.dlq = true;
            committed = committed.max(offset + 1);
            // A `failed` nack ends the lease even when it dead-letters: a consumer stops
            // handling the rest of its batch after one (the 2.x client does), so the rest is
            // delivered again at once, not at expiry. An explicit `dlq` sets the message aside
            // and the consumer goes on with its batch, as after a completed ack.
            if ack.status == AckStatus::Failed || mode == AckMode::Transaction {
                release = true;
                released_by.get_or_insert(n);
            }
        }
    }
    if committed >= to {
        // The whole leased batch is settled: the lease ends and the batch counter resets.
        release = true;
        retry_count = 0;
        retry_lease = None;
        if released_by.is_none() {
            released_by = members.iter().copied().rfind(|&n| outcomes[n].success);
        }
    }
    if live && release {
        if let Some(n) = released_by {
            outcomes[n].lease_released = true;
        }
    }
    dlq::insert(conn, &dead).await?;
    sqlx::query(
        "UPDATE queen.partition_consumers
            SET committed_offset = $3,
                lease_expires_at = CASE WHEN $4 THEN NULL ELSE lease_expires_at END,
                attention_at = CASE
                    WHEN NOT $4 THEN attention_at
                    WHEN $3 < (SELECT next_offset FROM queen.partitions WHERE id = $1) THEN now()
                    ELSE NULL
                END,
                batch_retry_count = $5,
                retry_lease_id = $6,
                last_consumed_at = CASE WHEN $7 > 0 THEN now() ELSE last_consumed_at END,
                total_consumed = total_consumed + $7
          WHERE partition_id = $1 AND consumer_group = $2",
    )
    .bind(info.id)
    .bind(group)
    .bind(committed)
    .bind(release)
    .bind(retry_count)
    .bind(retry_lease)
    .bind(committed - row.committed_offset)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Whether every transactionId of `wanted` is among the messages of `segments` inside
/// `from .. to`.
fn holds_all(
    segments: &[std::sync::Arc<CachedSegment>],
    from: i64,
    to: i64,
    wanted: &[&str],
    partition_id: i64,
) -> Result<bool, StorageError> {
    let mut present = std::collections::HashSet::new();
    for seg in segments {
        let frames =
            frames::decode(&seg.frames).map_err(|source| StorageError::CorruptSegment {
                partition: partition_id,
                source,
            })?;
        for (n, frame) in frames.iter().enumerate() {
            let offset = seg.base_offset + n as i64;
            if offset >= from && offset < to {
                present.insert(frame.transaction_id.to_string());
            }
        }
    }
    Ok(wanted.iter().all(|t| present.contains(*t)))
}

/// The common ack, decided without PostgreSQL: every ack of the request is `completed`, names
/// the same lease on the same partition and group, and that lease is one this broker handed out
/// — its offsets found by the transaction ids the pop recorded, or else in its segments when
/// they are all still cached. The plan is applied by [`crate::storage::consume::ack_group`],
/// which groups the plans of concurrent requests into one statement and one commit; a plan it
/// could not apply (the lease ran out, the range moved, the offset is already past) sends the
/// request down the general path ([`apply`]), which decides every other case. `None`: not the
/// common case.
///
/// # Errors
///
/// A cached segment that does not decode.
pub fn plan_completed_fast(
    cache: &SegmentCache,
    acks: &[Ack],
) -> Result<Option<FastPlan>, StorageError> {
    let Some(first) = acks.first() else {
        return Ok(None);
    };
    if !acks.iter().all(|a| a.partition == first.partition) {
        return Ok(None);
    }
    let Some(lease) = common_lease(acks) else {
        return Ok(None);
    };
    plan_one(cache, lease, acks.iter())
}

/// One partition's plan of a request, with the positions of its acks in the request.
pub type PartitionPlan = (FastPlan, Vec<usize>);

/// [`plan_completed_fast`] for the acks of a multi-partition lease (one pop claimed several
/// partitions under one lease id, and the consumer acks its batch in one call): one plan per
/// partition, in the order the partitions first appear, each with the positions in `acks` of
/// its acks. `None` unless every partition's acks make a plan (the request then takes the
/// general path whole).
///
/// # Errors
///
/// A cached segment that does not decode.
pub fn plan_completed_fast_by_partition(
    cache: &SegmentCache,
    acks: &[Ack],
) -> Result<Option<Vec<PartitionPlan>>, StorageError> {
    let Some(lease) = common_lease(acks) else {
        return Ok(None);
    };
    let mut by_partition: Vec<(Uuid, Vec<usize>)> = Vec::new();
    for (n, a) in acks.iter().enumerate() {
        match by_partition.iter_mut().find(|(p, _)| *p == a.partition) {
            Some((_, positions)) => positions.push(n),
            None => by_partition.push((a.partition, vec![n])),
        }
    }
    let mut plans = Vec::with_capacity(by_partition.len());
    for (_, positions) in by_partition {
        let Some(plan) = plan_one(cache, lease, positions.iter().map(|&n| &acks[n]))? else {
            return Ok(None);
        };
        plans.push((plan, positions));
    }
    Ok(Some(plans))
}

/// The lease every ack of `acks` names, when all are `completed` acks of one group naming the
/// same lease (the common ack); `None` otherwise.
fn common_lease(acks: &[Ack]) -> Option<Uuid> {
    let first = acks.first()?;
    let same = acks.iter().all(|a| {
        a.status == AckStatus::Completed && a.group == first.group && a.lease_id == first.lease_id
    });
    let lease = first
        .lease_id
        .as_deref()
        .and_then(|l| Uuid::parse_str(l).ok())?;
    same.then_some(lease)
}

/// The plan of `acks` (at least one, all on one partition, all of `lease`).
fn plan_one<'a>(
    cache: &SegmentCache,
    lease: Uuid,
    acks: impl Iterator<Item = &'a Ack> + Clone,
) -> Result<Option<FastPlan>, StorageError> {
    let Some(first) = acks.clone().next() else {
        return Ok(None);
    };
    let Some(range) = cache.leased(lease, first.partition) else {
        return Ok(None);
    };
    let plan = |lowest, end| FastPlan {
        ack: FastAck {
            partition_id: range.partition_id,
            group: first.group.clone(),
            lease,
            from: range.from,
            lowest,
            end,
            to: range.to,
        },
        queue: range.queue.clone(),
        partition: range.partition.clone(),
        batch: range.batch,
    };
    if let Some(txns) = &range.txns {
        // The ids the pop handed out: no segment is read.
        let mut end = range.from;
        let mut lowest = range.to;
        let mut hint = 0;
        for ack in acks.clone() {
            let Some((n, offset)) = txns.find(&ack.transaction_id, hint) else {
                return Ok(None);
            };
            end = end.max(offset + 1);
            lowest = lowest.min(offset);
            hint = n + 1;
        }
        return Ok(Some(plan(lowest, end)));
    }
    let Some(segments) = cache.covering(range.partition_id, range.from, range.to) else {
        return Ok(None);
    };
    let mut by_txn: HashMap<&str, i64> = HashMap::new();
    for seg in &segments {
        let frames =
            frames::decode(&seg.frames).map_err(|source| StorageError::CorruptSegment {
                partition: range.partition_id,
                source,
            })?;
        for (n, frame) in frames.iter().enumerate() {
            let offset = seg.base_offset + n as i64;
            if offset >= range.from && offset < range.to {
                by_txn.entry(frame.transaction_id).or_insert(offset);
            }
        }
    }
    let mut end = range.from;
    let mut lowest = range.to;
    for ack in acks {
        match by_txn.get(ack.transaction_id.as_str()) {
            Some(&offset) => {
                end = end.max(offset + 1);
                lowest = lowest.min(offset);
            }
            None => return Ok(None),
        }
    }
    Ok(Some(plan(lowest, end)))
}

/// A fast ack's plan: the statement's values and what the answer names.
#[derive(Debug, Clone)]
pub struct FastPlan {
    /// What the grouped statement writes.
    pub ack: FastAck,
    /// The queue's name.
    pub queue: std::sync::Arc<str>,
    /// The partition's name.
    pub partition: std::sync::Arc<str>,
    /// The batch of the queue-level pop that made the lease (`None`: a partition pop).
    pub batch: Option<usize>,
}

/// One fast ack as the grouped statement applies it: move the committed offset of
/// (`partition_id`, `group`) to `end`, only if the lease `lease` is still live with the range
/// `from .. to` and the offset is not past `lowest` (no acked message is below the cursor,
/// which the general path answers as a no-op); at the range's end the lease is released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastAck {
    /// Partition database id.
    pub partition_id: i64,
    /// Consumer group.
    pub group: String,
    /// The lease the acks name.
    pub lease: Uuid,
    /// Start of the leased range.
    pub from: i64,
    /// The offset of the first acked message.
    pub lowest: i64,
    /// The new committed offset (one past the last acked message).
    pub end: i64,
    /// End of the leased range (exclusive).
    pub to: i64,
}

/// Fills in the UUID of every ack that named its partition by the 64-bit id: from the cache of
/// ids this broker has handed out, else from PostgreSQL (a connection of `pool` taken only
/// then). An id no partition has keeps the nil UUID, which no partition has either: the ack
/// is answered as for an unknown partition.
///
/// # Errors
///
/// Any database error.
pub async fn resolve_partition_ids(
    pool: &sqlx::PgPool,
    cache: &SegmentCache,
    acks: &mut [Ack],
) -> Result<(), StorageError> {
    let mut missing: Vec<i64> = Vec::new();
    for ack in acks.iter_mut() {
        if let Some(id) = ack.partition_number {
            match cache.partition_uuid(id) {
                Some(uuid) => ack.partition = uuid,
                None => missing.push(id),
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort_unstable();
    missing.dedup();
    let mut conn = pool.acquire().await?;
    let found = crate::storage::push::partitions::uuids_by_id(&mut conn, &missing).await?;
    for (id, uuid) in &found {
        cache.note_partition(*id, *uuid);
    }
    for ack in acks.iter_mut() {
        if let Some(id) = ack.partition_number {
            if let Some((_, uuid)) = found.iter().find(|(i, _)| *i == id) {
                ack.partition = *uuid;
            }
        }
    }
    Ok(())
}
