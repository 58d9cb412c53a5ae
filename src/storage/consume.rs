//! The pop: find a partition with messages for a consumer group, claim it under a lease, and
//! read its next messages by offset range from whole segments.
//!
//! Correctness lives in PostgreSQL, never in broker memory: a claim is one conditional
//! statement on the (partition, group) row (`lease_expires_at` unset or past), so two consumers
//! of a group never hold one partition at once, on one broker or many.
//!
//! A queue-level pop must not scan every partition. It looks in two places, both indexed:
//! - rows of the group whose lease ran out (`lease_expires_at <= now()`; a release sets it to
//!   NULL) or that asked for attention (`attention_at <= now()`: a release that left messages
//!   behind, a delayed message now visible);
//! - partitions written since the group's watermark, in write order
//!   (`partitions (queue_id, last_write_xid, id)`). The watermark only moves past a partition
//!   whose write is older than the scan snapshot's xmin and that was caught up, claimed by this
//!   scan, or leased with nothing beyond its lease; anything written later has a larger id.
//!
//! This module never talks HTTP: it returns segments and offset ranges, and the HTTP layer
//! writes the payloads out verbatim.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use std::sync::Arc;

use crate::storage::ahead::{Ahead, AheadLeases};
use crate::storage::cache::{CachedSegment, LeasedRange, SegmentCache};
use crate::storage::claim_group::{ClaimGroup, ClaimJob};
use crate::storage::conns::LazyConn;
use crate::storage::error::StorageError;
use crate::storage::frames::{self, Frame, FrameError};
use crate::storage::handoff::Handoffs;

/// The consumer-group name meaning "no group" (one shared cursor).
pub const QUEUE_MODE: &str = "__QUEUE_MODE__";

/// Partitions examined per statement of the write-order scan: a pop usually claims one of
/// the first few, and every row read costs a join with the group's state.
const SCAN_CHUNK: i64 = 64;

/// How often a long write-order walk (a new group over a long history) records how far it got.
const WALK_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Concurrent queue-level pops start at different ones of this many oldest candidates.
const SPREAD: usize = 16;

/// Attention rows examined per pop.
const ATTENTION_ROWS: i64 = 64;

/// Where a named group starts on a queue it has never popped from.
#[derive(Clone, Debug, PartialEq)]
pub enum SubscriptionStart {
    /// From the oldest retained message.
    All,
    /// From the first pop's time on.
    New,
    /// From this time on.
    From(DateTime<Utc>),
}

/// One pop call.
#[derive(Clone, Debug)]
pub struct PopRequest<'a> {
    /// Queue name.
    pub queue: &'a str,
    /// Partition name (partition route), or any partition.
    pub partition: Option<&'a str>,
    /// Consumer group ([`QUEUE_MODE`] for none).
    pub group: &'a str,
    /// Most messages returned, across partitions (≥ 1).
    pub batch: usize,
    /// Most partitions claimed (≥ 1).
    pub partitions: usize,
    /// Commit the cursor at delivery instead of leasing.
    pub auto_ack: bool,
    /// First-contact start of a named group.
    pub start: SubscriptionStart,
    /// This broker's id, recorded as the lease owner.
    pub owner: &'a str,
    /// The broker's segment cache.
    pub cache: &'a SegmentCache,
    /// A long-poll's look that may come back empty while messages only the full pop finds
    /// wait (the caller looks in full a moment later): when no hand-off waits, or the
    /// one-statement pop finds nothing, the lists and the full pop are read only if this
    /// broker has not read them for such a look of the group within
    /// [`crate::storage::cache::WOKEN_FULL_POP_EVERY`].
    pub woken: bool,
    /// Partitions this broker's acks released with messages left (tried first).
    pub handoffs: &'a Handoffs,
    /// Where hand-off claims are run, grouped with those of concurrent pops.
    pub claims: &'a ClaimGroup,
    /// Leases claimed ahead for the next pops of a group (taken first).
    pub ahead: &'a AheadLeases,
}

/// Messages handed out from one partition: offsets `first_offset .. first_offset + count`.
#[derive(Debug)]
pub struct Delivery {
    /// Partition database id.
    pub partition_id: i64,
    /// Partition id on the wire.
    pub partition_uuid: Uuid,
    /// Partition name.
    pub partition: String,
    /// Offset of the first message.
    pub first_offset: i64,
    /// Number of messages.
    pub count: usize,
    /// The group's batch retry counter on this partition.
    pub retry_count: i32,
    /// Offsets inside the range whose messages were deleted: not handed out.
    pub deleted: Vec<i64>,
    segments: Vec<Arc<CachedSegment>>,
}

impl Delivery {
    /// When this broker committed the segment holding the first delivered message, if it did
    /// (and still held it): since then that message was visible to consumers.
    pub fn visible_since(&self) -> Option<std::time::Instant> {
        self.segments
            .iter()
            .find(|s| s.base_offset + s.count > self.first_offset)
            .and_then(|s| s.committed_at)
    }

    /// The delivered messages with their offsets, in offset order, borrowing from the
    /// segments.
    ///
    /// # Errors
    ///
    /// [`FrameError`] when a segment does not decode.
    pub fn frames(&self) -> Result<Vec<(i64, Frame<'_>)>, FrameError> {
        let mut out = Vec::with_capacity(self.count);
        let end = self.first_offset + self.count as i64;
        for seg in &self.segments {
            // Only the delivered frames are decoded: those before the range are stepped over,
            // and nothing after it is read.
            let skip = (self.first_offset - seg.base_offset).max(0);
            let decoded = frames::decode_from(&seg.frames, skip as usize)?;
            for (offset, frame) in (seg.base_offset + skip..end).zip(decoded) {
                let frame = frame?;
                if self.deleted.binary_search(&offset).is_err() {
                    out.push((offset, frame));
                }
            }
        }
        Ok(out)
    }
}

/// The result of a pop that found messages.
#[derive(Debug)]
pub struct Popped {
    /// Queue name.
    pub queue: String,
    /// The lease shared by every claimed partition (`None` with autoAck).
    pub lease_id: Option<Uuid>,
    /// One entry per claimed partition, in claim order.
    pub deliveries: Vec<Delivery>,
}

/// The queue options pop needs.
#[derive(Debug, Clone)]
struct QueueInfo {
    id: i64,
    name: String,
    lease_secs: i32,
    delay_secs: i32,
    window_secs: i32,
}

/// A group's subscription on a queue.
#[derive(Debug, Clone)]
struct Subscription {
    from: Option<DateTime<Utc>>,
    scan: (i64, i64),
}

/// A partition as a pop sees it, with the group's state on it.
#[derive(Debug, sqlx::FromRow)]
struct Candidate {
    id: i64,
    uuid: Uuid,
    name: String,
    next_offset: i64,
    last_write_at: Option<DateTime<Utc>>,
    last_write_xid: i64,
    committed: Option<i64>,
    leased: Option<bool>,
    leased_to: Option<i64>,
    db_now: DateTime<Utc>,
    /// The scan snapshot's xmin ([`SCAN_SQL`] only).
    #[sqlx(default)]
    xmin: Option<i64>,
}

