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
//!
//! This file holds the pop's types and its steps in order ([`pop`] → `look` → the one-statement
//! pop in [`ready`], else the full pop: candidates, claim, `Collect`); the SQL is in
//! [`statements`], a group's rows in [`group_rows`], reading a claimed range in [`read`].
//!
//! The 2.x pop extensions have rooms of their own (docs/consuming-2x.md): [`autopilot`] sizes
//! the knobs a pop leaves out, [`conflate`] is the last-value delivery of conflating groups,
//! [`lease_length`] the per-pop `leaseSeconds`.
//!
//! After the pop, by step: [`ahead`] claims a group's next lease ahead and [`handoff`] hands a
//! claimed partition to the pop waiting for it; [`claim_group`] and [`ack_group`] run many
//! consumers' claims and acks as one statement ([`grouping`] is what the two share); [`leases`]
//! extends and checks leases; [`acks`] commits offsets, retries and dead-letters into [`dlq`];
//! [`conns`] holds connections the way this path uses them. The transaction ids a pop handed
//! out are kept with the cached segments ([`crate::storage::segments::lease_txns`]).

pub mod ack_group;
pub mod acks;
pub mod ahead;
pub mod autopilot;
pub mod claim_group;
pub mod conflate;
pub mod conns;
pub mod dlq;
pub mod group_rows;
pub mod grouping;
pub mod handoff;
pub mod lease_length;
pub mod leases;
pub mod read;
pub mod ready;
pub mod statements;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use std::sync::Arc;

use crate::storage::consume::ahead::AheadLeases;
use crate::storage::consume::claim_group::ClaimGroup;
use crate::storage::consume::conns::LazyConn;
use crate::storage::consume::group_rows::{clear_attention, first_claim, join_untouched};
use crate::storage::consume::handoff::Handoffs;
use crate::storage::consume::read::{open, read_range, sent_or_held};
use crate::storage::consume::ready::pop_ready;
use crate::storage::consume::statements::{
    ClaimRow, CANDIDATE_COLUMNS, CLAIM_SQL, HELD_BACK_SQL, SCAN_SQL,
};
use crate::storage::error::StorageError;
use crate::storage::segments::cache::{CachedSegment, LeasedRange, SegmentCache};
use crate::storage::segments::frames::{self, Frame, FrameError, StoredRecord};

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
    /// [`crate::storage::segments::cache::WOKEN_FULL_POP_EVERY`].
    pub woken: bool,
    /// Partitions this broker's acks released with messages left (tried first).
    pub handoffs: &'a Handoffs,
    /// Where hand-off claims are run, grouped with those of concurrent pops.
    pub claims: &'a ClaimGroup,
    /// Leases claimed ahead for the next pops of a group (taken first).
    pub ahead: &'a AheadLeases,
    /// The pop asks for conflation (`conflation=true`): the group registers as conflating on
    /// its first pop, and the stored policy is read on every look ([`Looked::conflation`]).
    pub conflation: bool,
    /// The pop's own lease length in seconds (`leaseSeconds`), instead of the queue's.
    pub lease_seconds: Option<i32>,
}

/// One look of a pop: what it found, and what it learnt of the group's conflation policy.
#[derive(Debug, Default)]
pub struct Looked {
    /// The messages handed out; `None` when nothing is available now.
    pub popped: Option<Popped>,
    /// The group's stored conflation policy on the queue, when this look read it: always when
    /// the pop asked for conflation and the queue exists, and whenever the full pop ran.
    pub conflation: Option<bool>,
}

impl Looked {
    fn found(popped: Option<Popped>) -> Self {
        Self {
            popped,
            conflation: None,
        }
    }
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
    /// Messages of the partition past this delivery when it was claimed (the backlog it left).
    pub left: i64,
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

