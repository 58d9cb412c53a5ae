//! Leases claimed ahead of the next pop: while an ack's durable commit runs, the next hand-off
//! of its group is claimed for the pop that consumer sends next.
//!
//! A consumer's cycle is pop, work, ack, pop. Under load its ack waits for a WAL flush (behind
//! whatever the pushes wrote), and its next pop then waits for a claim statement of its own:
//! two round trips to PostgreSQL in a row, both queued behind the pushes' work. When an ack
//! ends a lease whole ([`crate::storage::consume::acks::FastPlan`], made by a queue-level pop of this
//! broker), the broker takes the next hand-off of the group ([`Handoffs::next_ahead`]: the
//! same order and the same turn of the one-statement pop as a pop's) and claims it through
//! the grouped hand-off claim ([`ClaimGroup`]) at once, while the ack's commit is still
//! flushing. The claimed lease waits here, and the next queue-level pop of the group that asks
//! for as many messages ([`AheadLeases::take_or_wait`]) delivers it without a statement of its
//! own; a consumer already waiting is woken for it.
//!
//! The lease is an ordinary lease in PostgreSQL from the moment it is claimed (one holder per
//! partition and group across brokers, as every claim): what is claimed ahead is only *who*
//! gets it on this broker. A lease no pop takes within the hold (`QUEEN_POP_AHEAD_MS`) is
//! released again (its row asks for attention, and the hand-off is offered again), so a
//! consumer that stopped after its ack holds a partition for that long at most. If the broker
//! dies meanwhile, the lease runs out at its expiry like any lease whose consumer died; nothing
//! was delivered under it, so nothing is lost or delivered twice.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use crate::storage::consume::claim_group::{ClaimGroup, ClaimJob};
use crate::storage::consume::handoff::Handoffs;
use crate::storage::consume::statements::{ReadyRow, RELEASE_SQL};
use crate::storage::consume::QUEUE_MODE;
use crate::storage::segments::cache::SegmentCache;
use crate::wake::{WakeHub, WakeKey};

/// Leases waiting per (queue, group) at most; an ack beyond them claims nothing ahead.
pub const MAX_PER_GROUP: usize = 64;

/// (queue, group) pairs kept at most; a pair beyond them claims nothing ahead.
const MAX_GROUPS: usize = 4096;

/// How long a stopping broker waits for the claims ahead still running before it releases.
const CLOSING_WAIT: Duration = Duration::from_millis(250);

/// One lease claimed ahead: the claim's rows, as a pop's own claim would have returned them.
pub struct Ahead {
    /// The lease id (the pop that takes it hands it out).
    pub lease: Uuid,
    /// The claimed partition's database id.
    pub partition_id: i64,
    /// Messages the claim asked for (a pop takes it only when it asks for as many).
    pub want: usize,
    /// The claim's rows.
    pub rows: Vec<ReadyRow>,
}

/// How many leases claimed ahead were taken by a pop and how many were released unused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AheadCounts {
    /// Claimed ahead.
    pub claimed: u64,
    /// Delivered by a pop.
    pub taken: u64,
    /// Released again, no pop having asked within the hold.
    pub released: u64,
}

/// The leases claimed ahead on this broker, by queue then group; share it behind an `Arc`.
pub struct AheadLeases {
    book: Mutex<HashMap<String, HashMap<String, VecDeque<Ahead>>>>,
    claims: ClaimGroup,
    handoffs: Arc<Handoffs>,
    cache: Arc<SegmentCache>,
    wake: Arc<WakeHub>,
    hold: Duration,
    claimed: AtomicU64,
    taken: AtomicU64,
    released: AtomicU64,
    /// Claims sent and not yet answered, by queue then group: a pop of a pair with a claim in
    /// flight waits for it, and a stopping broker for all of them.
    claiming: Mutex<HashMap<String, HashMap<String, usize>>>,
    /// Notified whenever a claim ahead is answered (booked or not).
    landed: tokio::sync::Notify,
    /// Lease ids claimed (or being claimed) ahead that no pop took and none released yet.
    outstanding: Mutex<HashSet<Uuid>>,
    /// The broker is stopping: nothing more is claimed ahead, and what is claimed is released.
    closed: AtomicBool,
}

