//! The firing task: every broker runs [`fire_loop`], which turns due timers into messages.
//!
//! One round ([`fire_due`]):
//! 1. without locks, the (queue, partition) pairs of the next due rows; their queues and
//!    partitions are created if missing, outside the transaction, exactly as for a push
//!    (`partitions::resolve_ids`);
//! 2. `BEGIN`; claim the due rows, oldest first, `FOR UPDATE SKIP LOCKED` (rows another broker
//!    is firing are skipped, never waited for);
//! 3. write their messages with the commit path's [`commit::write_segments`] (partition locks
//!    in id order, dedup with `transactionId` = the timer's `txn`, the NOTIFY that wakes
//!    long-polls on every broker); each message carries the id promised when it was scheduled;
//! 4. delete the rows that became messages (or duplicates of a message already stored); a row
//!    whose queue refused the message (`maxSize` reached, encrypted without a key) stays, with
//!    `attempts` + 1, the reason, and a later `deliver_at` (back-off);
//! 5. `COMMIT`.
//!
//! Messages and row deletions commit together, so a timer fires exactly once however many
//! brokers run: a broker killed before COMMIT leaves nothing (its claims end with its
//! connection and another broker fires those rows), one killed after has fired them.
//!
//! Never does: wait for a timer row, or hold a transaction open between rounds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use broker_actors::spool::SpoolState;
use broker_actors::store::SegmentWrite;
use broker_actors::{Item, PartitionKey, Verdict};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::push::commit::{self, WriteError};
use crate::storage::push::partitions;
use crate::storage::segments::crypto::PayloadKey;
use crate::wake::WakeHub;

/// Due timers fired per transaction at most; a full round is followed by another at once.
pub const FIRE_BATCH: i64 = 500;

/// Pause between rounds that found fewer than [`FIRE_BATCH`] due timers: the bound on how late
/// an idle broker notices a timer that came due (plus one round's time).
pub const FIRE_EVERY: Duration = Duration::from_millis(50);

/// Pause after a round that failed (PostgreSQL away, a deadlock, ...).
const FIRE_BACKOFF: Duration = Duration::from_secs(1);

/// Longest back-off of a timer whose queue refuses its message.
const REFUSED_BACKOFF_MAX_SECS: i64 = 300;

/// What one round did.
#[derive(Debug, Default)]
pub struct Fired {
    /// Rows claimed.
    pub claimed: usize,
    /// Messages written (`queued`).
    pub queued: usize,
    /// Rows whose message was a duplicate of one stored (deleted, nothing written).
    pub duplicates: usize,
    /// Rows whose queue refused the message (kept, backed off).
    pub refused: usize,
    /// Partitions written, for the long-poll wake-up when LISTEN is down.
    pub woken: Vec<PartitionKey>,
    /// How late each claimed row was when claimed (database clock), milliseconds.
    pub late_ms: Vec<f64>,
}

/// A claimed row.
#[derive(sqlx::FromRow)]
struct Claimed {
    queue: String,
    timer_key: String,
    partition_name: String,
    payload: String,
    txn: String,
    message_id: Uuid,
    producer_sub: Option<String>,
    attempts: i32,
    late_ms: f64,
}

