//! The commit transaction: many partitions' segments in one PostgreSQL transaction.
//!
//! Top to bottom: resolve new partitions' ids (own statements, before the transaction) · BEGIN ·
//! lock the partition rows in id order (so two brokers never deadlock) · probe the dedup sidecar
//! (a separate statement *after* the lock, so it sees every key committed by the writer we
//! waited for) · decide each item's verdict · one statement that moves `next_offset` (and the
//! write marker `last_write_xid` the queue-level pop scans by), inserts the segments and the
//! sidecar rows, and queues `NOTIFY queen_push` notices naming the written partitions with their
//! ids (delivered at COMMIT, so every broker wakes its long-polls and hands the partitions to
//! them) · COMMIT. Nothing is written for a duplicate.
//!
//! Two queue options act here, under the same locks:
//! - `maxSize` (> 0): after the partition locks, the transaction takes an advisory lock per
//!   limited queue (in queue id order, so commits never deadlock on them) and then counts, in a
//!   statement of its own (so it sees every commit that held the lock before), the queue's
//!   messages not yet consumed. Items beyond the room left are refused
//!   ([`Refusal::QueueFull`], `failed` on the wire); the rest of the batch is unaffected. A
//!   queue without a limit costs nothing more than two columns of the lock statement. The bound
//!   applies at admission: the spool's replay of items answered `buffered` (a promise) stores
//!   them past it ([`PgStore::admitted`]).
//! - `encryptionEnabled`: the segment's payloads are sealed ([`crate::storage::segments::crypto`]); a
//!   broker without a key refuses the items ([`Refusal::NoKey`]) rather than store plaintext.
//!
//! [`write_segments`] is the part between BEGIN and COMMIT, so `POST /api/v1/transaction` runs
//! the same statements inside its own transaction.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use broker_actors::error::StoreError;
use broker_actors::store::{SegmentOutcome, SegmentStore, SegmentWrite};
use broker_actors::{Item, PartitionKey, Refusal, Verdict};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection, Row};
use uuid::Uuid;

use std::sync::Arc;

use crate::storage::cluster::hosts::Primary;
use crate::storage::error::StorageError;
use crate::storage::push::dedup::{self, Original, Probe, Secret};
use crate::storage::segments::cache::SegmentCache;
use crate::storage::segments::crypto::PayloadKey;
use crate::storage::GENERIC_PLANS;
use crate::storage::{push::partitions, segments::frames};

/// A committer's store: its own connection, re-opened after a failure (and after a primary
/// switch, on the new host).
pub struct PgStore {
    options: PgConnectOptions,
    cache: Option<Arc<SegmentCache>>,
    key: Option<PayloadKey>,
    conn: Option<PgConnection>,
    primary: Option<Arc<Primary>>,
    /// The primary's generation when `conn` was opened.
    conn_generation: u64,
    connect_timeout: Duration,
    commit_timeout: Duration,
    /// Its batches were admitted earlier (spool replay): `maxSize` is not applied again.
    admitted: bool,
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
            cache: None,
            key: None,
            conn: None,
            primary: None,
            conn_generation: 0,
            connect_timeout,
            commit_timeout,
            admitted: false,
        }
    }
}

