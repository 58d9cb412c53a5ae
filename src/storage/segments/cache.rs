//! A bounded in-memory cache of committed segments, shared by every pop and ack of a broker.
//!
//! A segment row never changes once committed: `(partition id, base offset)` names the same
//! bytes forever (offsets only grow, and a deleted partition's id is never reused). So any
//! broker may keep copies, filled when it commits a segment or reads one for a pop, and a
//! consumer reading fresh data does not make PostgreSQL read the frames again.
//!
//! The cache is never asked whether a segment *exists*: the pop's claim statement reads which
//! segments cover the leased range from PostgreSQL (an index probe) and only skips sending the
//! frames of those the broker holds. A segment removed by retention is therefore never
//! delivered from here, whichever broker removed it.
//!
//! Eviction is oldest-inserted first under a byte budget: segments are read roughly in the
//! order they were written, and a consumed segment is rarely read again.
//!
//! The budget sizes itself between a base (`QUEEN_SEGMENT_CACHE_BYTES`) and a ceiling
//! (`QUEEN_SEGMENT_CACHE_MAX_BYTES`). The cache remembers the keys of the segments it evicted
//! lately (its ghosts), as many bytes of them as the budget could still grow by. A pop that
//! reads one of those again from PostgreSQL (a consumer group behind another one, fan-out) is
//! a read a larger budget would have saved, so the budget grows by twice that segment's size;
//! after [`SHRINK_AFTER`] without such a read it halves, down to the base. One group reading
//! a queue once never reads a segment twice, so its broker stays at the base.
//!
//! A committed segment is kept only when its queue is being consumed on this broker (a pop of
//! it started within [`CONSUMED_FOR`]): a queue nobody pops here would only fill the budget
//! with bytes no pop of this broker reads, and copy them on the push path for nothing.
//!
//! Beside the segments it remembers the ranges this broker leased out (lease id, partition →
//! offsets) and the transaction ids each handed out ([`LeaseTxns`], under a byte budget of
//! their own), so the common ack — every message of a live lease `completed` — is one
//! conditional statement that reads no segment: the statement checks that the lease and its
//! range are still what was remembered, and the general path runs whenever they are not.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::storage::segments::lease_txns::LeaseTxns;

/// One cached segment: its frames, exactly as stored.
#[derive(Debug)]
pub struct CachedSegment {
    /// Offset of its first message.
    pub base_offset: i64,
    /// Messages in it.
    pub count: i64,
    /// The `frames` column.
    pub frames: Vec<u8>,
    /// When this broker committed it (`None`: read from PostgreSQL, committed by any broker):
    /// from then on its messages were visible to consumers.
    pub committed_at: Option<std::time::Instant>,
}

/// The budget's ceiling is at most the memory the broker may use divided by this
/// ([`SegmentCache::ceiling_within`]): 1/16, so the default 64 MiB ceiling applies from 1 GiB
/// of memory up and a 256 MiB container grows the cache to 16 MiB at most.
pub const MEMORY_SHARE: u64 = 16;

/// Per-entry bookkeeping beyond the frames (map entries, queue slot).
const OVERHEAD: usize = 96;

/// Most cached segments handed to one claim (their bases travel as a statement parameter).
const MAX_HINTS: usize = 64;

/// How often one broker moves one group's scan watermark at most.
pub const WATERMARK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

/// How often one broker runs the full queue-level pop for one (queue, group) instead of the
/// one-statement pop, at most (so partitions the group never touched are found under load).
pub const FULL_SCAN_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// How often one broker lets a woken long-poll of one (queue, group) fall back to the full pop
/// when the one-statement pop found nothing, at most. A wake-up is only a hint (the partition
/// it names is often leased by the pop woken before), so most woken pops find nothing, and
/// the full pop is several statements; one of them every few milliseconds per broker still
/// finds whatever only the full pop can (it also moves the watermark the one-statement pop
/// reads from).
pub const WOKEN_FULL_POP_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// How long after a pop of a queue started on this broker its new segments are still kept.
pub const CONSUMED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Leases remembered at most (oldest forgotten first).
const MAX_LEASES: usize = 16_384;

/// Evicted segments remembered at most (their keys, about 40 bytes each), whatever their bytes.
const MAX_GHOSTS: usize = 16_384;

/// How long the budget stays above the base with no segment read again before it halves.
pub const SHRINK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes of leases' transaction ids kept at most (the oldest leases lose theirs first; their
/// acks then read the segments).
const LEASE_IDS_BYTES: usize = 4 << 20;

