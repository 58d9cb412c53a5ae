//! Pop autopilot (reference §2.8, docs/consuming-2x.md): the broker sizes the knobs a pop
//! leaves out (`batch`, `partitions`) and advises how long a consumer should wait after an
//! empty pop (`waitMs`).
//!
//! A value the request carries is never changed: the controller chooses only the omitted ones.
//! It learns per (pop scope, consumer group) on this broker, from the answers of the pops that
//! engaged it — what they delivered, how many partitions they claimed, and the backlog those
//! partitions still had — and, the first time it sees a pair, from one bounded count of the
//! partitions ready for the group among the queue's most recently written ones. Brokers do not
//! share what they learnt; a broker that never saw a pair starts from the count.
//!
//! The policy (ambiguity 8 of the reference is the broker's to decide):
//! - `batch`: a power of two that follows the backlog the pops see (delivered + left behind in
//!   their partitions): [`FIRST_BATCH`] for a pair never seen, raised to the next power of two
//!   above a larger backlog, halved after a backlog of a quarter of it or less, within
//!   [`MIN_BATCH`]..[`MAX_BATCH`]. It changes seldom on purpose: a lease claimed ahead after
//!   an ack (`storage::consume::ahead`) serves the group's next pop only if that pop asks for as many
//!   messages as the one before.
//! - `partitions`: the ready partitions counted on first sight (at least 1, at most
//!   [`MAX_PARTITIONS`]); then doubled after a pop that claimed every partition it could and
//!   still had room in its batch (more partitions would have filled it), set to what it claimed
//!   after a pop that claimed fewer without filling its batch (no more were ready), kept
//!   otherwise. Partitions this broker's acks released with messages left (hand-offs) count as
//!   ready too.
//! - `waitMs`: 0 (no advice) after a pop that delivered; after consecutive empty pops 100 ms,
//!   doubling up to [`MAX_WAIT_MS`].
//!
//! This module holds no lock across an await and runs no statement except the first-sight
//! count ([`ready_partitions`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// Smallest batch the controller chooses.
pub const MIN_BATCH: usize = 16;
/// Largest batch the controller chooses (a consumer that wants more says so).
pub const MAX_BATCH: usize = 1024;
/// Batch of a pair the controller has not seen yet.
pub const FIRST_BATCH: usize = 128;
/// Most partitions the controller claims in one pop.
pub const MAX_PARTITIONS: usize = 16;
/// Longest wait the controller advises after empty pops.
pub const MAX_WAIT_MS: u64 = 1000;
/// The first wait it advises (the 2.x client's own pause between empty pops).
const FIRST_WAIT_MS: u64 = 100;
/// Pairs remembered at most; the one used longest ago is forgotten first.
const MAX_PAIRS: usize = 4096;
/// Most recently written partitions the first-sight count looks at.
const READY_LOOK: i64 = 64;

/// What one pop runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// Messages at most, across partitions.
    pub batch: usize,
    /// Partitions claimed at most.
    pub partitions: usize,
}

/// What a pop that engaged the controller found: the input of [`Autopilot::learn`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Messages delivered.
    pub messages: usize,
    /// Partitions claimed.
    pub partitions: usize,
    /// Messages left behind in the claimed partitions.
    pub left: i64,
}

/// What the controller learnt of one (scope, group) pair.
#[derive(Debug, Clone, Copy)]
struct Pilot {
    batch: usize,
    partitions: usize,
    empty_pops: u32,
    used: Instant,
}

/// The controller of one broker; cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct Autopilot {
    pairs: Mutex<HashMap<(String, String), Pilot>>,
}

impl Autopilot {
    /// A controller that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the controller has not seen `(scope, group)` yet: the caller then counts the
    /// ready partitions ([`ready_partitions`]) for [`Autopilot::choose`].
    pub fn first_sight(&self, scope: &str, group: &str) -> bool {
        let pairs = self.pairs.lock().expect("autopilot lock poisoned");
        !pairs.contains_key(&(scope.to_string(), group.to_string()))
    }