impl PgStore {
    /// Keeps a copy of every segment this store commits in `cache`, for the pops that follow.
    pub fn with_cache(mut self, cache: Arc<SegmentCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Seals the payloads of queues with `encryptionEnabled` with `key` (without one, their
    /// items are refused).
    pub fn with_key(mut self, key: Option<PayloadKey>) -> Self {
        self.key = key;
        self
    }

    /// A store for items already admitted and answered `buffered` (spool replay): a `buffered`
    /// verdict is a promise, so the queue's `maxSize` (a bound on admission) does not refuse
    /// them here; it applies to the pushes that arrive later.
    pub fn admitted(mut self) -> Self {
        self.admitted = true;
        self
    }

    /// Connects to whichever host `primary` names (instead of the fixed options), reconnects
    /// after it switched, and tells it when a commit failed as unreachable.
    pub fn with_primary(mut self, primary: Arc<Primary>) -> Self {
        self.primary = Some(primary);
        self
    }

    fn unavailable(&self, error: StoreError) -> StoreError {
        if let (Some(primary), StoreError::Unavailable(_)) = (&self.primary, &error) {
            primary.suspect();
        }
        error
    }
}

impl SegmentStore for PgStore {
    async fn commit(&mut self, batch: &[SegmentWrite]) -> Result<Vec<SegmentOutcome>, StoreError> {
        if let Some(primary) = &self.primary {
            if self.conn.is_some() && self.conn_generation != primary.generation() {
                // The primary moved: this session is on the old host.
                self.conn = None;
            }
        }
        if self.conn.is_none() {
            let (options, generation) = match &self.primary {
                Some(p) => (p.options(), p.generation()),
                None => (self.options.clone(), 0),
            };
            // The write statement takes its rows from arrays: with their values in hand the
            // planner always finds a custom plan a little cheaper than the generic one, so
            // PostgreSQL planned it afresh at every commit (0.3–0.4 ms, more than the
            // statement's own execution). The generic plan follows the tables' statistics.
            let options = options.options([GENERIC_PLANS]);
            let connect = PgConnection::connect_with(&options);
            let conn = match tokio::time::timeout(self.connect_timeout, connect).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return Err(self.unavailable(StoreError::Unavailable(e.to_string()))),
                Err(_) => {
                    return Err(
                        self.unavailable(StoreError::Unavailable("connect timed out".into()))
                    )
                }
            };
            self.conn = Some(conn);
            self.conn_generation = generation;
        }
        let conn = self.conn.as_mut().expect("connected above");
        let cache = self.cache.as_deref();
        let commit = commit_batch(conn, batch, cache, self.key.as_ref(), self.admitted);
        match tokio::time::timeout(self.commit_timeout, commit).await {
            Ok(Ok(outcomes)) => Ok(outcomes),
            Ok(Err(e)) => {
                // Whatever state the session is in, a fresh one is the safe next step.
                self.conn = None;
                Err(self.unavailable(classify(e)))
            }
            Err(_) => {
                self.conn = None;
                Err(self.unavailable(StoreError::Unavailable(
                    "commit timed out; its outcome is unknown".into(),
                )))
            }
        }
    }
}

/// Sorts a storage error into "unreachable" (the items are spooled), "a value was refused"
/// ([`StorageError::is_refused_value`]: retried alone, quarantined by replay) and "this
/// transaction failed", by [`StorageError::is_unreachable`].
pub fn classify(e: StorageError) -> StoreError {
    if e.is_unreachable() {
        StoreError::Unavailable(e.to_string())
    } else if e.is_refused_value() {
        StoreError::Refused(e.to_string())
    } else {
        StoreError::Transaction(e.to_string())
    }
}

struct Locked {
    next_offset: i64,
    window_secs: i32,
    queue_id: i64,
    /// The queue's `maxSize` (0: no limit).
    max_size: i64,
    /// The queue's `encryptionEnabled`.
    encrypted: bool,
}

/// What the queue options decided for this batch, read under the locks.
struct Limits<'k> {
    /// Messages each limited queue may still take (queue id → room).
    room: HashMap<i64, i64>,
    /// The key that seals the payloads of encrypted queues.
    key: Option<&'k PayloadKey>,
}