enum Class {
    /// Nothing to hand out now, and nothing that needs this partition looked at again until
    /// it is written or its consumer row asks for attention.
    Settled,
    /// Not available now and must be looked at again (held by a lease with messages beyond
    /// it, or inside its window buffer).
    Blocked,
    /// Has messages and no live lease.
    Candidate,
}

enum Take {
    /// Claimed; the delivery was added to the pop's list.
    Taken,
    /// Someone else holds the lease.
    Lost,
    /// Claimed, nothing deliverable, released again.
    Empty,
}

/// Pops per `req`; `None` when nothing is available.
///
/// # Errors
///
/// Any database error, or a segment that does not decode.
pub async fn pop(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
) -> Result<Option<Popped>, StorageError> {
    // The one-statement pop claims only partitions the group already has a row for, and under
    // load it always finds one, so a partition the group never touched would wait for a quiet
    // moment. A few times a second per broker and group the full pop runs instead, looking at
    // the written partitions first and at untouched ones before the others.
    req.cache.note_pop(req.queue);
    // A lease claimed for this group while an ack committed is delivered first: it is held
    // for the next pop, and released again if none takes it.
    if req.partition.is_none() && !req.auto_ack {
        let ahead = req
            .ahead
            .take_or_wait(req.queue, req.group, req.batch.max(1))
            .await;
        if let Some(ahead) = ahead {
            if let Some(popped) = pop_ready(conn, req, Some(ahead)).await? {
                return Ok(Some(popped));
            }
        }
    }
    let written_first = req.partition.is_none() && req.cache.full_scan_due(req.queue, req.group);
    if written_first {
        // The one-statement pop enters the pair when it asks for a hand-off; this one does not.
        req.handoffs.enter(req.queue, req.group);
    }
    if req.partition.is_none() && !written_first {
        // A long-poll's look with nothing handed off: the write or release that rang went to
        // another pop. What only the lists hold (leases that ran out, other brokers' releases,
        // writes whose notice named no id) is looked for at most every
        // `WOKEN_FULL_POP_EVERY` per group, not by every such look.
        // Such a look that got past this reads the full pop too, if the lists find nothing.
        let nothing_handed_off = req.woken && req.handoffs.waiting(req.queue, req.group) == 0;
        if nothing_handed_off && !req.cache.woken_full_pop_due(req.queue, req.group) {
            return Ok(None);
        }
        if let Some(popped) = pop_ready(conn, req, None).await? {
            return Ok(Some(popped));
        }
        if req.woken && !nothing_handed_off && !req.cache.woken_full_pop_due(req.queue, req.group) {
            return Ok(None);
        }
    }
    let conn = conn.get().await?;
    let Some((queue, sub)) = open(conn, req.queue, req.group, &req.start).await? else {
        return Ok(None);
    };
    pop_from(conn, req, &queue, &sub, written_first).await
}

/// Pops from the queues whose namespace and/or task match (either `None` = any), highest
/// priority first; the first queue that yields wins.
///
/// # Errors
///
/// Any database error.
pub async fn pop_matching(
    conn: &mut LazyConn<'_>,
    namespace: Option<&str>,
    task: Option<&str>,
    req: &PopRequest<'_>,
) -> Result<Option<Popped>, StorageError> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT name
           FROM queen.queues
          WHERE ($1::text IS NULL OR namespace = $1)
            AND ($2::text IS NULL OR task = $2)
          ORDER BY priority DESC, name",
    )
    .bind(namespace)
    .bind(task)
    .fetch_all(conn.get().await?)
    .await?;
    for name in names {
        let one = PopRequest {
            queue: &name,
            partition: None,
            ..req.clone()
        };
        if let Some(popped) = pop(conn, &one).await? {
            return Ok(Some(popped));
        }
    }
    Ok(None)
}

async fn pop_from(
    conn: &mut PgConnection,
    req: &PopRequest<'_>,
    queue: &QueueInfo,
    sub: &Subscription,
    written_first: bool,
) -> Result<Option<Popped>, StorageError> {
    let lease_id = Uuid::now_v7();
    let mut pop = Collect {
        req,
        queue,
        sub,
        lease_id,
        remaining: req.batch.max(1),
        slots: req.partitions.max(1),
        deliveries: Vec::new(),
    };
    match req.partition {
        Some(name) => {
            pop.slots = 1;
            let row: Option<Candidate> = sqlx::query_as(&format!(
                "{CANDIDATE_COLUMNS}
                  WHERE p.queue_id = $1 AND p.name = $3"
            ))
            .bind(queue.id)
            .bind(req.group)
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
            if let Some(row) = row {
                if matches!(pop.classify(&row), Class::Candidate) {
                    pop.take(conn, &row).await?;
                }
            }
        }
        None => pop.scan_queue(conn, written_first).await?,
    }
    if pop.deliveries.is_empty() {
        return Ok(None);
    }
    Ok(Some(finish(req, &queue.name, lease_id, pop.deliveries)))
}

/// The answer of a pop that found messages; remembers the leased ranges for the acks.
fn finish(req: &PopRequest<'_>, queue: &str, lease_id: Uuid, deliveries: Vec<Delivery>) -> Popped {
    if !req.auto_ack {
        let queue_name: Arc<str> = Arc::from(queue);
        for d in &deliveries {
            req.cache.remember_lease(
                lease_id,
                d.partition_uuid,
                LeasedRange {
                    partition_id: d.partition_id,
                    from: d.first_offset,
                    to: d.first_offset + d.count as i64,
                    queue: queue_name.clone(),
                    partition: Arc::from(d.partition.as_str()),
                    txns: None,
                    batch: req.partition.is_none().then_some(req.batch.max(1)),
                },
            );
        }
    }
    Popped {
        queue: queue.to_string(),
        lease_id: (!req.auto_ack).then_some(lease_id),
        deliveries,
    }
}

/// Hand-offs a pop tries at most before it reads the one-statement pop's lists (a hand-off
/// goes stale when another pop took the partition first).
const HANDOFF_TRIES: usize = 2;