    /// The delivered messages as the stored record frames of their segments
    /// ([`frames::stored_records`]), for a framed pop to send as they are; `None` when a
    /// segment of the delivery is not in the framed layout (written before it, sealed, or with
    /// a trace id).
    ///
    /// # Errors
    ///
    /// [`FrameError`] when a segment does not decode.
    pub fn stored_records(&self) -> Result<Option<Vec<StoredRecord<'_>>>, FrameError> {
        let mut out = Vec::new();
        let end = self.first_offset + self.count as i64;
        for seg in &self.segments {
            if seg.base_offset >= end || seg.base_offset + seg.count <= self.first_offset {
                continue;
            }
            let framed = frames::stored_records(
                &seg.frames,
                seg.base_offset,
                self.first_offset,
                end,
                &self.deleted,
                &mut out,
            )?;
            if !framed {
                return Ok(None);
            }
        }
        Ok(Some(out))
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
pub(crate) struct QueueInfo {
    id: i64,
    name: String,
    lease_secs: i32,
    delay_secs: i32,
    window_secs: i32,
}

/// A group's subscription on a queue.
#[derive(Debug, Clone)]
pub(crate) struct Subscription {
    from: Option<DateTime<Utc>>,
    scan: (i64, i64),
    /// The group's stored policy: a conflating group gets the newest message of a partition.
    conflation: bool,
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

/// Pops per `req` (one look; the caller repeats it while long-polling). A pop that names its
/// own lease length has its lease set to it once claimed ([`lease_length`]).
///
/// # Errors
///
/// Any database error, or a segment that does not decode.
pub async fn pop(conn: &mut LazyConn<'_>, req: &PopRequest<'_>) -> Result<Looked, StorageError> {
    let looked = look(conn, req).await?;
    if let (Some(seconds), Some(lease)) = (
        req.lease_seconds,
        looked.popped.as_ref().and_then(|p| p.lease_id),
    ) {
        lease_length::set(conn.get().await?, lease, seconds).await?;
    }
    Ok(looked)
}

/// One look of [`pop`].
async fn look(conn: &mut LazyConn<'_>, req: &PopRequest<'_>) -> Result<Looked, StorageError> {
    // A pop that asks for conflation reads the group's stored policy first: it takes the full
    // pop (below), which registers the group and serves a conflating one. The fast paths never
    // serve a conflating group (their statements skip it).
    //
    // The one-statement pop claims only partitions the group already has a row for, and under
    // load it always finds one, so a partition the group never touched would wait for a quiet
    // moment. A few times a second per broker and group the full pop runs instead, looking at
    // the written partitions first and at untouched ones before the others.
    req.cache.note_pop(req.queue);
    // A lease claimed for this group while an ack committed is delivered first: it is held
    // for the next pop, and released again if none takes it.
    if req.partition.is_none() && !req.auto_ack && !req.conflation {
        let ahead = req
            .ahead
            .take_or_wait(req.queue, req.group, req.batch.max(1))
            .await;
        if let Some(ahead) = ahead {
            if let Some(popped) = pop_ready(conn, req, Some(ahead)).await? {
                return Ok(Looked::found(Some(popped)));
            }
        }
    }
    let written_first = req.partition.is_none() && req.cache.full_scan_due(req.queue, req.group);
    if written_first {
        // The one-statement pop enters the pair when it asks for a hand-off; this one does not.
        req.handoffs.enter(req.queue, req.group);
    }
    if req.partition.is_none() && !written_first && !req.conflation {
        // A long-poll's look with nothing handed off: the write or release that rang went to
        // another pop. What only the lists hold (leases that ran out, other brokers' releases,
        // writes whose notice named no id) is looked for at most every
        // `WOKEN_FULL_POP_EVERY` per group, not by every such look.
        // Such a look that got past this reads the full pop too, if the lists find nothing.
        let nothing_handed_off = req.woken && req.handoffs.waiting(req.queue, req.group) == 0;
        if nothing_handed_off && !req.cache.woken_full_pop_due(req.queue, req.group) {
            return Ok(Looked::default());
        }
        if let Some(popped) = pop_ready(conn, req, None).await? {
            return Ok(Looked::found(Some(popped)));
        }
        if req.woken && !nothing_handed_off && !req.cache.woken_full_pop_due(req.queue, req.group) {
            return Ok(Looked::default());
        }
    }
    let conn = conn.get().await?;
    let Some((queue, sub)) = open(conn, req.queue, req.group, &req.start, req.conflation).await?
    else {
        return Ok(Looked::default());
    };
    Ok(Looked {
        popped: pop_from(conn, req, &queue, &sub, written_first).await?,
        conflation: Some(sub.conflation),
    })
}

/// Pops from the queues whose namespace and/or task match (either `None` = any), highest
/// priority first; the first queue that yields wins. The conflation policy of a look that
/// found nothing is `false` when any matching queue's stored policy is, else `true` when any
/// was read.
///
/// # Errors
///
/// Any database error.
pub async fn pop_matching(
    conn: &mut LazyConn<'_>,
    namespace: Option<&str>,
    task: Option<&str>,
    req: &PopRequest<'_>,
) -> Result<Looked, StorageError> {
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
    let mut conflation: Option<bool> = None;
    for name in names {
        let one = PopRequest {
            queue: &name,
            partition: None,
            ..req.clone()
        };
        let looked = pop(conn, &one).await?;
        if looked.popped.is_some() {
            return Ok(looked);
        }
        if let Some(stored) = looked.conflation {
            conflation = Some(conflation.unwrap_or(true) && stored);
        }
    }
    Ok(Looked {
        popped: None,
        conflation,
    })
}

async fn pop_from(
    conn: &mut PgConnection,
    req: &PopRequest<'_>,
    queue: &QueueInfo,
    sub: &Subscription,
    written_first: bool,
) -> Result<Option<Popped>, StorageError> {
    let lease_id = Uuid::now_v7();
    // Until the pop ends with an answer, whatever its statements claimed under `lease_id` is
    // released when it ends otherwise (an error, or dropped by its time limit mid-statement).
    let mut lost = req.claims.guard(lease_id, !req.auto_ack);
    let mut pop = Collect {
        req,
        queue,
        sub,
        lease_id,
        remaining: req.batch.max(1),
        slots: req.partitions.max(1),
        deliveries: Vec::new(),
    };
    let conflating = sub.conflation;
    let collected: Result<(), StorageError> = async {
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
                Ok(())
            }
            None => pop.scan_queue(conn, written_first).await,
        }
    }
    .await;
    collected?;
    lost.disarm();
    if pop.deliveries.is_empty() {
        return Ok(None);
    }
    Ok(Some(finish(
        req,
        &queue.name,
        lease_id,
        pop.deliveries,
        conflating,
    )))
}