/// Commits `batch` in one transaction; see the module docs. Once COMMIT has returned, the
/// new segments are copied into `cache` (never before: a rolled-back segment's offsets are
/// handed out again). `admitted`: the items were admitted before (spool replay), `maxSize`
/// does not refuse them.
///
/// # Errors
///
/// Any database error; the transaction is then rolled back (or its outcome is unknown when the
/// connection broke during COMMIT).
pub async fn commit_batch(
    conn: &mut PgConnection,
    batch: &[SegmentWrite],
    cache: Option<&SegmentCache>,
    key: Option<&PayloadKey>,
    admitted: bool,
) -> Result<Vec<SegmentOutcome>, StorageError> {
    // An id an actor cached may belong to a partition deleted since (its queue was deleted
    // through the admin route): such keys are resolved again once, which recreates them.
    let mut stale: Vec<&PartitionKey> = Vec::new();
    loop {
        let ids = resolve_ids_except(conn, batch, &stale).await?;
        let written = match lock_partitions(conn, &ids, true).await {
            Ok((locked, secret)) => {
                write_locked(conn, batch, &ids, locked, secret, key, admitted).await
            }
            Err(e) => Err(e),
        };
        match written {
            Ok((outcomes, segments)) => {
                conn.execute("COMMIT").await?;
                if let Some(cache) = cache {
                    keep_consumed(cache, batch, &ids, segments);
                }
                return Ok(outcomes);
            }
            Err(WriteError::Deleted(missing)) if stale.is_empty() => {
                conn.execute("ROLLBACK").await?;
                stale = batch
                    .iter()
                    .zip(&ids)
                    .filter(|(_, id)| missing.contains(id))
                    .map(|(w, _)| &w.key)
                    .collect();
            }
            Err(e) => {
                // Best effort: the caller drops this connection after an error anyway.
                let _ = conn.execute("ROLLBACK").await;
                return Err(e.into());
            }
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
    Database(#[from] StorageError),
}

impl From<sqlx::Error> for WriteError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(StorageError::Database(e))
    }
}

impl From<WriteError> for StorageError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Deleted(_) => StorageError::PartitionGone(e.to_string()),
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
) -> Result<Vec<i64>, StorageError> {
    resolve_ids_except(conn, batch, &[]).await
}

