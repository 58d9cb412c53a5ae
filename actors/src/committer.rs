//! `Committer`: merges ready segments of many partitions into one transaction.
//!
//! Segments that arrive while a transaction is in flight wait and leave together in the next
//! one (group commit: flush as soon as the previous commit returns). Several committers run side
//! by side, each with its own store (its own connection); [`CommitterPool`] routes a segment to
//! the least busy one. A partition is never in two transactions at once because its actor keeps
//! a single write in flight, so each committer's backlog is bounded by the number of partitions
//! with pending writes.
//!
//! A transaction that fails for a reason other than PostgreSQL being unreachable (a value it
//! refuses, say) is retried segment by segment, so the partitions that merely shared it are
//! not held back: only the segment that fails on its own is reported failed (and spooled by
//! its partition actor, whose replay isolates the refused item).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::error::StoreError;
use crate::message::Item;
use crate::observe::{CommitObserver, CommitReport};
use crate::store::{SegmentOutcome, SegmentStore, SegmentWrite};

/// A commit that did not happen: why, and the items, so they can go to the spool.
#[derive(Debug)]
pub struct CommitFailure {
    /// What went wrong.
    pub error: StoreError,
    /// The segment's items, untouched.
    pub items: Vec<Item>,
}

/// What a partition actor learns about its segment.
pub type SegmentResult = Result<SegmentOutcome, CommitFailure>;

/// A partition's ready segment, handed to a committer.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SegmentReady {
    /// The segment.
    pub write: SegmentWrite,
    /// Where the outcome goes.
    pub reply: oneshot::Sender<SegmentResult>,
}

/// Limits of one committer.
#[derive(Clone, Debug)]
pub struct CommitterLimits {
    /// Segments merged into one transaction at most.
    pub max_batch_segments: usize,
    /// Items merged into one transaction at most (a single segment is never split).
    pub max_batch_items: usize,
}

impl Default for CommitterLimits {
    fn default() -> Self {
        Self {
            max_batch_segments: 1_000,
            max_batch_items: 20_000,
        }
    }
}

/// Whether committers commit one transaction at a time now (consumers are draining a
/// backlog), and how long they pause between transactions meanwhile; shared by a
/// [`CommitterPool`] and its committers ([`Committer::with_serial`]).
#[derive(Debug)]
pub struct Serial {
    /// Until when (milliseconds after `epoch`) nothing spills.
    until: AtomicU64,
    /// While serialized, the pause after each transaction (microseconds).
    rest_us: AtomicU64,
    epoch: Instant,
}

