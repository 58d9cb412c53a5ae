//! Timers (docs/timers.md): messages to be pushed later, one row of `queen.timers` per pending
//! (queue, timer key). This module holds the operations a caller asks for — schedule (an
//! upsert: schedule and reschedule are the same statement), cancel, peek, list — and
//! [`fire`] the firing task that turns due rows into messages.
//!
//! [`apply`] runs a list of operations inside the caller's open transaction, so
//! `POST /api/v1/timers` (which opens one for them alone, [`apply_alone`]) and the `timers`
//! rider of `POST /api/v1/transaction` share every statement. The operations arrive validated
//! (`protocol::timers` parses them); nothing here knows the request's JSON.
//!
//! Lock order: the operations of one call touch their rows in (queue, timer key) order,
//! whatever order the call lists them in, so two calls over overlapping keys queue behind each
//! other instead of deadlocking. The firing task never waits for a timer row (it skips locked
//! ones), so a caller that applies its timer operations *before* writing segments in the same
//! transaction cannot deadlock with a fire either (a fire holds timer rows and waits for
//! partition rows; partition rows are always locked in id order).
//!
//! `too_late`: a cancel reads the row and deletes it in one statement. When the statement's
//! snapshot still shows the row but the delete finds it gone, a fire held it and committed
//! while the cancel waited for its lock: the message is delivered.

pub mod fire;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// A `schedule` or `reschedule` operation (the same upsert on (queue, timer key)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The destination queue (need not exist yet: it is created when the timer fires).
    pub queue: String,
    /// The timer's key within the queue.
    pub timer_key: String,
    /// The destination partition.
    pub partition: String,
    /// The message data: JSON text, delivered verbatim.
    pub payload: String,
    /// Milliseconds from now (the database's clock); may be negative.
    pub delay_ms: i64,
    /// The delivered message's `transactionId`.
    pub txn: String,
    /// The scheduling caller's `sub`, the delivered message's `producerSub`.
    pub producer_sub: Option<String>,
    /// The id the delivered message will carry (minted when the operation was parsed).
    pub message_id: Uuid,
}

/// A `cancel` operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    /// The queue.
    pub queue: String,
    /// The timer's key within the queue.
    pub timer_key: String,
    /// The caller's `txn`, echoed in the answer (it does not guard the cancel).
    pub txn: Option<String>,
}

/// One timer operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerOp {
    /// Schedule or reschedule.
    Schedule(Schedule),
    /// Cancel.
    Cancel(Cancel),
}

impl TimerOp {
    /// The (queue, timer key) the operation touches.
    pub fn key(&self) -> (&str, &str) {
        match self {
            Self::Schedule(s) => (&s.queue, &s.timer_key),
            Self::Cancel(c) => (&c.queue, &c.timer_key),
        }
    }
}

/// What a cancel found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelStatus {
    /// The pending timer was removed; it will not fire.
    Cancelled,
    /// No pending timer under that key (never scheduled, cancelled, or already fired).
    Absent,
    /// A fire held the timer and committed while the cancel waited: the message is delivered.
    TooLate,
}

impl CancelStatus {
    /// The wire's `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::Absent => "absent",
            Self::TooLate => "too_late",
        }
    }
}

/// What one operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerResult {
    /// A schedule or reschedule.
    Scheduled {
        /// Whether a pending timer was replaced (`rescheduled`) rather than created.
        rescheduled: bool,
        /// The queue.
        queue: String,
        /// The key.
        timer_key: String,
        /// The delivered message's `transactionId`.
        txn: String,
        /// The delivered message's id.
        message_id: Uuid,
        /// When the timer becomes due.
        deliver_at: DateTime<Utc>,
    },
    /// A cancel.
    Cancelled {
        /// What the cancel found.
        status: CancelStatus,
        /// The queue.
        queue: String,
        /// The key.
        timer_key: String,
        /// The removed timer's `txn` (cancelled, too late), else the caller's.
        txn: Option<String>,
    },
}

/// A pending timer as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TimerRow {
    /// The queue.
    pub queue: String,
    /// The key.
    pub timer_key: String,
    /// The destination partition.
    pub partition_name: String,
    /// The message data (JSON text).
    pub payload: String,
    /// The delivered message's `transactionId`.
    pub txn: String,
    /// The delivered message's id.
    pub message_id: Uuid,
    /// When it becomes due.
    pub deliver_at: DateTime<Utc>,
    /// Fires the destination queue refused so far.
    pub attempts: i32,
    /// Why the last fire was refused.
    pub last_error: Option<String>,
    /// First scheduled (under this key, since it was last absent).
    pub created_at: DateTime<Utc>,
    /// Last scheduled or refused.
    pub updated_at: DateTime<Utc>,
}

