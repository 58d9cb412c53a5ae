//! `POST /api/v1/transaction` as one storage operation: push and ack operations applied in ONE
//! database transaction; any failure rolls back all of it.
//!
//! Pushes go through [`commit::write_segments`], the same statements as `/push`, inside this
//! transaction (so they bypass the partition actors; the partition row lock still orders them
//! against every other writer). All pushes are written first (one lock pass over their
//! partitions, in id order, so two transactions never deadlock), then the acks in request
//! order. An ack cannot name a message pushed by the same transaction (it has never been
//! leased), so the order is not observable.
//!
//! A push that the queue refuses (its `maxSize` is reached, or it is encrypted and this broker
//! has no key) fails the whole transaction with the refusal's text: a transaction is all or
//! nothing, so it cannot go on without one of its pushes.
//!
//! Riders (reference 2.x §2.4): the `kv` ops run first, right after the `requiredLeases` check
//! and before any push or ack, on the same transaction (`storage::kv::apply_ops`, which takes
//! the key locks to commit); a `required` op that loses ends the transaction with nothing
//! applied ([`Outcome::kv_failed`]). The `timers` rider follows ([`apply_timers_rider`]).
//! Every other failure reports "transaction rolled back: ..." and applies nothing.
//!
//! Knows nothing about the request's JSON: the handler parses it into a [`Request`] and writes
//! the [`Outcome`] back out.

use std::collections::HashMap;

use broker_actors::store::SegmentWrite;
use broker_actors::{Item, PartitionKey, Verdict};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::consume::acks::{self, Ack, AckMode, AckOutcome};
use crate::storage::error::StorageError;
use crate::storage::kv;
use crate::storage::segments::cache::SegmentCache;
use crate::storage::segments::crypto::PayloadKey;
use crate::storage::timers;
use crate::storage::{consume::leases, push::commit, push::partitions};

/// The start of every failure text: the client shows it, and it says that nothing applied.
pub const ROLLED_BACK: &str = "transaction rolled back";

/// One push item of the transaction, with where its result goes.
pub struct PushOp {
    /// Position of its result in the response.
    pub result: usize,
    /// The minted item.
    pub item: Item,
    /// Its partition.
    pub key: PartitionKey,
}

/// The parsed transaction.
pub struct Request {
    /// Push items, in request order.
    pub pushes: Vec<PushOp>,
    /// Acks, in request order (each knows its result position as `index`).
    pub acks: Vec<Ack>,
    /// Results in the response: one per push item and one per ack.
    pub results: usize,
    /// `requiredLeases`: each must be live, else nothing happens.
    pub required_leases: Vec<String>,
    /// The `kv` rider: its results follow the push and ack results (flat index
    /// `results + i`).
    pub kv: Vec<kv::Op>,
    /// The `timers` rider, when the bundle carries one.
    pub timers: Option<TimersRider>,
}

/// The `timers` rider of a bundle: its parsed ops, applied by [`apply_timers_rider`].
pub struct TimersRider {
    /// The ops, validated by the timers' one parser (`protocol::timers::parse_ops`).
    pub ops: Vec<timers::TimerOp>,
    /// Flat index of the first op's result.
    pub first_index: usize,
}

/// Applies a bundle's `timers` rider on the transaction's own connection, after the KV rider
/// and before the pushes and acks (a firing broker holds timer rows, then partition rows: the
/// same order here cannot deadlock with it), so the timers commit (or not) with the rest of the
/// bundle. Returns one result per op, in op order.
///
/// # Errors
///
/// Any database error.
pub async fn apply_timers_rider(
    conn: &mut PgConnection,
    rider: &TimersRider,
) -> Result<Vec<timers::TimerResult>, StorageError> {
    if rider.ops.is_empty() {
        return Ok(Vec::new());
    }
    timers::apply(conn, &rider.ops).await
}

/// A lost `required` KV precondition: nothing of the transaction applied.
pub struct KvFailure {
    /// Flat index of the op (push and ack results come first).
    pub index: usize,
    /// Its verdict (`Refused`, with the current value and version).
    pub outcome: kv::Outcome,
}

/// What one operation did.
pub enum OpResult {
    /// A push item's verdict.
    Push {
        /// `queued` or `duplicate`.
        verdict: Verdict,
        /// The new message's id, or the original's for a duplicate.
        message_id: Uuid,
        /// The partition's public id.
        partition_id: Option<Uuid>,
        /// Which push: an index into [`Request::pushes`] (its item and partition).
        op: usize,
    },
    /// An ack's outcome.
    Ack(AckOutcome),
}

/// What the transaction did.
pub struct Outcome {
    /// Results of the operations that ran, in request order (all of them on success).
    pub results: Vec<OpResult>,
    /// Why the transaction rolled back, if it did.
    pub error: Option<String>,
    /// Partitions that got new messages (their long-polls are to be woken).
    pub woken: Vec<PartitionKey>,
    /// Results of the `kv` rider, in order (on success).
    pub kv_results: Vec<kv::Outcome>,
    /// The `required` KV op that lost, if one did (then `error` is `None` and nothing applied).
    pub kv_failed: Option<KvFailure>,
    /// Results of the `timers` rider, in op order (on success).
    pub timer_results: Vec<timers::TimerResult>,
}

