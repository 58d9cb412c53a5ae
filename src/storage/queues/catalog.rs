//! Queue configuration: the options row of `queen.queues`, written by `/configure` as a full
//! replace (an option left out goes back to its default) and read by the admin routes.
//!
//! This file never decides what an option means on the wire or which values are allowed; that
//! is `http::configure`. It stores exactly what it is given.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// Every option of a queue, with Queen's defaults (reference §7). Serialises with the wire's
/// camelCase names, so `/configure` echoes it as `options`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct QueueOptions {
    /// Listing order, and the order of namespace/task pops (higher first).
    pub priority: i32,
    /// Lease length in seconds.
    pub lease_time: i32,
    /// Batch retries before dead-lettering.
    pub retry_limit: i32,
    /// Milliseconds; stored, no effect (as in Queen 0.15).
    pub retry_delay: i32,
    /// Most messages not yet consumed the queue holds (docs/operations.md); 0 = no limit.
    pub max_size: i64,
    /// Seconds; stored, no effect (as in Queen 0.15).
    pub ttl: i32,
    /// Stored, no effect: the dead-letter queue is always on (as in Queen 0.15).
    pub dead_letter_queue: bool,
    /// Stored, no effect: dead-lettering after the retry limit always happens (Queen 0.15).
    pub dlq_after_max_retries: bool,
    /// Seconds a message stays invisible after arrival.
    pub delayed_processing: i32,
    /// Seconds a partition's newest message must age before the partition is handed out.
    pub window_buffer: i32,
    /// Remove segments older than this many seconds (needs `retention_enabled`); 0 = keep.
    pub retention_seconds: i32,
    /// Remove segments older than this that every group consumed (needs `retention_enabled`).
    pub completed_retention_seconds: i32,
    /// Master switch of the two retention options above.
    pub retention_enabled: bool,
    /// Payload encryption at rest (`storage::segments::crypto`; needs `QUEEN_ENCRYPTION_KEY`).
    pub encryption_enabled: bool,
    /// Remove segments older than this many seconds, consumed or not; 0 = never.
    pub max_wait_time_seconds: i32,
    /// Dedup window in seconds; 0 turns dedup off for the queue.
    pub dedup_window_seconds: i32,
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            priority: 0,
            lease_time: 300,
            retry_limit: 3,
            retry_delay: 1000,
            max_size: 0,
            ttl: 3600,
            dead_letter_queue: false,
            dlq_after_max_retries: false,
            delayed_processing: 0,
            window_buffer: 0,
            retention_seconds: 0,
            completed_retention_seconds: 0,
            retention_enabled: false,
            encryption_enabled: false,
            max_wait_time_seconds: 0,
            dedup_window_seconds: 3600,
        }
    }
}

/// The option columns, in [`QueueOptions`] field order (shared by every statement below).
const OPTION_COLUMNS: &str = "priority, lease_time, retry_limit, retry_delay, max_size, ttl, \
     dead_letter_queue, dlq_after_max_retries, delayed_processing, window_buffer, \
     retention_seconds, completed_retention_seconds, retention_enabled, encryption_enabled, \
     max_wait_time_seconds, dedup_window_seconds";

/// What a configure call created or replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    /// The queue's public id.
    pub queue_uuid: Uuid,
    /// The public id of its `Default` partition.
    pub default_partition_uuid: Uuid,
}

/// Creates the queue or replaces all of its settings, and makes sure its `Default` partition
/// exists, in one transaction.
///
/// # Errors
///
/// Any database error.
pub async fn configure(
    conn: &mut PgConnection,
    name: &str,
    namespace: &str,
    task: &str,
    o: &QueueOptions,
) -> Result<Configured, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let updates = OPTION_COLUMNS
        .split(", ")
        .map(|c| format!("{c} = EXCLUDED.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "INSERT INTO queen.queues (name, namespace, task, {OPTION_COLUMNS})
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
         ON CONFLICT (name) DO UPDATE
            SET namespace = EXCLUDED.namespace, task = EXCLUDED.task, {updates}
         RETURNING id, uuid"
    );
    let (queue_id, queue_uuid): (i64, Uuid) = sqlx::query_as(&sql)
        .bind(name)
        .bind(namespace)
        .bind(task)
        .bind(o.priority)
        .bind(o.lease_time)
        .bind(o.retry_limit)
        .bind(o.retry_delay)
        .bind(o.max_size)
        .bind(o.ttl)
        .bind(o.dead_letter_queue)
        .bind(o.dlq_after_max_retries)
        .bind(o.delayed_processing)
        .bind(o.window_buffer)
        .bind(o.retention_seconds)
        .bind(o.completed_retention_seconds)
        .bind(o.retention_enabled)
        .bind(o.encryption_enabled)
        .bind(o.max_wait_time_seconds)
        .bind(o.dedup_window_seconds)
        .fetch_one(&mut *tx)
        .await?;
    // The upsert above holds the queue row's lock, so the partition row cannot vanish between
    // these two statements.
    let default_partition_uuid: Uuid = sqlx::query_scalar(
        "WITH created AS (
             INSERT INTO queen.partitions (queue_id, name)
             VALUES ($1, 'Default')
             ON CONFLICT (queue_id, name) DO NOTHING
             RETURNING uuid
         )
         SELECT uuid FROM created
          UNION ALL
         SELECT uuid FROM queen.partitions WHERE queue_id = $1 AND name = 'Default'
          LIMIT 1",
    )
    .bind(queue_id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Configured {
        queue_uuid,
        default_partition_uuid,
    })
}