/// Applies `ops` inside the caller's open transaction and returns one result per operation, in
/// the order of `ops`. The rows are touched in (queue, timer key) order (see the module docs);
/// `ops` must not name one key twice (`protocol::timers` refuses that).
///
/// # Errors
///
/// Any database error; the caller's transaction is then unusable and must be rolled back.
pub async fn apply(
    conn: &mut PgConnection,
    ops: &[TimerOp],
) -> Result<Vec<TimerResult>, StorageError> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by(|&a, &b| ops[a].key().cmp(&ops[b].key()));
    if ops.len() > 1 && ops.iter().all(|op| matches!(op, TimerOp::Schedule(_))) {
        // The common batch: one statement, rows upserted in the same key order.
        return schedule_many(conn, ops, &order).await;
    }
    let mut results: Vec<Option<TimerResult>> = vec![None; ops.len()];
    for n in order {
        results[n] = Some(match &ops[n] {
            TimerOp::Schedule(s) => schedule(conn, s).await?,
            TimerOp::Cancel(c) => cancel(conn, c).await?,
        });
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every operation ran"))
        .collect())
}

/// [`apply`] in a transaction of its own (`POST /api/v1/timers`).
///
/// # Errors
///
/// Any database error; nothing of `ops` is then applied (or, when the connection broke during
/// COMMIT, the outcome is unknown).
pub async fn apply_alone(
    conn: &mut PgConnection,
    ops: &[TimerOp],
) -> Result<Vec<TimerResult>, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let results = apply(&mut tx, ops).await?;
    tx.commit().await?;
    Ok(results)
}

/// The upsert: a new timer, or the pending one under that key replaced (payload, delay,
/// partition, txn, message id; attempts back to 0).
async fn schedule(conn: &mut PgConnection, s: &Schedule) -> Result<TimerResult, StorageError> {
    let (inserted, deliver_at): (bool, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO queen.timers AS t
                (queue, timer_key, partition_name, payload, txn, message_id, producer_sub,
                 deliver_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7,
                 clock_timestamp() + make_interval(secs => $8::float8 / 1000.0))
         ON CONFLICT (queue, timer_key) DO UPDATE
            SET partition_name = EXCLUDED.partition_name,
                payload = EXCLUDED.payload,
                txn = EXCLUDED.txn,
                message_id = EXCLUDED.message_id,
                producer_sub = EXCLUDED.producer_sub,
                deliver_at = EXCLUDED.deliver_at,
                attempts = 0,
                last_error = NULL,
                updated_at = now()
         RETURNING (t.xmax::text = '0'), t.deliver_at",
    )
    .bind(&s.queue)
    .bind(&s.timer_key)
    .bind(&s.partition)
    .bind(&s.payload)
    .bind(&s.txn)
    .bind(s.message_id)
    .bind(&s.producer_sub)
    .bind(s.delay_ms as f64)
    .fetch_one(&mut *conn)
    .await?;
    Ok(TimerResult::Scheduled {
        rescheduled: !inserted,
        queue: s.queue.clone(),
        timer_key: s.timer_key.clone(),
        txn: s.txn.clone(),
        message_id: s.message_id,
        deliver_at,
    })
}

