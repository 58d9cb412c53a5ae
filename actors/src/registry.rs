//! `Registry`: (queue, partition) → the partition's actor, created on demand.
//!
//! Actors run on a few dedicated arbiters (threads), chosen by the key's hash, so every HTTP
//! worker reaches the same actor for a partition. An idle actor removes itself and stops; a push
//! that raced with that is refused with `Closing` and [`Registry::push`] retries on a new actor.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
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

struct Inner {
    actors: Mutex<HashMap<PartitionKey, Addr<PartitionActor>>>,
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
                    .cloned()
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
        let mut actors = self.inner.actors.lock().expect("registry lock poisoned");
        if let Some(addr) = actors.get(key) {
            if addr.connected() {
                return addr.clone();
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
        actors.insert(key.clone(), addr.clone());
        addr
    }

    /// Removes `key` if it still maps to `addr` (called by a stopping actor).
    pub fn forget(&self, key: &PartitionKey, addr: &Addr<PartitionActor>) {
        let mut actors = self.inner.actors.lock().expect("registry lock poisoned");
        if actors.get(key).is_some_and(|current| current == addr) {
            actors.remove(key);
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
            let addr = self.actor(key);
            match addr.send(push).await {
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