/// Runs `req` in one transaction. Database trouble that means "PostgreSQL is away" is an
/// `Err` (the client retries); any other failure rolls back and is reported in
/// [`Outcome::error`].
///
/// # Errors
///
/// An error for which [`StorageError::is_unreachable`] holds.
pub async fn apply(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    key: Option<&PayloadKey>,
    req: &Request,
) -> Result<Outcome, StorageError> {
    // One segment per partition, items in request order.
    let mut writes: Vec<SegmentWrite> = Vec::new();
    let mut slots: Vec<Vec<usize>> = Vec::new();
    let mut by_key: HashMap<PartitionKey, usize> = HashMap::new();
    for (n, push) in req.pushes.iter().enumerate() {
        let w = *by_key.entry(push.key.clone()).or_insert_with(|| {
            writes.push(SegmentWrite {
                key: push.key.clone(),
                partition_id: None,
                items: Vec::new(),
            });
            slots.push(Vec::new());
            writes.len() - 1
        });
        writes[w].items.push(push.item.clone());
        slots[w].push(n);
    }
    let ids = if writes.is_empty() {
        Vec::new()
    } else {
        commit::resolve_partition_ids(conn, &writes).await?
    };
    let uuids = if ids.is_empty() {
        HashMap::new()
    } else {
        partitions::uuids(conn, &ids).await?
    };

    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let mut results: Vec<Option<OpResult>> = Vec::new();
    results.resize_with(req.results, || None);
    let fail = |results: Vec<Option<OpResult>>, error: String| Outcome {
        results: results.into_iter().flatten().collect(),
        error: Some(format!("{ROLLED_BACK}: {error}")),
        woken: Vec::new(),
        kv_results: Vec::new(),
        kv_failed: None,
        timer_results: Vec::new(),
    };

    if !req.required_leases.is_empty() {
        let parsed: Vec<Uuid> = req
            .required_leases
            .iter()
            .filter_map(|l| Uuid::parse_str(l).ok())
            .collect();
        if parsed.len() != req.required_leases.len() {
            return Ok(fail(
                results,
                "requiredLeases holds a lease id that is not a UUID".into(),
            ));
        }
        let dead = leases::not_live(&mut tx, &parsed).await?;
        if let Some(lease) = dead.first() {
            return Ok(fail(
                results,
                format!("Lease {lease} is not live (it expired, was released or was taken over)"),
            ));
        }
    }

    let mut kv_results = Vec::new();
    if !req.kv.is_empty() {
        let batch = match kv::apply_ops(&mut tx, &req.kv).await {
            Ok(b) => b,
            Err(e) if !e.is_unreachable() => return Ok(fail(results, e.to_string())),
            Err(e) => return Err(e),
        };
        if let Some(i) = batch.failed {
            // Dropping `tx` rolls back.
            return Ok(Outcome {
                results: Vec::new(),
                error: None,
                woken: Vec::new(),
                kv_results: Vec::new(),
                kv_failed: Some(KvFailure {
                    index: req.results + i,
                    outcome: batch.results[i].clone(),
                }),
                timer_results: Vec::new(),
            });
        }
        kv_results = batch.results;
    }

    let mut timer_results = Vec::new();
    if let Some(rider) = &req.timers {
        timer_results = match apply_timers_rider(&mut tx, rider).await {
            Ok(r) => r,
            Err(e) if !e.is_unreachable() => return Ok(fail(results, e.to_string())),
            Err(e) => return Err(e),
        };
    }

    let mut woken = Vec::new();
    if !writes.is_empty() {
        let outcomes = match commit::write_segments(&mut tx, &writes, &ids, key)
            .await
            .map_err(StorageError::from)
        {
            Ok(o) => o,
            Err(e) if !e.is_unreachable() => return Ok(fail(results, e.to_string())),
            Err(e) => return Err(e),
        };
        let refused = writes.iter().zip(&outcomes).find_map(|(write, outcome)| {
            outcome.verdicts.iter().find_map(|v| match v {
                Verdict::Refused(why) => Some(why.message(&write.key.queue)),
                _ => None,
            })
        });
        if let Some(error) = refused {
            return Ok(fail(results, error));
        }
        for ((write, outcome), members) in writes.iter().zip(&outcomes).zip(&slots) {
            let partition_id = uuids.get(&outcome.partition_id).copied();
            for (verdict, &n) in outcome.verdicts.iter().zip(members) {
                let push = &req.pushes[n];
                let message_id = match verdict {
                    Verdict::Duplicate(original) => *original,
                    _ => push.item.message_id,
                };
                results[push.result] = Some(OpResult::Push {
                    verdict: *verdict,
                    message_id,
                    partition_id,
                    op: n,
                });
            }
            if outcome.verdicts.contains(&Verdict::Queued) {
                woken.push(write.key.clone());
            }
        }
    }

    if !req.acks.is_empty() {
        let outcomes = match acks::apply(&mut tx, cache, &req.acks, AckMode::Transaction).await {
            Ok(o) => o,
            Err(e) if !e.is_unreachable() => return Ok(fail(results, e.to_string())),
            Err(e) => return Err(e),
        };
        let mut first_error = None;
        for o in outcomes {
            if !o.success && first_error.is_none() {
                first_error = Some(format!(
                    "ack of {}: {}",
                    o.transaction_id,
                    o.error.as_deref().unwrap_or("unsupported status")
                ));
            }
            let index = o.index;
            results[index] = Some(OpResult::Ack(o));
        }
        if let Some(error) = first_error {
            return Ok(fail(results, error));
        }
    }
    match tx.commit().await.map_err(StorageError::from) {
        Ok(()) => Ok(Outcome {
            results: results.into_iter().flatten().collect(),
            error: None,
            woken,
            kv_results,
            timer_results,
            kv_failed: None,
        }),
        Err(e) if !e.is_unreachable() => Ok(fail(Vec::new(), e.to_string())),
        Err(e) => Err(e),
    }
}
