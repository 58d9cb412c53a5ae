//! `POST /streams/v1/cycle` as one storage operation: a partition's state ops, its sink pushes
//! and its source ack in ONE PostgreSQL transaction. Any refusal rolls all of it back; a broker
//! killed or a PostgreSQL restarted mid-cycle leaves nothing half-applied, because nothing is
//! visible before COMMIT.
//!
//! Top to bottom: resolve the sink partitions' ids (own statements, before the transaction, as
//! the commit path does: a partition created for a cycle that then rolls back stays empty) ·
//! BEGIN · the query's advisory lock, shared (a reset takes it exclusive, `super::register`),
//! and its bounds · the shard row of (query, partition), upserted, which locks it: cycles and
//! idle flushes of one shard queue behind each other on every broker · state ops, checked against the query's bounds with the
//! shard's running size · the sink pushes through [`commit::write_segments`] (the `/push`
//! statements: dedup, partition locks in id order, offsets, NOTIFY that wakes long-polls) · the
//! ack through [`acks::apply`] (the `/transaction` ack: lease check, cumulative offset commit,
//! dead-lettering) · the lease release asked for · COMMIT.
//!
//! Knows nothing about JSON: `protocol::streams` builds the [`Cycle`], and the HTTP layer
//! writes the [`Committed`] or the [`Refused`] out.

use std::collections::{BTreeMap, HashMap};

use broker_actors::store::SegmentWrite;
use broker_actors::{Item, PartitionKey, Verdict};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::consume::acks::{self, Ack, AckMode, AckStatus};
use crate::storage::error::StorageError;
use crate::storage::push::commit::{self, WriteError};
use crate::storage::push::partitions;
use crate::storage::segments::cache::SegmentCache;
use crate::storage::segments::crypto::PayloadKey;

/// One state op, as applied: an upsert carries the value, a delete does not.
#[derive(Debug, Clone, PartialEq)]
pub struct StateOp {
    /// The row's key.
    pub key: String,
    /// The JSON text to store (`None`: delete the row).
    pub value: Option<String>,
    /// The value's top-level `windowEnd`, when it is a number.
    pub window_end: Option<f64>,
}

/// One sink push: the minted item and its partition.
#[derive(Debug, Clone)]
pub struct SinkPush {
    /// Where it goes.
    pub key: PartitionKey,
    /// The item (its message id is the broker's UUIDv7 or the one the cycle gave).
    pub item: Item,
}

/// The source ack: cumulative, up to and including the message `transaction_id`.
#[derive(Debug, Clone)]
pub struct SourceAck {
    /// The last message of the batch the cycle consumed.
    pub transaction_id: String,
    /// The lease the runtime holds (checked when given).
    pub lease_id: Option<String>,
    /// `Completed` advances; `Failed` and `Dlq` dead-letter that message.
    pub status: AckStatus,
    /// How many messages the runtime says it consumed (echoed back).
    pub count: i64,
    /// Reason stored with a dead letter.
    pub error: Option<String>,
}

/// A parsed cycle.
#[derive(Debug, Clone)]
pub struct Cycle {
    /// The query's server id.
    pub query_id: Uuid,
    /// The source partition's public id.
    pub partition_id: Uuid,
    /// The partition's 64-bit id when the body named it so (decimal text, as a framed pop
    /// gives it); resolved to `partition_id` before the cycle runs.
    pub partition_number: Option<i64>,
    /// The source consumer group.
    pub group: String,
    /// State ops, in request order.
    pub state_ops: Vec<StateOp>,
    /// Sink pushes, in emit order.
    pub pushes: Vec<SinkPush>,
    /// The source ack (`None` for an idle flush).
    pub ack: Option<SourceAck>,
    /// Clear the source lease after the ack (`false` keeps it until it expires, so the unacked
    /// tail of the batch redelivers in order).
    pub release_lease: bool,
}

/// What one sink push did.
#[derive(Debug, Clone, PartialEq)]
pub struct PushDone {
    /// `Queued` or `Duplicate`.
    pub verdict: Verdict,
    /// The new message's id, or the original's for a duplicate.
    pub message_id: Uuid,
    /// The dedup key used.
    pub transaction_id: String,
    /// The sink queue.
    pub queue: String,
    /// The sink partition's public id.
    pub partition_id: Option<Uuid>,
}

/// What the ack did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckDone {
    /// The count the runtime sent.
    pub count: i64,
    /// The lease ended with this cycle.
    pub lease_released: bool,
    /// The message went to the dead-letter table.
    pub dlq: bool,
}

