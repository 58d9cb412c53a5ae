//! Dead letters: a copy of each message a group gave up on, with the reason, newest first.
//!
//! The copy is deliberate: retention removes whole segments, and a dead letter must outlive
//! the segment it came from.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// One message to dead-letter.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Partition database id.
    pub partition_id: i64,
    /// Consumer group that gave up.
    pub group: String,
    /// The message's offset.
    pub offset: i64,
    /// Message id.
    pub message_id: Uuid,
    /// Its transactionId.
    pub transaction_id: String,
    /// Its traceId.
    pub trace_id: Option<String>,
    /// Its producer's `sub`.
    pub producer_sub: Option<String>,
    /// Payload text, verbatim.
    pub payload: String,
    /// Arrival time, microseconds since the Unix epoch.
    pub created_at_micros: i64,
    /// The reason given by the consumer (or ours).
    pub error: Option<String>,
    /// The group's batch retry counter at the time.
    pub retry_count: i32,
}

/// Inserts dead letters in one statement.
///
/// # Errors
///
/// Any database error.
pub async fn insert(conn: &mut PgConnection, rows: &[DeadLetter]) -> Result<(), StorageError> {
    if rows.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&DeadLetter) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO queen.dead_letters
                (partition_id, consumer_group, msg_offset, message_id, transaction_id, trace_id,
                 producer_sub, payload, message_created_at, error_message, retry_count,
                 payload_sealed)
         SELECT x.partition_id, x.consumer_group, x.msg_offset, x.message_id, x.transaction_id,
                x.trace_id, x.producer_sub, x.payload,
                'epoch'::timestamptz + x.created_micros * interval '1 microsecond',
                x.error_message, x.retry_count,
                -- Sealed when its segment is (version byte 2, storage::segments::frames).
                COALESCE((SELECT get_byte(s.frames, 0) = 2
                            FROM queen.segments s
                           WHERE s.partition_id = x.partition_id
                             AND s.base_offset <= x.msg_offset
                           ORDER BY s.base_offset DESC
                           LIMIT 1), FALSE)
           FROM unnest($1::int8[], $2::text[], $3::int8[], $4::uuid[], $5::text[], $6::text[],
                       $7::text[], $8::text[], $9::int8[], $10::text[], $11::int4[])
             AS x(partition_id, consumer_group, msg_offset, message_id, transaction_id, trace_id,
                  producer_sub, payload, created_micros, error_message, retry_count)",
    )
    .bind(rows.iter().map(|r| r.partition_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.group.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.offset).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.message_id).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.transaction_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(col(|r| r.trace_id.clone()))
    .bind(col(|r| r.producer_sub.clone()))
    .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.created_at_micros).collect::<Vec<_>>())
    .bind(col(|r| r.error.clone()))
    .bind(rows.iter().map(|r| r.retry_count).collect::<Vec<_>>())
    .execute(conn)
    .await?;
    Ok(())
}

/// One dead letter as listed.
#[derive(Debug, sqlx::FromRow)]
pub struct Listed {
    /// Message id.
    pub message_id: Uuid,
    /// Its transactionId.
    pub transaction_id: String,
    /// Partition id on the wire.
    pub partition_uuid: Uuid,
    /// Queue name.
    pub queue: String,
    /// Partition name.
    pub partition: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Reason.
    pub error_message: Option<String>,
    /// Retry counter at the time.
    pub retry_count: i32,
    /// Payload text, verbatim (sealed when `payload_sealed`).
    pub payload: String,
    /// The payload is sealed (its queue had `encryptionEnabled`).
    pub payload_sealed: bool,
    /// Producer's `sub`.
    pub producer_sub: Option<String>,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Arrival time of the message.
    pub created_at: DateTime<Utc>,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
}

/// Dead letters, newest failure first, optionally of one queue and/or group, and the total.
///
/// # Errors
///
/// Any database error.
pub async fn list(
    conn: &mut PgConnection,
    queue: Option<&str>,
    group: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<Listed>, i64), StorageError> {
    let filter = "FROM queen.dead_letters d
                  JOIN queen.partitions p ON p.id = d.partition_id
                  JOIN queen.queues q ON q.id = p.queue_id
                 WHERE ($1::text IS NULL OR q.name = $1)
                   AND ($2::text IS NULL OR d.consumer_group = $2)";
    let rows: Vec<Listed> = sqlx::query_as(&format!(
        "SELECT d.message_id, d.transaction_id, p.uuid AS partition_uuid, q.name AS queue,
                p.name AS partition, d.consumer_group, d.error_message, d.retry_count, d.payload,
                d.payload_sealed, d.producer_sub, d.trace_id, d.message_created_at AS created_at, d.failed_at
           {filter}
          ORDER BY d.failed_at DESC, d.id DESC
          LIMIT $3 OFFSET $4"
    ))
    .bind(queue)
    .bind(group)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) {filter}"))
        .bind(queue)
        .bind(group)
        .fetch_one(&mut *conn)
        .await?;
    Ok((rows, total))
}
