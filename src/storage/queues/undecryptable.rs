//! Messages of an encrypted queue that this broker's key cannot open (another key, no key, or
//! changed bytes): the partition's cursor stops in front of them for the group.
//!
//! A pop that meets such a message delivers the messages before it only, and
//! [`hold_at`] narrows the group's claim on that partition to end at the message (a leased pop)
//! or moves the committed offset back to it (an autoAck pop), so no ack and no autoAck passes
//! it: once a broker with the right key pops, the message is delivered. Meanwhile the partition
//! is held for [`HOLD`] before the next attempt (no pop spins on it). [`Stops`] remembers, on
//! this broker, which (queue, partition, group) is stopped where and why, for
//! `GET /api/v1/system/undecryptable`; a delivery from a stopped partition clears its entry.
//!
//! This module never opens a payload (that is `crypto`) and never decides which queue is
//! encrypted; it never moves a cursor forward.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// How long a partition stopped by an unopenable message is held before the next attempt.
pub const HOLD: Duration = Duration::from_secs(5);

/// One partition stopped for one group.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stop {
    /// Queue name.
    pub queue: String,
    /// Partition name.
    pub partition: String,
    /// Partition id on the wire.
    pub partition_id: Uuid,
    /// Consumer group (`__QUEUE_MODE__` for none).
    pub consumer_group: String,
    /// Offset of the first message that cannot be opened.
    pub offset: i64,
    /// Its message id.
    pub message_id: Uuid,
    /// Why it cannot be opened.
    pub error: String,
    /// When this broker first met it (ISO-8601).
    pub since: String,
    /// Pops that stopped there since.
    pub pops: u64,
}

/// The partitions this broker found stopped, by (queue, partition, group).
#[derive(Debug, Default)]
pub struct Stops {
    map: Mutex<BTreeMap<(String, String, String), Stop>>,
    /// Whether `map` may have entries (read without the lock by every pop).
    any: AtomicBool,
    /// Pops that stopped in front of an unopenable message since start.
    total: AtomicU64,
}

impl Stops {
    /// Records a pop that stopped at `stop.offset`.
    pub fn record(&self, stop: Stop) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self.map.lock().expect("stops lock poisoned");
        let key = (
            stop.queue.clone(),
            stop.partition.clone(),
            stop.consumer_group.clone(),
        );
        match map.get_mut(&key) {
            Some(known) if known.offset == stop.offset => known.pops += 1,
            _ => {
                map.insert(key, stop);
            }
        }
        self.any.store(true, Ordering::Relaxed);
    }

    /// A pop delivered from this partition without stopping: it is no longer stopped.
    pub fn delivered(&self, queue: &str, partition: &str, group: &str) {
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let mut map = self.map.lock().expect("stops lock poisoned");
        map.remove(&(queue.to_string(), partition.to_string(), group.to_string()));
        self.any.store(!map.is_empty(), Ordering::Relaxed);
    }

    /// The stopped partitions, by queue, partition and group.
    pub fn list(&self) -> Vec<Stop> {
        self.map
            .lock()
            .expect("stops lock poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// Pops that stopped in front of an unopenable message since start.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// Makes the group's last claim on `partition_id` end at `offset` (the first message that
/// cannot be opened): the lease's range ends there, an autoAck's committed offset moves back
/// to it, and the partition is held for [`HOLD`] when nothing before it was delivered from
/// this partition (a leased pop that delivered some keeps its lease for their acks). Only the
/// claim that covers `offset` is changed (a later claim of another pop is left alone).
/// Returns whether the claim was found.
///
/// # Errors
///
/// Any database error.
pub async fn hold_at(
    conn: &mut PgConnection,
    partition_id: i64,
    group: &str,
    offset: i64,
    auto_ack: bool,
) -> Result<bool, StorageError> {
    let done = sqlx::query(
        "UPDATE queen.partition_consumers
            SET total_consumed = total_consumed - GREATEST(committed_offset - $3, 0),
                committed_offset = LEAST(committed_offset, $3),
                leased_to = $3,
                lease_expires_at = CASE
                    WHEN $4 OR leased_from = $3 THEN now() + make_interval(secs => $5)
                    ELSE lease_expires_at
                END,
                attention_at = NULL
          WHERE partition_id = $1
            AND consumer_group = $2
            AND leased_from <= $3
            AND leased_to > $3",
    )
    .bind(partition_id)
    .bind(group)
    .bind(offset)
    .bind(auto_ack)
    .bind(HOLD.as_secs_f64())
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}