/// As [`resolve_partition_ids`], also resolving again the keys in `stale` (a cached id whose
/// partition was deleted since: resolving recreates it).
async fn resolve_ids_except(
    conn: &mut PgConnection,
    batch: &[SegmentWrite],
    stale: &[&PartitionKey],
) -> Result<Vec<i64>, StorageError> {
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
                (None, None) => Err(StorageError::PartitionGone(format!(
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
    key: Option<&PayloadKey>,
) -> Result<Vec<SegmentOutcome>, WriteError> {
    let (locked, secret) = lock_partitions(tx, ids, false).await?;
    Ok(write_locked(tx, batch, ids, locked, secret, key, false)
        .await?
        .0)
}

/// Hands the new segments of queues being consumed on this broker to the cache (moved, not
/// copied); the others are dropped here.
fn keep_consumed(
    cache: &SegmentCache,
    batch: &[SegmentWrite],
    ids: &[i64],
    segments: Vec<NewSegment>,
) {
    let consumed = cache.consumed_queues();
    if consumed.is_empty() {
        return;
    }
    let kept: HashSet<i64> = batch
        .iter()
        .zip(ids)
        .filter(|(w, _)| consumed.iter().any(|q| **q == *w.key.queue))
        .map(|(_, id)| *id)
        .collect();
    for s in segments {
        if kept.contains(&s.partition_id) {
            cache.insert(s.partition_id, s.base_offset, s.count.into(), s.frames);
        }
    }
}

/// A segment written by [`write_locked`].
struct NewSegment {
    partition_id: i64,
    base_offset: i64,
    count: i32,
    frames: Vec<u8>,
}

/// A locked partition's row: id, next offset, dedup window, queue id, `maxSize`, whether the
/// queue encrypts, and the database's dedup secret.
type LockRow = (i64, i64, i32, i64, i64, bool, Option<Vec<u8>>);

/// Locks the partitions' rows in ascending id order (two brokers committing overlapping sets
/// queue behind each other instead of deadlocking) and reads each one's next offset and dedup
/// window. With `begin`, the same round trip opens the transaction: the ids are integers of
/// our own, inlined into one simple-protocol `BEGIN; SELECT … FOR UPDATE`.
async fn lock_partitions(
    conn: &mut PgConnection,
    ids: &[i64],
    begin: bool,
) -> Result<(HashMap<i64, Locked>, Option<Secret>), WriteError> {
    let mut lock_ids = ids.to_vec();
    lock_ids.sort_unstable();
    lock_ids.dedup();
    // The dedup secret rides along: no extra round trip.
    const LOCK: &str = "SELECT p.id, p.next_offset, q.dedup_window_seconds,
                q.id, q.max_size, q.encryption_enabled,
                (SELECT secret FROM queen.dedup_secret) AS secret
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.id = ANY($1)
          ORDER BY p.id
            FOR UPDATE OF p";
    let rows: Vec<LockRow> = if begin {
        let list: Vec<String> = lock_ids.iter().map(i64::to_string).collect();
        let sql = format!(
            "BEGIN; {}",
            LOCK.replace("$1", &format!("'{{{}}}'::int8[]", list.join(",")))
        );
        let mut rows = Vec::with_capacity(lock_ids.len());
        for row in sqlx::raw_sql(&sql).fetch_all(&mut *conn).await? {
            rows.push((
                row.try_get(0)?,
                row.try_get(1)?,
                row.try_get(2)?,
                row.try_get(3)?,
                row.try_get(4)?,
                row.try_get(5)?,
                row.try_get(6)?,
            ));
        }
        rows
    } else {
        sqlx::query_as(LOCK)
            .bind(&lock_ids)
            .fetch_all(&mut *conn)
            .await?
    };
    let secret = match rows.first().and_then(|r| r.6.as_deref()) {
        Some(bytes) => Some(Secret::from_stored(bytes)?),
        None => None,
    };
    let locked: HashMap<i64, Locked> = rows
        .into_iter()
        .map(
            |(id, next_offset, window_secs, queue_id, max_size, encrypted, _)| {
                (
                    id,
                    Locked {
                        next_offset,
                        window_secs,
                        queue_id,
                        max_size,
                        encrypted,
                    },
                )
            },
        )
        .collect();
    if locked.len() != lock_ids.len() {
        let missing = lock_ids
            .into_iter()
            .filter(|id| !locked.contains_key(id))
            .collect();
        return Err(WriteError::Deleted(missing));
    }
    Ok((locked, secret))
}

/// Namespace (first key) of the advisory locks that serialise the writers of a queue with a
/// `maxSize`; the second key is the queue id.
const QUEUE_SIZE_LOCK: i32 = 0x5153_495a; // "QSIZ"

/// The room left in each locked queue with a `maxSize`: takes the queues' advisory locks (in id
/// order) and then counts, per queue, the messages not yet consumed (docs/operations.md, "Queue
/// size limit"): per partition, the stored offsets at or above the offset below which every
/// group has consumed (`queen.partition_consumed`), stored meaning not yet removed by
/// retention. The count is a statement of its own, after the lock: its snapshot then holds
/// every commit of a writer that held the lock before.
async fn room_left(
    tx: &mut PgConnection,
    locked: &HashMap<i64, Locked>,
) -> Result<HashMap<i64, i64>, StorageError> {
    let mut limits: Vec<(i64, i64)> = locked
        .values()
        .filter(|l| l.max_size > 0)
        .map(|l| (l.queue_id, l.max_size))
        .collect();
    if limits.is_empty() {
        return Ok(HashMap::new());
    }
    limits.sort_unstable();
    limits.dedup();
    let queue_ids: Vec<i64> = limits.iter().map(|(id, _)| *id).collect();
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, (x.id % 2147483648)::int4)
           FROM unnest($2::int8[]) WITH ORDINALITY AS x(id, n)
          ORDER BY x.n",
    )
    .bind(QUEUE_SIZE_LOCK)
    .bind(&queue_ids)
    .execute(&mut *tx)
    .await?;
    let counts: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT p.queue_id,
                COALESCE(sum(p.next_offset - GREATEST(c.consumed_below, COALESCE(
                    (SELECT min(s.base_offset)
                       FROM queen.segments s
                      WHERE s.partition_id = p.id), p.next_offset))), 0)::int8
           FROM queen.partitions p
           JOIN queen.partition_consumed c ON c.partition_id = p.id
          WHERE p.queue_id = ANY($1)
          GROUP BY p.queue_id",
    )
    .bind(&queue_ids)
    .fetch_all(&mut *tx)
    .await?;
    let counts: HashMap<i64, i64> = counts.into_iter().collect();
    Ok(limits
        .into_iter()
        .map(|(id, limit)| {
            let stored = counts.get(&id).copied().unwrap_or(0).max(0);
            (id, (limit - stored).max(0))
        })
        .collect())
}