/// One queue as the admin routes show it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Queue {
    /// Internal id.
    pub id: i64,
    /// Public id.
    pub uuid: Uuid,
    /// Name.
    pub name: String,
    /// Namespace ("" when none).
    pub namespace: String,
    /// Task ("" when none).
    pub task: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Its options.
    #[sqlx(flatten)]
    pub options: QueueOptions,
}

/// The queue named `name`, if it exists.
///
/// # Errors
///
/// Any database error.
pub async fn find(conn: &mut PgConnection, name: &str) -> Result<Option<Queue>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT id, uuid, name, namespace, task, created_at, {OPTION_COLUMNS}
           FROM queen.queues
          WHERE name = $1"
    ))
    .bind(name)
    .fetch_optional(conn)
    .await
    .map_err(StorageError::from)
}

/// Every queue, highest priority first, then by name.
///
/// # Errors
///
/// Any database error.
pub async fn all(conn: &mut PgConnection) -> Result<Vec<Queue>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT id, uuid, name, namespace, task, created_at, {OPTION_COLUMNS}
           FROM queen.queues
          ORDER BY priority DESC, name"
    ))
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// Turns a search text into an `ILIKE` pattern matching names that contain it (case
/// insensitive; `%`, `_` and `\\` match themselves).
pub fn contains_pattern(search: &str) -> String {
    let mut out = String::with_capacity(search.len() + 2);
    out.push('%');
    for c in search.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// One page of the queues in listing order (highest priority first, then by name), of those
/// whose name contains `search` (all when `None`), and how many queues match in all.
///
/// # Errors
///
/// Any database error.
pub async fn page(
    conn: &mut PgConnection,
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<Queue>, i64), StorageError> {
    let pattern = search.map(contains_pattern);
    let queues = sqlx::query_as(&format!(
        "SELECT id, uuid, name, namespace, task, created_at, {OPTION_COLUMNS}
           FROM queen.queues
          WHERE $1::text IS NULL OR name ILIKE $1
          ORDER BY priority DESC, name
          LIMIT $2 OFFSET $3"
    ))
    .bind(&pattern)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8 FROM queen.queues WHERE $1::text IS NULL OR name ILIKE $1",
    )
    .bind(&pattern)
    .fetch_one(conn)
    .await?;
    Ok((queues, total))
}

/// How many queues there are, and how many distinct non-empty namespaces and tasks they name.
///
/// # Errors
///
/// Any database error.
pub async fn counts(conn: &mut PgConnection) -> Result<(i64, i64, i64), StorageError> {
    Ok(sqlx::query_as(
        "SELECT count(*)::int8,
                count(DISTINCT NULLIF(namespace, ''))::int8,
                count(DISTINCT NULLIF(task, ''))::int8
           FROM queen.queues",
    )
    .fetch_one(conn)
    .await?)
}

/// Deletes the queue with everything it holds: partitions and segments (by cascade) and the
/// partitions' dedup sidecar rows (no foreign key there, so explicitly). Returns whether it
/// existed.
///
/// A push committing to the queue at the same moment holds its partitions' row locks; the
/// delete waits for that commit and then removes its segments too. A later push recreates the
/// queue (with derived namespace/task and default options).
///
/// # Errors
///
/// Any database error.
pub async fn delete(conn: &mut PgConnection, name: &str) -> Result<bool, StorageError> {
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let queue_id: Option<i64> =
        sqlx::query_scalar("SELECT id FROM queen.queues WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(queue_id) = queue_id else {
        return Ok(false);
    };
    sqlx::query(
        "DELETE FROM queen.dedup_keys
          WHERE partition_id IN (SELECT id FROM queen.partitions WHERE queue_id = $1)",
    )
    .bind(queue_id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM queen.queues WHERE id = $1")
        .bind(queue_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(true)
}