    /// The knobs of one pop of `(scope, group)`: `batch` and `partitions` as the request
    /// carries them, the omitted ones from what the controller learnt; `ready` is what the
    /// caller knows of ready partitions (the first-sight count, hand-offs waiting).
    pub fn choose(
        &self,
        scope: &str,
        group: &str,
        batch: Option<usize>,
        partitions: Option<usize>,
        ready: usize,
    ) -> Knobs {
        let mut pairs = self.pairs.lock().expect("autopilot lock poisoned");
        let key = (scope.to_string(), group.to_string());
        if !pairs.contains_key(&key) && pairs.len() >= MAX_PAIRS {
            let oldest = pairs
                .iter()
                .min_by_key(|(_, p)| p.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                pairs.remove(&oldest);
            }
        }
        let pilot = pairs.entry(key).or_insert(Pilot {
            batch: FIRST_BATCH,
            partitions: ready.clamp(1, MAX_PARTITIONS),
            empty_pops: 0,
            used: Instant::now(),
        });
        pilot.used = Instant::now();
        Knobs {
            batch: batch.unwrap_or(pilot.batch).max(1),
            partitions: partitions
                .unwrap_or_else(|| pilot.partitions.max(ready.min(MAX_PARTITIONS)))
                .max(1),
        }
    }

    /// Learns from the answer of a pop of `(scope, group)` that ran with `used` and found
    /// `seen`; returns the wait to advise with that answer (milliseconds, 0 = no advice).
    /// Only the knobs the request left out (`chose_batch`, `chose_partitions`) are adjusted.
    pub fn learn(
        &self,
        scope: &str,
        group: &str,
        used: Knobs,
        seen: Seen,
        chose_batch: bool,
        chose_partitions: bool,
    ) -> u64 {
        let mut pairs = self.pairs.lock().expect("autopilot lock poisoned");
        let Some(pilot) = pairs.get_mut(&(scope.to_string(), group.to_string())) else {
            return 0;
        };
        if seen.messages == 0 {
            pilot.empty_pops = pilot.empty_pops.saturating_add(1);
            return FIRST_WAIT_MS
                .saturating_mul(1 << (pilot.empty_pops - 1).min(16))
                .min(MAX_WAIT_MS);
        }
        pilot.empty_pops = 0;
        if chose_batch {
            let backlog = seen
                .messages
                .saturating_add(usize::try_from(seen.left).unwrap_or(0));
            if backlog > pilot.batch {
                pilot.batch = backlog
                    .checked_next_power_of_two()
                    .unwrap_or(MAX_BATCH)
                    .clamp(MIN_BATCH, MAX_BATCH);
            } else if backlog.saturating_mul(4) <= pilot.batch {
                pilot.batch = (pilot.batch / 2).max(MIN_BATCH);
            }
        }
        if chose_partitions && seen.messages < used.batch {
            pilot.partitions = if seen.partitions >= used.partitions {
                (used.partitions * 2).min(MAX_PARTITIONS)
            } else {
                seen.partitions.max(1)
            };
        }
        0
    }
}