/// A range this broker leased out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedRange {
    /// Partition database id.
    pub partition_id: i64,
    /// First leased offset.
    pub from: i64,
    /// End of the leased range (exclusive).
    pub to: i64,
    /// Queue name.
    pub queue: Arc<str>,
    /// Partition name.
    pub partition: Arc<str>,
    /// The transaction ids handed out, when the pop's answer recorded them
    /// ([`SegmentCache::index_lease`]).
    pub txns: Option<Arc<LeaseTxns>>,
    /// The batch of the queue-level pop that leased it (`None`: a partition pop), which the
    /// consumer's next pop most likely asks for again (`storage::consume::ahead`).
    pub batch: Option<usize>,
}

type LeaseKey = (uuid::Uuid, uuid::Uuid);

#[derive(Debug, Default)]
struct Leases {
    by_key: HashMap<LeaseKey, LeasedRange>,
    order: VecDeque<LeaseKey>,
    /// Leases given transaction ids, oldest first (some may be forgotten since).
    indexed: VecDeque<LeaseKey>,
    /// Bytes of the transaction ids held.
    txn_bytes: usize,
}

impl Leases {
    /// Takes the bytes of ids a lease no longer holds off the count.
    fn drop_ids(&mut self, txns: Option<Arc<LeaseTxns>>) {
        self.txn_bytes -= txns.map_or(0, |t| t.bytes());
    }

    fn forget(&mut self, key: &LeaseKey) {
        if let Some(gone) = self.by_key.remove(key) {
            self.drop_ids(gone.txns);
        }
    }
}

/// The keys of segments evicted lately and what each cost: the ones a budget larger by up to
/// `room` bytes would still hold, oldest first.
#[derive(Debug, Default)]
struct Ghosts {
    costs: HashMap<(i64, i64), usize>,
    /// Eviction order; keys read again since stay here until trimmed.
    order: VecDeque<(i64, i64)>,
    bytes: usize,
}

impl Ghosts {
    /// Remembers an evicted segment, then forgets the oldest past `room` bytes.
    fn push(&mut self, key: (i64, i64), cost: usize, room: usize) {
        if self.costs.insert(key, cost).is_none() {
            self.order.push_back(key);
            self.bytes += cost;
        }
        self.trim(room);
    }

    /// Forgets the oldest until at most `room` bytes and [`MAX_GHOSTS`] keys are remembered.
    fn trim(&mut self, room: usize) {
        while self.bytes > room || self.costs.len() > MAX_GHOSTS {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(cost) = self.costs.remove(&key) {
                self.bytes -= cost;
            }
        }
        if self.order.len() > 2 * MAX_GHOSTS {
            let costs = &self.costs;
            self.order.retain(|key| costs.contains_key(key));
        }
    }

    /// The cost of `key` if it was evicted lately; it is forgotten.
    fn take(&mut self, key: (i64, i64)) -> Option<usize> {
        let cost = self.costs.remove(&key)?;
        self.bytes -= cost;
        Some(cost)
    }
}

#[derive(Debug)]
struct Inner {
    /// partition id → base offset → segment.
    by_partition: HashMap<i64, BTreeMap<i64, Arc<CachedSegment>>>,
    /// Insertion order, for eviction.
    order: VecDeque<(i64, i64)>,
    bytes: usize,
    /// The budget now, between the cache's base and ceiling.
    budget: usize,
    ghosts: Ghosts,
    /// When a pop last read again a segment evicted lately, or the budget last halved.
    grown_or_shrunk: std::time::Instant,
}

impl Inner {
    fn new(budget: usize) -> Self {
        Self {
            by_partition: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            budget,
            ghosts: Ghosts::default(),
            grown_or_shrunk: std::time::Instant::now(),
        }
    }

    /// The run of consecutive segments of `pid` held that ends at its newest one:
    /// `(pid, first base, last base)`.
    fn held_run(&self, pid: i64) -> Option<(i64, i64, i64)> {
        let mut segments = self.by_partition.get(&pid)?.values().rev();
        let newest = segments.next()?;
        let mut first = newest.base_offset;
        for seg in segments {
            if seg.base_offset + seg.count != first {
                break;
            }
            first = seg.base_offset;
        }
        Some((pid, first, newest.base_offset))
    }
}

/// Partition ids whose UUIDs the cache keeps (48 bytes each).
const PARTITION_UUIDS: usize = 100_000;

/// The cache; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct SegmentCache {
    /// The budget it starts with and shrinks back to.
    base: usize,
    /// The budget it grows to at most.
    ceiling: usize,
    /// Queue-level pops of each (queue id, group) running on this broker right now.
    running: Arc<Mutex<HashMap<(i64, String), usize>>>,
    /// When this broker last moved each (queue id, group)'s scan watermark.
    watermarks: Every<(i64, String)>,
    /// When this broker last ran the full pop of each (queue name, group).
    full_scans: Every<(String, String)>,
    /// When a woken pop of (queue, group) last fell back to the full pop.
    woken_full_pops: Every<(String, String)>,
    /// When a pop of each queue last started on this broker.
    popped: Mutex<HashMap<Arc<str>, std::time::Instant>>,
    inner: Mutex<Inner>,
    leases: Mutex<Leases>,
    /// The UUIDs of partitions by 64-bit id, as framed pops handed the ids out (acks name
    /// partitions by them). A partition keeps both for life, and ids are never reused.
    partition_uuids: Mutex<HashMap<i64, uuid::Uuid>>,
    /// Segments pops took from here since start.
    hits: AtomicU64,
    /// Segments pops read from PostgreSQL since start.
    misses: AtomicU64,
    /// Of those, segments this cache had evicted lately.
    rereads: AtomicU64,
}