impl Default for Serial {
    fn default() -> Self {
        Self {
            until: AtomicU64::new(0),
            rest_us: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Serial {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether transactions are serialized now.
    pub fn active(&self) -> bool {
        self.now_ms() < self.until.load(Ordering::Relaxed)
    }

    /// The pause after each transaction while serialized (zero when not).
    pub fn rest(&self) -> Duration {
        if !self.active() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.rest_us.load(Ordering::Relaxed))
    }

    fn extend(&self, period: Duration, rest: Duration) {
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
        self.until.fetch_max(until, Ordering::Relaxed);
        let us = u64::try_from(rest.as_micros()).unwrap_or(u64::MAX);
        self.rest_us.store(us, Ordering::Relaxed);
    }
}

/// One committer; see the module docs.
pub struct Committer<S: SegmentStore> {
    id: usize,
    store: Option<S>,
    waiting: Vec<SegmentReady>,
    load: Arc<AtomicUsize>,
    limits: CommitterLimits,
    observer: Option<Arc<dyn CommitObserver>>,
    /// The pool's serial mode: while it is on, a pause after each transaction.
    serial: Option<Arc<Serial>>,
    /// A rest is running: its end starts the next transaction.
    resting: bool,
}

impl<S: SegmentStore> Committer<S> {
    /// A committer writing through `store`; `load` counts items given to it and not answered.
    pub fn new(id: usize, store: S, load: Arc<AtomicUsize>, limits: CommitterLimits) -> Self {
        Self {
            id,
            store: Some(store),
            waiting: Vec::new(),
            load,
            limits,
            observer: None,
            serial: None,
            resting: false,
        }
    }

    /// Follows the serial mode of a pool built [`CommitterPool::with_serial`]: while it is
    /// on, pauses [`Serial::rest`] after each transaction before the next starts (segments
    /// arriving meanwhile wait and leave together).
    #[must_use]
    pub fn with_serial(mut self, serial: Arc<Serial>) -> Self {
        self.serial = Some(serial);
        self
    }

    /// Reports every commit to `observer`.
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn CommitObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Starts the next transaction with everything waiting, unless one is in flight.
    fn start_commit(&mut self, ctx: &mut Context<Self>) {
        if self.waiting.is_empty() {
            return;
        }
        if self.resting {
            return; // the rest's end starts it
        }
        let Some(mut store) = self.store.take() else {
            return; // a transaction is in flight; its completion starts the next one
        };
        let mut take = 0;
        let mut items = 0;
        for ready in &self.waiting {
            let n = ready.write.items.len();
            if take > 0
                && (take >= self.limits.max_batch_segments
                    || items + n > self.limits.max_batch_items)
            {
                break;
            }
            take += 1;
            items += n;
        }
        let batch: Vec<SegmentReady> = self.waiting.drain(..take).collect();
        let id = self.id;
        let observer = self.observer.clone();
        let commit = async move {
            let (writes, replies): (Vec<SegmentWrite>, Vec<_>) =
                batch.into_iter().map(|r| (r.write, r.reply)).unzip();
            let started = std::time::Instant::now();
            let result = store.commit(&writes).await;
            let report = CommitReport {
                segments: writes.len(),
                items,
                elapsed: started.elapsed(),
                committed: result.is_ok(),
            };
            if let Some(observer) = &observer {
                observer.committed(&report);
            }
            tracing::trace!(
                committer = id,
                segments = report.segments,
                items,
                elapsed_us = report.elapsed.as_micros() as u64,
                ok = report.committed,
                "commit"
            );
            let results: Vec<Result<SegmentOutcome, StoreError>> = match result {
                Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
                Err(StoreError::Transaction(e) | StoreError::Refused(e)) if writes.len() > 1 => {
                    tracing::warn!(committer = id, error = %e, segments = writes.len(),
                        "commit refused; committing its segments one by one");
                    let mut each = Vec::with_capacity(writes.len());
                    for write in &writes {
                        // Once PostgreSQL is unreachable, the rest would only wait to fail.
                        if let Some(Err(unreachable @ StoreError::Unavailable(_))) = each.last() {
                            each.push(Err(StoreError::clone(unreachable)));
                            continue;
                        }
                        let alone = store.commit(std::slice::from_ref(write)).await;
                        each.push(alone.map(|mut o| o.remove(0)));
                    }
                    each
                }
                Err(error) => writes.iter().map(|_| Err(error.clone())).collect(),
            };
            (store, writes, replies, results)
        };
        ctx.spawn(
            commit
                .into_actor(self)
                .map(|(store, writes, replies, results), act, ctx| {
                    act.store = Some(store);
                    let answered: usize = writes.iter().map(|w| w.items.len()).sum();
                    act.load.fetch_sub(answered, Ordering::Relaxed);
                    for ((reply, write), result) in replies.into_iter().zip(writes).zip(results) {
                        let _ = reply.send(result.map_err(|error| CommitFailure {
                            error,
                            items: write.items,
                        }));
                    }
                    if let Some(serial) = &act.serial {
                        let gap = serial.rest();
                        if !gap.is_zero() {
                            act.resting = true;
                            ctx.run_later(gap, |act, ctx| {
                                act.resting = false;
                                act.start_commit(ctx);
                            });
                            return;
                        }
                    }
                    act.start_commit(ctx);
                }),
        );
    }
}

impl<S: SegmentStore> Actor for Committer<S> {
    type Context = Context<Self>;
}

impl<S: SegmentStore> Handler<SegmentReady> for Committer<S> {
    type Result = ();

    fn handle(&mut self, ready: SegmentReady, ctx: &mut Context<Self>) {
        self.waiting.push(ready);
        self.start_commit(ctx);
    }
}

/// Routes segments to committers: fill one, then spill to the next.
///
/// A segment goes to the first committer holding fewer than `spill_items` unanswered items, so
/// under light load (small pushes) everything waits behind one transaction and leaves in the
/// next one: fewer, fuller transactions, each paying one WAL flush. Only when every committer
/// up to there is that full does the next one start a transaction in parallel; when all are,
/// the least loaded one takes it.
///
/// While consumers of this broker are draining a backlog ([`CommitterPool::serialize_for`]),
/// nothing spills: every segment waits for the first committer, whose next transaction merges
/// all of them, and that committer pauses between transactions for as long as it is told (the
/// further behind the consumers, the longer). Pushes then cost less CPU each (fuller
/// transactions), are answered later, and take less of the machine, so producers slow down to
/// what the consumers can follow instead of running the backlog up.
#[derive(Clone)]
pub struct CommitterPool {
    committers: Arc<Vec<(Recipient<SegmentReady>, Arc<AtomicUsize>)>>,
    spill_items: usize,
    serial: Arc<Serial>,
}

impl CommitterPool {
    /// A pool over committers and their load counters (as given to [`Committer::new`]).
    pub fn new(
        committers: Vec<(Recipient<SegmentReady>, Arc<AtomicUsize>)>,
        spill_items: usize,
    ) -> Self {
        Self::with_serial(committers, spill_items, Arc::default())
    }

    /// [`CommitterPool::new`], sharing `serial` with committers built
    /// [`Committer::with_serial`].
    pub fn with_serial(
        committers: Vec<(Recipient<SegmentReady>, Arc<AtomicUsize>)>,
        spill_items: usize,
        serial: Arc<Serial>,
    ) -> Self {
        assert!(
            !committers.is_empty(),
            "a committer pool needs at least one committer"
        );
        Self {
            committers: Arc::new(committers),
            spill_items,
            serial,
        }
    }

    /// Commits one transaction at a time (no spilling) for the next `period`, e.g. because
    /// consumers are draining a backlog, and meanwhile pauses `rest` after each transaction
    /// (committers built [`Committer::with_serial`]; the latest call sets the pause); see the
    /// type's docs.
    pub fn serialize_for(&self, period: Duration, rest: Duration) {
        self.serial.extend(period, rest);
    }

    /// The pause between transactions now (zero unless serialized).
    pub fn rest(&self) -> Duration {
        self.serial.rest()
    }

    /// Whether segments spill to parallel transactions now.
    pub fn spills(&self) -> bool {
        !self.serial.active()
    }

    /// Hands a segment to a committer; see the type's docs.
    pub fn submit(&self, ready: SegmentReady) {
        let loads = || {
            self.committers
                .iter()
                .map(|(r, load)| (r, load, load.load(Ordering::Relaxed)))
        };
        let pick = if self.spills() {
            loads()
                .find(|(_, _, items)| *items < self.spill_items)
                .or_else(|| loads().min_by_key(|(_, _, items)| *items))
        } else {
            loads().next()
        };
        let (recipient, load, _) = pick.expect("the pool is never empty");
        load.fetch_add(ready.write.items.len(), Ordering::Relaxed);
        // Unbounded on purpose: each partition has at most one segment here, see module docs.
        recipient.do_send(ready);
    }

    /// Items handed to committers and not yet answered.
    pub fn backlog(&self) -> usize {
        self.committers
            .iter()
            .map(|(_, load)| load.load(Ordering::Relaxed))
            .sum()
    }
}
