//! Lag at scale: measuring where every subscribed group stands on every partition in a
//! background pass, chunk by chunk, and reading the pass's result (docs/operations.md, "Lag at
//! scale"; schema in `migrations/0018_lag_passes.up.sql`).
//!
//! The lag views (`storage::queues::groups`) measure on request while the subscribed (group,
//! partition) pairs are few: [`source`] counts them, reading at most one more index entry than
//! the limit. Past it a request reads the last pass's tables, whose size is that of the (queue,
//! group) pairs, and says when the pass ran. One broker at a time takes a pass (an advisory
//! lock); each pass replaces the rows of the one before.

use std::collections::{BinaryHeap, HashMap};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::consume::read::start_offset_sql;
use crate::storage::error::StorageError;
use crate::storage::queues::catalog::contains_pattern;
use crate::storage::queues::groups::{
    matching_pairs, oldest_unconsumed_sql, spreads, GroupSummary, PairBacklog, PartitionLag, Spread,
};

/// Advisory lock (first key; the second is 0) held by the broker taking a pass.
const PASS_LOCK: i32 = 0x4c41_4750; // "LAGP"

/// Lagging (group, partition) pairs a pass keeps, the oldest first: the largest `limit` of
/// `GET /api/v1/consumer-groups/lagging`.
pub const OLDEST_KEPT: usize = 10_000;

/// Where the lag views read from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Source {
    /// Few enough pairs: measured on request.
    Live,
    /// Too many pairs: the last pass's result (`None`: no pass finished yet).
    Pass(Option<PassInfo>),
}

impl Source {
    /// When the figures were measured: `None` on request (now); for a pass, its end (`None`
    /// inside while no pass has finished yet).
    pub fn measured_at(&self) -> Option<Option<DateTime<Utc>>> {
        match self {
            Source::Live => None,
            Source::Pass(info) => Some(info.map(|i| i.finished_at)),
        }
    }
}

/// When the last pass ran and what it read.
#[derive(Debug, Clone, Copy, PartialEq, sqlx::FromRow)]
pub struct PassInfo {
    /// Its start.
    pub started_at: DateTime<Utc>,
    /// Its end: the figures are as of between the two.
    pub finished_at: DateTime<Utc>,
    /// Partitions walked.
    pub partitions: i64,
    /// Subscribed (group, partition) pairs measured.
    pub pairs: i64,
}

/// Whether the subscribed (group, partition) pairs are at most `live_pairs`: one statement
/// that stops after `live_pairs + 1` of them.
///
/// # Errors
///
/// Any database error.
pub async fn within(conn: &mut PgConnection, live_pairs: i64) -> Result<bool, StorageError> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8
           FROM (SELECT 1
                   FROM queen.consumer_subscriptions s
                  CROSS JOIN LATERAL (SELECT 1
                                        FROM queen.partitions p
                                       WHERE p.queue_id = s.queue_id
                                       LIMIT $1 + 1) p
                  LIMIT $1 + 1) x",
    )
    .bind(live_pairs)
    .fetch_one(conn)
    .await?;
    Ok(n <= live_pairs)
}

/// The last pass, if one finished.
///
/// # Errors
///
/// Any database error.
pub async fn last_pass(conn: &mut PgConnection) -> Result<Option<PassInfo>, StorageError> {
    sqlx::query_as(
        "SELECT started_at, finished_at, partitions, pairs FROM queen.lag_pass WHERE only_row",
    )
    .fetch_optional(conn)
    .await
    .map_err(StorageError::from)
}

/// Where the lag views read from when measuring on request is allowed up to `live_pairs`
/// subscribed (group, partition) pairs.
///
/// # Errors
///
/// Any database error.
pub async fn source(conn: &mut PgConnection, live_pairs: i64) -> Result<Source, StorageError> {
    if within(&mut *conn, live_pairs).await? {
        Ok(Source::Live)
    } else {
        Ok(Source::Pass(last_pass(conn).await?))
    }
}