/// How many segments pops took from the cache (`hits`) and read from PostgreSQL (`misses`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheReads {
    /// Segments served from the cache.
    pub hits: u64,
    /// Segments read from PostgreSQL (kept afterwards when they fit).
    pub misses: u64,
    /// Of the misses, segments this cache had evicted lately (each grew the budget).
    pub rereads: u64,
}

impl SegmentCache {
    /// A cache holding at most `capacity` bytes of frames (0 disables it), never more; see
    /// [`SegmentCache::growing_to`].
    pub fn new(capacity: usize) -> Self {
        Self {
            base: capacity,
            ceiling: capacity,
            running: Arc::default(),
            watermarks: Every::default(),
            full_scans: Every::default(),
            woken_full_pops: Every::default(),
            popped: Mutex::default(),
            inner: Mutex::new(Inner::new(capacity)),
            leases: Mutex::new(Leases::default()),
            partition_uuids: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rereads: AtomicU64::new(0),
        }
    }

    /// Lets the budget grow up to `ceiling` bytes while pops read again segments it evicted
    /// (see the module docs); a ceiling below the base, or a cache that is off, stays as it
    /// is.
    #[must_use]
    pub fn growing_to(mut self, ceiling: usize) -> Self {
        if self.base > 0 {
            self.ceiling = ceiling.max(self.base);
        }
        self
    }

    /// The ceiling a broker that may use `memory` bytes gives the budget: the configured one,
    /// lowered to [`MEMORY_SHARE`] of that memory when it is smaller (a small container);
    /// `None` (unknown memory) keeps the configured one.
    pub fn ceiling_within(configured: usize, memory: Option<u64>) -> usize {
        memory.map_or(configured, |m| {
            let share = usize::try_from(m / MEMORY_SHARE).unwrap_or(usize::MAX);
            configured.min(share)
        })
    }

    /// The byte budget now (between the base and the ceiling).
    pub fn budget(&self) -> usize {
        self.inner
            .lock()
            .expect("segment cache lock poisoned")
            .budget
    }

    /// Remembers a partition's UUID under its 64-bit id (at most `PARTITION_UUIDS` of them;
    /// past that the map starts again, and a miss costs one indexed read).
    pub fn note_partition(&self, id: i64, uuid: uuid::Uuid) {
        let mut map = self
            .partition_uuids
            .lock()
            .expect("partition id map lock poisoned");
        if map.len() >= PARTITION_UUIDS && !map.contains_key(&id) {
            map.clear();
        }
        map.insert(id, uuid);
    }

    /// The UUID of the partition with this 64-bit id, if noted.
    pub fn partition_uuid(&self, id: i64) -> Option<uuid::Uuid> {
        self.partition_uuids
            .lock()
            .expect("partition id map lock poisoned")
            .get(&id)
            .copied()
    }

    /// Segments pops took from the cache and read from PostgreSQL since start.
    pub fn reads(&self) -> CacheReads {
        CacheReads {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rereads: self.rereads.load(Ordering::Relaxed),
        }
    }

    /// Counts a held segment a pop used instead of reading it (found by
    /// [`SegmentCache::from_offset`]; [`SegmentCache::get`] counts its own).
    pub fn count_hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps a committed segment (the caller checked [`SegmentCache::consumed_queues`]).
    pub fn insert(&self, partition_id: i64, base_offset: i64, count: i64, frames: Vec<u8>) {
        if frames.len() + OVERHEAD <= self.ceiling {
            let now = Some(std::time::Instant::now());
            self.keep(partition_id, base_offset, count, frames, now);
        }
    }

    /// Records that a pop of `queue` starts on this broker: its segments committed within
    /// [`CONSUMED_FOR`] from now are kept.
    pub fn note_pop(&self, queue: &str) {
        if self.ceiling == 0 {
            return;
        }
        let now = std::time::Instant::now();
        let mut popped = self.popped.lock().expect("popped queues lock poisoned");
        if let Some(at) = popped.get_mut(queue) {
            *at = now;
            return;
        }
        if popped.len() >= MAX_LEASES {
            popped.retain(|_, at| now.duration_since(*at) < CONSUMED_FOR);
        }
        popped.insert(Arc::from(queue), now);
    }

