//! `PartitionActor`: owns one partition's writes.
//!
//! One segment is in flight at a time. Pushes that arrive meanwhile wait in `pending` and leave
//! together as the next segment (group commit), which is why offset order equals commit order
//! and why many small concurrent pushes cost one row. The actor never awaits while holding its
//! state: a commit runs as a spawned future whose completion handler flushes again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use crate::committer::{CommitFailure, SegmentReady};
use crate::error::{PushError, StoreError};
use crate::message::{Item, PartitionKey, Verdict};
use crate::registry::Registry;
use crate::spool::record::Record;
use crate::spool::SpoolHandle;
use crate::store::SegmentWrite;

/// Limits of one partition actor.
#[derive(Clone, Debug)]
pub struct PartitionLimits {
    /// Items waiting behind the in-flight write before pushes are refused (503).
    pub max_pending_items: usize,
    /// Items packed into one segment at most (a single request's group is never split).
    pub max_segment_items: usize,
    /// An actor with nothing to do for this long stops.
    pub idle_after: Duration,
    /// Live partition actors at most: creating one more first evicts the least recently used
    /// idle ones (an actor with a write pending or in flight is never evicted, so a burst over
    /// that many busy partitions may exceed it until their writes settle).
    pub max_actors: usize,
}

impl Default for PartitionLimits {
    fn default() -> Self {
        Self {
            max_pending_items: 100_000,
            max_segment_items: 10_000,
            idle_after: Duration::from_secs(30),
            max_actors: 10_000,
        }
    }
}

/// The verdicts of one push group, or why there are none.
pub type GroupResult = Result<Vec<Verdict>, PushError>;

/// Items of one request for this partition, in body order.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), Refused>")]
pub struct Push {
    /// The items, in body order.
    pub items: Vec<Item>,
    /// Where the verdicts go, one per item, once the write is settled.
    pub reply: oneshot::Sender<GroupResult>,
}

/// Why an actor did not take a push; the items come back untouched.
#[derive(Debug)]
pub enum Refused {
    /// The actor is stopping; ask the registry for a fresh one.
    Closing(Push),
    /// Too many items are already waiting.
    Overloaded(Push),
}

struct Waiting {
    items: Vec<Item>,
    reply: oneshot::Sender<GroupResult>,
}

/// The actor owning one partition's write; see the module docs.
///
/// Kept small on purpose (one lives per recently written partition): what every actor shares
/// (committers, limits, spool) is reached through the registry handle, not copied.
pub struct PartitionActor {
    key: PartitionKey,
    partition_id: Option<i64>,
    registry: Registry,
    /// The registry entry's work counter: pushes on their way here, plus one while this actor
    /// has a write pending or in flight (`holding`). Zero means the registry may evict it.
    work: Arc<AtomicUsize>,
    pending: VecDeque<Waiting>,
    pending_items: usize,
    in_flight: bool,
    holding: bool,
    closing: bool,
    /// Removed from the registry while busy (only possible for a push sent straight to the
    /// address): stop once the write settles.
    evicted: bool,
    last_active: Instant,
}

impl PartitionActor {
    /// Creates the actor for `key`; it writes through the registry's committers, and spools
    /// through its spool when a commit fails (without a spool, a failed commit is an error for
    /// the producer). `work` is the registry entry's counter (see [`Registry`]).
    pub fn new(key: PartitionKey, registry: Registry, work: Arc<AtomicUsize>) -> Self {
        Self {
            key,
            partition_id: None,
            registry,
            work,
            pending: VecDeque::new(),
            pending_items: 0,
            in_flight: false,
            holding: false,
            closing: false,
            evicted: false,
            last_active: Instant::now(),
        }
    }

    fn limits(&self) -> &PartitionLimits {
        self.registry.limits()
    }

    fn spool(&self) -> Option<&SpoolHandle> {
        self.registry.spool()
    }

