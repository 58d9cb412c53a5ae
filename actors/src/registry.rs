//! `Registry`: (queue, partition) → the partition's actor, created on demand.
//!
//! Actors run on a few dedicated arbiters (threads), chosen by the key's hash, so every HTTP
//! worker reaches the same actor for a partition. Actors are evicted when idle for
//! `idle_after`, and the least recently used idle ones when more than `max_actors` are alive, so
//! the registry (and the broker's memory) does not grow with the number of partitions ever
//! written. An actor is only evicted when no push is on its way to it and it has no write
//! pending or in flight: [`Registry::push`] counts a push in the actor's entry from the lookup
//! until the actor has read it (actix drops the messages still queued in a stopped actor's
//! mailbox), and the actor counts itself while it has work. A push that finds the actor closing
//! anyway (sent straight to its address) is refused with `Closing` and retried on a new actor.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hashlink::LinkedHashMap;

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::committer::CommitterPool;
use crate::error::PushError;
use crate::message::{Item, PartitionKey};
use crate::partition::{Evict, GroupResult, PartitionActor, PartitionLimits, Push, Refused};
use crate::spool::SpoolHandle;

/// How long a producer is asked to wait when the broker is saturated.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A live actor, its work counter and when a push last looked it up.
struct Entry {
    addr: Addr<PartitionActor>,
    /// Pushes on their way to the actor (looked up, not yet read by it), plus one while the
    /// actor has a write pending or in flight. Zero: the actor may be evicted.
    work: Arc<AtomicUsize>,
    last_used: Instant,
}

/// One push counted in its actor's entry until dropped.
struct InTransit(Arc<AtomicUsize>);

impl Drop for InTransit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Entries in least recently used order (front: the one looked up longest ago).
type Actors = LinkedHashMap<PartitionKey, Entry>;

/// What every partition actor shares; actors reach it through their [`Registry`] handle
/// instead of holding copies (one actor lives per recently written partition).
struct Inner {
    actors: Mutex<Actors>,
    arbiters: Vec<ArbiterHandle>,
    committers: CommitterPool,
    limits: PartitionLimits,
    spool: Option<SpoolHandle>,
    evicted: AtomicU64,
}

/// Shared handle to the partition actors; cheap to clone.
///
/// The registry holds at most [`PartitionLimits::max_actors`] actors: creating one more first
/// evicts the least recently used idle ones. An actor that has been idle for
/// [`PartitionLimits::idle_after`] is evicted by a sweeper that walks the entries from the
/// least recently used end and stops at the first recent one, so a sweep costs what it evicts,
/// not what is alive. Eviction only takes an entry whose work counter is zero (no push on its
/// way, no write pending or in flight), under the registry's lock, so no push can reach the
/// evicted actor through the registry afterwards, and the next push to that partition starts a
/// fresh actor that continues its offsets (the store allocates them under the partition's row
/// lock; the actor only remembers the partition's database id).
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

/// How many busy entries eviction skips (moving them to the recent end) before it gives up
/// for this insert; bounds the time spent under the lock when many partitions are busy.
const EVICTION_SKIPS: usize = 8;

impl Registry {
    /// A registry whose actors run on `arbiters` and write through `committers`.
    pub fn new(
        arbiters: Vec<ArbiterHandle>,
        committers: CommitterPool,
        limits: PartitionLimits,
        spool: Option<SpoolHandle>,
    ) -> Self {
        assert!(
            !arbiters.is_empty(),
            "the registry needs at least one arbiter"
        );
        let registry = Self {
            inner: Arc::new(Inner {
                actors: Mutex::new(LinkedHashMap::new()),
                arbiters,
                committers,
                limits,
                spool,
                evicted: AtomicU64::new(0),
            }),
        };
        registry.start_idle_sweeper();
        registry
    }

    /// The committers every actor writes through.
    pub(crate) fn committers(&self) -> &CommitterPool {
        &self.inner.committers
    }