/// Seconds since the last pass finished, by PostgreSQL's clock (`None`: no pass yet).
///
/// # Errors
///
/// Any database error.
pub async fn pass_age(conn: &mut PgConnection) -> Result<Option<f64>, StorageError> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - finished_at)::float8
           FROM queen.lag_pass WHERE only_row",
    )
    .fetch_optional(conn)
    .await
    .map_err(StorageError::from)
}

/// One subscribed (group, partition) pair a chunk found lagging or leased.
#[derive(Debug, sqlx::FromRow)]
struct PairRow {
    consumer_group: String,
    queue_id: i64,
    partition_id: i64,
    offset_lag: i64,
    lease_active: bool,
    oldest_unconsumed_at: Option<DateTime<Utc>>,
    /// Seconds from the oldest unconsumed message to the statement's now().
    time_lag: f64,
}

#[derive(Default)]
struct Totals {
    members: i64,
    partitions_with_lag: i64,
    backlog: i64,
    oldest: Option<DateTime<Utc>>,
}

/// The pairs of the partitions with ids in (`after`, `upto`] that have something unconsumed
/// or a live lease (the others add nothing), and how many pairs there were.
async fn chunk(
    conn: &mut PgConnection,
    after: i64,
    upto: i64,
) -> Result<(Vec<PairRow>, i64), StorageError> {
    let start = start_offset_sql("p.id", "s.subscription_from");
    let oldest = oldest_unconsumed_sql("pos");
    let pairs: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8
           FROM queen.partitions p
           JOIN queen.consumer_subscriptions s ON s.queue_id = p.queue_id
          WHERE p.id > $1 AND p.id <= $2",
    )
    .bind(after)
    .bind(upto)
    .fetch_one(&mut *conn)
    .await?;
    if pairs == 0 {
        return Ok((Vec::new(), 0));
    }
    let rows = sqlx::query_as(&format!(
        "WITH pos AS (
             SELECT s.consumer_group, p.queue_id, p.id AS partition_id, p.next_offset,
                    COALESCE(c.lease_expires_at > now(), false) AS lease_active,
                    COALESCE(c.committed_offset, {start}) AS position
               FROM queen.partitions p
               JOIN queen.consumer_subscriptions s ON s.queue_id = p.queue_id
               LEFT JOIN queen.partition_consumers c
                 ON c.partition_id = p.id AND c.consumer_group = s.consumer_group
              WHERE p.id > $1 AND p.id <= $2
         ), found AS (
             SELECT pos.*,
                    GREATEST(pos.next_offset - pos.position, 0) AS offset_lag,
                    {oldest} AS oldest_unconsumed_at
               FROM pos
              WHERE pos.next_offset > pos.position OR pos.lease_active
         )
         SELECT consumer_group, queue_id, partition_id, offset_lag, lease_active,
                oldest_unconsumed_at,
                COALESCE(GREATEST(extract(epoch FROM now() - oldest_unconsumed_at), 0), 0)::float8
                    AS time_lag
           FROM found"
    ))
    .bind(after)
    .bind(upto)
    .fetch_all(conn)
    .await?;
    Ok((rows, pairs))
}

/// The last partition id of the chunk of at most `size` partitions after `after` and how
/// many it holds (`None`: none left).
async fn chunk_end(
    conn: &mut PgConnection,
    after: i64,
    size: i64,
) -> Result<Option<(i64, i64)>, StorageError> {
    let (last, n): (Option<i64>, i64) = sqlx::query_as(
        "SELECT max(id), count(*)::int8
           FROM (SELECT id FROM queen.partitions WHERE id > $1 ORDER BY id LIMIT $2) c",
    )
    .bind(after)
    .bind(size)
    .fetch_one(conn)
    .await?;
    Ok(last.map(|last| (last, n)))
}