/// How many of the queue `queue`'s most recently written partitions (at most 64)
/// hold messages past the group `group`'s committed offset (the start of the partition for a
/// group that never touched it) and no live lease: what a controller seeing the pair for the
/// first time takes as the partitions ready for it. One statement, read from the index
/// `partitions_changed` backwards.
///
/// # Errors
///
/// Any database error.
pub async fn ready_partitions(
    conn: &mut PgConnection,
    queue: &str,
    group: &str,
) -> Result<usize, StorageError> {
    let ready: i64 = sqlx::query_scalar(
        "SELECT count(*)
           FROM (SELECT p.id, p.next_offset
                   FROM queen.partitions p
                  WHERE p.queue_id = (SELECT id FROM queen.queues WHERE name = $1)
                    AND p.last_write_at IS NOT NULL
                  ORDER BY p.last_write_at DESC
                  LIMIT $3) w
           LEFT JOIN queen.partition_consumers c
             ON c.partition_id = w.id AND c.consumer_group = $2
          WHERE COALESCE(c.committed_offset, 0) < w.next_offset
            AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= now())",
    )
    .bind(queue)
    .bind(group)
    .bind(READY_LOOK)
    .fetch_one(conn)
    .await?;
    Ok(usize::try_from(ready).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: (bool, bool) = (true, true);

    fn learn(a: &Autopilot, used: Knobs, seen: Seen) -> u64 {
        a.learn("q", "g", used, seen, ALL.0, ALL.1)
    }

    #[test]
    fn a_value_the_request_carries_is_never_changed() {
        let a = Autopilot::new();
        let k = a.choose("q", "g", Some(7), Some(3), 12);
        assert_eq!(
            k,
            Knobs {
                batch: 7,
                partitions: 3
            }
        );
        // Whatever it learns, the carried values stay.
        a.learn(
            "q",
            "g",
            k,
            Seen {
                messages: 7,
                partitions: 1,
                left: 5000,
            },
            false,
            false,
        );
        assert_eq!(a.choose("q", "g", Some(7), Some(3), 0), k);
    }

    #[test]
    fn a_first_pop_claims_the_ready_partitions_it_was_told_of() {
        let a = Autopilot::new();
        assert!(a.first_sight("q", "g"));
        let k = a.choose("q", "g", None, None, 4);
        assert_eq!(
            k,
            Knobs {
                batch: FIRST_BATCH,
                partitions: 4
            }
        );
        assert!(!a.first_sight("q", "g"));
        assert_eq!(a.choose("q", "other", None, None, 0).partitions, 1);
        assert_eq!(
            a.choose("q2", "g", None, None, 500).partitions,
            MAX_PARTITIONS
        );
    }

    #[test]
    fn the_batch_follows_the_backlog_in_powers_of_two_within_its_bounds() {
        let a = Autopilot::new();
        let batch = |a: &Autopilot| a.choose("q", "g", None, Some(1), 0).batch;
        let seen = |messages, left| Seen {
            messages,
            partitions: 1,
            left,
        };
        let k = a.choose("q", "g", None, Some(1), 1);
        assert_eq!(k.batch, FIRST_BATCH);
        learn(&a, k, seen(128, 372));
        assert_eq!(batch(&a), 512);
        learn(&a, k, seen(512, 1_000_000));
        assert_eq!(batch(&a), MAX_BATCH);
        // A backlog that moves a little leaves it alone.
        learn(&a, k, seen(300, 0));
        assert_eq!(batch(&a), MAX_BATCH);
        // A small one halves it, down to the floor.
        let halves: Vec<usize> = (0..8)
            .map(|_| {
                learn(&a, k, seen(2, 0));
                batch(&a)
            })
            .collect();
        assert_eq!(halves, vec![512, 256, 128, 64, 32, 16, 16, 16]);
    }

    #[test]
    fn partitions_grow_while_they_run_dry_and_shrink_to_what_was_there() {
        let a = Autopilot::new();
        let k = a.choose("q", "g", Some(100), None, 1);
        assert_eq!(k.partitions, 1);
        learn(
            &a,
            k,
            Seen {
                messages: 5,
                partitions: 1,
                left: 0,
            },
        );
        let k = a.choose("q", "g", Some(100), None, 0);
        assert_eq!(k.partitions, 2);
        learn(
            &a,
            k,
            Seen {
                messages: 10,
                partitions: 2,
                left: 0,
            },
        );
        let k = a.choose("q", "g", Some(100), None, 0);
        assert_eq!(k.partitions, 4);
        learn(
            &a,
            k,
            Seen {
                messages: 15,
                partitions: 3,
                left: 0,
            },
        );
        let k = a.choose("q", "g", Some(100), None, 0);
        assert_eq!(k.partitions, 3);
        // A full batch says nothing about partitions.
        learn(
            &a,
            k,
            Seen {
                messages: 100,
                partitions: 1,
                left: 9,
            },
        );
        assert_eq!(a.choose("q", "g", Some(100), None, 0).partitions, 3);
        // Hand-offs waiting count as ready.
        assert_eq!(a.choose("q", "g", Some(100), None, 6).partitions, 6);
    }

    #[test]
    fn empty_pops_advise_a_growing_wait_and_a_delivery_resets_it() {
        let a = Autopilot::new();
        let k = a.choose("q", "g", None, None, 0);
        let waits: Vec<u64> = (0..6).map(|_| learn(&a, k, Seen::default())).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(
            learn(
                &a,
                k,
                Seen {
                    messages: 1,
                    partitions: 1,
                    left: 0
                }
            ),
            0
        );
        assert_eq!(learn(&a, k, Seen::default()), 100);
    }

    #[test]
    fn the_pairs_are_bounded() {
        let a = Autopilot::new();
        for n in 0..MAX_PAIRS + 10 {
            a.choose(&format!("q{n}"), "g", None, None, 0);
        }
        assert_eq!(a.pairs.lock().unwrap().len(), MAX_PAIRS);
        assert!(a.first_sight("q0", "g"), "the oldest pair was forgotten");
        assert!(!a.first_sight(&format!("q{}", MAX_PAIRS + 9), "g"));
    }
}