/// Everything one write statement needs, planned from the locked rows and the known hits.
struct WritePlan<'a> {
    outcomes: Vec<SegmentOutcome>,
    upd_ids: Vec<i64>,
    upd_next: Vec<i64>,
    seg_pids: Vec<i64>,
    seg_bases: Vec<i64>,
    seg_counts: Vec<i32>,
    seg_frames: Vec<Vec<u8>>,
    key_pids: Vec<i64>,
    key_hashes: Vec<i64>,
    key_offsets: Vec<i64>,
    written: Vec<(&'a PartitionKey, i64)>,
}

/// Writes the batch under the locks already held. Optimistic about duplicates: the write is
/// planned as if no stored key matched and runs in one statement with the dedup probe, which
/// writes nothing when the probe finds a hit. Only then are the originals read and the write
/// planned and sent again: one round trip in the common case, three with duplicates.
/// `admitted` items (spool replay) are not counted against `maxSize`.
async fn write_locked(
    tx: &mut PgConnection,
    batch: &[SegmentWrite],
    ids: &[i64],
    locked: HashMap<i64, Locked>,
    secret: Option<Secret>,
    key: Option<&PayloadKey>,
    admitted: bool,
) -> Result<(Vec<SegmentOutcome>, Vec<NewSegment>), WriteError> {
    let needs_secret = ids.iter().any(|id| locked[id].window_secs > 0);
    let secret = match secret {
        Some(secret) => secret,
        None if needs_secret => {
            return Err(WriteError::Database(StorageError::Inconsistent(
                "queen.dedup_secret is missing (migration 0007)".into(),
            )))
        }
        None => Secret::from_stored(&[0; 16])?,
    };
    let limits = Limits {
        room: if admitted {
            HashMap::new()
        } else {
            room_left(tx, &locked).await?
        },
        key,
    };
    let hashes: Vec<Vec<i64>> = batch
        .iter()
        .zip(ids)
        .map(|(write, id)| {
            if locked[id].window_secs > 0 {
                write
                    .items
                    .iter()
                    .map(|i| dedup::key_hash(&secret, &i.transaction_id))
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

    let plan = plan_write(
        batch,
        ids,
        &hashes,
        &locked,
        &limits,
        &HashMap::new(),
        &HashMap::new(),
    );
    let hits = execute_write(tx, &plan, &probes).await?;
    if hits.is_empty() {
        return Ok(plan.into_written());
    }
    let mut by_key: HashMap<(i64, i64), Vec<i64>> = HashMap::new();
    for (pid, hash, offset) in hits {
        by_key.entry((pid, hash)).or_default().push(offset);
    }
    let at: Vec<(i64, i64)> = by_key
        .iter()
        .flat_map(|((pid, _), offs)| offs.iter().map(|o| (*pid, *o)))
        .collect();
    let originals = dedup::originals(&mut *tx, &at).await?;
    let plan = plan_write(batch, ids, &hashes, &locked, &limits, &by_key, &originals);
    execute_write(tx, &plan, &[]).await?;
    Ok(plan.into_written())
}

impl WritePlan<'_> {
    /// The verdicts and the segments the plan wrote.
    fn into_written(self) -> (Vec<SegmentOutcome>, Vec<NewSegment>) {
        let segments = self
            .seg_pids
            .into_iter()
            .zip(self.seg_bases)
            .zip(self.seg_counts)
            .zip(self.seg_frames)
            .map(
                |(((partition_id, base_offset), count), frames)| NewSegment {
                    partition_id,
                    base_offset,
                    count,
                    frames,
                },
            )
            .collect();
        (self.outcomes, segments)
    }
}

/// Decides each item's verdict and the offsets of the accepted ones, given the stored keys
/// that matched (`hits`, confirmed through `originals`).
fn plan_write<'a>(
    batch: &'a [SegmentWrite],
    ids: &[i64],
    hashes: &[Vec<i64>],
    locked: &HashMap<i64, Locked>,
    limits: &Limits<'_>,
    hits: &HashMap<(i64, i64), Vec<i64>>,
    originals: &HashMap<(i64, i64), Original>,
) -> WritePlan<'a> {
    let mut next: HashMap<i64, i64> = locked.iter().map(|(id, l)| (*id, l.next_offset)).collect();
    let mut room = limits.room.clone();
    let mut plan = WritePlan {
        outcomes: Vec::with_capacity(batch.len()),
        upd_ids: Vec::new(),
        upd_next: Vec::new(),
        seg_pids: Vec::new(),
        seg_bases: Vec::new(),
        seg_counts: Vec::new(),
        seg_frames: Vec::new(),
        key_pids: Vec::new(),
        key_hashes: Vec::new(),
        key_offsets: Vec::new(),
        written: Vec::new(),
    };
    for ((write, &pid), seg_hashes) in batch.iter().zip(ids).zip(hashes) {
        let queue = &locked[&pid];
        let dedup_on = queue.window_secs > 0;
        let no_key = queue.encrypted && limits.key.is_none();
        let base = next[&pid];
        let mut verdicts = Vec::with_capacity(write.items.len());
        let mut accepted: Vec<&Item> = Vec::with_capacity(write.items.len());
        let mut first_in_batch: HashMap<&str, Uuid> = HashMap::new();
        for (n, item) in write.items.iter().enumerate() {
            if dedup_on {
                let hash = seg_hashes[n];
                if let Some(original) =
                    stored_original(hits, originals, pid, hash, &item.transaction_id)
                {
                    verdicts.push(Verdict::Duplicate(original));
                    continue;
                }
                if let Some(first) = first_in_batch.get(item.transaction_id.as_str()) {
                    verdicts.push(Verdict::Duplicate(*first));
                    continue;
                }
            }
            if no_key {
                verdicts.push(Verdict::Refused(Refusal::NoKey));
                continue;
            }
            if let Some(left) = room.get_mut(&queue.queue_id) {
                if *left == 0 {
                    verdicts.push(Verdict::Refused(Refusal::QueueFull {
                        limit: queue.max_size,
                    }));
                    continue;
                }
                *left -= 1;
            }
            if dedup_on {
                let hash = seg_hashes[n];
                first_in_batch.insert(&item.transaction_id, item.message_id);
                plan.key_pids.push(pid);
                plan.key_hashes.push(hash);
                plan.key_offsets.push(base + accepted.len() as i64);
            }
            verdicts.push(Verdict::Queued);
            accepted.push(item);
        }
        if !accepted.is_empty() {
            let end = base + accepted.len() as i64;
            plan.seg_pids.push(pid);
            plan.seg_bases.push(base);
            plan.seg_counts.push(accepted.len() as i32);
            plan.seg_frames.push(match (queue.encrypted, limits.key) {
                (true, Some(key)) => frames::encode_sealed(accepted.iter().copied(), key),
                _ => frames::encode(accepted.iter().copied()),
            });
            plan.upd_ids.push(pid);
            plan.upd_next.push(end);
            plan.written.push((&write.key, pid));
            next.insert(pid, end);
        }
        plan.outcomes.push(SegmentOutcome {
            partition_id: pid,
            verdicts,
        });
    }
    plan
}

