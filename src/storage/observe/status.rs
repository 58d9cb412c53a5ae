//! What the dashboard's status and analytics routes read (reference §9.6): messages written per
//! time bucket (from the segments' commit times), per-queue tallies of message counts, and
//! PostgreSQL's own statistics. Everything is computed on request; nothing here keeps history.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::error::StorageError;

/// Which queues a status read covers (`None`: no condition).
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Queue name.
    pub queue: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Task.
    pub task: Option<String>,
}

/// A bucket width of the time series: a `date_trunc` unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// One week.
    Week,
    /// One month.
    Month,
}

impl Interval {
    /// The interval named `text` (`minute`, `hour`, `day`, `week`, `month`).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "minute" => Self::Minute,
            "hour" => Self::Hour,
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            _ => return None,
        })
    }

    /// The unit's name (also the `date_trunc` argument).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }
}

/// Most buckets one series may have.
pub const MAX_BUCKETS: i64 = 2000;

impl Interval {
    /// The unit's shortest length, seconds (a month: 28 days).
    fn min_secs(self) -> i64 {
        match self {
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 28 * 86_400,
        }
    }
}

/// An upper bound of the buckets from `from` to `to` (both truncated to the unit), counted
/// without asking PostgreSQL: a range of centuries is refused before any statement runs.
pub fn buckets_at_most(from: DateTime<Utc>, to: DateTime<Utc>, interval: Interval) -> i64 {
    let secs = (to - from).num_seconds().max(0);
    secs / interval.min_secs() + 2
}

/// Messages written per bucket from `from` to `to` (every bucket, empty ones as 0), per queue
/// when `by_queue`, else with the queue `None`. `None` when the range needs more than
/// [`MAX_BUCKETS`] buckets.
///
/// # Errors
///
/// Any database error.
pub async fn written(
    conn: &mut PgConnection,
    scope: &Scope,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    interval: Interval,
    by_queue: bool,
) -> Result<Option<Vec<(DateTime<Utc>, Option<String>, i64)>>, StorageError> {
    let unit = interval.as_str();
    if buckets_at_most(from, to, interval) > MAX_BUCKETS {
        return Ok(None);
    }
    let rows = sqlx::query_as(
        "WITH buckets AS (
             SELECT b FROM generate_series(date_trunc($1, $2), date_trunc($1, $3),
                                           ('1 ' || $1)::interval) AS b
         ), written AS (
             SELECT date_trunc($1, s.created_at) AS b,
                    CASE WHEN $7 THEN q.name END AS queue,
                    sum(s.msg_count)::int8 AS n
               FROM queen.segments s
               JOIN queen.partitions p ON p.id = s.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE s.created_at >= $2 AND s.created_at <= $3
                AND ($4::text IS NULL OR q.name = $4)
                AND ($5::text IS NULL OR q.namespace = $5)
                AND ($6::text IS NULL OR q.task = $6)
              GROUP BY 1, 2
         )
         SELECT buckets.b, written.queue, COALESCE(written.n, 0)::int8
           FROM buckets
           LEFT JOIN written ON written.b = buckets.b
          ORDER BY buckets.b, written.queue",
    )
    .bind(unit)
    .bind(from)
    .bind(to)
    .bind(&scope.queue)
    .bind(&scope.namespace)
    .bind(&scope.task)
    .bind(by_queue)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some(rows))
}

/// Dead letters recorded per queue name.
///
/// # Errors
///
/// Any database error.
pub async fn dead_letters_by_queue(
    conn: &mut PgConnection,
) -> Result<HashMap<String, i64>, StorageError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT q.name, count(*)::int8
           FROM queen.dead_letters d
           JOIN queen.partitions p ON p.id = d.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          GROUP BY q.name",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// PostgreSQL's statistics of this database and the sizes of the broker's tables.
#[derive(Debug, Clone)]
pub struct PostgresStats {
    /// `pg_database_size`, bytes.
    pub database_bytes: i64,
    /// Backends connected to this database.
    pub connections: i32,
    /// Committed transactions.
    pub commits: i64,
    /// Rolled-back transactions.
    pub rollbacks: i64,
    /// Blocks found in shared buffers.
    pub blocks_hit: i64,
    /// Blocks read from disk.
    pub blocks_read: i64,
    /// Deadlocks detected.
    pub deadlocks: i64,
    /// (table, total bytes with indexes and TOAST, estimated live rows) of schema `queen`.
    pub tables: Vec<(String, i64, i64)>,
}

/// Reads [`PostgresStats`].
///
/// # Errors
///
/// Any database error.
pub async fn postgres(conn: &mut PgConnection) -> Result<PostgresStats, StorageError> {
    let (database_bytes, connections, commits, rollbacks, blocks_hit, blocks_read, deadlocks): (
        i64,
        i32,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "SELECT pg_database_size(current_database())::int8, numbackends, xact_commit,
                xact_rollback, blks_hit, blks_read, deadlocks
           FROM pg_stat_database
          WHERE datname = current_database()",
    )
    .fetch_one(&mut *conn)
    .await?;
    let tables = sqlx::query_as(
        "SELECT c.relname::text, pg_total_relation_size(c.oid)::int8,
                GREATEST(c.reltuples, 0)::int8
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'queen' AND c.relkind = 'r'
          ORDER BY pg_total_relation_size(c.oid) DESC, c.relname",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(PostgresStats {
        database_bytes,
        connections,
        commits,
        rollbacks,
        blocks_hit,
        blocks_read,
        deadlocks,
        tables,
    })
}
