//! Partitions known to have messages for a queue and group, offered to the next queue-level
//! pop of that queue and group on this broker: those an ack of this broker released with
//! messages left behind, and those a commit (of any broker: its `NOTIFY` names them) just
//! wrote, for every group that pops the queue here.
//!
//! Under a steady load almost every ack ends its lease with more messages waiting in the
//! partition, and under a live load every commit writes partitions a consumer waits for. The
//! one-statement pop ([`crate::storage::consume::statements::READY_SQL`]) would find those partitions
//! through its lists, but it is a large statement (three candidate lists, a sort and a row
//! lock each, initialised on every call), and under a live load it mostly came back empty: the
//! partition that rang had been taken by the pop woken before. A pop that knows which
//! partition to take claims it by primary key instead ([`crate::storage::consume`]'s hand-off
//! claim), a statement half the size that reads one row.
//!
//! A hand-off is only a hint: the claim checks in PostgreSQL, as every claim does, that the
//! lease is free and that messages wait past the committed offset, so a hint that went stale
//! (another pop or broker took the partition meanwhile) claims nothing and the pop moves on.
//! The lists the one-statement pop reads (leases that ran out, partitions written since the
//! watermark, releases by other brokers) still get their turn: a pop runs the one-statement
//! pop whenever no hand-off waits (a long-poll's look, at most every
//! [`crate::storage::segments::cache::WOKEN_FULL_POP_EVERY`] per group), and at least every
//! [`ONE_STATEMENT_EVERY`]-th pop of a queue and group on this broker even when some do.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Hand-offs kept per (queue, group) at most; a release or write beyond them is left to the
/// one-statement pop's lists.
pub const MAX_PER_GROUP: usize = 256;

/// (queue, group) pairs kept at most; beyond them the book starts over.
const MAX_GROUPS: usize = 4096;

/// Pops of a queue and group in a row that take hand-offs, at most, before one runs the
/// one-statement pop (which serves leases that ran out first). Only pops that find a hand-off
/// waiting count, i.e. a broker under load (a pop finding none runs the one-statement pop
/// anyway), where 32 pops are a few milliseconds; at 8 the large statement was one pop in
/// seven of the pop+ack bench (docs/history/benchmarks.md, sixteenth run).
pub const ONE_STATEMENT_EVERY: usize = 32;

#[derive(Debug, Default)]
struct Waiting {
    /// Partition database ids, oldest offer first.
    list: VecDeque<i64>,
    /// Hand-offs taken since a pop of this queue and group last ran the one-statement pop.
    taken: usize,
}

impl Waiting {
    /// The oldest hand-off, counted, unless none waits or the one-statement pop is due.
    fn in_turn(&mut self) -> Option<i64> {
        if self.list.is_empty() || self.taken + 1 >= ONE_STATEMENT_EVERY {
            return None;
        }
        self.taken += 1;
        self.list.pop_front()
    }

    /// Adds the partition at the back, unless it waits already or the list is full.
    fn add(&mut self, partition_id: i64) {
        if self.list.len() < MAX_PER_GROUP && !self.list.contains(&partition_id) {
            self.list.push_back(partition_id);
        }
    }
}

/// The hand-offs of this broker, by queue then group (looked up without allocating); cheap
/// to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Handoffs {
    by_queue: Mutex<HashMap<String, HashMap<String, Waiting>>>,
}

impl Handoffs {
    /// Offers the partition `partition_id` to the next pops of `(queue, group)` (once; at
    /// most [`MAX_PER_GROUP`] wait).
    pub fn offer(&self, queue: &str, group: &str, partition_id: i64) {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        Self::entered(&mut by_queue, queue, group);
        if let Some(waiting) = by_queue.get_mut(queue).and_then(|g| g.get_mut(group)) {
            waiting.add(partition_id);
        }
    }

    /// The partition of the oldest hand-off of `(queue, group)`, unless none waits or the
    /// one-statement pop is due (then `None`, and the caller runs it: the count starts over).
    ///
    /// The first call for a pair enters it in the book, so that writes are offered to it from
    /// then on ([`Handoffs::written`]).
    pub fn next(&self, queue: &str, group: &str) -> Option<i64> {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        if Self::entered(&mut by_queue, queue, group) {
            return None;
        }
        let waiting = by_queue.get_mut(queue)?.get_mut(group)?;
        let next = waiting.in_turn();
        if next.is_none() {
            waiting.taken = 0;
        }
        next
    }

    /// The partition of the oldest hand-off of `(queue, group)` for a lease claimed ahead of
    /// the next pop (`storage::consume::ahead`), counted like a pop's; `None` when none waits or the
    /// one-statement pop is due (which is left to the next pop: its turn is not spent here).
    pub fn next_ahead(&self, queue: &str, group: &str) -> Option<i64> {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        by_queue.get_mut(queue)?.get_mut(group)?.in_turn()
    }

    /// The partition of the oldest hand-off of `(queue, group)`, whether or not the
    /// one-statement pop is due (it just ran and found nothing).
    pub fn take(&self, queue: &str, group: &str) -> Option<i64> {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        by_queue.get_mut(queue)?.get_mut(group)?.list.pop_front()
    }

    /// Enters `(queue, group)` in the book, if it is not yet: a queue-level pop of the pair
    /// ran on this broker, so writes to the queue are offered to it from now on.
    pub fn enter(&self, queue: &str, group: &str) {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        Self::entered(&mut by_queue, queue, group);
    }

