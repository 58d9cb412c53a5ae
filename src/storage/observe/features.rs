//! What the 2.x state holds, for operators (the dashboard's "State" page, `queenctl kv list`,
//! `locks`, `timers`, `streams`): KV namespaces, live lock permits, pending timers per queue
//! and stream queries. Each read is one statement with a row limit; the namespace, timer and
//! stream summaries aggregate their table once (operator routes, run on the admin pool with
//! its statement timeout), never per row.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::error::StorageError;
use crate::storage::kv::LOCKS_NAMESPACE;

/// One KV namespace (live keys only).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Namespace {
    /// Namespace.
    pub namespace: String,
    /// Live keys.
    pub keys: i64,
    /// Bytes of their keys and values (JSON text).
    pub bytes: i64,
    /// Keys that expire within the next minute.
    pub expiring_soon: i64,
    /// Keys with an expiry at all.
    pub expiring: i64,
    /// The newest write.
    pub last_write: Option<DateTime<Utc>>,
}

/// The `limit` namespaces with the most live keys (the locks' namespace included: its keys are
/// the permits).
///
/// # Errors
///
/// Any database error.
pub async fn namespaces(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<Namespace>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT namespace,
                count(*)::int8 AS keys,
                COALESCE(sum(octet_length(key) + octet_length(value)), 0)::int8 AS bytes,
                count(*) FILTER (WHERE expires_at <= now() + interval '60 seconds')::int8
                    AS expiring_soon,
                count(expires_at)::int8 AS expiring,
                max(updated_at) AS last_write
           FROM queen.kv
          WHERE expires_at IS NULL OR expires_at > now()
          GROUP BY namespace
          ORDER BY keys DESC, namespace
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// One live lock permit, as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Permit {
    /// `<name>#<slot>`.
    pub key: String,
    /// `{"owner", "since"}` as JSON text.
    pub value: String,
    /// The fencing token.
    pub token: i64,
    /// When it dies.
    pub expires_at: Option<DateTime<Utc>>,
    /// Its last write (taken or renewed).
    pub renewed_at: DateTime<Utc>,
}

/// Live lock permits, the `limit` that expire first.
///
/// # Errors
///
/// Any database error.
pub async fn permits(conn: &mut PgConnection, limit: i64) -> Result<Vec<Permit>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT key, value, version AS token, expires_at, updated_at AS renewed_at
           FROM queen.kv
          WHERE namespace = $1
            AND (expires_at IS NULL OR expires_at > now())
          ORDER BY expires_at NULLS LAST, key
          LIMIT $2",
    )
    .bind(LOCKS_NAMESPACE)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// Pending timers of one queue.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct QueueTimers {
    /// Queue.
    pub queue: String,
    /// Timers not yet fired.
    pub pending: i64,
    /// The earliest due time.
    pub next_due: DateTime<Utc>,
    /// How far past due the earliest is (0 when it is not due yet).
    pub late_seconds: f64,
    /// Timers whose fire the queue refused at least once.
    pub refused: i64,
}

/// Pending timers per queue, the `limit` queues due first.
///
/// # Errors
///
/// Any database error.
pub async fn timers(conn: &mut PgConnection, limit: i64) -> Result<Vec<QueueTimers>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT queue,
                count(*)::int8 AS pending,
                min(deliver_at) AS next_due,
                GREATEST(extract(epoch FROM now() - min(deliver_at)), 0)::float8 AS late_seconds,
                count(*) FILTER (WHERE attempts > 0)::int8 AS refused
           FROM queen.timers
          GROUP BY queue
          ORDER BY next_due, queue
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// One stream query and its partitions' state.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StreamQuery {
    /// Query name.
    pub name: String,
    /// Source queue.
    pub source_queue: String,
    /// Sink queue, if any.
    pub sink_queue: Option<String>,
    /// Partitions with state.
    pub partitions: i64,
    /// State keys over all partitions.
    pub state_keys: i64,
    /// State bytes over all partitions.
    pub state_bytes: i64,
    /// State bytes of the largest partition.
    pub largest_partition_bytes: i64,
    /// Cycles run over all partitions.
    pub cycles: i64,
    /// The newest cycle (or registration when none ran).
    pub last_cycle: Option<DateTime<Utc>>,
}

/// Stream queries by name, at most `limit`.
///
/// # Errors
///
/// Any database error.
pub async fn stream_queries(
    conn: &mut PgConnection,
    limit: i64,
) -> Result<Vec<StreamQuery>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT q.name, q.source_queue, q.sink_queue,
                count(s.partition_id)::int8 AS partitions,
                COALESCE(sum(s.state_keys), 0)::int8 AS state_keys,
                COALESCE(sum(s.state_bytes), 0)::int8 AS state_bytes,
                COALESCE(max(s.state_bytes), 0)::int8 AS largest_partition_bytes,
                COALESCE(sum(s.cycles), 0)::int8 AS cycles,
                max(s.updated_at) FILTER (WHERE s.cycles > 0) AS last_cycle
           FROM queen.stream_queries q
           LEFT JOIN queen.stream_shards s ON s.query_id = q.id
          GROUP BY q.id, q.name, q.source_queue, q.sink_queue
          ORDER BY q.name
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

/// Live lock permits (the rows of the locks' namespace), counted through its key index.
///
/// # Errors
///
/// Any database error.
pub async fn permits_held(conn: &mut PgConnection) -> Result<i64, StorageError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*)::int8
           FROM queen.kv
          WHERE namespace = $1
            AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(LOCKS_NAMESPACE)
    .fetch_one(conn)
    .await?)
}
