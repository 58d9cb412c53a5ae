//! What the resource routes show about queues and partitions: per-partition facts read with
//! primary-key probes (first and last segment), the partition's consumer state
//! ([`crate::storage::queues::progress`]), and the message counts derived from them.
//!
//! Counts follow the message statuses of the messages listing (the rules are in
//! `storage::queues::progress`): every stored message is counted once, as `pending`, `processing`,
//! `completed` or `deadLetter`. `failed` is always 0: a failed ack releases the lease without
//! moving the cursor, so the message is `pending` again until its retries run out and it is
//! dead-lettered.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::queues::progress::{self, DeadCounts, Progress, PROGRESS_COLUMNS};

/// One partition and what its segments say.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PartitionRow {
    /// Internal id.
    pub id: i64,
    /// Public id (`partitionId` on the wire).
    pub uuid: Uuid,
    /// Its queue's internal id.
    pub queue_id: i64,
    /// Name.
    pub name: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// The next offset to hand out: every message ever stored has an offset below it.
    pub next_offset: i64,
    /// Base offset of the oldest segment still stored (none when empty).
    pub first_offset: Option<i64>,
    /// When the oldest stored segment was written.
    pub oldest_at: Option<DateTime<Utc>>,
    /// When the newest stored segment was written.
    pub newest_at: Option<DateTime<Utc>>,
    /// What its consumer groups have done.
    #[sqlx(flatten)]
    pub progress: Progress,
    /// Dead letters among its stored messages.
    #[sqlx(skip)]
    pub dead: DeadCounts,
}

impl PartitionRow {
    /// Messages stored now. Retention removes a prefix of whole segments (`storage::queues::retention`),
    /// so the stored ones are exactly the offsets `first_offset .. next_offset`.
    pub fn stored(&self) -> i64 {
        self.first_offset
            .map_or(0, |first| self.next_offset - first)
    }

    /// The offsets stored now (empty when none).
    pub fn stored_range(&self) -> std::ops::Range<i64> {
        self.first_offset.unwrap_or(self.next_offset)..self.next_offset
    }
}