/// One round: fires up to `batch` due timers in one transaction (see the module docs).
///
/// # Errors
///
/// Any database error; the transaction is then rolled back and nothing fired.
pub async fn fire_due(
    conn: &mut PgConnection,
    key: Option<&PayloadKey>,
    batch: i64,
) -> Result<Fired, StorageError> {
    // 1. Where the next due timers go; created outside the transaction, like a push's.
    let targets: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT queue, partition_name
           FROM (SELECT queue, partition_name
                   FROM queen.timers
                  WHERE deliver_at <= clock_timestamp()
                  ORDER BY deliver_at
                  LIMIT $1) AS due",
    )
    .bind(batch)
    .fetch_all(&mut *conn)
    .await?;
    if targets.is_empty() {
        return Ok(Fired::default());
    }
    let keys: Vec<PartitionKey> = targets
        .iter()
        .map(|(q, p)| PartitionKey::new(q, p))
        .collect();
    let refs: Vec<&PartitionKey> = keys.iter().collect();
    let ids = partitions::resolve_ids(conn, &refs).await?;

    // 2. Claim.
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let claimed: Vec<Claimed> = sqlx::query_as(
        "SELECT queue, timer_key, partition_name, payload, txn, message_id, producer_sub,
                attempts,
                (EXTRACT(EPOCH FROM clock_timestamp() - deliver_at) * 1000)::float8 AS late_ms
           FROM queen.timers
          WHERE deliver_at <= clock_timestamp()
          ORDER BY deliver_at
          LIMIT $1
            FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    let mut fired = Fired {
        claimed: claimed.len(),
        late_ms: claimed.iter().map(|c| c.late_ms).collect(),
        ..Fired::default()
    };

    // 3. One segment per partition, rows in claim (due) order. A row whose partition was not
    // resolved in step 1 (rescheduled to another partition meanwhile) waits for the next round.
    let arrived_at_micros = chrono::Utc::now().timestamp_micros();
    let mut writes: Vec<SegmentWrite> = Vec::new();
    let mut write_ids: Vec<i64> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    let mut by_key: HashMap<PartitionKey, usize> = HashMap::new();
    for (n, row) in claimed.iter().enumerate() {
        let pkey = PartitionKey::new(&row.queue, &row.partition_name);
        let Some(&id) = ids.get(&pkey) else { continue };
        let w = *by_key.entry(pkey.clone()).or_insert_with(|| {
            writes.push(SegmentWrite {
                key: pkey,
                partition_id: Some(id),
                items: Vec::new(),
            });
            write_ids.push(id);
            members.push(Vec::new());
            writes.len() - 1
        });
        writes[w].items.push(Item {
            message_id: row.message_id,
            transaction_id: row.txn.clone(),
            payload: row.payload.clone().into_boxed_str(),
            producer_sub: row.producer_sub.clone(),
            trace_id: None,
            arrived_at_micros,
        });
        members[w].push(n);
    }
    if writes.is_empty() {
        tx.rollback().await?;
        return Ok(fired);
    }
    let outcomes = match commit::write_segments(&mut tx, &writes, &write_ids, key).await {
        Ok(o) => o,
        Err(WriteError::Deleted(gone)) => {
            // A queue was deleted since step 1: the next round creates it again.
            tx.rollback().await?;
            tracing::debug!(partitions = ?gone, "timer destination deleted meanwhile; retrying");
            return Ok(Fired::default());
        }
        Err(WriteError::Database(e)) => return Err(e),
    };

    // 4. Settle the rows.
    let (mut done_q, mut done_k) = (Vec::new(), Vec::new());
    let (mut kept_q, mut kept_k, mut kept_err, mut kept_wait) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((write, outcome), rows) in writes.iter().zip(&outcomes).zip(&members) {
        for (verdict, &n) in outcome.verdicts.iter().zip(rows) {
            let row = &claimed[n];
            match verdict {
                Verdict::Refused(why) => {
                    fired.refused += 1;
                    kept_q.push(row.queue.clone());
                    kept_k.push(row.timer_key.clone());
                    kept_err.push(why.message(&write.key.queue));
                    let wait = 1_i64
                        .checked_shl(row.attempts.clamp(0, 20) as u32)
                        .unwrap_or(REFUSED_BACKOFF_MAX_SECS)
                        .min(REFUSED_BACKOFF_MAX_SECS);
                    kept_wait.push(wait as f64);
                }
                other => {
                    if *other == Verdict::Queued {
                        fired.queued += 1;
                    } else {
                        fired.duplicates += 1;
                    }
                    done_q.push(row.queue.clone());
                    done_k.push(row.timer_key.clone());
                }
            }
        }
        if outcome.verdicts.contains(&Verdict::Queued) {
            fired.woken.push(write.key.clone());
        }
    }
    if !done_q.is_empty() {
        sqlx::query(
            "DELETE FROM queen.timers t
              USING unnest($1::text[], $2::text[]) AS x(queue, timer_key)
              WHERE t.queue = x.queue
                AND t.timer_key = x.timer_key",
        )
        .bind(&done_q)
        .bind(&done_k)
        .execute(&mut *tx)
        .await?;
    }
    if !kept_q.is_empty() {
        sqlx::query(
            "UPDATE queen.timers t
                SET attempts = t.attempts + 1,
                    last_error = x.error,
                    deliver_at = clock_timestamp() + make_interval(secs => x.wait),
                    updated_at = now()
               FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[])
                    AS x(queue, timer_key, error, wait)
              WHERE t.queue = x.queue
                AND t.timer_key = x.timer_key",
        )
        .bind(&kept_q)
        .bind(&kept_k)
        .bind(&kept_err)
        .bind(&kept_wait)
        .execute(&mut *tx)
        .await?;
    }

    // 5.
    tx.commit().await?;
    Ok(fired)
}