fn spread(mut values: Vec<f64>) -> Spread {
    if values.is_empty() {
        return Spread::default();
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    // percentile_cont(0.5), as the measurement on request computes it.
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Spread {
        avg: values.iter().sum::<f64>() / n as f64,
        median,
        min: values[0],
        max: values[n - 1],
    }
}

/// Takes a pass: walks every partition in chunks of `chunk_size` (one statement each, so no
/// statement holds a snapshot for long), measures every subscribed pair, and replaces the
/// tables' rows with the result in one transaction. Returns `None` without doing anything
/// when another broker is taking one.
///
/// # Errors
///
/// Any database error (the lock is released; the tables keep the previous pass).
pub async fn take_pass(
    conn: &mut PgConnection,
    chunk_size: i64,
) -> Result<Option<PassInfo>, StorageError> {
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, 0)")
        .bind(PASS_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Ok(None);
    }
    let result = walk_and_store(&mut *conn, chunk_size).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, 0)")
        .bind(PASS_LOCK)
        .execute(&mut *conn)
        .await;
    let info = result?;
    unlocked?;
    Ok(Some(info))
}

async fn walk_and_store(
    conn: &mut PgConnection,
    chunk_size: i64,
) -> Result<PassInfo, StorageError> {
    let started_at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *conn)
        .await?;
    let mut totals: HashMap<(String, i64), Totals> = HashMap::new();
    // The oldest lagging pairs: a max-heap on age kept at OLDEST_KEPT by dropping the newest.
    let mut oldest: BinaryHeap<(DateTime<Utc>, String, i64, i64)> = BinaryHeap::new();
    let (mut times, mut offsets) = (Vec::new(), Vec::new());
    let (mut after, mut partitions, mut pairs) = (0_i64, 0_i64, 0_i64);
    while let Some((upto, walked)) = chunk_end(&mut *conn, after, chunk_size).await? {
        let (rows, n) = chunk(&mut *conn, after, upto).await?;
        pairs += n;
        partitions += walked;
        for r in rows {
            let t = totals
                .entry((r.consumer_group.clone(), r.queue_id))
                .or_default();
            t.members += i64::from(r.lease_active);
            if r.offset_lag > 0 {
                t.partitions_with_lag += 1;
                t.backlog += r.offset_lag;
                t.oldest = match (t.oldest, r.oldest_unconsumed_at) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                times.push(r.time_lag);
                offsets.push(r.offset_lag as f64);
                if let Some(at) = r.oldest_unconsumed_at {
                    oldest.push((at, r.consumer_group, r.partition_id, r.offset_lag));
                    if oldest.len() > OLDEST_KEPT {
                        oldest.pop();
                    }
                }
            }
        }
        after = upto;
    }
    let (time, offset) = (spread(times), spread(offsets));
    store(
        conn,
        totals,
        oldest.into_vec(),
        started_at,
        partitions,
        pairs,
        time,
        offset,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn store(
    conn: &mut PgConnection,
    totals: HashMap<(String, i64), Totals>,
    oldest: Vec<(DateTime<Utc>, String, i64, i64)>,
    started_at: DateTime<Utc>,
    partitions: i64,
    pairs: i64,
    time: Spread,
    offset: Spread,
) -> Result<PassInfo, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    sqlx::query("DELETE FROM queen.lag_totals")
        .execute(&mut *tx)
        .await?;
    let mut groups = Vec::with_capacity(totals.len());
    let mut queues = Vec::with_capacity(totals.len());
    let (mut members, mut lagging, mut backlog, mut at) = (vec![], vec![], vec![], vec![]);
    for ((group, queue), t) in totals {
        groups.push(group);
        queues.push(queue);
        members.push(t.members);
        lagging.push(t.partitions_with_lag);
        backlog.push(t.backlog);
        at.push(t.oldest);
    }
    // Queues deleted during the pass are left out (their rows would break the foreign key).
    sqlx::query(
        "INSERT INTO queen.lag_totals
                (consumer_group, queue_id, members, partitions_with_lag, backlog,
                 oldest_unconsumed_at)
         SELECT t.*
           FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],
                       $6::timestamptz[]) AS t(g, queue_id, m, l, b, o)
          WHERE EXISTS (SELECT 1 FROM queen.queues q WHERE q.id = t.queue_id)",
    )
    .bind(&groups)
    .bind(&queues)
    .bind(&members)
    .bind(&lagging)
    .bind(&backlog)
    .bind(&at)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM queen.lag_oldest")
        .execute(&mut *tx)
        .await?;
    let mut groups = Vec::with_capacity(oldest.len());
    let (mut ids, mut lags, mut ats) = (vec![], vec![], vec![]);
    for (at, group, partition, lag) in oldest {
        ats.push(at);
        groups.push(group);
        ids.push(partition);
        lags.push(lag);
    }
    sqlx::query(
        "INSERT INTO queen.lag_oldest
                (consumer_group, partition_id, offset_lag, oldest_unconsumed_at)
         SELECT t.*
           FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::timestamptz[])
                AS t(g, partition_id, l, o)
          WHERE EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = t.partition_id)",
    )
    .bind(&groups)
    .bind(&ids)
    .bind(&lags)
    .bind(&ats)
    .execute(&mut *tx)
    .await?;
    let info: PassInfo = sqlx::query_as(
        "INSERT INTO queen.lag_pass
                (only_row, started_at, finished_at, partitions, pairs,
                 time_avg, time_median, time_min, time_max,
                 offset_avg, offset_median, offset_min, offset_max)
         VALUES (true, $1, clock_timestamp(), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (only_row) DO UPDATE
            SET started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
                partitions = EXCLUDED.partitions, pairs = EXCLUDED.pairs,
                time_avg = EXCLUDED.time_avg, time_median = EXCLUDED.time_median,
                time_min = EXCLUDED.time_min, time_max = EXCLUDED.time_max,
                offset_avg = EXCLUDED.offset_avg, offset_median = EXCLUDED.offset_median,
                offset_min = EXCLUDED.offset_min, offset_max = EXCLUDED.offset_max
         RETURNING started_at, finished_at, partitions, pairs",
    )
    .bind(started_at)
    .bind(partitions)
    .bind(pairs)
    .bind(time.avg)
    .bind(time.median)
    .bind(time.min)
    .bind(time.max)
    .bind(offset.avg)
    .bind(offset.median)
    .bind(offset.min)
    .bind(offset.max)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(info)
}