/// Runs the planned write in one statement, unless `probes` find a stored key: returns the
/// (partition, hash, offset) of every hit, and wrote nothing if there is any.
async fn execute_write(
    tx: &mut PgConnection,
    plan: &WritePlan<'_>,
    probes: &[Probe],
) -> Result<Vec<(i64, i64, i64)>, StorageError> {
    if plan.seg_pids.is_empty() && probes.is_empty() {
        return Ok(Vec::new());
    }
    let probe_pids: Vec<i64> = probes.iter().map(|p| p.partition_id).collect();
    let probe_hashes: Vec<i64> = probes.iter().map(|p| p.hash).collect();
    let probe_windows: Vec<i32> = probes.iter().map(|p| p.window_secs).collect();
    // The probe is a LATERAL subquery with OFFSET 0: one index probe per key, whatever plan is
    // cached (it cannot be flattened into a join that scans the sidecar). The notices ride in
    // the same statement; joining their one-row count into the UPDATE makes them run exactly
    // once, and only when something is written.
    sqlx::query_as(
        "WITH hits AS (
             SELECT x.partition_id, x.key_hash, d.msg_offset
               FROM unnest($11::int8[], $12::int8[], $13::int4[])
                    AS x(partition_id, key_hash, window_secs)
              CROSS JOIN LATERAL (
                    SELECT k.msg_offset
                      FROM queen.dedup_keys k
                     WHERE k.partition_id = x.partition_id
                       AND k.key_hash = x.key_hash
                       AND k.created_at > now() - make_interval(secs => x.window_secs)
                    OFFSET 0
              ) d
         ), go AS (
             SELECT NOT EXISTS (SELECT 1 FROM hits) AS ok
         ), notified AS (
             -- One row when the notices were sent (all of them: the count reads every
             -- row), none when nothing is written.
             SELECT count(*) AS sent
               FROM (SELECT pg_notify('queen_push', n)
                       FROM go, unnest($10::text[]) AS n
                      WHERE go.ok AND cardinality($1::int8[]) > 0) AS s
             HAVING count(*) > 0
         ), moved AS (
             UPDATE queen.partitions p
                SET next_offset = x.next_offset,
                    last_write_at = now(),
                    last_write_xid = pg_current_xact_id()::text::int8
               FROM unnest($1::int8[], $2::int8[]) AS x(id, next_offset), notified
              WHERE p.id = x.id
                AND p.id = ANY($1)
         ), segments AS (
             INSERT INTO queen.segments (partition_id, base_offset, msg_count, frames)
             SELECT s.partition_id, s.base_offset, s.msg_count, s.frames
               FROM unnest($3::int8[], $4::int8[], $5::int4[], $6::bytea[])
                    AS s(partition_id, base_offset, msg_count, frames), go
              WHERE go.ok
         ), keys AS (
             INSERT INTO queen.dedup_keys (partition_id, key_hash, msg_offset)
             SELECT k.partition_id, k.key_hash, k.msg_offset
               FROM unnest($7::int8[], $8::int8[], $9::int8[])
                    AS k(partition_id, key_hash, msg_offset), go
              WHERE go.ok
         )
         SELECT partition_id, key_hash, msg_offset FROM hits",
    )
    .bind(&plan.upd_ids)
    .bind(&plan.upd_next)
    .bind(&plan.seg_pids)
    .bind(&plan.seg_bases)
    .bind(&plan.seg_counts)
    .bind(&plan.seg_frames)
    .bind(&plan.key_pids)
    .bind(&plan.key_hashes)
    .bind(&plan.key_offsets)
    .bind(crate::wake::notify_payloads(&plan.written))
    .bind(&probe_pids)
    .bind(&probe_hashes)
    .bind(&probe_windows)
    .fetch_all(&mut *tx)
    .await
    .map_err(StorageError::from)
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