/// The queue-level pop by [`HANDOFF_SQL`] (a partition this broker released with messages
/// left, when one waits) or [`READY_SQL`], one statement per claimed partition; `None` when it
/// claimed nothing (the caller then runs the full pop). A lease claimed `ahead` is delivered
/// first, as if this pop had claimed it (its lease id is the pop's).
async fn pop_ready(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    ahead: Option<Ahead>,
) -> Result<Option<Popped>, StorageError> {
    let lease_id = ahead.as_ref().map_or_else(Uuid::now_v7, |a| a.lease);
    let mut ahead = ahead.map(|a| (a.partition_id, a.rows));
    // What the one-statement pop is told not to send, read once and only if it runs.
    let mut all_held: Option<HeldRuns> = None;
    let sub = Subscription {
        from: None,
        scan: (0, 0),
    };
    let mut queue: Option<QueueInfo> = None;
    let mut remaining = req.batch.max(1);
    let mut deliveries = Vec::new();
    let mut handoffs_tried = 0;
    // Whether the one-statement pop ran and found nothing: hand-offs are then tried even when
    // it was its turn.
    let mut ready_empty = false;
    while remaining > 0 && deliveries.len() < req.partitions.max(1) {
        let (handoff, rows) = match ahead.take() {
            Some((partition_id, rows)) => (Some(partition_id), rows),
            None => {
                let handoff = match (handoffs_tried < HANDOFF_TRIES, ready_empty) {
                    (false, _) => None,
                    (true, false) => req.handoffs.next(req.queue, req.group),
                    (true, true) => req.handoffs.take(req.queue, req.group),
                };
                if handoff.is_none() && ready_empty {
                    break;
                }
                handoffs_tried += usize::from(handoff.is_some());
                let rows = claim(conn, req, lease_id, remaining, handoff, &mut all_held).await?;
                (handoff, rows)
            }
        };
        let Some(head) = rows.first() else {
            // A hand-off taken meanwhile or with nothing left: the next one, or the lists.
            // The lists empty: a hand-off, if one waits.
            ready_empty |= handoff.is_none();
            continue;
        };
        if handoff.is_none() {
            req.handoffs.forget(req.queue, req.group, head.partition_id);
        }
        let info = queue.get_or_insert_with(|| QueueInfo {
            id: head.queue_id,
            name: req.queue.to_string(),
            lease_secs: head.lease_time,
            delay_secs: 0,
            window_secs: 0,
        });
        let partition_id = head.partition_id;
        let mut claimed = Claimed {
            partition_id,
            uuid: head.uuid,
            name: head.name.clone(),
            db_now: head.db_now,
            committed: head.committed_offset,
            retry_count: head.batch_retry_count,
            next_offset: head.next_offset,
            recorded: true,
            deleted: head.deleted.clone().unwrap_or_default(),
            segments: Vec::with_capacity(rows.len()),
        };
        let mut evicted = false;
        for r in rows {
            let Some(base) = r.base_offset else {
                continue;
            };
            let count = r.msg_count.unwrap_or(0).into();
            match r.frames {
                Some(frames) => {
                    claimed
                        .segments
                        .push(req.cache.insert_read(partition_id, base, count, frames))
                }
                None => match req.cache.get(partition_id, base) {
                    Some(seg) => claimed.segments.push(seg),
                    // Evicted since the statement was sent: the range is read again.
                    None => evicted = true,
                },
            }
        }
        if evicted {
            claimed.segments.clear();
        }
        let mut collect = Collect {
            req,
            queue: info,
            sub: &sub,
            lease_id,
            remaining,
            slots: req.partitions.max(1),
            deliveries: std::mem::take(&mut deliveries),
        };
        let taken = collect.deliver(conn, claimed).await?;
        remaining = collect.remaining;
        deliveries = collect.deliveries;
        if !matches!(taken, Take::Taken) {
            break;
        }
    }
    Ok(match queue {
        Some(q) if !deliveries.is_empty() => Some(finish(req, &q.name, lease_id, deliveries)),
        _ => None,
    })
}

/// One claim of [`pop_ready`]: the hand-off `handoff` (grouped with concurrent pops' claims,
/// or alone when the group's statement failed), or the one-statement pop when none is named.
async fn claim(
    conn: &mut LazyConn<'_>,
    req: &PopRequest<'_>,
    lease_id: Uuid,
    remaining: usize,
    handoff: Option<i64>,
    all_held: &mut Option<HeldRuns>,
) -> Result<Vec<ReadyRow>, StorageError> {
    let Some(partition_id) = handoff else {
        let held =
            all_held.get_or_insert_with(|| req.cache.held_runs(HELD_PARTITIONS).into_iter().into());
        return Ok(ready_statement(READY_SQL, req, lease_id, remaining, held)
            .fetch_all(conn.get().await?)
            .await?);
    };
    // A hand-off names its partition: only that one's held run is sent.
    let held = req.cache.held_run(partition_id);
    let job = ClaimJob {
        queue: req.queue.to_string(),
        group: req.group.to_string(),
        lease: lease_id,
        want: remaining as i64,
        partition_id,
        held: held.map(|(_, from, to)| (from, to)),
    };
    if let Some(rows) = req.claims.claim(job).await {
        return Ok(rows);
    }
    let held = HeldRuns::from(held.into_iter());
    Ok(
        ready_statement(HANDOFF_SQL, req, lease_id, remaining, &held)
            .bind(partition_id)
            .fetch_all(conn.get().await?)
            .await?,
    )
}

/// [`READY_SQL`] or [`HANDOFF_SQL`] with the parameters `$1`..`$8` both take (the hand-off
/// claim binds its partition as `$9` after them).
fn ready_statement<'q>(
    sql: &'q str,
    req: &'q PopRequest<'_>,
    lease_id: Uuid,
    remaining: usize,
    held: &'q HeldRuns,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, ReadyRow, sqlx::postgres::PgArguments> {
    sqlx::query_as(sql)
        .bind(req.queue)
        .bind(req.group)
        .bind(lease_id)
        .bind(req.owner)
        .bind(remaining as i64)
        .bind(&held.pids)
        .bind(&held.from)
        .bind(&held.to)
}

/// The columns of [`Candidate`], joined for the group in `$2`; callers add WHERE/ORDER.
const CANDIDATE_COLUMNS: &str =
    "SELECT p.id, p.uuid, p.name, p.next_offset, p.last_write_at, p.last_write_xid,
        c.committed, c.leased, c.leased_to,
        now() AS db_now
   FROM queen.partitions p
   LEFT JOIN LATERAL (SELECT c.committed_offset AS committed,
                             c.lease_expires_at > now() AS leased,
                             c.leased_to
                        FROM queen.partition_consumers c
                       WHERE c.partition_id = p.id AND c.consumer_group = $2
                       LIMIT 1) c ON true";

/// The write-order scan of the queue-level pop: partitions of queue `$1` written at or after
/// the watermark `($3, $4)`, oldest write first, with the group `$2`'s state, at most `$5`.
/// Served by the index `partitions_write_order`; public so tests can EXPLAIN it.
pub const SCAN_SQL: &str =
    "SELECT p.id, p.uuid, p.name, p.next_offset, p.last_write_at, p.last_write_xid,
        c.committed, c.leased, c.leased_to,
        now() AS db_now,
        (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8) AS xmin
   FROM queen.partitions p
   LEFT JOIN LATERAL (SELECT c.committed_offset AS committed,
                             c.lease_expires_at > now() AS leased,
                             c.leased_to
                        FROM queen.partition_consumers c
                       WHERE c.partition_id = p.id AND c.consumer_group = $2
                       LIMIT 1) c ON true
  WHERE p.queue_id = $1
    AND (p.last_write_xid, p.id) >= ($3, $4)
  ORDER BY p.last_write_xid, p.id
  LIMIT $5";