/// The answer of a pop that found messages; remembers the leased ranges for the acks (with the
/// batch the ack may claim ahead for, unless the group conflates: its pops claim nothing ahead).
fn finish(
    req: &PopRequest<'_>,
    queue: &str,
    lease_id: Uuid,
    deliveries: Vec<Delivery>,
    conflating: bool,
) -> Popped {
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
                    batch: (req.partition.is_none() && !conflating).then_some(req.batch.max(1)),
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

/// A partition just claimed, with the segments read for it.
struct Claimed {
    partition_id: i64,
    uuid: Uuid,
    name: String,
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
    /// pass may lie far above such a write. At most once per [`crate::storage::segments::cache::
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
        if self.sub.conflation {
            return conflate::take(self, conn, row).await;
        }
        let group = self.req.group;
        let lease_secs = lease_length::of_queue(self.queue.lease_secs);
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
                let inserted = first_claim(
                    conn,
                    row.id,
                    group,
                    self.lease_id,
                    self.req.owner,
                    lease_secs,
                    self.sub.from,
                )
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
        // This pop holds the partition now: an offer of it waiting here (its write's notice, a
        // release) is stale, and the next one-statement pop would spend a claim on it (as
        // `ready::claim_and_deliver` drops the offer of a partition the lists gave it).
        self.req
            .handoffs
            .forget(self.req.queue, self.req.group, row.id);
        self.deliver(
            &mut LazyConn::Held(conn),
            Claimed {
                partition_id: row.id,
                uuid: row.uuid,
                name: row.name.clone(),
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
        // A delay counts from the segment's commit, by PostgreSQL's clock (the frames' times
        // are this or another broker's clock, which may be off or jump).
        let held_back: Option<(i64, DateTime<Utc>)> = if self.queue.delay_secs > 0 {
            let bases: Vec<i64> = segments.iter().map(|s| s.base_offset).collect();
            sqlx::query_as(HELD_BACK_SQL)
                .bind(partition_id)
                .bind(&bases)
                .bind(self.queue.delay_secs)
                .fetch_optional(conn.get().await?)
                .await?
        } else {
            None
        };
        'segments: for seg in &segments {
            let skip = (first - seg.base_offset).max(0);
            if let Some((base, at)) = held_back {
                if seg.base_offset >= base {
                    visible_at = Some(at);
                    break 'segments;
                }
            }
            for offset in seg.base_offset + skip..seg.base_offset + seg.count {
                if count as i64 >= want {
                    break 'segments;
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
            left: (next_offset - end).max(0),
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