/// Fires due timers until the process ends: a round every [`FIRE_EVERY`], at once again after
/// a full round, paused while maintenance mode is on (pushes are being held back on purpose;
/// timers then fire late, never lost). After each commit, long-polls on this broker are woken
/// directly when the LISTEN connection is down (otherwise the commit's NOTIFY does it, on
/// every broker).
///
/// A round unanswered within `round_limit` (`QUEEN_COMMIT_TIMEOUT_MS`, as for a commit; a
/// half-open link: PostgreSQL's own timeouts never hear of it) is given up with its connection; the server ends its transaction, and frees
/// the timers it claimed, after [`IDLE_IN_TRANSACTION`](crate::storage::begin::IDLE_IN_TRANSACTION).
pub async fn fire_loop(
    pool: PgPool,
    key: Option<PayloadKey>,
    hub: Arc<WakeHub>,
    spool: Arc<SpoolState>,
    round_limit: Duration,
) {
    let mut last_failure: Option<String> = None;
    loop {
        if spool.maintenance() {
            tokio::time::sleep(FIRE_EVERY).await;
            continue;
        }
        let round = async {
            let mut conn = pool.acquire().await?;
            fire_due(&mut conn, key.as_ref(), FIRE_BATCH).await
        };
        let Ok(answered) = tokio::time::timeout(round_limit, round).await else {
            tracing::warn!(limit = ?round_limit,
                "a timer round went unanswered (half-open connection?); it is given up and retried");
            tokio::time::sleep(FIRE_BACKOFF).await;
            continue;
        };
        match answered {
            Ok(fired) => {
                last_failure = None;
                if fired.claimed > 0 {
                    let worst = fired.late_ms.iter().copied().fold(0.0_f64, f64::max);
                    tracing::debug!(
                        claimed = fired.claimed,
                        queued = fired.queued,
                        duplicates = fired.duplicates,
                        refused = fired.refused,
                        late_ms_max = worst,
                        "timers fired"
                    );
                }
                if !hub.listening() {
                    for k in &fired.woken {
                        hub.wake(&k.queue, &k.partition);
                    }
                }
                if fired.claimed < usize::try_from(FIRE_BATCH).unwrap_or(usize::MAX) {
                    tokio::time::sleep(FIRE_EVERY).await;
                }
            }
            Err(e) => {
                let text = e.to_string();
                if e.is_unreachable() {
                    tracing::debug!(error = %text, "timers not fired: PostgreSQL is away");
                } else if last_failure.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "firing timers failed; retrying");
                    last_failure = Some(text);
                }
                tokio::time::sleep(FIRE_BACKOFF).await;
            }
        }
    }
}
