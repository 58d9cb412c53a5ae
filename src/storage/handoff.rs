//! Partitions an ack of this broker released with messages left behind, offered to the next
//! queue-level pop of the same queue and group on this broker.
//!
//! Under a steady load almost every ack ends its lease with more messages waiting in the
//! partition. The one-statement pop ([`crate::storage::consume::READY_SQL`]) would find that
//! partition again through the "released" list, but it is a large statement: three candidate
//! lists, a sort and a row lock each, initialised on every call. A pop that knows which
//! partition to take claims it by primary key instead ([`crate::storage::consume`]'s hand-off
//! claim), a statement half the size that reads one row.
//!
//! A hand-off is only a hint: the claim checks in PostgreSQL, as every claim does, that the
//! lease is free and that messages wait past the committed offset, so a hint that went stale
//! (another pop or broker took the partition meanwhile) claims nothing and the pop moves on.
//! The lists the one-statement pop reads (leases that ran out, partitions written since the
//! watermark, releases by other brokers) still get their turn: a pop runs the one-statement
//! pop whenever no hand-off waits, and at least every [`ONE_STATEMENT_EVERY`]-th pop of a queue
//! and group on this broker even when some do.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Hand-offs kept per (queue, group) at most; a release beyond them is left to the
/// one-statement pop's "released" list.
pub const MAX_PER_GROUP: usize = 256;

/// (queue, group) pairs kept at most; beyond them the book starts over.
const MAX_GROUPS: usize = 4096;

/// Pops of a queue and group in a row that take hand-offs, at most, before one runs the
/// one-statement pop (which serves leases that ran out first).
pub const ONE_STATEMENT_EVERY: usize = 8;

#[derive(Debug, Default)]
struct Waiting {
    /// Partition database ids, oldest release first.
    list: VecDeque<i64>,
    /// Hand-offs taken since a pop of this queue and group last ran the one-statement pop.
    taken: usize,
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
        let known = by_queue.get(queue).is_some_and(|g| g.contains_key(group));
        if !known && by_queue.values().map(HashMap::len).sum::<usize>() >= MAX_GROUPS {
            by_queue.clear();
        }
        let groups = match by_queue.get_mut(queue) {
            Some(groups) => groups,
            None => by_queue.entry(queue.to_string()).or_default(),
        };
        let waiting = match groups.get_mut(group) {
            Some(waiting) => waiting,
            None => groups.entry(group.to_string()).or_default(),
        };
        if waiting.list.len() < MAX_PER_GROUP && !waiting.list.contains(&partition_id) {
            waiting.list.push_back(partition_id);
        }
    }

    /// The partition of the oldest hand-off of `(queue, group)`, unless none waits or the
    /// one-statement pop is due (then `None`, and the caller runs it: the count starts over).
    pub fn next(&self, queue: &str, group: &str) -> Option<i64> {
        let mut by_queue = self.by_queue.lock().expect("hand-offs lock poisoned");
        let waiting = by_queue.get_mut(queue)?.get_mut(group)?;
        if waiting.list.is_empty() || waiting.taken + 1 >= ONE_STATEMENT_EVERY {
            waiting.taken = 0;
            return None;
        }
        waiting.taken += 1;
        waiting.list.pop_front()
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
        for id in 0..20 {
            h.offer("q", "g", id);
        }
        let taken: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY).map(|_| h.next("q", "g")).collect();
        let expected: Vec<Option<i64>> = (0..ONE_STATEMENT_EVERY as i64 - 1)
            .map(Some)
            .chain([None])
            .collect();
        assert_eq!(taken, expected, "the last one runs the one-statement pop");
        assert_eq!(h.next("q", "g"), Some(ONE_STATEMENT_EVERY as i64 - 1));
    }
}