    /// Sends everything waiting (up to the segment limit) as the next segment: to a committer,
    /// or to the spool when the partition already has spooled items or maintenance is on.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.pending.is_empty() {
            return;
        }
        let mut groups: Vec<(usize, oneshot::Sender<GroupResult>)> = Vec::new();
        let mut items: Vec<Item> = Vec::new();
        while let Some(front) = self.pending.front() {
            let fits = items.is_empty()
                || items.len() + front.items.len() <= self.limits().max_segment_items;
            if !fits {
                break;
            }
            let waiting = self.pending.pop_front().expect("front was just seen");
            groups.push((waiting.items.len(), waiting.reply));
            items.extend(waiting.items);
        }
        self.pending_items -= items.len();
        self.in_flight = true;

        if let Some(spool) = self.spool() {
            let force = spool.state.maintenance();
            if spool
                .state
                .route_to_spool(&self.key, items.len() as u64, force)
            {
                self.spool_items(items, groups, ctx);
                return;
            }
        }

        let (reply, result) = oneshot::channel();
        self.registry.committers().submit(SegmentReady {
            write: SegmentWrite {
                key: self.key.clone(),
                partition_id: self.partition_id,
                items,
            },
            reply,
        });
        let settled = async move {
            result.await.unwrap_or_else(|_| {
                Err(CommitFailure {
                    error: StoreError::Transaction("committer stopped before answering".into()),
                    items: Vec::new(),
                })
            })
        };
        ctx.spawn(settled.into_actor(self).map(move |result, act, ctx| match result {
            Ok(outcome) => {
                if let Some(spool) = act.spool() {
                    spool.state.mark_db_up();
                }
                act.partition_id = Some(outcome.partition_id);
                let mut verdicts = outcome.verdicts.into_iter();
                for (count, reply) in groups {
                    let share: Vec<Verdict> = verdicts.by_ref().take(count).collect();
                    // A producer that hung up no longer needs its answer; the write stands.
                    let _ = reply.send(Ok(share));
                }
                act.write_done(ctx);
            }
            Err(failure) => {
                tracing::warn!(partition = %act.key, error = %failure.error, "segment commit failed");
                // The partition may have been deleted and recreated: look its id up again.
                act.partition_id = None;
                match act.spool() {
                    Some(spool) if !failure.items.is_empty() => {
                        if matches!(failure.error, StoreError::Unavailable(_)) {
                            spool.state.mark_db_down();
                        }
                        spool.state.reserve(&act.key, failure.items.len() as u64);
                        act.spool_items(failure.items, groups, ctx);
                    }
                    _ => {
                        for (_, reply) in groups {
                            let _ = reply.send(Err(PushError::CommitFailed(failure.error.to_string())));
                        }
                        act.write_done(ctx);
                    }
                }
            }
        }));
    }

    /// Appends items (their spool places already reserved) and answers `buffered`, or `failed`
    /// when the spool could not take them. First wins, as on the live path: an item whose
    /// transactionId an earlier item of the segment carries is answered `duplicate` naming
    /// that item's id and is not spooled.
    fn spool_items(
        &mut self,
        items: Vec<Item>,
        groups: Vec<(usize, oneshot::Sender<GroupResult>)>,
        ctx: &mut Context<Self>,
    ) {
        let spool = self.spool().cloned().expect("only called with a spool");
        let mut first: std::collections::HashMap<String, uuid::Uuid> =
            std::collections::HashMap::new();
        let mut repeats: Vec<Option<Verdict>> = Vec::with_capacity(items.len());
        let mut records: Vec<Record> = Vec::with_capacity(items.len());
        for item in items {
            if let Some(id) = first.get(&item.transaction_id) {
                repeats.push(Some(Verdict::Duplicate(*id)));
                continue;
            }
            first.insert(item.transaction_id.clone(), item.message_id);
            repeats.push(None);
            records.push(Record {
                key: self.key.clone(),
                item,
            });
        }
        let duplicates = (repeats.len() - records.len()) as u64;
        if duplicates > 0 {
            spool.state.release(&self.key, duplicates);
        }
        let appended = async move {
            if records.is_empty() {
                return Ok(());
            }
            spool.append(records).await
        };
        ctx.spawn(appended.into_actor(self).map(move |result, act, ctx| {
            let verdict = match result {
                Ok(()) => Verdict::Buffered,
                Err(e) => {
                    tracing::error!(partition = %act.key, error = %e, "items could not be spooled");
                    Verdict::Failed
                }
            };
            let mut verdicts = repeats.into_iter().map(|r| r.unwrap_or(verdict));
            for (count, reply) in groups {
                let _ = reply.send(Ok(verdicts.by_ref().take(count).collect()));
            }
            act.write_done(ctx);
        }));
    }

    fn write_done(&mut self, ctx: &mut Context<Self>) {
        self.in_flight = false;
        self.last_active = Instant::now();
        self.flush(ctx);
        if !self.in_flight && self.pending.is_empty() {
            // Idle: hand the queue's buffer back (four slots, allocated by the first push).
            // One actor lives per recently written partition and most of them are idle, so a
            // kept buffer is memory per partition; a busy actor keeps it between writes.
            self.pending = VecDeque::new();
            self.release_hold();
            if self.evicted {
                self.closing = true;
                ctx.stop();
            }
        }
    }

    /// Counts this actor's pending work in its registry entry (once), so it is not evicted.
    fn hold(&mut self) {
        if !self.holding {
            self.work.fetch_add(1, Ordering::AcqRel);
            self.holding = true;
        }
    }

    /// Nothing pending or in flight any more: the registry may evict this actor.
    fn release_hold(&mut self) {
        if self.holding {
            self.work.fetch_sub(1, Ordering::AcqRel);
            self.holding = false;
        }
    }

    fn idle(&self) -> bool {
        !self.in_flight && self.pending.is_empty()
    }
}