/// The claim of one partition for a group, in one statement: lock the (partition, group) row
/// unless another claim is locking it right now (`SKIP LOCKED`: move on rather than wait),
/// take the lease if it is free or ran out and there is something past the committed offset
/// (the scan's view may be stale: a claim of a caught-up partition would only be released
/// again), record the range `committed .. committed + $6`
/// (capped at the partition's end) as leased, and return the segments covering that range —
/// without their frames for the bases in `$7`, which the broker already holds. No row: not
/// claimed. One row per covering segment (one row with NULL segment columns when none).
const CLAIM_SQL: &str = "
WITH target AS (
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
     WHERE c.partition_id = $1
       AND c.consumer_group = $2
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < (SELECT next_offset FROM queen.partitions WHERE id = $1)
       FOR UPDATE OF c SKIP LOCKED
), claim AS (
    UPDATE queen.partition_consumers c
       SET lease_id = $3,
           lease_owner = $4,
           lease_acquired_at = now(),
           lease_expires_at = now() + $5 * interval '1 second',
           attention_at = NULL,
           leased_from = c.committed_offset,
           leased_to = GREATEST(c.committed_offset,
                                LEAST(c.committed_offset + $6, p.next_offset))
      FROM target t, queen.partitions p
     WHERE c.partition_id = t.partition_id
       AND c.consumer_group = t.consumer_group
       AND p.id = $1
 RETURNING c.committed_offset, c.batch_retry_count, p.next_offset, c.leased_to
)
SELECT claim.committed_offset, claim.batch_retry_count, claim.next_offset,
       (SELECT array_agg(d.msg_offset ORDER BY d.msg_offset)
          FROM queen.deleted_messages d
         WHERE d.partition_id = $1
           AND d.msg_offset >= claim.committed_offset
           AND d.msg_offset < claim.leased_to) AS deleted,
       s.base_offset, s.msg_count,
       CASE WHEN s.base_offset = ANY($7) THEN NULL ELSE s.frames END AS frames
  FROM claim
  LEFT JOIN LATERAL (
        SELECT sg.base_offset, sg.msg_count, sg.frames
          FROM queen.segments sg
         WHERE sg.partition_id = $1
           AND sg.base_offset < claim.leased_to
           AND sg.base_offset >= COALESCE((SELECT max(x.base_offset)
                                             FROM queen.segments x
                                            WHERE x.partition_id = $1
                                              AND x.base_offset <= claim.committed_offset),
                                          claim.committed_offset)
         ORDER BY sg.base_offset
       ) s ON true
 ORDER BY s.base_offset";

/// One row of [`CLAIM_SQL`].
#[derive(sqlx::FromRow)]
struct ClaimRow {
    committed_offset: i64,
    batch_retry_count: i32,
    next_offset: i64,
    deleted: Option<Vec<i64>>,
    base_offset: Option<i64>,
    msg_count: Option<i32>,
    frames: Option<Vec<u8>>,
}

/// Held runs as the one-statement pops take them: `$6` partition ids, `$7` first and `$8`
/// last bases ([`SegmentCache::held_runs`]).
#[derive(Default)]
struct HeldRuns {
    pids: Vec<i64>,
    from: Vec<i64>,
    to: Vec<i64>,
}

impl<I: Iterator<Item = (i64, i64, i64)>> From<I> for HeldRuns {
    fn from(runs: I) -> Self {
        let mut held = Self::default();
        for (pid, from, to) in runs {
            held.pids.push(pid);
            held.from.push(from);
            held.to.push(to);
        }
        held
    }
}

/// Partitions whose cached segments are named to [`READY_SQL`] as not to be sent (those
/// given segments most recently: what live consumers read).
const HELD_PARTITIONS: usize = 1024;

/// The CTE `q` both one-statement pops start with: the queue named `$1` with the group `$2`'s
/// subscription, when this statement serves it (no window buffer, no delayed processing).
macro_rules! one_statement_queue {
    () => {
        "
WITH q AS (
    SELECT q.id, q.lease_time, s.scan_xid, s.scan_pid
      FROM queen.queues q
      JOIN queen.consumer_subscriptions s
        ON s.queue_id = q.id AND s.consumer_group = $2
     WHERE q.name = $1
       AND q.window_buffer = 0
       AND q.delayed_processing = 0
)"
    };
}

/// The offsets of deleted messages in the range `claim` (a CTE with `partition_id`,
/// `committed_offset` and `leased_to`) just leased, as the select-list item `deleted`.
macro_rules! claimed_deleted {
    () => {
        "
       (SELECT array_agg(d.msg_offset ORDER BY d.msg_offset)
          FROM queen.deleted_messages d
         WHERE d.partition_id = claim.partition_id
           AND d.msg_offset >= claim.committed_offset
           AND d.msg_offset < claim.leased_to) AS deleted,"
    };
}
pub(crate) use claimed_deleted;

/// The segments covering the range `claim` just leased (from the one holding its committed
/// offset), in offset order, as `s` joined to each claimed row (NULL columns when none).
macro_rules! claimed_segments {
    () => {
        "
  LEFT JOIN LATERAL (
        SELECT sg.base_offset, sg.msg_count, sg.frames
          FROM queen.segments sg
         WHERE sg.partition_id = claim.partition_id
           AND sg.base_offset < claim.leased_to
           AND sg.base_offset >= COALESCE((SELECT max(x.base_offset)
                                             FROM queen.segments x
                                            WHERE x.partition_id = claim.partition_id
                                              AND x.base_offset <= claim.committed_offset),
                                          claim.committed_offset)
         ORDER BY sg.base_offset
       ) s ON true"
    };
}
pub(crate) use claimed_segments;

/// The end both one-statement pops share: claim the `target` row (lease `$3` for owner `$4`,
/// range `committed .. committed + $5` capped at the partition's end) and return the covering
/// segments, without the frames of those in the held runs `$6`/`$7`/`$8`.
macro_rules! one_statement_claim {
    () => {
        concat!(
            "),
claim AS (
    UPDATE queen.partition_consumers c
       SET lease_id = $3,
           lease_owner = $4,
           lease_acquired_at = now(),
           lease_expires_at = now() + (SELECT CASE WHEN q.lease_time > 0 THEN q.lease_time
                                                   ELSE 60 END
                                         FROM q) * interval '1 second',
           attention_at = NULL,
           leased_from = c.committed_offset,
           leased_to = GREATEST(c.committed_offset,
                                LEAST(c.committed_offset + $5, p.next_offset))
      FROM target t, queen.partitions p
     WHERE c.partition_id = t.partition_id
       AND c.consumer_group = t.consumer_group
       AND p.id = t.partition_id
 RETURNING c.partition_id, p.uuid, p.name, c.committed_offset, c.batch_retry_count,
           p.next_offset, c.leased_to
)
SELECT q.id AS queue_id, q.lease_time, now() AS db_now,
       claim.partition_id, claim.uuid, claim.name, claim.committed_offset,
       claim.batch_retry_count, claim.next_offset,
",
            claimed_deleted!(),
            "
       s.base_offset, s.msg_count,
       CASE WHEN s.base_offset
                 BETWEEN ($7::int8[])[array_position($6::int8[], claim.partition_id)]
                     AND ($8::int8[])[array_position($6::int8[], claim.partition_id)]
            THEN NULL ELSE s.frames END AS frames
  FROM claim
 CROSS JOIN q",
            claimed_segments!(),
            "
 ORDER BY s.base_offset"
        )
    };
}

