//! Message traces (`queen.message_traces`, `queen.message_trace_names`; reference §9.4): events
//! recorded about a message, read back per message, per name, and as the list of names.
//!
//! Never decides what a trace request may contain (that is `http::traces`); it stores what it is
//! given. Trace data is JSON text, stored and sent back verbatim.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;
use crate::storage::queues::messages;

/// A trace to record.
#[derive(Debug, Clone)]
pub struct NewTrace<'a> {
    /// The message's partition (public id).
    pub partition: Uuid,
    /// The message's transaction id.
    pub transaction_id: &'a str,
    /// Consumer group (`__QUEUE_MODE__` for none).
    pub consumer_group: &'a str,
    /// Event type (`info` by default).
    pub event_type: &'a str,
    /// JSON text.
    pub data: &'a str,
    /// Names that link this trace with others.
    pub names: &'a [String],
    /// Who recorded it.
    pub worker_id: Option<&'a str>,
}

/// Records `trace`; `None` when its message is not stored.
///
/// # Errors
///
/// Any database error.
pub async fn record(
    conn: &mut PgConnection,
    trace: &NewTrace<'_>,
) -> Result<Option<Uuid>, StorageError> {
    let Some(message) = messages::find(&mut *conn, trace.partition, trace.transaction_id).await?
    else {
        return Ok(None);
    };
    let mut tx = crate::storage::begin::begin(&mut *conn).await?;
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO queen.message_traces
                (partition_id, transaction_id, message_id, consumer_group, event_type, data, worker_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         RETURNING id",
    )
    .bind(message.partition_id)
    .bind(trace.transaction_id)
    .bind(message.id)
    .bind(trace.consumer_group)
    .bind(trace.event_type)
    .bind(trace.data)
    .bind(trace.worker_id)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO queen.message_trace_names (trace_id, trace_name)
         SELECT $1, n FROM unnest($2::text[]) AS n
         ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(trace.names)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(id))
}

/// One recorded trace.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Trace {
    /// Trace id.
    pub id: Uuid,
    /// The message's transaction id.
    pub transaction_id: String,
    /// The message's partition (public id).
    pub partition_uuid: Uuid,
    /// Partition name.
    pub partition: String,
    /// Queue name.
    pub queue: String,
    /// Event type.
    pub event_type: String,
    /// JSON text.
    pub data: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Who recorded it.
    pub worker_id: Option<String>,
    /// When.
    pub created_at: DateTime<Utc>,
    /// Its names, sorted.
    pub names: Vec<String>,
}

const TRACE_COLUMNS: &str = "t.id, t.transaction_id, p.uuid AS partition_uuid, p.name AS partition,
        q.name AS queue, t.event_type, t.data, t.consumer_group, t.worker_id, t.created_at,
        ARRAY(SELECT n.trace_name FROM queen.message_trace_names n
               WHERE n.trace_id = t.id ORDER BY n.trace_name)::text[] AS names";

/// The traces of one message, oldest first.
///
/// # Errors
///
/// Any database error.
pub async fn of_message(
    conn: &mut PgConnection,
    partition: Uuid,
    transaction_id: &str,
) -> Result<Vec<Trace>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT {TRACE_COLUMNS}
           FROM queen.message_traces t
           JOIN queen.partitions p ON p.id = t.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE p.uuid = $1 AND t.transaction_id = $2
          ORDER BY t.created_at, t.id"
    ))
    .bind(partition)
    .bind(transaction_id)
    .fetch_all(conn)
    .await
    .map_err(StorageError::from)
}

/// The traces filed under `name`, oldest first, one page.
///
/// # Errors
///
/// Any database error.
pub async fn by_name(
    conn: &mut PgConnection,
    name: &str,
    limit: i64,
    offset: i64,
) -> Result<(Vec<Trace>, i64), StorageError> {
    let rows = sqlx::query_as(&format!(
        "SELECT {TRACE_COLUMNS}
           FROM queen.message_trace_names tn
           JOIN queen.message_traces t ON t.id = tn.trace_id
           JOIN queen.partitions p ON p.id = t.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE tn.trace_name = $1
          ORDER BY t.created_at, t.id
          LIMIT $2 OFFSET $3"
    ))
    .bind(name)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 =
        sqlx::query_scalar("SELECT count(*) FROM queen.message_trace_names WHERE trace_name = $1")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
    Ok((rows, total))
}

/// One trace name with what it links.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TraceName {
    /// The name.
    pub name: String,
    /// Traces filed under it.
    pub trace_count: i64,
    /// Distinct messages those traces are about.
    pub message_count: i64,
    /// Newest trace under it.
    pub last_seen: DateTime<Utc>,
}

/// Trace names, most recently used first, one page; and how many names there are.
///
/// # Errors
///
/// Any database error.
pub async fn names(
    conn: &mut PgConnection,
    limit: i64,
    offset: i64,
) -> Result<(Vec<TraceName>, i64), StorageError> {
    let rows = sqlx::query_as(
        "SELECT tn.trace_name AS name,
                count(*) AS trace_count,
                count(DISTINCT (t.partition_id, t.transaction_id)) AS message_count,
                max(t.created_at) AS last_seen
           FROM queen.message_trace_names tn
           JOIN queen.message_traces t ON t.id = tn.trace_id
          GROUP BY tn.trace_name
          ORDER BY max(t.created_at) DESC, tn.trace_name
          LIMIT $1 OFFSET $2",
    )
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT trace_name) FROM queen.message_trace_names")
            .fetch_one(&mut *conn)
            .await?;
    Ok((rows, total))
}