/// Several schedules in one statement (no cancel among them): the rows are upserted in
/// `order` (by queue and key), as [`apply`] promises.
async fn schedule_many(
    conn: &mut PgConnection,
    ops: &[TimerOp],
    order: &[usize],
) -> Result<Vec<TimerResult>, StorageError> {
    let schedules: Vec<&Schedule> = order
        .iter()
        .map(|&n| match &ops[n] {
            TimerOp::Schedule(s) => s,
            TimerOp::Cancel(_) => unreachable!("only schedules reach here"),
        })
        .collect();
    let column = |f: fn(&Schedule) -> String| schedules.iter().map(|s| f(s)).collect::<Vec<_>>();
    let rows: Vec<(String, String, bool, DateTime<Utc>)> = sqlx::query_as(
        "INSERT INTO queen.timers AS t
                (queue, timer_key, partition_name, payload, txn, message_id, producer_sub,
                 deliver_at)
         SELECT x.queue, x.timer_key, x.partition_name, x.payload, x.txn, x.message_id,
                x.producer_sub, clock_timestamp() + make_interval(secs => x.delay_ms / 1000.0)
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::uuid[],
                       $7::text[], $8::float8[])
                WITH ORDINALITY
                AS x(queue, timer_key, partition_name, payload, txn, message_id, producer_sub,
                     delay_ms, n)
          ORDER BY x.n
         ON CONFLICT (queue, timer_key) DO UPDATE
            SET partition_name = EXCLUDED.partition_name,
                payload = EXCLUDED.payload,
                txn = EXCLUDED.txn,
                message_id = EXCLUDED.message_id,
                producer_sub = EXCLUDED.producer_sub,
                deliver_at = EXCLUDED.deliver_at,
                attempts = 0,
                last_error = NULL,
                updated_at = now()
         RETURNING t.queue, t.timer_key, (t.xmax::text = '0'), t.deliver_at",
    )
    .bind(column(|s| s.queue.clone()))
    .bind(column(|s| s.timer_key.clone()))
    .bind(column(|s| s.partition.clone()))
    .bind(column(|s| s.payload.clone()))
    .bind(column(|s| s.txn.clone()))
    .bind(schedules.iter().map(|s| s.message_id).collect::<Vec<_>>())
    .bind(
        schedules
            .iter()
            .map(|s| s.producer_sub.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        schedules
            .iter()
            .map(|s| s.delay_ms as f64)
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *conn)
    .await?;
    // Keys are unique within a call, so each returned row names its operation.
    let mut by_key: HashMap<(String, String), (bool, DateTime<Utc>)> = rows
        .into_iter()
        .map(|(q, k, inserted, at)| ((q, k), (inserted, at)))
        .collect();
    ops.iter()
        .map(|op| {
            let TimerOp::Schedule(s) = op else {
                unreachable!("only schedules reach here")
            };
            let (inserted, deliver_at) = by_key
                .remove(&(s.queue.clone(), s.timer_key.clone()))
                .ok_or_else(|| {
                    StorageError::Inconsistent(format!(
                        "timer {}/{} was upserted but not returned",
                        s.queue, s.timer_key
                    ))
                })?;
            Ok(TimerResult::Scheduled {
                rescheduled: !inserted,
                queue: s.queue.clone(),
                timer_key: s.timer_key.clone(),
                txn: s.txn.clone(),
                message_id: s.message_id,
                deliver_at,
            })
        })
        .collect()
}

/// Removes a pending timer (see the module docs for `too_late`).
///
/// # Errors
///
/// Any database error.
pub async fn cancel(conn: &mut PgConnection, c: &Cancel) -> Result<TimerResult, StorageError> {
    // Both CTEs run on the statement's snapshot; the DELETE alone waits for a row lock and
    // then sees the row's latest version (or that it is gone).
    let (seen, gone): (Option<String>, Option<String>) = sqlx::query_as(
        "WITH seen AS (
             SELECT txn
               FROM queen.timers
              WHERE queue = $1
                AND timer_key = $2
         ), gone AS (
             DELETE FROM queen.timers
              WHERE queue = $1
                AND timer_key = $2
             RETURNING txn
         )
         SELECT (SELECT txn FROM seen), (SELECT txn FROM gone)",
    )
    .bind(&c.queue)
    .bind(&c.timer_key)
    .fetch_one(&mut *conn)
    .await?;
    let (status, txn) = match (seen, gone) {
        (_, Some(txn)) => (CancelStatus::Cancelled, Some(txn)),
        (Some(txn), None) => (CancelStatus::TooLate, Some(txn)),
        (None, None) => (CancelStatus::Absent, c.txn.clone()),
    };
    Ok(TimerResult::Cancelled {
        status,
        queue: c.queue.clone(),
        timer_key: c.timer_key.clone(),
        txn,
    })
}

/// The pending timer under (queue, key), if any.
///
/// # Errors
///
/// Any database error.
pub async fn peek(
    conn: &mut PgConnection,
    queue: &str,
    timer_key: &str,
) -> Result<Option<TimerRow>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT queue, timer_key, partition_name, payload, txn, message_id, deliver_at,
                attempts, last_error, created_at, updated_at
           FROM queen.timers
          WHERE queue = $1
            AND timer_key = $2",
    )
    .bind(queue)
    .bind(timer_key)
    .fetch_optional(conn)
    .await?)
}

/// One queue's pending timers with keys after `after` (exclusive), in ascending key order
/// (bytewise), at most `limit` of them; the flag says whether more follow.
///
/// # Errors
///
/// Any database error.
pub async fn list(
    conn: &mut PgConnection,
    queue: &str,
    after: Option<&str>,
    limit: i64,
) -> Result<(Vec<TimerRow>, bool), StorageError> {
    // Keys are never empty, so '' is before every key (COLLATE "C").
    let mut rows: Vec<TimerRow> = sqlx::query_as(
        "SELECT queue, timer_key, partition_name, payload, txn, message_id, deliver_at,
                attempts, last_error, created_at, updated_at
           FROM queen.timers
          WHERE queue = $1
            AND timer_key > COALESCE($2, '')
          ORDER BY timer_key
          LIMIT $3",
    )
    .bind(queue)
    .bind(after)
    .bind(limit + 1)
    .fetch_all(conn)
    .await?;
    let truncated = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    Ok((rows, truncated))
}