/// A committed cycle.
#[derive(Debug, Clone)]
pub struct Committed {
    /// State ops applied (every op of the request).
    pub state_ops_applied: usize,
    /// One result per sink push, in request order.
    pub pushes: Vec<PushDone>,
    /// The ack's result (`None` without an ack).
    pub ack: Option<AckDone>,
    /// The source partition's queue and name (known when the cycle acked).
    pub source: Option<(String, String)>,
    /// The source lease ended and messages are left behind it (their consumers are to be
    /// woken).
    pub left_behind: bool,
    /// Sink partitions that got new messages (their long-polls are to be woken).
    pub woken: Vec<PartitionKey>,
}

/// Why a cycle applied nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    /// No query with this id is registered (never, or it was deleted).
    #[error("query {0} is not registered")]
    UnknownQuery(Uuid),
    /// The state of (query, partition) would pass the query's bound.
    #[error("state of query {query} on partition {partition} would hold {keys} keys and {bytes} bytes, past the bound of {max_keys} keys and {max_bytes} bytes; nothing applied")]
    StateTooLarge {
        /// The query.
        query: Uuid,
        /// The partition.
        partition: Uuid,
        /// Keys after the cycle.
        keys: i64,
        /// Bytes (keys and values) after the cycle.
        bytes: i64,
        /// The query's `max_state_keys`.
        max_keys: i64,
        /// The query's `max_state_bytes`.
        max_bytes: i64,
    },
    /// A sink queue refused its push (`maxSize` reached, encryption without a key) or its
    /// partition was deleted meanwhile.
    #[error("sink push refused: {0}")]
    SinkRefused(String),
    /// The ack names a lease that is not the live lease of (partition, group).
    #[error(
        "{}: lease {lease} is not the live lease of partition {partition} for group {group}",
        acks::BAD_LEASE
    )]
    LeaseLost {
        /// The lease the cycle named.
        lease: String,
        /// The source partition.
        partition: Uuid,
        /// The group.
        group: String,
    },
    /// The acked message is not in the group's current lease on the partition (or the
    /// partition does not exist).
    #[error("{}: transactionId {transaction_id} is not in the leased messages of partition {partition} for group {group}", acks::NOT_FOUND)]
    AckNotFound {
        /// The transactionId acked.
        transaction_id: String,
        /// The source partition.
        partition: Uuid,
        /// The group.
        group: String,
    },
    /// Any other refusal of the ack.
    #[error("ack refused: {0}")]
    AckRefused(String),
}