/// The columns of a [`GroupSummary`] from the pass's totals `t` joined to the subscription
/// `s` (a pair the pass did not see — subscribed since, or caught up with no lease — counts
/// zero).
const SUMMARY_COLUMNS: &str = "s.consumer_group, q.name AS queue,
    COALESCE(t.members, 0)::int8 AS members,
    COALESCE(t.partitions_with_lag, 0)::int8 AS partitions_with_lag,
    COALESCE(t.backlog, 0)::int8 AS backlog,
    COALESCE(extract(epoch FROM now() - t.oldest_unconsumed_at)::int8, 0) AS max_time_lag,
    s.subscription_mode, s.subscription_from, s.created_at AS subscribed_at";

/// [`crate::storage::queues::groups::list`] from the last pass.
///
/// # Errors
///
/// Any database error.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<GroupSummary>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT {SUMMARY_COLUMNS}
           FROM queen.consumer_subscriptions s
           JOIN queen.queues q ON q.id = s.queue_id
           LEFT JOIN queen.lag_totals t
             ON t.consumer_group = s.consumer_group AND t.queue_id = s.queue_id
          ORDER BY s.consumer_group, q.name"
    ))
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// [`crate::storage::queues::groups::list_page`] from the last pass.
///
/// # Errors
///
/// Any database error.
pub async fn list_page(
    conn: &mut PgConnection,
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<GroupSummary>, i64), StorageError> {
    let pattern = search.map(contains_pattern);
    let matching = matching_pairs("$1");
    let rows = sqlx::query_as(&format!(
        "SELECT {SUMMARY_COLUMNS}
           FROM (SELECT s.* {matching}
                  ORDER BY s.consumer_group, q.name
                  LIMIT $2 OFFSET $3) s
           JOIN queen.queues q ON q.id = s.queue_id
           LEFT JOIN queen.lag_totals t
             ON t.consumer_group = s.consumer_group AND t.queue_id = s.queue_id
          ORDER BY s.consumer_group, q.name"
    ))
    .bind(&pattern)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*)::int8 {matching}"))
        .bind(&pattern)
        .fetch_one(conn)
        .await?;
    Ok((rows, total))
}