/// The queue-level pop in one statement, for the common case: claim one partition of the queue
/// that the group has a row for, with messages past its committed offset and no live lease,
/// taken from three lists in turn: leases that ran out (oldest first), rows released with
/// messages left (in release order), partitions written since the group's watermark (of the 16
/// written longest ago, the one claimed least recently). Each list is read from its index only
/// as far as its first claimable row, skipping rows another claim is locking (`SKIP LOCKED`),
/// so a pop reads a handful of rows however many partitions wait. It records the leased range
/// and returns the covering segments with the queue's options, without the frames of the
/// segments the broker holds: for each partition in `$6`, those with bases from `$7` to `$8`
/// (the run of consecutive segments it holds, [`SegmentCache::held_runs`]). No row: nothing
/// claimable among those lists, or a case this statement leaves to the full pop (no
/// subscription yet, a window buffer, delayed processing); the caller then runs the full pop,
/// which also settles and rescans.
pub const READY_SQL: &str = concat!(
    one_statement_queue!(),
    ",
expired AS (
    -- Leases that ran out, oldest first: walked in index order (the queue id is a parameter
    -- of the scan, not a join, so the index gives the order), the first row not locked by a
    -- concurrent pop that still has messages wins; nothing after it is read.
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.queue_id = (SELECT id FROM q)
       AND c.consumer_group = $2
       AND c.lease_expires_at <= now()
       AND c.committed_offset < p.next_offset
     ORDER BY c.lease_expires_at
     LIMIT 1
       FOR UPDATE OF c SKIP LOCKED
), released AS (
    -- Rows released with messages left behind, in the order they were released (a queue of
    -- partitions waiting for a consumer), read the same way.
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.queue_id = (SELECT id FROM q)
       AND c.consumer_group = $2
       AND c.attention_at <= now()
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < p.next_offset
     ORDER BY c.attention_at
     LIMIT 1
       FOR UPDATE OF c SKIP LOCKED
), recent AS MATERIALIZED (
    -- The 16 partitions written longest ago since the watermark, read from the write-order
    -- index once (materialized: never re-read per row of a join, whatever the planner thinks
    -- of tables it has not analyzed yet).
    SELECT w.id, w.next_offset
      FROM queen.partitions w
     WHERE w.queue_id = (SELECT id FROM q)
       AND (w.last_write_xid, w.id) >= ((SELECT scan_xid FROM q), (SELECT scan_pid FROM q))
     ORDER BY w.last_write_xid, w.id
     LIMIT 16
), written AS (
    -- Of those, the one claimed least recently (a partition written all the time is always
    -- among the newest writes, so the write order alone would keep it waiting); the group's
    -- rows are probed by primary key, once.
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
     WHERE c.partition_id = ANY (ARRAY(SELECT r.id FROM recent r))
       AND c.consumer_group = $2
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < (SELECT r.next_offset FROM recent r WHERE r.id = c.partition_id)
     ORDER BY c.lease_acquired_at NULLS FIRST
     LIMIT 1
       FOR UPDATE OF c SKIP LOCKED
), target AS (
    -- The three lists in turn: a later one is read only when the earlier ones found nothing.
    SELECT * FROM expired
    UNION ALL
    SELECT * FROM released
    UNION ALL
    SELECT * FROM written
     LIMIT 1
",
    one_statement_claim!()
);

/// The hand-off claim ([`crate::storage::handoff`]): the one-statement pop's claim of a
/// partition this broker released with messages left behind, named by `$9` instead of
/// searched for in the three lists. It claims nothing when the lease is taken (or being
/// claimed right now), nothing waits past the committed offset, the partition is not of the
/// queue `$1`, or the queue is one the one-statement pop leaves to the full pop. Same
/// parameters `$1`..`$8` and rows as [`READY_SQL`].
pub const HANDOFF_SQL: &str = concat!(
    one_statement_queue!(),
    ",
target AS (
    SELECT c.partition_id, c.consumer_group
      FROM queen.partition_consumers c
      JOIN queen.partitions p ON p.id = c.partition_id
     WHERE c.partition_id = $9
       AND c.consumer_group = $2
       AND c.queue_id = (SELECT id FROM q)
       AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())
       AND c.committed_offset < p.next_offset
       FOR UPDATE OF c SKIP LOCKED
",
    one_statement_claim!()
);

/// One row of [`READY_SQL`] and [`HANDOFF_SQL`] (and of the grouped hand-off claim,
/// [`crate::storage::claim_group`]).
#[derive(sqlx::FromRow)]
pub struct ReadyRow {
    queue_id: i64,
    lease_time: i32,
    db_now: DateTime<Utc>,
    partition_id: i64,
    uuid: Uuid,
    name: String,
    committed_offset: i64,
    batch_retry_count: i32,
    next_offset: i64,
    deleted: Option<Vec<i64>>,
    base_offset: Option<i64>,
    msg_count: Option<i32>,
    frames: Option<Vec<u8>>,
}

/// A partition just claimed, with the segments read for it.
struct Claimed {
    partition_id: i64,
    uuid: Uuid,
    name: String,
    db_now: DateTime<Utc>,
    committed: i64,
    retry_count: i32,
    next_offset: i64,
    /// Whether the claim recorded the range `committed ..` as leased (a first-contact
    /// insert records none).
    recorded: bool,
    /// Offsets of deleted messages in the claimed range, ascending.
    deleted: Vec<i64>,
    segments: Vec<Arc<CachedSegment>>,
}

struct Collect<'r, 'a> {
    req: &'r PopRequest<'a>,
    queue: &'r QueueInfo,
    sub: &'r Subscription,
    lease_id: Uuid,
    remaining: usize,
    slots: usize,
    deliveries: Vec<Delivery>,
}

impl Collect<'_, '_> {
    fn done(&self) -> bool {
        self.remaining == 0 || self.deliveries.len() >= self.slots
    }

    fn classify(&self, row: &Candidate) -> Class {
        let start = match row.committed {
            Some(c) => c,
            None => {
                // A partition the group never touched, written only before its subscription.
                if let (Some(from), Some(written)) = (self.sub.from, row.last_write_at) {
                    if written < from {
                        return Class::Settled;
                    }
                }
                0
            }
        };
        if start >= row.next_offset {
            return Class::Settled;
        }
        if row.leased == Some(true) {
            // A release computes its follow-up from what it sees; messages that arrived
            // beyond the lease may be invisible to it, so this partition must be seen again.
            return match row.leased_to {
                Some(to) if row.next_offset <= to => Class::Settled,
                _ => Class::Blocked,
            };
        }
        if self.queue.window_secs > 0 {
            if let Some(written) = row.last_write_at {
                if written + chrono::Duration::seconds(self.queue.window_secs.into()) > row.db_now {
                    return Class::Blocked;
                }
            }
        }
        Class::Candidate
    }

    /// Attention rows first, then the write-order scan from the watermark; with
    /// `written_first`, the other way round, and partitions the group never touched before the
    /// others (see [`pop`]).
    async fn scan_queue(
        &mut self,
        conn: &mut PgConnection,
        written_first: bool,
    ) -> Result<(), StorageError> {
        if written_first {
            self.scan_written(conn, true).await?;
            if !self.done() {
                self.scan_attention(conn).await?;
            }
        } else {
            self.scan_attention(conn).await?;
            if !self.done() {
                self.scan_written(conn, false).await?;
            }
        }
        Ok(())
    }

    /// The rows asking for attention: ran-out leases and releases that left messages.
    async fn scan_attention(&mut self, conn: &mut PgConnection) -> Result<(), StorageError> {
        let rows: Vec<Candidate> = sqlx::query_as(&format!(
            "{CANDIDATE_COLUMNS}
              WHERE p.id IN ((SELECT a.partition_id
                                FROM queen.partition_consumers a
                               WHERE a.queue_id = $1
                                 AND a.consumer_group = $2
                                 AND a.lease_expires_at <= now()
                               ORDER BY a.lease_expires_at
                               LIMIT $3)
                             UNION ALL
                             (SELECT a.partition_id
                                FROM queen.partition_consumers a
                               WHERE a.queue_id = $1
                                 AND a.consumer_group = $2
                                 AND a.attention_at <= now()
                               ORDER BY a.attention_at
                               LIMIT $3))"
        ))
        .bind(self.queue.id)
        .bind(self.req.group)
        .bind(ATTENTION_ROWS)
        .fetch_all(&mut *conn)
        .await?;
        // Concurrent pops of this broker start at different rows here too (see the scan).
        let slot = self.req.cache.pop_slot(self.queue.id, self.req.group);
        let start = slot.index() % rows.len().max(1);
        for row in rows[start..].iter().chain(&rows[..start]) {
            if self.done() {
                return Ok(());
            }
            match self.classify(row) {
                Class::Settled => clear_attention(conn, row.id, self.req.group).await?,
                Class::Blocked => {}
                Class::Candidate => {
                    self.take(conn, row).await?;
                }
            }
        }

        Ok(())
    }

    /// The write-order scan from the watermark, which also moves the watermark; with
    /// `untouched_first`, the first chunk's partitions the group has no row for are tried
    /// before the others.
    async fn scan_written(
        &mut self,
        conn: &mut PgConnection,
        untouched_first: bool,
    ) -> Result<(), StorageError> {
        let slot = self.req.cache.pop_slot(self.queue.id, self.req.group);
        let mut cursor = self.sub.scan;
        // Where the watermark stands (this pop may move it on the way).
        let mut floor = self.sub.scan;
        let mut walking = std::time::Instant::now();
        let mut first_unpassed: Option<(i64, i64)> = None;
        let mut last_seen: Option<(i64, i64)> = None;
        // The oldest xmin of the chunks' snapshots (they only grow).
        let mut xmin: Option<i64> = None;
        let mut first_chunk = true;
        let mut joined = false;
        while !self.done() {
            let rows: Vec<Candidate> = sqlx::query_as(SCAN_SQL)
                .bind(self.queue.id)
                .bind(self.req.group)
                .bind(cursor.0)
                .bind(cursor.1)
                .bind(SCAN_CHUNK)
                .fetch_all(&mut *conn)
                .await?;
            let full = rows.len() as i64 == SCAN_CHUNK;
            if let Some(x) = rows.iter().find_map(|r| r.xmin) {
                xmin = Some(xmin.map_or(x, |m: i64| m.min(x)));
            }
            // Concurrent pops read the same oldest-first list: the k-th pop running on this
            // broker starts at the k-th candidate, so they do not all try to claim the same
            // partition; a pop alone takes the oldest.
            let start = if first_chunk {
                slot.index() % rows.len().clamp(1, SPREAD)
            } else {
                0
            };
            // Per row: None = not looked at (this pop was done first), else whether the
            // watermark may pass it.
            let mut passed: Vec<Option<bool>> = vec![None; rows.len()];
            let mut order: Vec<usize> = (start..rows.len()).chain(0..start).collect();
            if untouched_first && first_chunk {
                order.sort_by_key(|&n| rows[n].committed.is_some());
            }
            if !joined && rows.iter().any(|r| r.committed.is_none()) {
                // Partitions the group never touched: give the group a row on each of them
                // at once, so the one-statement pop finds them (it claims only rows that
                // exist) instead of one full pop per partition, a few of which a broker runs
                // per second.
                join_untouched(conn, self.queue.id, self.req.group, cursor, self.sub.from).await?;
                joined = true;
            }
            first_chunk = false;
            for n in order {
                if self.done() {
                    break;
                }
                let row = &rows[n];
                let gone_past = match self.classify(row) {
                    Class::Settled => true,
                    Class::Blocked => false,
                    Class::Candidate => !matches!(self.take(conn, row).await?, Take::Lost),
                };
                // A write at or above the snapshot's xmin may have a concurrent, still
                // invisible sibling with a smaller id: never move the watermark past it.
                let settled_for_good = row.xmin.is_some_and(|xmin| row.last_write_xid < xmin);
                passed[n] = Some(gone_past && settled_for_good);
            }
            for (row, passed) in rows.iter().zip(&passed) {
                let key = (row.last_write_xid, row.id);
                if *passed != Some(true) && first_unpassed.is_none() {
                    first_unpassed = Some(key);
                }
                if passed.is_some() {
                    last_seen = Some(key);
                }
            }
            let all_seen = passed.iter().all(Option::is_some);
            match last_seen {
                Some((xid, id)) if full && all_seen => cursor = (xid, id + 1),
                _ => break,
            }
            // A long walk (a new group over a long history) records its progress as it goes:
            // a pop that runs out of time must not leave the next one to start over.
            if first_unpassed.is_none() && walking.elapsed() >= WALK_PROGRESS_EVERY {
                self.advance_watermark(conn, cursor, xmin, &mut floor, true)
                    .await?;
                walking = std::time::Instant::now();
            }
        }
        let watermark = first_unpassed.or(last_seen.map(|(xid, id)| (xid, id + 1)));
        if let Some(w) = watermark {
            self.advance_watermark(conn, w, xmin, &mut floor, false)
                .await?;
        }
        Ok(())
    }

    /// Moves the group's scan watermark up to `w`, never past `(xmin, 0)`: a transaction that
    /// was still running when the scan looked has an id at or above the snapshot's xmin and
    /// may yet commit a write the scan could not see, and the first row the scan could not
    /// pass may lie far above such a write. At most once per [`crate::storage::cache::
    /// WATERMARK_EVERY`] per broker and group, unless `progress` (a long walk recording how
    /// far it got, every [`WALK_PROGRESS_EVERY`]).
    async fn advance_watermark(
        &self,
        conn: &mut PgConnection,
        w: (i64, i64),
        xmin: Option<i64>,
        floor: &mut (i64, i64),
        progress: bool,
    ) -> Result<(), StorageError> {
        let Some(xmin) = xmin else {
            return Ok(());
        };
        let w = w.min((xmin, 0));
        if w <= *floor {
            return Ok(());
        }
        if progress || self.req.cache.watermark_due(self.queue.id, self.req.group) {
            // Every pop of the group would move this one row: a pop that finds it being
            // moved leaves it to that one (the watermark only saves scanning), and each broker
            // moves it at most every few milliseconds.
            sqlx::query(
                "UPDATE queen.consumer_subscriptions
                    SET scan_xid = $3, scan_pid = $4
                  WHERE (consumer_group, queue_id) IN (SELECT s.consumer_group, s.queue_id
                                                         FROM queen.consumer_subscriptions s
                                                        WHERE s.queue_id = $1
                                                          AND s.consumer_group = $2
                                                          AND (s.scan_xid, s.scan_pid) < ($3, $4)
                                                          FOR UPDATE SKIP LOCKED)",
            )
            .bind(self.queue.id)
            .bind(self.req.group)
            .bind(w.0)
            .bind(w.1)
            .execute(&mut *conn)
            .await?;
            *floor = w;
        }
        Ok(())
    }

    /// Claims `row` for the group, reads up to `remaining` messages, and keeps the lease only
    /// if there are any.
    async fn take(
        &mut self,
        conn: &mut PgConnection,
        row: &Candidate,
    ) -> Result<Take, StorageError> {
        let group = self.req.group;
        let lease_secs = if self.queue.lease_secs > 0 {
            self.queue.lease_secs
        } else {
            60
        };
        // Segments this broker holds: the claim statement does not send their frames again.
        let held = self
            .req
            .cache
            .from_offset(row.id, row.committed.unwrap_or(0));
        let held_bases: Vec<i64> = held.iter().map(|s| s.base_offset).collect();
        // One statement: claim the lease (skipping a row another claim is locking), record the
        // leased range as if every message in it were deliverable, and read the segments that
        // cover it. A range that turns out shorter (delay, retention) is corrected below.
        let rows: Vec<ClaimRow> = sqlx::query_as(CLAIM_SQL)
            .bind(row.id)
            .bind(group)
            .bind(self.lease_id)
            .bind(self.req.owner)
            .bind(lease_secs)
            .bind(self.remaining as i64)
            .bind(&held_bases)
            .fetch_all(&mut *conn)
            .await?;
        let claimed = !rows.is_empty();
        let (committed, retry_count, next_offset, segments, deleted) = match rows.first() {
            Some(first) => {
                let head = (
                    first.committed_offset,
                    first.batch_retry_count,
                    first.next_offset,
                );
                let deleted = first.deleted.clone().unwrap_or_default();
                let mut segments = Vec::with_capacity(rows.len());
                for r in rows {
                    if let Some(base) = r.base_offset {
                        let count = r.msg_count.unwrap_or(0).into();
                        segments.push(sent_or_held(
                            self.req.cache,
                            &held,
                            row.id,
                            base,
                            count,
                            r.frames,
                        )?);
                    }
                }
                (head.0, head.1, head.2, segments, deleted)
            }
            // The group already had a row here when the scan read it: the lease is held by
            // someone else (or being claimed right now).
            None if row.committed.is_some() => return Ok(Take::Lost),
            // First contact of the group with this partition (or the lease is held: then the
            // insert conflicts and returns nothing).
            None => {
                let inserted: Option<(i64, i32, i64)> = sqlx::query_as(&format!(
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
                .bind(row.id)
                .bind(group)
                .bind(self.lease_id)
                .bind(self.req.owner)
                .bind(lease_secs)
                .bind(self.sub.from)
                .fetch_optional(&mut *conn)
                .await?;
                let Some((committed, retry_count, next_offset)) = inserted else {
                    return Ok(Take::Lost);
                };
                let deleted: Vec<i64> = sqlx::query_scalar(
                    "SELECT msg_offset FROM queen.deleted_messages
                      WHERE partition_id = $1 AND msg_offset >= $2 AND msg_offset < $3
                      ORDER BY msg_offset",
                )
                .bind(row.id)
                .bind(committed)
                .bind(next_offset)
                .fetch_all(&mut *conn)
                .await?;
                (committed, retry_count, next_offset, Vec::new(), deleted)
            }
        };
        self.deliver(
            &mut LazyConn::Held(conn),
            Claimed {
                partition_id: row.id,
                uuid: row.uuid,
                name: row.name.clone(),
                db_now: row.db_now,
                committed,
                retry_count,
                next_offset,
                recorded: claimed,
                deleted,
                segments,
            },
        )
        .await
    }

    /// Hands out what a claim found: counts the deliverable messages (reading the segments
    /// when the claim returned none), releases an empty claim, and records the delivery.
    async fn deliver(
        &mut self,
        conn: &mut LazyConn<'_>,
        claim: Claimed,
    ) -> Result<Take, StorageError> {
        let Claimed {
            partition_id,
            uuid,
            name,
            db_now,
            committed,
            retry_count,
            next_offset,
            recorded,
            deleted,
            mut segments,
        } = claim;

        let want = (self.remaining as i64).min(next_offset - committed).max(0);
        // What the claim recorded as leased (the insert records no range).
        let recorded = recorded.then_some((committed, committed + want));
        let mut first = segments
            .first()
            .map_or(committed, |s| committed.max(s.base_offset));
        if want > 0 && segments.is_empty() {
            // First contact, or retention removed the whole range: read what is there.
            (segments, first) = read_range(
                conn.get().await?,
                self.req.cache,
                partition_id,
                committed,
                want,
                next_offset,
            )
            .await?;
        }
        // Count what is deliverable: consecutive offsets from `first`, stopping at the first
        // message still inside its delay.
        let mut count = 0usize;
        // The messages deleted one by one inside what is counted: a run of them at the start
        // or the end is cut off the range, one in the middle is left out of the answer.
        let mut shown: Option<(i64, i64)> = None;
        let mut visible_at: Option<DateTime<Utc>> = None;
        let delay_micros = i64::from(self.queue.delay_secs) * 1_000_000;
        let now_micros = db_now.timestamp_micros();
        let corrupt = |source| StorageError::CorruptSegment {
            partition: partition_id,
            source,
        };
        'segments: for seg in &segments {
            // Counting needs the frames only to read their times (a delayed queue); the
            // answer decodes the delivered ones (`Delivery::frames`).
            let skip = (first - seg.base_offset).max(0);
            let mut times = if delay_micros > 0 {
                Some(frames::decode_from(&seg.frames, skip as usize).map_err(corrupt)?)
            } else {
                None
            };
            for offset in seg.base_offset + skip..seg.base_offset + seg.count {
                if count as i64 >= want {
                    break 'segments;
                }
                if let Some(times) = times.as_mut() {
                    let Some(frame) = times.next().transpose().map_err(corrupt)? else {
                        break;
                    };
                    if frame.created_at_micros + delay_micros > now_micros {
                        visible_at =
                            DateTime::from_timestamp_micros(frame.created_at_micros + delay_micros);
                        break 'segments;
                    }
                }
                count += 1;
                if deleted.binary_search(&offset).is_err() {
                    shown = Some(shown.map_or((offset, offset), |(a, _)| (a, offset)));
                }
            }
        }
        if count > 0 && shown.is_none() {
            // Every counted message was deleted: the group moves past them (nobody may ack a
            // message it was never handed), and the pop goes on elsewhere.
            let end = first + count as i64;
            self.release_empty(conn.get().await?, partition_id, None, end)
                .await?;
            return Ok(Take::Empty);
        }
        if let Some((a, b)) = shown {
            count = (b + 1 - a) as usize;
            first = a;
        }

        if count == 0 {
            self.release_empty(conn.get().await?, partition_id, visible_at, committed)
                .await?;
            return Ok(Take::Empty);
        }

        let end = first + count as i64;
        if self.req.auto_ack || recorded != Some((first, end)) {
            self.settle_range(conn.get().await?, partition_id, first, end)
                .await?;
        }

        self.remaining -= count;
        self.deliveries.push(Delivery {
            partition_id,
            partition_uuid: uuid,
            partition: name,
            first_offset: first,
            count,
            retry_count,
            deleted: deleted
                .into_iter()
                .filter(|o| *o >= first && *o < end)
                .collect(),
            segments,
        });
        Ok(Take::Taken)
    }

    /// Ends a claim that hands nothing out. `skip_to` moves the cursor (a range of deleted
    /// messages: nobody may ack what was never handed out); then the row asks for attention
    /// at `visible_at` (a delayed message), or at once after a skip, or in a second when
    /// messages are left (retention or a delay being decided elsewhere), else not at all.
    async fn release_empty(
        &self,
        conn: &mut PgConnection,
        partition_id: i64,
        visible_at: Option<DateTime<Utc>>,
        skip_to: i64,
    ) -> Result<(), StorageError> {
        sqlx::query(
            "UPDATE queen.partition_consumers
                SET committed_offset = GREATEST(committed_offset, $5),
                    lease_expires_at = NULL,
                    attention_at = CASE
                        WHEN $4::timestamptz IS NOT NULL THEN $4
                        WHEN GREATEST(committed_offset, $5) < (SELECT next_offset
                                                                 FROM queen.partitions
                                                                WHERE id = $1)
                            THEN CASE WHEN $5 > committed_offset THEN now()
                                      ELSE now() + interval '1 second' END
                        ELSE NULL
                    END
              WHERE partition_id = $1 AND consumer_group = $2 AND lease_id = $3",
        )
        .bind(partition_id)
        .bind(self.req.group)
        .bind(self.lease_id)
        .bind(visible_at)
        .bind(skip_to)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Records the range actually handed out (or, with autoAck, commits it), when it is not
    /// what the claim recorded.
    async fn settle_range(
        &self,
        conn: &mut PgConnection,
        partition_id: i64,
        first: i64,
        end: i64,
    ) -> Result<(), StorageError> {
        if self.req.auto_ack {
            sqlx::query(
                "UPDATE queen.partition_consumers
                    SET committed_offset = GREATEST(committed_offset, $5),
                        leased_from = $4,
                        leased_to = $5,
                        lease_expires_at = NULL,
                        batch_retry_count = 0,
                        retry_lease_id = NULL,
                        last_consumed_at = now(),
                        total_consumed = total_consumed + ($5 - $4),
                        attention_at = CASE
                            WHEN $5 < (SELECT next_offset FROM queen.partitions WHERE id = $1)
                                THEN now()
                            ELSE NULL
                        END
                  WHERE partition_id = $1 AND consumer_group = $2 AND lease_id = $3",
            )
        } else {
            sqlx::query(
                "UPDATE queen.partition_consumers
                    SET leased_from = $4,
                        leased_to = $5
                  WHERE partition_id = $1 AND consumer_group = $2 AND lease_id = $3",
            )
        }
        .bind(partition_id)
        .bind(self.req.group)
        .bind(self.lease_id)
        .bind(first)
        .bind(end)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// Untouched partitions given a row per statement at most (oldest writes first).
const JOIN_ROWS: i64 = 1024;

/// Gives the group a row on the partitions written at or after `from_write` (a point of the
/// write order) that it has never touched and that hold messages for it ([`JOIN_ROWS`] at
/// most, oldest writes first): no lease, the committed offset where the group starts on that
/// partition (as a first claim would set it, from the subscription start `since`), and a
/// request for attention, which the one-statement pop serves in request order. A partition
/// with nothing for the group gets no row, as before: its first claim makes one. Rows are
/// inserted in partition id order, so concurrent calls never wait on each other in a cycle; a
/// row another pop created meanwhile is left as it is.
async fn join_untouched(
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
async fn clear_attention(
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
fn sent_or_held(
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

/// The queue and the group's subscription on it, recording the subscription on first contact.
async fn open(
    conn: &mut PgConnection,
    queue: &str,
    group: &str,
    start: &SubscriptionStart,
) -> Result<Option<(QueueInfo, Subscription)>, StorageError> {
    type Row = (
        i64,
        i32,
        i32,
        i32,
        Option<DateTime<Utc>>,
        Option<i64>,
        Option<i64>,
    );
    let select = "SELECT q.id, q.lease_time, q.delayed_processing, q.window_buffer,
                         s.subscription_from, s.scan_xid, s.scan_pid
                    FROM queen.queues q
                    LEFT JOIN queen.consumer_subscriptions s
                      ON s.queue_id = q.id AND s.consumer_group = $2
                   WHERE q.name = $1";
    let mut row: Option<Row> = sqlx::query_as(select)
        .bind(queue)
        .bind(group)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some((queue_id, _, _, _, _, None, _)) = row {
        let (mode, from) = match (group == QUEUE_MODE, start) {
            (true, _) | (false, SubscriptionStart::All) => ("all", None),
            (false, SubscriptionStart::New) => ("new", None),
            (false, SubscriptionStart::From(t)) => ("timestamp", Some(*t)),
        };
        // A new group starts its scan at the current xmin: everything written before it
        // subscribed is history it does not want. Durable even on the lease pool's
        // asynchronous-commit sessions: where a group starts must not move after a crash.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query("SET LOCAL synchronous_commit = on")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO queen.consumer_subscriptions
                    (consumer_group, queue_id, subscription_mode, subscription_from, scan_xid)
             VALUES ($1, $2, $3,
                     CASE $3 WHEN 'new' THEN now() ELSE $4 END,
                     CASE $3 WHEN 'new'
                          THEN pg_snapshot_xmin(pg_current_snapshot())::text::int8
                          ELSE 0 END)
             ON CONFLICT (consumer_group, queue_id) DO NOTHING",
        )
        .bind(group)
        .bind(queue_id)
        .bind(mode)
        .bind(from)
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
        |(id, lease_secs, delay_secs, window_secs, from, xid, pid)| {
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
                },
            )
        },
    ))
}