/// Which partitions [`partitions_in`] reads.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// Every partition of every queue.
    All,
    /// Every partition of these queues (internal ids).
    Queues(&'a [i64]),
    /// The partitions of these queues that hold messages now (those without contribute nothing
    /// to the counts but their number; [`partition_counts`] has that).
    HeldIn(&'a [i64]),
    /// These partitions (internal ids).
    Ids(&'a [i64]),
}

/// Partitions with their segment facts and consumer state: of one queue, or of every queue.
/// Two statements, however many partitions.
///
/// # Errors
///
/// Any database error.
pub async fn partitions(
    conn: &mut PgConnection,
    queue_id: Option<i64>,
) -> Result<Vec<PartitionRow>, StorageError> {
    match queue_id {
        Some(id) => partitions_in(conn, Scope::Queues(&[id])).await,
        None => partitions_in(conn, Scope::All).await,
    }
}

/// Partitions of `scope` with their segment facts and consumer state, in queue and name
/// order. Two statements, however many partitions; the work is two primary-key probes per
/// partition in scope (the first and the last segment) and a look at its consumer rows.
///
/// # Errors
///
/// Any database error.
pub async fn partitions_in(
    conn: &mut PgConnection,
    scope: Scope<'_>,
) -> Result<Vec<PartitionRow>, StorageError> {
    let held;
    let (filter, ids): (&str, Option<&[i64]>) = match scope {
        Scope::All => ("$1::int8[] IS NULL", None),
        Scope::Queues(ids) => ("p.queue_id = ANY($1)", Some(ids)),
        Scope::HeldIn(queues) => {
            // One probe of the segments' key per partition first; the consumer state is then
            // read for the partitions that hold messages only.
            held = held_in(conn, queues).await?;
            ("p.id = ANY($1)", Some(held.as_slice()))
        }
        Scope::Ids(ids) => ("p.id = ANY($1)", Some(ids)),
    };
    let mut rows: Vec<PartitionRow> = sqlx::query_as(&format!(
        "SELECT p.id, p.uuid, p.queue_id, p.name, p.created_at, p.next_offset,
                f.base_offset AS first_offset, f.created_at AS oldest_at, l.created_at AS newest_at,
                {PROGRESS_COLUMNS}
           FROM queen.partitions p
           LEFT JOIN LATERAL (
                SELECT base_offset, created_at FROM queen.segments
                 WHERE partition_id = p.id ORDER BY base_offset LIMIT 1
           ) f ON TRUE
           LEFT JOIN LATERAL (
                SELECT created_at FROM queen.segments
                 WHERE partition_id = p.id ORDER BY base_offset DESC LIMIT 1
           ) l ON TRUE
           {joins}
          WHERE {filter}
          ORDER BY p.queue_id, p.name",
        joins = progress::progress_joins()
    ))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    let ranges: Vec<_> = rows
        .iter()
        .filter(|p| p.stored() > 0)
        .map(|p| (p.id, p.stored_range(), &p.progress))
        .collect();
    let dead: HashMap<i64, DeadCounts> = progress::dead_counts(conn, &ranges)
        .await?
        .into_iter()
        .collect();
    for row in &mut rows {
        if let Some(d) = dead.get(&row.id) {
            row.dead = *d;
        }
    }
    Ok(rows)
}

/// The partitions (internal ids) of these queues that hold messages now.
async fn held_in(conn: &mut PgConnection, queue_ids: &[i64]) -> Result<Vec<i64>, StorageError> {
    Ok(sqlx::query_scalar(
        "SELECT p.id
           FROM queen.partitions p
          WHERE p.queue_id = ANY($1)
            AND EXISTS (SELECT 1 FROM queen.segments s WHERE s.partition_id = p.id)",
    )
    .bind(queue_ids)
    .fetch_all(conn)
    .await?)
}

/// The partition count of each of these queues (internal ids; a queue without partitions is
/// absent): an index-only count over the `(queue_id, name)` index.
///
/// # Errors
///
/// Any database error.
pub async fn partition_counts(
    conn: &mut PgConnection,
    queue_ids: &[i64],
) -> Result<HashMap<i64, i64>, StorageError> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT queue_id, count(*)::int8
           FROM queen.partitions
          WHERE queue_id = ANY($1)
          GROUP BY queue_id",
    )
    .bind(queue_ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// The internal ids of one page of a queue's partitions, by name.
///
/// # Errors
///
/// Any database error.
pub async fn partition_page(
    conn: &mut PgConnection,
    queue_id: i64,
    limit: i64,
    offset: i64,
) -> Result<Vec<i64>, StorageError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM queen.partitions WHERE queue_id = $1 ORDER BY name LIMIT $2 OFFSET $3",
    )
    .bind(queue_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(conn)
    .await?)
}

/// Up to `limit` partitions (internal ids, ascending) that hold messages now, found by a
/// skip scan of the segments' primary key: one index probe per partition found, however many
/// partitions there are and however many segments each holds.
///
/// # Errors
///
/// Any database error.
pub async fn held_partitions(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<i64>, StorageError> {
    Ok(sqlx::query_scalar(
        "WITH RECURSIVE held(id, n) AS (
             (SELECT partition_id, 1 FROM queen.segments ORDER BY partition_id LIMIT 1)
             UNION ALL
             SELECT (SELECT s.partition_id FROM queen.segments s
                      WHERE s.partition_id > held.id
                      ORDER BY s.partition_id LIMIT 1), held.n + 1
               FROM held
              WHERE held.id IS NOT NULL AND held.n < $1
         )
         SELECT id FROM held WHERE id IS NOT NULL",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// How many partitions there are: exact up to `exact_up_to` (a count stopped there), else
/// PostgreSQL's estimate of the table's rows (`pg_class.reltuples`, kept by autovacuum and
/// ANALYZE). The flag says whether the figure is exact.
///
/// # Errors
///
/// Any database error.
pub async fn partition_total(
    conn: &mut PgConnection,
    exact_up_to: i64,
) -> Result<(i64, bool), StorageError> {
    let counted: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8 FROM (SELECT 1 FROM queen.partitions LIMIT $1) x",
    )
    .bind(exact_up_to + 1)
    .fetch_one(&mut *conn)
    .await?;
    if counted <= exact_up_to {
        return Ok((counted, true));
    }
    let estimate: f64 = sqlx::query_scalar(
        "SELECT GREATEST(reltuples, 0)::float8 FROM pg_class WHERE oid = 'queen.partitions'::regclass",
    )
    .fetch_one(conn)
    .await?;
    Ok(((estimate as i64).max(counted), false))
}

/// Message counts of a partition (or a sum of them), with the wire's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageCounts {
    /// Stored messages.
    pub total: i64,
    /// Not yet consumed.
    pub pending: i64,
    /// Under a live lease.
    pub processing: i64,
    /// Consumed.
    pub completed: i64,
    /// Always 0 here (see the module documentation).
    pub failed: i64,
    /// Dead-lettered.
    pub dead_letter: i64,
}

impl std::ops::AddAssign for MessageCounts {
    fn add_assign(&mut self, o: Self) {
        self.total += o.total;
        self.pending += o.pending;
        self.processing += o.processing;
        self.completed += o.completed;
        self.failed += o.failed;
        self.dead_letter += o.dead_letter;
    }
}

/// The counts of one partition's stored messages, by the statuses of the messages listing:
/// queue mode (or no group): `completed` below the queue-mode cursor, `processing` inside the
/// live queue-mode lease's range, the rest `pending`; bus mode: `completed` once every named
/// group consumed it; dead-lettered ones count as `deadLetter` only.
pub fn message_counts(p: &PartitionRow) -> MessageCounts {
    let t = p.progress.tally(p.stored_range(), &p.dead);
    MessageCounts {
        total: p.stored(),
        pending: t.pending,
        processing: t.processing,
        completed: t.completed,
        failed: 0,
        dead_letter: t.dead_letter,
    }
}

/// Messages stored per second over the last minute, from the segments written in it.
///
/// # Errors
///
/// Any database error.
pub async fn ingested_per_second(conn: &mut PgConnection) -> Result<f64, StorageError> {
    let last_minute: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(msg_count), 0)::int8
           FROM queen.segments
          WHERE created_at > now() - interval '60 seconds'",
    )
    .fetch_one(conn)
    .await?;
    Ok(last_minute as f64 / 60.0)
}

