//! `Registry`: (queue, partition) → the partition's actor, created on demand.
//!
//! Actors run on a few dedicated arbiters (threads), chosen by the key's hash, so every HTTP
//! worker reaches the same actor for a partition. An idle actor removes itself and stops, but
//! only when no push is on its way to it: [`Registry::push`] counts a push in the actor's entry
//! from the lookup until the actor has read it, because actix drops the messages still queued
//! in a stopped actor's mailbox. A push that finds the actor closing anyway (sent straight to its
//! address) is refused with `Closing` and retried on a new actor.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::committer::CommitterPool;
use crate::error::PushError;
use crate::message::{Item, PartitionKey};
use crate::partition::{GroupResult, IdleCheck, PartitionActor, PartitionLimits, Push, Refused};
use crate::spool::SpoolHandle;

/// How long a producer is asked to wait when the broker is saturated.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A live actor and the pushes on their way to it (looked up, not yet read by it).
struct Entry {
    addr: Addr<PartitionActor>,
    in_transit: Arc<AtomicUsize>,
}

/// One push counted in its actor's entry until dropped.
struct InTransit(Arc<AtomicUsize>);

impl Drop for InTransit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Inner {
    actors: Mutex<HashMap<PartitionKey, Entry>>,
    arbiters: Vec<ArbiterHandle>,
    committers: CommitterPool,
    limits: PartitionLimits,
    spool: Option<SpoolHandle>,
}

/// Shared handle to the partition actors; cheap to clone.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

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
                actors: Mutex::new(HashMap::new()),
                arbiters,
                committers,
                limits,
                spool,
            }),
        };
        registry.start_idle_sweeper();
        registry
    }

    /// One timer for all actors (not one per actor, which costs memory per live partition):
    /// every half idle period each actor is asked to stop if it has been idle long enough.
    fn start_idle_sweeper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let every = (self.inner.limits.idle_after / 2).max(std::time::Duration::from_millis(10));
        self.inner.arbiters[0].spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let actors: Vec<Addr<PartitionActor>> = inner
                    .actors
                    .lock()
                    .expect("registry lock poisoned")
                    .values()
                    .map(|entry| entry.addr.clone())
                    .collect();
                drop(inner);
                for addr in actors {
                    addr.do_send(IdleCheck);
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
        if let Some(entry) = actors.get(key) {
            if entry.addr.connected() {
                entry.in_transit.fetch_add(1, Ordering::AcqRel);
                return (entry.addr.clone(), InTransit(entry.in_transit.clone()));
            }
        }
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let arbiter = &self.inner.arbiters[hasher.finish() as usize % self.inner.arbiters.len()];
        let (k, committers, registry, limits, spool) = (
            key.clone(),
            self.inner.committers.clone(),
            self.clone(),
            self.inner.limits.clone(),
            self.inner.spool.clone(),
        );
        let addr = PartitionActor::start_in_arbiter(arbiter, move |_| {
            PartitionActor::new(k, committers, registry, limits, spool)
        });
        let in_transit = Arc::new(AtomicUsize::new(1));
        actors.insert(
            key.clone(),
            Entry {
                addr: addr.clone(),
                in_transit: in_transit.clone(),
            },
        );
        (addr, InTransit(in_transit))
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
                if current.in_transit.load(Ordering::Acquire) > 0 {
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

    /// Pushes one partition's items (body order) and waits for their verdicts.
    ///
    /// # Errors
    ///
    /// [`PushError::Overloaded`] when the partition's queue is full, [`PushError::ActorStopped`]
    /// when the actor vanished, [`PushError::CommitFailed`] when the write failed.
    pub async fn push(&self, key: &PartitionKey, items: Vec<Item>) -> GroupResult {
        let (reply, verdicts) = oneshot::channel();
        let mut push = Push { items, reply };
        // A few attempts cover an actor that stopped between lookup and send.
        for _ in 0..8 {
            let (addr, in_transit) = self.checkout(key);
            let sent = addr.send(push).await;
            drop(in_transit);
            match sent {
                Ok(Ok(())) => return verdicts.await.unwrap_or(Err(PushError::ActorStopped)),
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