    /// The queues whose committed segments are kept now: those a pop of started on this
    /// broker within [`CONSUMED_FOR`] (none when the cache is off).
    pub fn consumed_queues(&self) -> Vec<Arc<str>> {
        let popped = self.popped.lock().expect("popped queues lock poisoned");
        popped
            .iter()
            .filter(|(_, at)| at.elapsed() < CONSUMED_FOR)
            .map(|(q, _)| q.clone())
            .collect()
    }

    /// Keeps a segment a pop just read from PostgreSQL (a miss) and hands it back, shared. A
    /// segment this cache evicted lately grows the budget (see the module docs).
    pub fn insert_read(
        &self,
        partition_id: i64,
        base_offset: i64,
        count: i64,
        frames: Vec<u8>,
    ) -> Arc<CachedSegment> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        if self.ceiling > self.base {
            let mut inner = self.inner.lock().expect("segment cache lock poisoned");
            if let Some(cost) = inner.ghosts.take((partition_id, base_offset)) {
                self.rereads.fetch_add(1, Ordering::Relaxed);
                inner.budget = inner.budget.saturating_add(2 * cost).min(self.ceiling);
                inner.grown_or_shrunk = std::time::Instant::now();
            }
        }
        self.keep(partition_id, base_offset, count, frames, None)
    }

    fn keep(
        &self,
        partition_id: i64,
        base_offset: i64,
        count: i64,
        frames: Vec<u8>,
        committed_at: Option<std::time::Instant>,
    ) -> Arc<CachedSegment> {
        let cost = frames.len() + OVERHEAD;
        let seg = Arc::new(CachedSegment {
            base_offset,
            count,
            frames,
            committed_at,
        });
        if cost > self.ceiling {
            return seg;
        }
        let mut guard = self.inner.lock().expect("segment cache lock poisoned");
        let inner = &mut *guard;
        if inner.budget > self.base && inner.grown_or_shrunk.elapsed() >= SHRINK_AFTER {
            inner.budget = (inner.budget / 2).max(self.base);
            inner.grown_or_shrunk = std::time::Instant::now();
        }
        if cost > inner.budget {
            return seg;
        }
        let slot = inner.by_partition.entry(partition_id).or_default();
        if let Some(existing) = slot.get(&base_offset) {
            return existing.clone();
        }
        slot.insert(base_offset, seg.clone());
        inner.order.push_back((partition_id, base_offset));
        inner.bytes += cost;
        let room = self.ceiling - inner.budget;
        while inner.bytes > inner.budget {
            let Some((pid, base)) = inner.order.pop_front() else {
                break;
            };
            if let Some(slot) = inner.by_partition.get_mut(&pid) {
                if let Some(gone) = slot.remove(&base) {
                    let cost = gone.frames.len() + OVERHEAD;
                    inner.bytes -= cost;
                    if room > 0 {
                        inner.ghosts.push((pid, base), cost, room);
                    }
                }
                if slot.is_empty() {
                    inner.by_partition.remove(&pid);
                }
            }
        }
        inner.ghosts.trim(room);
        seg
    }

    /// The cached segments of a partition that may hold offsets at or after `from`, oldest
    /// first, at most a few dozen. The caller keeps the `Arc`s, so an eviction meanwhile does
    /// not take the bytes away.
    pub fn from_offset(&self, partition_id: i64, from: i64) -> Vec<Arc<CachedSegment>> {
        let inner = self.inner.lock().expect("segment cache lock poisoned");
        let Some(slot) = inner.by_partition.get(&partition_id) else {
            return Vec::new();
        };
        // The segment holding `from` starts at or below it.
        let start = slot.range(..=from).next_back().map_or(from, |(b, _)| *b);
        slot.range(start..)
            .take(MAX_HINTS)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// For the `n` partitions given segments most recently, the run of consecutive segments
    /// held that ends at the newest one: `(partition id, first base, last base)`. What a
    /// queue-level pop that does not know its partition yet tells PostgreSQL not to send; a
    /// segment evicted meanwhile is read again (the caller checks [`SegmentCache::get`]).
    pub fn held_runs(&self, n: usize) -> Vec<(i64, i64, i64)> {
        let inner = self.inner.lock().expect("segment cache lock poisoned");
        // Every partition held when they are few enough, else the most recent ones.
        if inner.by_partition.len() <= n {
            return inner
                .by_partition
                .keys()
                .filter_map(|&pid| inner.held_run(pid))
                .collect();
        }
        let mut seen = std::collections::HashSet::new();
        inner
            .order
            .iter()
            .rev()
            .map(|&(pid, _)| pid)
            .filter(|pid| seen.insert(*pid))
            .take(n)
            .filter_map(|pid| inner.held_run(pid))
            .collect()
    }

    /// [`SegmentCache::held_runs`] of one partition: what a pop that knows its partition tells
    /// PostgreSQL not to send.
    pub fn held_run(&self, partition_id: i64) -> Option<(i64, i64, i64)> {
        let inner = self.inner.lock().expect("segment cache lock poisoned");
        inner.held_run(partition_id)
    }

    /// One cached segment, for a pop (counted as a hit when held).
    pub fn get(&self, partition_id: i64, base_offset: i64) -> Option<Arc<CachedSegment>> {
        let inner = self.inner.lock().expect("segment cache lock poisoned");
        let seg = inner
            .by_partition
            .get(&partition_id)?
            .get(&base_offset)
            .cloned()?;
        self.count_hit();
        Some(seg)
    }

    /// Remembers that `lease` covers `range` of the partition with wire id `partition`.
    pub fn remember_lease(&self, lease: uuid::Uuid, partition: uuid::Uuid, range: LeasedRange) {
        let mut leases = self.leases.lock().expect("lease book lock poisoned");
        let key = (lease, partition);
        match leases.by_key.insert(key, range) {
            Some(old) => leases.drop_ids(old.txns),
            None => leases.order.push_back(key),
        }
        while leases.order.len() > MAX_LEASES {
            if let Some(old) = leases.order.pop_front() {
                leases.forget(&old);
            }
        }
    }

    /// Records the transaction ids `lease` handed out on `partition`, `(offset, id)` in
    /// delivery order (a remembered lease; nothing when the cache is off, or when two messages
    /// share an id, see [`LeaseTxns::new`]). The oldest leases lose theirs past
    /// `LEASE_IDS_BYTES`.
    pub fn index_lease<'a>(
        &self,
        lease: uuid::Uuid,
        partition: uuid::Uuid,
        delivered: impl Iterator<Item = (i64, &'a str)>,
    ) {
        if self.ceiling == 0 {
            return;
        }
        let Some(txns) = LeaseTxns::new(delivered) else {
            return;
        };
        let key = (lease, partition);
        let mut guard = self.leases.lock().expect("lease book lock poisoned");
        let leases = &mut *guard;
        let Some(range) = leases.by_key.get_mut(&key) else {
            return;
        };
        let bytes = txns.bytes();
        let before = range.txns.replace(Arc::new(txns));
        leases.drop_ids(before);
        leases.txn_bytes += bytes;
        leases.indexed.push_back(key);
        while leases.txn_bytes > LEASE_IDS_BYTES || leases.indexed.len() > MAX_LEASES {
            let Some(old) = leases.indexed.pop_front() else {
                break;
            };
            let gone = leases.by_key.get_mut(&old).and_then(|r| r.txns.take());
            leases.drop_ids(gone);
        }
    }

    /// Forgets a lease that ended (its last ack released it).
    pub fn forget_lease(&self, lease: uuid::Uuid, partition: uuid::Uuid) {
        self.leases
            .lock()
            .expect("lease book lock poisoned")
            .forget(&(lease, partition));
    }

    /// Bytes of leases' transaction ids held.
    pub fn lease_id_bytes(&self) -> usize {
        self.leases
            .lock()
            .expect("lease book lock poisoned")
            .txn_bytes
    }

    /// The range `lease` covers on `partition`, when this broker handed it out.
    pub fn leased(&self, lease: uuid::Uuid, partition: uuid::Uuid) -> Option<LeasedRange> {
        let leases = self.leases.lock().expect("lease book lock poisoned");
        leases.by_key.get(&(lease, partition)).cloned()
    }

    /// The cached segments covering exactly `from .. to` of a partition, or `None` when any
    /// part of it is not held.
    pub fn covering(
        &self,
        partition_id: i64,
        from: i64,
        to: i64,
    ) -> Option<Vec<Arc<CachedSegment>>> {
        let segments = self.from_offset(partition_id, from);
        let mut next = from;
        let mut out = Vec::new();
        for seg in segments {
            if next >= to {
                break;
            }
            if seg.base_offset > next {
                return None;
            }
            if seg.base_offset + seg.count > next {
                next = seg.base_offset + seg.count;
                out.push(seg);
            }
        }
        (next >= to).then_some(out)
    }

    /// Registers a queue-level pop of `(queue_id, group)` for as long as the guard lives; the
    /// guard's [`PopSlot::index`] is how many others were running when it started (0 for a
    /// pop alone), so concurrent pops can start at different candidates.
    pub fn pop_slot(&self, queue_id: i64, group: &str) -> PopSlot {
        let key = (queue_id, group.to_string());
        let mut running = self.running.lock().expect("pop slots lock poisoned");
        let count = running.entry(key.clone()).or_insert(0);
        let index = *count;
        *count += 1;
        PopSlot {
            running: self.running.clone(),
            key,
            index,
        }
    }

    /// Whether this broker may move the scan watermark of `(queue_id, group)` now: at most
    /// once per [`WATERMARK_EVERY`]. Saying yes records the move.
    pub fn watermark_due(&self, queue_id: i64, group: &str) -> bool {
        self.watermarks
            .due((queue_id, group.to_string()), WATERMARK_EVERY)
    }

    /// Whether this queue-level pop of `(queue, group)` should run the full pop: at most once
    /// per [`FULL_SCAN_EVERY`] per broker, the first time included. Saying yes records it.
    pub fn full_scan_due(&self, queue: &str, group: &str) -> bool {
        self.full_scans
            .due((queue.to_string(), group.to_string()), FULL_SCAN_EVERY)
    }

    /// Whether a woken long-poll of `(queue, group)` whose one-statement pop found nothing
    /// should run the full pop: at most once per [`WOKEN_FULL_POP_EVERY`] per broker. Saying
    /// yes records it.
    pub fn woken_full_pop_due(&self, queue: &str, group: &str) -> bool {
        self.woken_full_pops
            .due((queue.to_string(), group.to_string()), WOKEN_FULL_POP_EVERY)
    }

    /// Bytes held (frames plus bookkeeping).
    pub fn bytes(&self) -> usize {
        self.inner
            .lock()
            .expect("segment cache lock poisoned")
            .bytes
    }
}