    /// The limits of every actor.
    pub(crate) fn limits(&self) -> &PartitionLimits {
        &self.inner.limits
    }

    /// The spool, when there is one.
    pub(crate) fn spool(&self) -> Option<&SpoolHandle> {
        self.inner.spool.as_ref()
    }

    /// One timer for all actors (not one per actor, which costs memory per live partition):
    /// every half idle period the entries not looked up for the idle period, and idle, are
    /// evicted, least recently used first.
    fn start_idle_sweeper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let every = (self.inner.limits.idle_after / 2).max(std::time::Duration::from_millis(10));
        self.inner.arbiters[0].spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let idle_after = inner.limits.idle_after;
                let evicted = {
                    let mut actors = inner.actors.lock().expect("registry lock poisoned");
                    evict(&mut actors, 0, |e| e.last_used.elapsed() >= idle_after)
                };
                inner
                    .evicted
                    .fetch_add(evicted.len() as u64, Ordering::Relaxed);
                drop(inner);
                for addr in evicted {
                    addr.do_send(Evict);
                }
            }
        });
    }

    /// The actor for `key`, started if there is none.
    pub fn actor(&self, key: &PartitionKey) -> Addr<PartitionActor> {
        self.checkout(key).0
    }

    /// The actor for `key` (started if there is none) and a count of one push on its way to it.
    fn checkout(&self, key: &PartitionKey) -> (Addr<PartitionActor>, InTransit) {
        let mut actors = self.inner.actors.lock().expect("registry lock poisoned");
        if let Some(entry) = actors.to_back(key) {
            if entry.addr.connected() {
                entry.work.fetch_add(1, Ordering::AcqRel);
                entry.last_used = Instant::now();
                return (entry.addr.clone(), InTransit(entry.work.clone()));
            }
        }
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let arbiter = &self.inner.arbiters[hasher.finish() as usize % self.inner.arbiters.len()];
        let work = Arc::new(AtomicUsize::new(1));
        let (k, registry, counter) = (key.clone(), self.clone(), work.clone());
        let addr = PartitionActor::start_in_arbiter(arbiter, move |_| {
            PartitionActor::new(k, registry, counter)
        });
        actors.insert(
            key.clone(),
            Entry {
                addr: addr.clone(),
                work: work.clone(),
                last_used: Instant::now(),
            },
        );
        // Full: make room by evicting the least recently used idle actors (never the new one,
        // which a push is about to reach: its counter is 1).
        let over = actors.len().saturating_sub(self.inner.limits.max_actors);
        let evicted = if over > 0 {
            evict(&mut actors, over, |_| true)
        } else {
            Vec::new()
        };
        drop(actors);
        if !evicted.is_empty() {
            self.inner
                .evicted
                .fetch_add(evicted.len() as u64, Ordering::Relaxed);
            for old in evicted {
                old.do_send(Evict);
            }
        }
        (addr, InTransit(work))
    }

    /// Removes `key` if it still maps to `addr`.
    pub fn forget(&self, key: &PartitionKey, addr: &Addr<PartitionActor>) {
        let mut actors = self.inner.actors.lock().expect("registry lock poisoned");
        if actors.get(key).is_some_and(|current| current.addr == *addr) {
            actors.remove(key);
        }
    }

    /// Called by an idle actor: removes it, unless a push is on its way to it. Returns whether
    /// it may stop (nothing can reach it through the registry any more).
    pub fn retire(&self, key: &PartitionKey, addr: &Addr<PartitionActor>) -> bool {
        let mut actors = self.inner.actors.lock().expect("registry lock poisoned");
        match actors.get(key) {
            Some(current) if current.addr == *addr => {
                if current.work.load(Ordering::Acquire) > 0 {
                    return false;
                }
                actors.remove(key);
                true
            }
            // Already replaced or forgotten: no new push can find it.
            _ => true,
        }
    }

    /// Number of live partition actors.
    pub fn len(&self) -> usize {
        self.inner
            .actors
            .lock()
            .expect("registry lock poisoned")
            .len()
    }

    /// Whether no partition actor is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Actors evicted so far (idle too long, or the registry full).
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    /// Pushes one partition's items (body order) and waits for their verdicts.
    ///
    /// # Errors
    ///
    /// [`PushError::Overloaded`] when the partition's queue is full, [`PushError::ActorStopped`]
    /// when the actor vanished, [`PushError::CommitFailed`] when the write failed.
    pub async fn push(&self, key: &PartitionKey, items: Vec<Item>) -> GroupResult {
        self.hand_over(key, items).await?.verdicts().await
    }

    /// Hands one partition's items (body order) to its actor and returns once the actor holds
    /// them, without waiting for their commit. Items handed over one call after another are
    /// stored in that order, so a caller that must keep the order of several pushes to one
    /// partition (a Kafka connection's pipelined produces) awaits each hand-over before it
    /// makes the next, and the verdicts whenever it likes.
    ///
    /// # Errors
    ///
    /// [`PushError::Overloaded`] when the partition's queue is full, [`PushError::ActorStopped`]
    /// when the actor vanished.
    pub async fn hand_over(
        &self,
        key: &PartitionKey,
        items: Vec<Item>,
    ) -> Result<Handed, PushError> {
        let (reply, verdicts) = oneshot::channel();
        let mut push = Push { items, reply };
        // A few attempts cover an actor that stopped between lookup and send.
        for _ in 0..8 {
            let (addr, in_transit) = self.checkout(key);
            let sent = addr.send(push).await;
            drop(in_transit);
            match sent {
                Ok(Ok(())) => return Ok(Handed(verdicts)),
                Ok(Err(Refused::Overloaded(_))) => return Err(PushError::Overloaded(RETRY_AFTER)),
                Ok(Err(Refused::Closing(returned))) => {
                    self.forget(key, &addr);
                    push = returned;
                }
                Err(MailboxError::Closed) => {
                    self.forget(key, &addr);
                    return Err(PushError::ActorStopped);
                }
                Err(MailboxError::Timeout) => return Err(PushError::Overloaded(RETRY_AFTER)),
            }
        }
        Err(PushError::ActorStopped)
    }
}

