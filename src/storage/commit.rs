//! The commit transaction: many partitions' segments in one PostgreSQL transaction.
//!
//! Top to bottom: resolve new partitions' ids (own statements, before the transaction) · BEGIN ·
//! lock the partition rows in id order (so two brokers never deadlock) · probe the dedup sidecar
//! (a separate statement *after* the lock, so it sees every key committed by the writer we
//! waited for) · decide each item's verdict · one statement that moves `next_offset` (and the
//! write marker `last_write_xid` the queue-level pop scans by), inserts the segments and the
//! sidecar rows, and queues one `NOTIFY queen_push` naming the written partitions (delivered at
//! COMMIT, so other brokers wake their long-polls) · COMMIT. Nothing is written for a duplicate.
//!
//! [`write_segments`] is the part between BEGIN and COMMIT, so `POST /api/v1/transaction` runs
//! the same statements inside its own transaction.

use std::collections::HashMap;
use std::time::Duration;

use broker_actors::error::StoreError;
use broker_actors::store::{SegmentOutcome, SegmentStore, SegmentWrite};
use broker_actors::{Item, PartitionKey, Verdict};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::storage::dedup::{self, Original, Probe};
use crate::storage::{frames, partitions};

/// A committer's store: its own connection, re-opened after a failure.
pub struct PgStore {
    options: PgConnectOptions,
    conn: Option<PgConnection>,
    connect_timeout: Duration,
    commit_timeout: Duration,
}

impl PgStore {
    /// A store that connects lazily with `options`. A connect or a whole commit taking longer
    /// than its timeout counts as PostgreSQL being unreachable (the items are then spooled; a
    /// commit that did land is absorbed by dedup on replay).
    pub fn new(
        options: PgConnectOptions,
        connect_timeout: Duration,
        commit_timeout: Duration,
    ) -> Self {
        Self {
            options,
            conn: None,
            connect_timeout,
            commit_timeout,
        }
    }
}

impl SegmentStore for PgStore {
    async fn commit(&mut self, batch: &[SegmentWrite]) -> Result<Vec<SegmentOutcome>, StoreError> {
        if self.conn.is_none() {
            let connect = PgConnection::connect_with(&self.options);
            let conn = match tokio::time::timeout(self.connect_timeout, connect).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(StoreError::Unavailable(e.to_string())),
                Err(_) => return Err(StoreError::Unavailable("connect timed out".into())),
            };
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        match tokio::time::timeout(self.commit_timeout, commit_batch(conn, batch)).await {
            Ok(Ok(outcomes)) => Ok(outcomes),
            Ok(Err(e)) => {
                // Whatever state the session is in, a fresh one is the safe next step.
                self.conn = None;
                Err(classify(e))
            }
            Err(_) => {
                self.conn = None;
                Err(StoreError::Unavailable(
                    "commit timed out; its outcome is unknown".into(),
                ))
            }
        }
    }
}

/// Sorts a database error into "unreachable" and "this transaction failed".
pub fn classify(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed => StoreError::Unavailable(e.to_string()),
        other => StoreError::Transaction(other.to_string()),
    }
}

struct Locked {
    next_offset: i64,
    window_secs: i32,
}