impl Actor for PartitionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
    }
}

/// Sent by the registry after it removed this actor (idle too long, or the least recently used
/// one when the registry is full): stop now, or once the write in flight settles.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Evict;

impl Handler<Evict> for PartitionActor {
    type Result = ();

    fn handle(&mut self, _: Evict, ctx: &mut Context<Self>) {
        // The registry no longer names us, so no new push can find us through it; one sent
        // straight to the address is refused with `Closing` and retried on a fresh actor.
        if self.idle() {
            self.closing = true;
            ctx.stop();
        } else {
            self.evicted = true;
        }
    }
}

/// Sent by tests (and formerly the registry's sweeper): stop if idle for the configured time.
#[derive(Message)]
#[rtype(result = "()")]
pub struct IdleCheck;

impl Handler<IdleCheck> for PartitionActor {
    type Result = ();

    fn handle(&mut self, _: IdleCheck, ctx: &mut Context<Self>) {
        let idle = self.idle() && self.last_active.elapsed() >= self.limits().idle_after;
        // Leave the registry first, and only when no push is on its way here (a stopped
        // actor's queued messages are dropped); a push sent straight to our address after that
        // is refused with `Closing` and retried on a fresh actor.
        if idle && self.registry.retire(&self.key, &ctx.address()) {
            self.closing = true;
            ctx.stop();
        }
    }
}

impl Handler<Push> for PartitionActor {
    type Result = Result<(), Refused>;

    fn handle(&mut self, push: Push, ctx: &mut Context<Self>) -> Self::Result {
        if self.closing {
            return Err(Refused::Closing(push));
        }
        if self.pending_items > 0
            && self.pending_items + push.items.len() > self.limits().max_pending_items
        {
            return Err(Refused::Overloaded(push));
        }
        // Taken before the push's own in-transit count is dropped (the sender still holds it
        // while this handler runs), so the entry's counter never reads 0 with work here.
        self.hold();
        self.last_active = Instant::now();
        self.pending_items += push.items.len();
        self.pending.push_back(Waiting {
            items: push.items,
            reply: push.reply,
        });
        self.flush(ctx);
        Ok(())
    }
}