impl AheadLeases {
    /// Claims ahead through `claims`, holds each lease `hold` for a pop (zero: never claims
    /// ahead).
    pub fn new(
        claims: ClaimGroup,
        handoffs: Arc<Handoffs>,
        cache: Arc<SegmentCache>,
        wake: Arc<WakeHub>,
        hold: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            book: Mutex::default(),
            claims,
            handoffs,
            cache,
            wake,
            hold,
            claimed: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            released: AtomicU64::new(0),
            claiming: Mutex::default(),
            landed: tokio::sync::Notify::new(),
            outstanding: Mutex::default(),
            closed: AtomicBool::new(false),
        })
    }

    /// An ack of `(queue, group)` is ending a lease whole that a queue-level pop of `want`
    /// messages made: claims the group's next hand-off for its next pop (on the current
    /// runtime, without waiting), unless none waits, the one-statement pop is due, or enough
    /// leases wait already.
    pub fn after_ack(self: &Arc<Self>, queue: &str, group: &str, want: usize) {
        if self.hold.is_zero()
            || want == 0
            || self.closed.load(Ordering::Acquire)
            || !self.room(queue, group)
        {
            return;
        }
        let Some(partition_id) = self.handoffs.next_ahead(queue, group) else {
            return;
        };
        *self
            .claiming
            .lock()
            .expect("ahead claims lock poisoned")
            .entry(queue.to_string())
            .or_default()
            .entry(group.to_string())
            .or_default() += 1;
        let this = self.clone();
        let (queue, group) = (queue.to_string(), group.to_string());
        actix_web::rt::spawn(async move { this.claim(queue, group, partition_id, want).await });
    }

    /// The oldest lease of `(queue, group)` claimed ahead for `want` messages, if one waits.
    fn take(&self, queue: &str, group: &str, want: usize) -> Option<Ahead> {
        let mut book = self.book.lock().expect("ahead book lock poisoned");
        let waiting = book.get_mut(queue)?.get_mut(group)?;
        let at = waiting.iter().position(|a| a.want == want)?;
        let ahead = waiting.remove(at)?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        self.settled(ahead.lease);
        Some(ahead)
    }

    /// The oldest lease of `(queue, group)` claimed ahead for `want` messages; when none waits
    /// while a claim ahead of the pair is still being answered (an ack's claim runs while the
    /// ack's answer travels, so the consumer's next pop can arrive first), waits for it, at most
    /// the hold.
    pub async fn take_or_wait(&self, queue: &str, group: &str, want: usize) -> Option<Ahead> {
        let deadline = std::time::Instant::now() + self.hold;
        loop {
            // Enabled before looking, so an answer landing in between still wakes this.
            let landed = self.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            if let Some(ahead) = self.take(queue, group, want) {
                return Some(ahead);
            }
            if !self.claiming_for(queue, group) {
                return None;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || tokio::time::timeout(left, landed).await.is_err() {
                return self.take(queue, group, want);
            }
        }
    }

    /// Whether a claim ahead of `(queue, group)` is in flight.
    fn claiming_for(&self, queue: &str, group: &str) -> bool {
        self.claiming
            .lock()
            .expect("ahead claims lock poisoned")
            .get(queue)
            .and_then(|g| g.get(group))
            .is_some_and(|n| *n > 0)
    }

    /// A claim ahead of `(queue, group)` was answered (its lease booked, or nothing claimed).
    fn answered(&self, queue: &str, group: &str) {
        {
            let mut claiming = self.claiming.lock().expect("ahead claims lock poisoned");
            if let Some(groups) = claiming.get_mut(queue) {
                if let Some(n) = groups.get_mut(group) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        groups.remove(group);
                    }
                }
                if groups.is_empty() {
                    claiming.remove(queue);
                }
            }
        }
        self.landed.notify_waiters();
    }

    /// Releases every lease claimed ahead that no pop took, and claims nothing ahead from now
    /// on; for the broker's shutdown, after its server stopped. Claims still running are waited
    /// for (`CLOSING_WAIT`, 250 ms, at most): the release is by lease id, so it also covers a claim
    /// whose task stopped with the server's workers while its statement committed.
    pub async fn release_all(&self) {
        self.closed.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + CLOSING_WAIT;
        while !self
            .claiming
            .lock()
            .expect("ahead claims lock poisoned")
            .is_empty()
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.book.lock().expect("ahead book lock poisoned").clear();
        let leases: Vec<Uuid> = self
            .outstanding
            .lock()
            .expect("ahead leases lock poisoned")
            .drain()
            .collect();
        if leases.is_empty() {
            return;
        }
        match sqlx::query(RELEASE_SQL)
            .bind(&leases)
            .execute(self.claims.pool())
            .await
        {
            Ok(done) => {
                self.released
                    .fetch_add(done.rows_affected(), Ordering::Relaxed);
                tracing::info!(
                    released = done.rows_affected(),
                    "leases claimed ahead released at shutdown"
                );
            }
            Err(e) => tracing::warn!(error = %e, leases = leases.len(),
                "releasing the leases claimed ahead failed; they run out at their expiry"),
        }
    }

    /// Leases of `(queue, group)` waiting for a pop.
    pub fn waiting(&self, queue: &str, group: &str) -> usize {
        let book = self.book.lock().expect("ahead book lock poisoned");
        book.get(queue)
            .and_then(|g| g.get(group))
            .map_or(0, VecDeque::len)
    }

    /// Claimed, taken and released so far.
    pub fn counts(&self) -> AheadCounts {
        AheadCounts {
            claimed: self.claimed.load(Ordering::Relaxed),
            taken: self.taken.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }

    /// Whether another lease of the pair may wait.
    fn room(&self, queue: &str, group: &str) -> bool {
        let book = self.book.lock().expect("ahead book lock poisoned");
        match book.get(queue).and_then(|g| g.get(group)) {
            Some(waiting) => waiting.len() < MAX_PER_GROUP,
            None => book.values().map(HashMap::len).sum::<usize>() < MAX_GROUPS,
        }
    }

    /// Claims `partition_id` for the next pop of `(queue, group)`, keeps the lease for the
    /// hold and releases it if no pop took it.
    async fn claim(self: Arc<Self>, queue: String, group: String, partition_id: i64, want: usize) {
        let lease = Uuid::now_v7();
        // Known before the statement is sent: a stopping broker releases it even when this task
        // stops with the server's workers before the answer comes.
        self.outstanding
            .lock()
            .expect("ahead leases lock poisoned")
            .insert(lease);
        let held = self.cache.held_run(partition_id);
        let job = ClaimJob {
            queue: queue.clone(),
            group: group.clone(),
            lease,
            want: i64::try_from(want).unwrap_or(i64::MAX),
            partition_id,
            held: held.map(|(_, from, to)| (from, to)),
        };
        let answer = self.claims.claim(job).await;
        let key = wake_key(&queue, &group);
        let rows = match answer {
            Some(rows) if !rows.is_empty() => rows,
            stale_or_failed => {
                if stale_or_failed.is_none() {
                    // The grouped statement failed (and logged why): the next pop tries it.
                    self.handoffs.offer(&queue, &group, partition_id);
                }
                self.settled(lease);
                self.answered(&queue, &group);
                return;
            }
        };
        self.claimed.fetch_add(1, Ordering::Relaxed);
        if self.closed.load(Ordering::Acquire) {
            // The broker is stopping: no pop will take it.
            self.release(&queue, &group, partition_id, lease, &key)
                .await;
            self.answered(&queue, &group);
            return;
        }
        self.book
            .lock()
            .expect("ahead book lock poisoned")
            .entry(queue.clone())
            .or_default()
            .entry(group.clone())
            .or_default()
            .push_back(Ahead {
                lease,
                partition_id,
                want,
                rows,
            });
        self.answered(&queue, &group);
        self.wake.wake_one(&key);
        tokio::time::sleep(self.hold).await;
        if self.remove(&queue, &group, lease) {
            self.release(&queue, &group, partition_id, lease, &key)
                .await;
        }
    }

    /// The lease `lease` needs no release at shutdown any more (taken, released, or never
    /// claimed).
    fn settled(&self, lease: Uuid) {
        self.outstanding
            .lock()
            .expect("ahead leases lock poisoned")
            .remove(&lease);
    }

    /// Drops the lease `lease` from the book; whether it was still there (no pop took it).
    fn remove(&self, queue: &str, group: &str, lease: Uuid) -> bool {
        let mut book = self.book.lock().expect("ahead book lock poisoned");
        let Some(groups) = book.get_mut(queue) else {
            return false;
        };
        let Some(waiting) = groups.get_mut(group) else {
            return false;
        };
        let before = waiting.len();
        waiting.retain(|a| a.lease != lease);
        let removed = waiting.len() < before;
        if waiting.is_empty() {
            groups.remove(group);
            if groups.is_empty() {
                book.remove(queue);
            }
        }
        removed
    }

    /// Releases a lease no pop took and offers its partition to the next pop again.
    async fn release(
        &self,
        queue: &str,
        group: &str,
        partition_id: i64,
        lease: Uuid,
        key: &WakeKey,
    ) {
        // Retried while PostgreSQL is unreachable: a release lost to a network fault left the
        // partition held for the queue's whole lease time (a backlog no pop drained, seen in
        // the broker-PostgreSQL partition test).
        if self.claims.release(&[lease]).await {
            self.settled(lease);
            self.released.fetch_add(1, Ordering::Relaxed);
            self.handoffs.offer(queue, group, partition_id);
            self.wake.wake_one(key);
        } else {
            tracing::warn!(queue, group, partition_id, %lease,
                "a lease claimed ahead could not be released within two minutes; it runs out at its expiry");
        }
    }
}

impl std::fmt::Debug for AheadLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AheadLeases")
            .field("hold", &self.hold)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// The key the queue-level pops of `(queue, group)` wait on (`http/pop.rs`).
fn wake_key(queue: &str, group: &str) -> WakeKey {
    if group == QUEUE_MODE {
        WakeKey::Queue(queue.to_string())
    } else {
        WakeKey::Group(queue.to_string(), group.to_string())
    }
}