/// Commits `batch` in one transaction; see the module docs.
///
/// # Errors
///
/// Any database error; the transaction is then rolled back (or its outcome is unknown when the
/// connection broke during COMMIT).
pub async fn commit_batch(
    conn: &mut PgConnection,
    batch: &[SegmentWrite],
) -> sqlx::Result<Vec<SegmentOutcome>> {
    // An id an actor cached may belong to a partition deleted since (its queue was deleted
    // through the admin route): such keys are resolved again once, which recreates them.
    let mut stale: Vec<&PartitionKey> = Vec::new();
    loop {
        let ids = resolve_ids_except(conn, batch, &stale).await?;
        let mut tx = conn.begin().await?;
        match write_segments(&mut tx, batch, &ids).await {
            Ok(outcomes) => {
                tx.commit().await?;
                return Ok(outcomes);
            }
            Err(WriteError::Deleted(missing)) if stale.is_empty() => {
                tx.rollback().await?;
                stale = batch
                    .iter()
                    .zip(&ids)
                    .filter(|(_, id)| missing.contains(id))
                    .map(|(w, _)| &w.key)
                    .collect();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Why [`write_segments`] wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// These partitions were deleted (their rows are gone).
    #[error("a partition was deleted while being written")]
    Deleted(Vec<i64>),
    /// A statement failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<WriteError> for sqlx::Error {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Deleted(_) => sqlx::Error::Protocol(e.to_string()),
            WriteError::Database(e) => e,
        }
    }
}

/// The database id of each write's partition (same order as `batch`), creating queues and
/// partitions that do not exist yet. Runs outside the commit transaction: a partition created
/// for a write that then rolls back simply stays empty.
///
/// # Errors
///
/// Any database error, or a partition that could not be created.
pub async fn resolve_partition_ids(
    conn: &mut PgConnection,
    batch: &[SegmentWrite],
) -> sqlx::Result<Vec<i64>> {
    resolve_ids_except(conn, batch, &[]).await
}

/// As [`resolve_partition_ids`], also resolving again the keys in `stale` (a cached id whose
/// partition was deleted since: resolving recreates it).
async fn resolve_ids_except(
    conn: &mut PgConnection,
    batch: &[SegmentWrite],
    stale: &[&PartitionKey],
) -> sqlx::Result<Vec<i64>> {
    let unresolved: Vec<&PartitionKey> = batch
        .iter()
        .filter(|w| w.partition_id.is_none() || stale.contains(&&w.key))
        .map(|w| &w.key)
        .collect();
    let resolved = if unresolved.is_empty() {
        HashMap::new()
    } else {
        partitions::resolve_ids(conn, &unresolved).await?
    };
    batch
        .iter()
        .map(
            |write| match (resolved.get(&write.key).copied(), write.partition_id) {
                (Some(id), _) | (None, Some(id)) => Ok(id),
                (None, None) => Err(sqlx::Error::Protocol(format!(
                    "partition {} could not be created",
                    write.key
                ))),
            },
        )
        .collect()
}

/// Writes the segments of `batch` (partition ids from [`resolve_partition_ids`]) inside the
/// caller's open transaction `tx`: lock, dedup probe, verdicts, offsets, segment and sidecar
/// rows, write marker and NOTIFY. The caller commits or rolls back.
///
/// # Errors
///
/// [`WriteError::Deleted`] naming partitions that no longer exist, or any database error; the
/// caller's transaction is then unusable and must be rolled back.
pub async fn write_segments(
    tx: &mut PgConnection,
    batch: &[SegmentWrite],
    ids: &[i64],
) -> Result<Vec<SegmentOutcome>, WriteError> {
    let mut lock_ids = ids.to_vec();
    lock_ids.sort_unstable();
    lock_ids.dedup();
    let rows: Vec<(i64, i64, i32)> = sqlx::query_as(
        "SELECT p.id, p.next_offset, q.dedup_window_seconds
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.id = ANY($1)
          ORDER BY p.id
            FOR UPDATE OF p",
    )
    .bind(&lock_ids)
    .fetch_all(&mut *tx)
    .await?;
    let mut locked: HashMap<i64, Locked> = rows
        .into_iter()
        .map(|(id, next_offset, window_secs)| {
            (
                id,
                Locked {
                    next_offset,
                    window_secs,
                },
            )
        })
        .collect();
    if locked.len() != lock_ids.len() {
        let missing = lock_ids
            .into_iter()
            .filter(|id| !locked.contains_key(id))
            .collect();
        return Err(WriteError::Deleted(missing));
    }

    // Probe every key of every dedup-enabled partition in one statement.
    let hashes: Vec<Vec<i64>> = batch
        .iter()
        .zip(ids)
        .map(|(write, id)| {
            if locked[id].window_secs > 0 {
                write
                    .items
                    .iter()
                    .map(|i| dedup::key_hash(&i.transaction_id))
                    .collect()
            } else {
                Vec::new()
            }
        })
        .collect();
    let mut probes = Vec::new();
    for (id, seg_hashes) in ids.iter().zip(&hashes) {
        let window_secs = locked[id].window_secs;
        probes.extend(seg_hashes.iter().map(|&hash| Probe {
            partition_id: *id,
            hash,
            window_secs,
        }));
    }
    let hits = dedup::probe(&mut *tx, &probes).await?;
    let originals = if hits.is_empty() {
        HashMap::new()
    } else {
        let at: Vec<(i64, i64)> = hits
            .iter()
            .flat_map(|((pid, _), offs)| offs.iter().map(|o| (*pid, *o)))
            .collect();
        dedup::originals(&mut *tx, &at).await?
    };

    // Decide verdicts and allocate offsets, segment by segment.
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut upd_ids = Vec::new();
    let mut upd_next = Vec::new();
    let mut seg_pids = Vec::new();
    let mut seg_bases = Vec::new();
    let mut seg_counts = Vec::new();
    let mut seg_frames: Vec<Vec<u8>> = Vec::new();
    let mut key_pids = Vec::new();
    let mut key_hashes = Vec::new();
    let mut key_offsets = Vec::new();
    let mut written: Vec<&PartitionKey> = Vec::new();
    for ((write, &pid), seg_hashes) in batch.iter().zip(ids).zip(&hashes) {
        let lock = locked.get_mut(&pid).expect("every id was locked");
        let dedup_on = lock.window_secs > 0;
        let mut verdicts = Vec::with_capacity(write.items.len());
        let mut accepted: Vec<&Item> = Vec::with_capacity(write.items.len());
        let mut first_in_batch: HashMap<&str, Uuid> = HashMap::new();
        for (n, item) in write.items.iter().enumerate() {
            if dedup_on {
                let hash = seg_hashes[n];
                if let Some(original) =
                    stored_original(&hits, &originals, pid, hash, &item.transaction_id)
                {
                    verdicts.push(Verdict::Duplicate(original));
                    continue;
                }
                if let Some(first) = first_in_batch.get(item.transaction_id.as_str()) {
                    verdicts.push(Verdict::Duplicate(*first));
                    continue;
                }
                first_in_batch.insert(&item.transaction_id, item.message_id);
                key_pids.push(pid);
                key_hashes.push(hash);
                key_offsets.push(lock.next_offset + accepted.len() as i64);
            }
            verdicts.push(Verdict::Queued);
            accepted.push(item);
        }
        if !accepted.is_empty() {
            seg_pids.push(pid);
            seg_bases.push(lock.next_offset);
            seg_counts.push(accepted.len() as i32);
            seg_frames.push(frames::encode(accepted.iter().copied()));
            lock.next_offset += accepted.len() as i64;
            upd_ids.push(pid);
            upd_next.push(lock.next_offset);
            written.push(&write.key);
        }
        outcomes.push(SegmentOutcome {
            partition_id: pid,
            verdicts,
        });
    }

    if !seg_pids.is_empty() {
        // The notification rides in the same statement (no extra round trip); joining it into
        // the UPDATE makes PostgreSQL evaluate it exactly once.
        sqlx::query(
            "WITH notified AS (
                 SELECT pg_notify('queen_push', $10)
             ), moved AS (
                 UPDATE queen.partitions p
                    SET next_offset = x.next_offset,
                        last_write_at = now(),
                        last_write_xid = pg_current_xact_id()::text::int8
                   FROM unnest($1::int8[], $2::int8[]) AS x(id, next_offset), notified
                  WHERE p.id = x.id
             ), segments AS (
                 INSERT INTO queen.segments (partition_id, base_offset, msg_count, frames)
                 SELECT * FROM unnest($3::int8[], $4::int8[], $5::int4[], $6::bytea[])
             )
             INSERT INTO queen.dedup_keys (partition_id, key_hash, msg_offset)
             SELECT * FROM unnest($7::int8[], $8::int8[], $9::int8[])",
        )
        .bind(&upd_ids)
        .bind(&upd_next)
        .bind(&seg_pids)
        .bind(&seg_bases)
        .bind(&seg_counts)
        .bind(&seg_frames)
        .bind(&key_pids)
        .bind(&key_hashes)
        .bind(&key_offsets)
        .bind(crate::wake::notify_payload(&written))
        .execute(&mut *tx)
        .await?;
    }
    Ok(outcomes)
}

/// The original's id if `transaction_id` is already stored in the partition inside the window:
/// a hash hit whose frame carries the same key, or the all-zero UUID when the segment is gone.
fn stored_original(
    hits: &HashMap<(i64, i64), Vec<i64>>,
    originals: &HashMap<(i64, i64), Original>,
    pid: i64,
    hash: i64,
    transaction_id: &str,
) -> Option<Uuid> {
    let offsets = hits.get(&(pid, hash))?;
    let mut gone = false;
    for offset in offsets {
        match originals.get(&(pid, *offset)) {
            Some(Original::Found {
                id,
                transaction_id: stored,
            }) if stored == transaction_id => return Some(*id),
            Some(Original::Found { .. }) => {} // a hash collision with another key
            Some(Original::Gone) | None => gone = true,
        }
    }
    gone.then_some(Uuid::nil())
}