/// Per key, when something was last done: says yes at most once per interval (the first time
/// included) and records the yes. Keys are (queue, group) pairs; past [`MAX_LEASES`] of them
/// the record starts over.
#[derive(Debug)]
struct Every<K>(Mutex<HashMap<K, std::time::Instant>>);

impl<K> Default for Every<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: std::hash::Hash + Eq> Every<K> {
    fn due(&self, key: K, every: std::time::Duration) -> bool {
        let now = std::time::Instant::now();
        let mut last = self.0.lock().expect("rate gate lock poisoned");
        if let Some(at) = last.get_mut(&key) {
            if now.duration_since(*at) < every {
                return false;
            }
            *at = now;
            return true;
        }
        if last.len() >= MAX_LEASES {
            last.clear();
        }
        last.insert(key, now);
        true
    }
}

/// A running queue-level pop (see [`SegmentCache::pop_slot`]).
#[derive(Debug)]
pub struct PopSlot {
    running: Arc<Mutex<HashMap<(i64, String), usize>>>,
    key: (i64, String),
    index: usize,
}

impl PopSlot {
    /// How many pops of the same queue and group were running when this one started.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for PopSlot {
    fn drop(&mut self) {
        let mut running = self.running.lock().expect("pop slots lock poisoned");
        if let Some(count) = running.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_runs_end_at_each_partitions_newest_segment_and_stop_at_a_gap() {
        let cache = SegmentCache::new(1 << 20);
        // Partition 1: 0..10, 10..15, then 20..30 after a gap (15..20 never held).
        cache.insert(1, 0, 10, vec![0u8; 10]);
        cache.insert(1, 10, 5, vec![0u8; 10]);
        cache.insert(1, 20, 10, vec![0u8; 10]);
        cache.insert(1, 30, 10, vec![0u8; 10]);
        cache.insert(2, 0, 3, vec![0u8; 10]);
        let mut runs = cache.held_runs(10);
        runs.sort_unstable();
        assert_eq!(runs, vec![(1, 20, 30), (2, 0, 0)]);
        // Past `n` partitions, the ones given segments last.
        cache.insert(3, 7, 1, vec![0u8; 10]);
        assert_eq!(cache.held_runs(1), vec![(3, 7, 7)]);
    }

    #[test]
    fn oldest_inserted_leave_first_under_the_budget() {
        let cache = SegmentCache::new(3 * (100 + OVERHEAD));
        for base in [0, 10, 20, 30] {
            cache.insert(7, base, 10, vec![0u8; 100]);
        }
        assert!(cache.get(7, 0).is_none());
        assert!(cache.get(7, 10).is_some());
        assert!(cache.get(7, 30).is_some());
        assert_eq!(cache.bytes(), 3 * (100 + OVERHEAD));
    }

    #[test]
    fn pops_count_what_they_took_from_the_cache_and_what_they_read() {
        let cache = SegmentCache::new(1 << 20);
        cache.insert(1, 0, 10, vec![0]);
        assert_eq!(
            cache.reads(),
            CacheReads::default(),
            "keeping a commit is no read"
        );
        assert!(cache.get(1, 0).is_some());
        assert!(cache.get(1, 10).is_none());
        cache.insert_read(1, 10, 10, vec![1]);
        cache.count_hit();
        // Off, every read is a miss and nothing is held.
        let off = SegmentCache::new(0);
        off.insert_read(1, 0, 10, vec![0]);
        assert!(off.get(1, 0).is_none());
        assert_eq!(
            cache.reads(),
            CacheReads {
                hits: 2,
                misses: 1,
                rereads: 0
            }
        );
        assert_eq!(
            off.reads(),
            CacheReads {
                hits: 0,
                misses: 1,
                rereads: 0
            }
        );
    }

    #[test]
    fn from_offset_starts_at_the_segment_holding_the_offset() {
        let cache = SegmentCache::new(1 << 20);
        for base in [0, 10, 20] {
            cache.insert(1, base, 10, vec![base as u8]);
        }
        cache.insert(2, 15, 1, vec![9]);
        let bases: Vec<i64> = cache
            .from_offset(1, 15)
            .iter()
            .map(|s| s.base_offset)
            .collect();
        assert_eq!(bases, vec![10, 20]);
        assert!(cache.from_offset(3, 0).is_empty());
    }

    #[test]
    fn covering_needs_every_offset_of_the_range() {
        let cache = SegmentCache::new(1 << 20);
        cache.insert(1, 0, 10, vec![0]);
        cache.insert(1, 10, 5, vec![1]);
        cache.insert(1, 20, 5, vec![2]);
        let bases = |r: Option<Vec<Arc<CachedSegment>>>| {
            r.map(|v| v.iter().map(|s| s.base_offset).collect::<Vec<_>>())
        };
        assert_eq!(bases(cache.covering(1, 3, 15)), Some(vec![0, 10]));
        assert_eq!(bases(cache.covering(1, 10, 15)), Some(vec![10]));
        // Offsets 15..20 are not held.
        assert_eq!(bases(cache.covering(1, 12, 22)), None);
        assert_eq!(bases(cache.covering(2, 0, 1)), None);
    }

    #[test]
    fn concurrent_pops_get_distinct_slots_and_give_them_back() {
        let cache = SegmentCache::new(0);
        let a = cache.pop_slot(1, "g");
        let b = cache.pop_slot(1, "g");
        let other = cache.pop_slot(2, "g");
        assert_eq!((a.index(), b.index(), other.index()), (0, 1, 0));
        drop(a);
        drop(b);
        assert_eq!(cache.pop_slot(1, "g").index(), 0);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let cache = SegmentCache::new(0);
        cache.insert(1, 0, 1, vec![1, 2, 3]);
        assert!(cache.get(1, 0).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn only_queues_popped_here_lately_have_their_segments_kept() {
        let cache = SegmentCache::new(1 << 20);
        assert!(cache.consumed_queues().is_empty());
        cache.note_pop("orders");
        cache.note_pop("orders");
        let queues: Vec<String> = cache
            .consumed_queues()
            .iter()
            .map(|q| q.to_string())
            .collect();
        assert_eq!(queues, vec!["orders".to_string()]);
        // A pop long ago no longer counts.
        cache.popped.lock().unwrap().insert(
            Arc::from("old"),
            std::time::Instant::now() - CONSUMED_FOR - std::time::Duration::from_secs(1),
        );
        assert_eq!(cache.consumed_queues().len(), 1);
        // With the cache off nothing is recorded.
        let off = SegmentCache::new(0);
        off.note_pop("orders");
        assert!(off.consumed_queues().is_empty());
    }

    /// What one 100-byte segment costs the budget.
    const SEG: usize = 100 + OVERHEAD;

    #[test]
    fn segments_read_again_after_their_eviction_grow_the_budget_up_to_the_ceiling() {
        let cache = SegmentCache::new(3 * SEG).growing_to(6 * SEG);
        for base in 0..4 {
            cache.insert_read(1, base, 1, vec![0u8; 100]);
        }
        assert!(cache.get(1, 0).is_none(), "the oldest left under the base");
        assert_eq!(cache.budget(), 3 * SEG);
        // A second group reads the evicted segment: a read a larger budget would have saved.
        cache.insert_read(1, 0, 1, vec![0u8; 100]);
        assert_eq!(cache.budget(), 5 * SEG);
        assert_eq!(cache.reads().rereads, 1);
        assert!(cache.get(1, 0).is_some(), "the segment read again is held");
        assert!(
            cache.get(1, 1).is_some(),
            "the grown budget evicted nothing"
        );
        // Further re-reads stop at the ceiling, and the cache never holds more than it.
        for round in 0..3 {
            for base in 0..6 {
                cache.insert_read(1, base, 1, vec![round; 100]);
                assert!(cache.bytes() <= cache.budget());
            }
        }
        assert_eq!(cache.budget(), 6 * SEG);
        assert_eq!(cache.bytes(), 6 * SEG);
        // Segments further apart than even the ceiling could hold never grow it: the cache
        // remembers only as many evicted bytes as it could still grow by.
        let cache = SegmentCache::new(3 * SEG).growing_to(4 * SEG);
        for round in 0..3 {
            for base in 0..12 {
                cache.insert_read(1, base, 1, vec![round; 100]);
            }
        }
        assert_eq!(cache.budget(), 3 * SEG);
        assert_eq!(cache.reads().rereads, 0);
    }

    #[test]
    fn one_pass_over_the_data_leaves_the_budget_at_its_base() {
        let cache = SegmentCache::new(3 * SEG).growing_to(100 * SEG);
        for base in 0..1000 {
            cache.insert_read(1, base, 1, vec![0u8; 100]);
            cache.insert(2, base, 1, vec![0u8; 100]);
        }
        assert_eq!(cache.budget(), 3 * SEG);
        assert_eq!(cache.reads().rereads, 0);
        assert_eq!(cache.bytes(), 3 * SEG);
    }

    #[test]
    fn only_evictions_a_larger_budget_would_have_avoided_count() {
        // Room to grow by two segments: the cache remembers the last two it evicted.
        let cache = SegmentCache::new(2 * SEG).growing_to(4 * SEG);
        for base in 0..10 {
            cache.insert_read(1, base, 1, vec![0u8; 100]);
        }
        assert!(cache.inner.lock().unwrap().ghosts.bytes <= 2 * SEG);
        // Evicted long ago: a budget at the ceiling would not have held it either.
        cache.insert_read(1, 0, 1, vec![0u8; 100]);
        assert_eq!(cache.budget(), 2 * SEG);
        // Evicted last: it would have.
        cache.insert_read(1, 7, 1, vec![0u8; 100]);
        assert_eq!(cache.budget(), 4 * SEG);
        assert_eq!(cache.reads().rereads, 1);
    }

    #[test]
    fn without_segments_read_again_the_budget_halves_back_to_its_base() {
        let cache = SegmentCache::new(2 * SEG).growing_to(16 * SEG);
        for base in 0..3 {
            cache.insert_read(1, base, 1, vec![0u8; 100]);
        }
        for _ in 0..4 {
            cache.insert_read(1, 0, 1, vec![0u8; 100]);
            cache.insert_read(1, 100, 1, vec![0u8; 100]);
            cache.insert_read(1, 101, 1, vec![0u8; 100]);
            cache.insert_read(1, 102, 1, vec![0u8; 100]);
        }
        let grown = cache.budget();
        assert!(grown > 2 * SEG, "re-reads grew it ({grown})");
        let long_ago = std::time::Instant::now() - SHRINK_AFTER - std::time::Duration::from_secs(1);
        let mut halvings = 0;
        while cache.budget() > 2 * SEG {
            cache.inner.lock().unwrap().grown_or_shrunk = long_ago;
            let before = cache.budget();
            cache.insert(3, halvings, 1, vec![0u8; 100]);
            assert_eq!(cache.budget(), (before / 2).max(2 * SEG));
            assert!(cache.bytes() <= cache.budget());
            halvings += 1;
        }
        assert!(halvings >= 1);
        // Not before its time.
        cache.inner.lock().unwrap().budget = 8 * SEG;
        cache.inner.lock().unwrap().grown_or_shrunk = std::time::Instant::now();
        cache.insert(3, 99, 1, vec![0u8; 100]);
        assert_eq!(cache.budget(), 8 * SEG);
    }

    #[test]
    fn a_cache_that_is_off_does_not_grow() {
        let cache = SegmentCache::new(0).growing_to(1 << 20);
        cache.insert_read(1, 0, 1, vec![0u8; 100]);
        cache.insert_read(1, 0, 1, vec![0u8; 100]);
        assert_eq!(cache.budget(), 0);
        assert_eq!(cache.bytes(), 0);
        // A ceiling below the base is the base.
        assert_eq!(SegmentCache::new(4 * SEG).growing_to(SEG).ceiling, 4 * SEG);
    }

    #[test]
    fn the_ceiling_stays_within_a_share_of_the_memory_the_broker_may_use() {
        let configured = 64 << 20;
        // A large machine: the configured ceiling.
        assert_eq!(
            SegmentCache::ceiling_within(configured, Some(24 << 30)),
            configured
        );
        // 1 GiB: exactly the default ceiling; a 256 MiB container: 16 MiB.
        assert_eq!(
            SegmentCache::ceiling_within(configured, Some(1 << 30)),
            64 << 20
        );
        assert_eq!(
            SegmentCache::ceiling_within(configured, Some(256 << 20)),
            16 << 20
        );
        // Unknown memory: as configured. A share below the base leaves the base fixed.
        assert_eq!(SegmentCache::ceiling_within(configured, None), configured);
        let tiny = SegmentCache::ceiling_within(configured, Some(64 << 20));
        assert_eq!(SegmentCache::new(8 << 20).growing_to(tiny).ceiling, 8 << 20);
    }
}