/// Runs `cycle` in one transaction. `Ok(Err(..))`: refused, nothing applied; `Err`: a database
/// error (the transaction rolled back too).
///
/// # Errors
///
/// Any database error.
pub async fn run(
    conn: &mut PgConnection,
    cache: &SegmentCache,
    key: Option<&PayloadKey>,
    cycle: &Cycle,
) -> Result<Result<Committed, Refused>, StorageError> {
    // One segment per sink partition, items in emit order (offsets then follow emit order).
    let mut writes: Vec<SegmentWrite> = Vec::new();
    let mut slots: Vec<Vec<usize>> = Vec::new();
    let mut by_key: HashMap<&PartitionKey, usize> = HashMap::new();
    for (n, push) in cycle.pushes.iter().enumerate() {
        let w = *by_key.entry(&push.key).or_insert_with(|| {
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

    // Dropping `tx` on any early return rolls back.
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    // The query's advisory lock, shared: a reset (exclusive) is wholly before or after this
    // cycle. Read committed: the statements after this one see what a reset committed.
    let bounds: Option<(i64, i64)> = sqlx::query_as(
        "SELECT q.max_state_keys, q.max_state_bytes
           FROM (SELECT pg_advisory_xact_lock_shared($2, hashtext($1::text))) AS locked,
                queen.stream_queries q
          WHERE q.id = $1",
    )
    .bind(cycle.query_id)
    .bind(super::QUERY_LOCK)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((max_keys, max_bytes)) = bounds else {
        return Ok(Err(Refused::UnknownQuery(cycle.query_id)));
    };
    // The shard row: inserted or updated, it is locked until COMMIT either way.
    let (keys_before, bytes_before): (i64, i64) = sqlx::query_as(
        "INSERT INTO queen.stream_shards AS s (query_id, partition_id, cycles)
         VALUES ($1, $2, 1)
         ON CONFLICT (query_id, partition_id) DO UPDATE
            SET cycles = s.cycles + 1,
                updated_at = now()
         RETURNING s.state_keys, s.state_bytes",
    )
    .bind(cycle.query_id)
    .bind(cycle.partition_id)
    .fetch_one(&mut *tx)
    .await?;

    if !cycle.state_ops.is_empty() {
        if let Err(refused) = apply_state_ops(
            &mut tx,
            cycle,
            (keys_before, bytes_before),
            (max_keys, max_bytes),
        )
        .await?
        {
            return Ok(Err(refused));
        }
    }

    let mut pushes: Vec<Option<PushDone>> = vec![None; cycle.pushes.len()];
    let mut woken = Vec::new();
    if !writes.is_empty() {
        let outcomes = match commit::write_segments(&mut tx, &writes, &ids, key).await {
            Ok(o) => o,
            Err(WriteError::Deleted(_)) => {
                return Ok(Err(Refused::SinkRefused(
                    "a sink partition was deleted while being written; nothing applied".into(),
                )))
            }
            Err(WriteError::Database(e)) => return Err(e),
        };
        for ((write, outcome), members) in writes.iter().zip(&outcomes).zip(&slots) {
            if let Some(why) = outcome.verdicts.iter().find_map(|v| match v {
                Verdict::Refused(why) => Some(why.message(&write.key.queue)),
                _ => None,
            }) {
                return Ok(Err(Refused::SinkRefused(why)));
            }
            let partition_id = uuids.get(&outcome.partition_id).copied();
            for (verdict, &n) in outcome.verdicts.iter().zip(members) {
                let push = &cycle.pushes[n];
                pushes[n] = Some(PushDone {
                    verdict: *verdict,
                    message_id: match verdict {
                        Verdict::Duplicate(original) => *original,
                        _ => push.item.message_id,
                    },
                    transaction_id: push.item.transaction_id.clone(),
                    queue: write.key.queue.to_string(),
                    partition_id,
                });
            }
            if outcome.verdicts.contains(&Verdict::Queued) {
                woken.push(write.key.clone());
            }
        }
    }

    let mut ack_done = None;
    let mut source = None;
    let mut left_behind = false;
    if let Some(ack) = &cycle.ack {
        let applied = acks::apply(
            &mut tx,
            cache,
            &[Ack {
                index: 0,
                partition: cycle.partition_id,
                partition_number: None,
                transaction_id: ack.transaction_id.clone(),
                status: ack.status,
                group: cycle.group.clone(),
                lease_id: ack.lease_id.clone(),
                error: ack.error.clone(),
            }],
            AckMode::Transaction,
        )
        .await?;
        let outcome = applied.into_iter().next().expect("one outcome per ack");
        if !outcome.success {
            return Ok(Err(match outcome.error.as_deref() {
                Some(acks::BAD_LEASE) => Refused::LeaseLost {
                    lease: ack.lease_id.clone().unwrap_or_default(),
                    partition: cycle.partition_id,
                    group: cycle.group.clone(),
                },
                Some(acks::NOT_FOUND) => Refused::AckNotFound {
                    transaction_id: ack.transaction_id.clone(),
                    partition: cycle.partition_id,
                    group: cycle.group.clone(),
                },
                other => Refused::AckRefused(other.unwrap_or("unsupported status").to_string()),
            }));
        }
        let mut lease_released = outcome.lease_released;
        if cycle.release_lease && !lease_released {
            let (released, left) = release_lease(&mut tx, cycle.partition_id, &cycle.group).await?;
            lease_released = released;
            left_behind = left;
        }
        if let (Some(q), Some(p)) = (outcome.queue_name, outcome.partition_name) {
            source = Some((q, p));
        }
        ack_done = Some(AckDone {
            count: ack.count,
            lease_released,
            dlq: outcome.dlq,
        });
    }
    tx.commit().await?;
    Ok(Ok(Committed {
        state_ops_applied: cycle.state_ops.len(),
        pushes: pushes.into_iter().flatten().collect(),
        ack: ack_done,
        source,
        left_behind,
        woken,
    }))
}

/// Applies the state ops of `cycle` under the shard lock: the last op on a key decides it;
/// the new size is the shard's running size plus the change of the keys touched, checked
/// against the bounds unless the cycle shrinks the state.
async fn apply_state_ops(
    tx: &mut PgConnection,
    cycle: &Cycle,
    (keys_before, bytes_before): (i64, i64),
    (max_keys, max_bytes): (i64, i64),
) -> Result<Result<(), Refused>, StorageError> {
    let mut last: BTreeMap<&str, &StateOp> = BTreeMap::new();
    for op in &cycle.state_ops {
        last.insert(op.key.as_str(), op);
    }
    let touched: Vec<&str> = last.keys().copied().collect();
    let existing: Vec<(String, i64)> = sqlx::query_as(
        "SELECT key, (octet_length(key) + octet_length(value))::bigint
           FROM queen.stream_state
          WHERE query_id = $1
            AND partition_id = $2
            AND key = ANY($3)",
    )
    .bind(cycle.query_id)
    .bind(cycle.partition_id)
    .bind(&touched)
    .fetch_all(&mut *tx)
    .await?;
    let existing: HashMap<String, i64> = existing.into_iter().collect();
    let (mut keys, mut bytes) = (keys_before, bytes_before);
    let mut upsert_keys = Vec::new();
    let mut upsert_values = Vec::new();
    let mut upsert_ends = Vec::new();
    let mut deletes = Vec::new();
    for (key, op) in &last {
        if let Some(old) = existing.get(*key) {
            keys -= 1;
            bytes -= old;
        }
        match &op.value {
            Some(value) => {
                keys += 1;
                bytes += (key.len() + value.len()) as i64;
                upsert_keys.push(*key);
                upsert_values.push(value.as_str());
                upsert_ends.push(op.window_end);
            }
            None => {
                if existing.contains_key(*key) {
                    deletes.push(*key);
                }
            }
        }
    }
    let grows = keys > keys_before || bytes > bytes_before;
    if grows && (keys > max_keys || bytes > max_bytes) {
        return Ok(Err(Refused::StateTooLarge {
            query: cycle.query_id,
            partition: cycle.partition_id,
            keys,
            bytes,
            max_keys,
            max_bytes,
        }));
    }
    if !upsert_keys.is_empty() {
        sqlx::query(
            "INSERT INTO queen.stream_state AS s
                    (query_id, partition_id, key, value, window_end, updated_at)
             SELECT $1, $2, u.key, u.value, u.window_end, now()
               FROM unnest($3::text[], $4::text[], $5::float8[]) AS u(key, value, window_end)
             ON CONFLICT (query_id, partition_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    window_end = EXCLUDED.window_end,
                    updated_at = EXCLUDED.updated_at",
        )
        .bind(cycle.query_id)
        .bind(cycle.partition_id)
        .bind(&upsert_keys)
        .bind(&upsert_values)
        .bind(&upsert_ends)
        .execute(&mut *tx)
        .await?;
    }
    if !deletes.is_empty() {
        sqlx::query(
            "DELETE FROM queen.stream_state
              WHERE query_id = $1
                AND partition_id = $2
                AND key = ANY($3)",
        )
        .bind(cycle.query_id)
        .bind(cycle.partition_id)
        .bind(&deletes)
        .execute(&mut *tx)
        .await?;
    }
    if (keys, bytes) != (keys_before, bytes_before) {
        sqlx::query(
            "UPDATE queen.stream_shards
                SET state_keys = $3,
                    state_bytes = $4
              WHERE query_id = $1
                AND partition_id = $2",
        )
        .bind(cycle.query_id)
        .bind(cycle.partition_id)
        .bind(keys)
        .bind(bytes)
        .execute(&mut *tx)
        .await?;
    }
    Ok(Ok(()))
}

/// Ends the live lease of (partition, group) after the cycle's ack: the messages left behind it
/// are redelivered at the group's next pop (the row asks for attention now). Returns whether a
/// lease ended and whether messages are left.
async fn release_lease(
    tx: &mut PgConnection,
    partition: Uuid,
    group: &str,
) -> Result<(bool, bool), StorageError> {
    let left: Option<bool> = sqlx::query_scalar(
        "UPDATE queen.partition_consumers c
            SET lease_expires_at = NULL,
                attention_at = CASE WHEN c.committed_offset < p.next_offset THEN now() END
           FROM queen.partitions p
          WHERE p.uuid = $1
            AND c.partition_id = p.id
            AND c.consumer_group = $2
            AND c.lease_expires_at > now()
      RETURNING c.committed_offset < p.next_offset",
    )
    .bind(partition)
    .bind(group)
    .fetch_optional(&mut *tx)
    .await?;
    Ok((left.is_some(), left.unwrap_or(false)))
}