/// [`crate::storage::queues::groups::lagging`] from the last pass: its oldest lagging pairs,
/// with each partition's lease as it is now.
///
/// # Errors
///
/// Any database error.
pub async fn lagging(
    conn: &mut PgConnection,
    min_lag_secs: i64,
    limit: i64,
) -> Result<Vec<PartitionLag>, StorageError> {
    sqlx::query_as(
        "SELECT o.consumer_group, q.name AS queue, p.name AS partition,
                p.uuid AS partition_uuid, c.lease_owner, o.offset_lag,
                COALESCE(extract(epoch FROM now() - o.oldest_unconsumed_at)::int8, 0)
                    AS time_lag_seconds,
                o.oldest_unconsumed_at, c.last_consumed_at,
                COALESCE(c.total_consumed, 0) AS total_consumed,
                COALESCE(c.lease_expires_at > now(), false) AS lease_active
           FROM queen.lag_oldest o
           JOIN queen.partitions p ON p.id = o.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
           LEFT JOIN queen.partition_consumers c
             ON c.partition_id = o.partition_id AND c.consumer_group = o.consumer_group
          WHERE o.oldest_unconsumed_at <= now() - $1 * interval '1 second'
          ORDER BY o.oldest_unconsumed_at, o.consumer_group, q.name, p.name
          LIMIT $2",
    )
    .bind(min_lag_secs as f64)
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// [`crate::storage::queues::groups::lag_summary`] as the last pass measured it (zeros
/// without a pass).
///
/// # Errors
///
/// Any database error.
pub async fn lag_summary(conn: &mut PgConnection) -> Result<(Spread, Spread), StorageError> {
    type Row = (f64, f64, f64, f64, f64, f64, f64, f64);
    let r: Option<Row> = sqlx::query_as(
        "SELECT time_avg, time_median, time_min, time_max,
                offset_avg, offset_median, offset_min, offset_max
           FROM queen.lag_pass WHERE only_row",
    )
    .fetch_optional(conn)
    .await?;
    Ok(r.map_or((Spread::default(), Spread::default()), spreads))
}

/// [`crate::storage::queues::groups::largest_backlogs`] from the last pass.
///
/// # Errors
///
/// Any database error.
pub async fn largest_backlogs(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<PairBacklog>, StorageError> {
    sqlx::query_as(
        "SELECT q.name AS queue, t.consumer_group, t.backlog,
                COALESCE(GREATEST(extract(epoch FROM now() - t.oldest_unconsumed_at), 0), 0)::float8
                    AS oldest_seconds
           FROM queen.lag_totals t
           JOIN queen.queues q ON q.id = t.queue_id
          WHERE t.backlog > 0
          ORDER BY t.backlog DESC, oldest_seconds DESC, q.name, t.consumer_group
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_matches_percentile_cont() {
        assert_eq!(spread(vec![]), Spread::default());
        let s = spread(vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.avg, s.median, s.min, s.max), (2.5, 2.5, 1.0, 4.0));
        assert_eq!(spread(vec![5.0, 1.0, 3.0]).median, 3.0);
    }
}