/// Items a partition actor holds (see [`Registry::hand_over`]); their verdicts come once they
/// are committed or spooled.
#[derive(Debug)]
pub struct Handed(oneshot::Receiver<GroupResult>);

impl Handed {
    /// Waits for the verdicts of the handed items.
    ///
    /// # Errors
    ///
    /// As [`Registry::push`].
    pub async fn verdicts(self) -> GroupResult {
        self.0.await.unwrap_or(Err(PushError::ActorStopped))
    }
}

/// Removes idle entries from the least recently used end: up to `count` of them (0: no limit)
/// among those `due` says may go, stopping at the first entry that is not due (the rest are
/// more recent). A busy entry (work counter above zero) is moved to the recent end and skipped,
/// at most [`EVICTION_SKIPS`] times. Returns the evicted actors' addresses; the caller tells
/// each to stop once the lock is released.
fn evict(
    actors: &mut Actors,
    count: usize,
    due: impl Fn(&Entry) -> bool,
) -> Vec<Addr<PartitionActor>> {
    let mut out = Vec::new();
    let mut skipped = 0;
    while count == 0 || out.len() < count {
        let Some((key, entry)) = actors.front() else {
            break;
        };
        if !due(entry) {
            break;
        }
        if entry.work.load(Ordering::Acquire) > 0 {
            if skipped == EVICTION_SKIPS {
                break;
            }
            skipped += 1;
            let key = key.clone();
            if let Some(e) = actors.to_back(&key) {
                e.last_used = Instant::now();
            }
            continue;
        }
        let (_, entry) = actors.pop_front().expect("front was just seen");
        out.push(entry.addr);
    }
    out
}