/// Tallies over every queue count partitions exactly while there are at most this many in all.
pub const EXACT_PARTITIONS: i64 = 100_000;
/// Tallies over every queue sum the messages of at most this many partitions holding some.
pub const TALLIED_PARTITIONS: i64 = 10_000;

/// Per queue (internal id) its partition count and its messages by status, and whether each
/// figure is whole.
#[derive(Debug, Default)]
pub struct Tallies {
    /// (partitions, messages) per queue id; a queue without partitions or messages is absent.
    pub by_queue: HashMap<i64, (i64, MessageCounts)>,
    /// False when the partitions were not counted (more than [`EXACT_PARTITIONS`] in all).
    pub partitions_exact: bool,
    /// False when more than [`TALLIED_PARTITIONS`] partitions hold messages (only those were
    /// summed).
    pub messages_exact: bool,
}

/// The tallies of these queues (`Some`: their partitions counted from the `(queue_id, name)`
/// index, messages over those of their partitions holding some), or of every queue (`None`),
/// bounded: partitions counted only while at most [`EXACT_PARTITIONS`] in all, messages over
/// at most [`TALLIED_PARTITIONS`] partitions holding some, found by a skip scan.
///
/// # Errors
///
/// Any database error.
pub async fn tallies(
    conn: &mut PgConnection,
    queue_ids: Option<&[i64]>,
) -> Result<Tallies, StorageError> {
    let mut out = Tallies {
        partitions_exact: true,
        messages_exact: true,
        ..Tallies::default()
    };
    let held = match queue_ids {
        Some(ids) => {
            for (id, n) in partition_counts(&mut *conn, ids).await? {
                out.by_queue.entry(id).or_default().0 = n;
            }
            partitions_in(&mut *conn, Scope::HeldIn(ids)).await?
        }
        None => {
            out.partitions_exact = partition_total(&mut *conn, EXACT_PARTITIONS).await?.1;
            if out.partitions_exact {
                let rows: Vec<(i64, i64)> = sqlx::query_as(
                    "SELECT queue_id, count(*)::int8 FROM queen.partitions GROUP BY queue_id",
                )
                .fetch_all(&mut *conn)
                .await?;
                for (id, n) in rows {
                    out.by_queue.entry(id).or_default().0 = n;
                }
            }
            let mut held = held_partitions(&mut *conn, TALLIED_PARTITIONS + 1).await?;
            out.messages_exact = held.len() as i64 <= TALLIED_PARTITIONS;
            held.truncate(TALLIED_PARTITIONS as usize);
            partitions_in(&mut *conn, Scope::Ids(&held)).await?
        }
    };
    for p in held {
        out.by_queue.entry(p.queue_id).or_default().1 += message_counts(&p);
    }
    Ok(out)
}