    /// Enters the pair unless it is known; whether it was new.
    fn entered(
        by_queue: &mut HashMap<String, HashMap<String, Waiting>>,
        queue: &str,
        group: &str,
    ) -> bool {
        if by_queue.get(queue).is_some_and(|g| g.contains_key(group)) {
            return false;
        }
        if by_queue.values().map(HashMap::len).sum::<usize>() >= MAX_GROUPS {
            by_queue.clear();
        }
        by_queue
            .entry(queue.to_string())
            .or_default()
            .insert(group.to_string(), Waiting::default());
        true
    }

    /// Offers the partition `partition_id` of `queue`, which a commit just wrote, to every
    /// group that pops the queue on this broker (those in the book), unless it waits already
    /// or the group's list is full.
    pub fn written(&self, queue: &str, partition_id: i64) {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        for waiting in by_queue
            .get_mut(queue)
            .into_iter()
            .flat_map(|g| g.values_mut())
        {
            waiting.add(partition_id);
        }
    }

    /// Drops the hand-off of `partition_id` for `(queue, group)`, if one waits: a pop just
    /// claimed that partition another way.
    pub fn forget(&self, queue: &str, group: &str, partition_id: i64) {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        if let Some(waiting) = by_queue.get_mut(queue).and_then(|g| g.get_mut(group)) {
            waiting.list.retain(|p| *p != partition_id);
        }
    }

    /// Hand-offs waiting for `(queue, group)`.
    pub fn waiting(&self, queue: &str, group: &str) -> usize {
        let by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        by_queue
            .get(queue)
            .and_then(|g| g.get(group))
            .map_or(0, |w| w.list.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_offs_leave_in_release_order_once_each_and_per_group() {
        let h = Handoffs::default();
        h.offer("q", "g", 1);
        h.offer("q", "g", 2);
        h.offer("q", "g", 1);
        h.offer("q", "other", 3);
        assert_eq!(h.waiting("q", "g"), 2);
        assert_eq!(h.next("q", "g"), Some(1));
        assert_eq!(h.next("q", "g"), Some(2));
        assert_eq!(h.next("q", "g"), None);
        assert_eq!(h.next("q", "other"), Some(3));
        assert_eq!(h.next("nobody", "g"), None);
    }

    #[test]
    fn a_forgotten_hand_off_is_not_offered_and_the_list_is_bounded() {
        let h = Handoffs::default();
        for id in 0..(MAX_PER_GROUP as i64 + 10) {
            h.offer("q", "g", id);
        }
        assert_eq!(h.waiting("q", "g"), MAX_PER_GROUP);
        h.forget("q", "g", 0);
        assert_eq!(h.next("q", "g"), Some(1));
    }

    #[test]
    fn the_one_statement_pop_gets_its_turn_while_hand_offs_wait() {
        let h = Handoffs::default();
        for id in 0..2 * ONE_STATEMENT_EVERY as i64 {
            h.offer("q", "g", id);
        }
        let taken: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY).map(|_| h.next("q", "g")).collect();
        let expected: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY as i64 - 1)
            .map(Some)
            .chain([None])
            .collect();
        assert_eq!(taken, expected, "the last one runs the one-statement pop");
        assert_eq!(
            h.take("q", "g"),
            Some(ONE_STATEMENT_EVERY as i64 - 1),
            "when it found nothing, the hand-off it skipped"
        );
        assert_eq!(h.next("q", "g"), Some(ONE_STATEMENT_EVERY as i64));
    }

    #[test]
    fn a_claim_ahead_takes_hand_offs_but_leaves_the_one_statement_turn_to_a_pop() {
        let h = Handoffs::default();
        assert_eq!(
            h.next_ahead("q", "g"),
            None,
            "an unknown group is not entered"
        );
        assert_eq!(h.next("q", "g"), None, "the first pop enters the group");
        for id in 0..2 * ONE_STATEMENT_EVERY as i64 {
            h.offer("q", "g", id);
        }
        let ahead: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY)
            .map(|_| h.next_ahead("q", "g"))
            .collect();
        let expected: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY as i64 - 1)
            .map(Some)
            .chain([None])
            .collect();
        assert_eq!(ahead, expected);
        assert_eq!(h.next_ahead("q", "g"), None, "the turn is still due");
        assert_eq!(
            h.next("q", "g"),
            None,
            "the next pop runs the one-statement pop"
        );
        assert_eq!(h.next_ahead("q", "g"), Some(ONE_STATEMENT_EVERY as i64 - 1));
    }

    #[test]
    fn a_write_is_offered_once_to_each_group_that_pops_the_queue() {
        let h = Handoffs::default();
        h.written("q", 7);
        assert_eq!(h.waiting("q", "g"), 0, "nobody pops q yet: nothing kept");
        assert_eq!(h.next("q", "g"), None, "the first pop enters the group");
        assert_eq!(h.next("q", "h"), None);
        h.offer("q", "g", 5);
        h.written("q", 5);
        h.written("q", 7);
        h.written("q", 7);
        h.written("other", 9);
        assert_eq!(h.waiting("q", "g"), 2);
        assert_eq!(h.waiting("q", "h"), 2);
        assert_eq!(h.next("q", "g"), Some(5));
        assert_eq!(h.next("q", "g"), Some(7));
        assert_eq!(h.next("q", "h"), Some(5));
        assert_eq!(h.waiting("other", "g"), 0);
    }
}
