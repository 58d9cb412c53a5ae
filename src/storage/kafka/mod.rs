//! The SQL of the Kafka front door (`crate::kafka`, docs/kafka.md): topics as queues with a
//! partition count, offsets by time, the offset a produced record was stored at, consumer
//! group offsets as the groups' cursors (`partition_consumers.committed_offset`) and producer
//! ids. Reading records by offset is `storage::queues::reads`, shared with `POST /api/v1/fetch`.
//! [`coordinators`]: the brokers on this database and which one coordinates each group.
//!
//! Never decides anything about the Kafka protocol: it answers what is stored.

pub mod coordinators;

use broker_actors::PartitionKey;
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::error::StorageError;
use crate::storage::push::partitions;

/// A topic as Kafka sees it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Topic {
    /// The queue's name.
    pub name: String,
    /// The queue's id.
    pub queue_id: i64,
    /// Kafka partitions `0 .. partitions`.
    pub partitions: i32,
}

/// The partition count of a queue without a `kafka_topics` row: one more than its highest
/// partition named by a decimal number, at least 1.
const COUNT_SQL: &str = "COALESCE(kt.partitions,
        GREATEST(1, (SELECT max(p.name::int8) + 1
                       FROM queen.partitions p
                      WHERE p.queue_id = q.id
                        AND p.name ~ '^(0|[1-9][0-9]{0,8})$'))::int4)";

/// The topics named (every queue when `names` is `None`), in name order; names without a
/// queue are absent.
///
/// # Errors
///
/// Any database error.
pub async fn topics(
    conn: &mut PgConnection,
    names: Option<&[String]>,
) -> Result<Vec<Topic>, StorageError> {
    let sql = format!(
        "SELECT q.name::text AS name, q.id AS queue_id, {COUNT_SQL} AS partitions
           FROM queen.queues q
           LEFT JOIN queen.kafka_topics kt ON kt.queue_id = q.id
          WHERE $1::text[] IS NULL OR q.name = ANY($1)
          ORDER BY q.name"
    );
    Ok(sqlx::query_as(&sql).bind(names).fetch_all(conn).await?)
}

/// Creates the queue `name` with partitions `"0" .. partitions` and records the count. When
/// the queue exists already nothing changes and `false` is returned.
///
/// # Errors
///
/// Any database error.
pub async fn create_topic(
    conn: &mut PgConnection,
    name: &str,
    partitions: i32,
) -> Result<bool, StorageError> {
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM queen.queues WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    if exists.is_some() {
        return Ok(false);
    }
    let keys: Vec<PartitionKey> = (0..partitions.max(1))
        .map(|i| PartitionKey::new(name, &i.to_string()))
        .collect();
    let refs: Vec<&PartitionKey> = keys.iter().collect();
    partitions::resolve_ids(conn, &refs).await?;
    let inserted = sqlx::query(
        "INSERT INTO queen.kafka_topics (queue_id, partitions)
         SELECT id, $2 FROM queen.queues WHERE name = $1
         ON CONFLICT (queue_id) DO NOTHING",
    )
    .bind(name)
    .bind(partitions.max(1))
    .execute(&mut *conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// The offset of the first message of partition `partition_id` stored at or after `at`, by the
/// time its segment was committed (`None`: nothing that recent). Reads the partition's segments
/// in offset order up to the first match.
///
/// # Errors
///
/// Any database error.
pub async fn offset_at(
    conn: &mut PgConnection,
    partition_id: i64,
    at: DateTime<Utc>,
) -> Result<Option<i64>, StorageError> {
    Ok(sqlx::query_scalar(
        "SELECT s.base_offset
           FROM queen.segments s
          WHERE s.partition_id = $1
            AND s.created_at >= $2
          ORDER BY s.base_offset
          LIMIT 1",
    )
    .bind(partition_id)
    .bind(at)
    .fetch_optional(conn)
    .await?)
}

/// Where each `(queue, partition, key hash)` was stored, found through the dedup sidecar
/// (`storage::push::dedup`): the highest offset with that hash, `None` when the queue keeps no dedup
/// keys (window 0) or the key expired. Answers in the order asked.
///
/// # Errors
///
/// Any database error.
pub async fn offsets_of_keys(
    conn: &mut PgConnection,
    queues: &[String],
    partitions: &[String],
    hashes: &[i64],
) -> Result<Vec<Option<i64>>, StorageError> {
    let rows: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT r.ord,
                (SELECT max(d.msg_offset)
                   FROM queen.dedup_keys d
                  WHERE d.partition_id = p.id
                    AND d.key_hash = r.hash)
           FROM unnest($1::text[], $2::text[], $3::int8[]) WITH ORDINALITY
                    AS r(queue, partition, hash, ord)
           LEFT JOIN queen.queues q ON q.name = r.queue
           LEFT JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition
          ORDER BY r.ord",
    )
    .bind(queues)
    .bind(partitions)
    .bind(hashes)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(_, offset)| offset).collect())
}

/// Sets the committed offset of `group` on each `(queue, partition)` to `offsets` (a Kafka
/// commit may move it back as well as forward). Partitions that do not exist yet are
/// created. Returns nothing: the commit applies to every entry or fails as a whole.
///
/// # Errors
///
/// Any database error.
pub async fn commit_offsets(
    conn: &mut PgConnection,
    group: &str,
    queues: &[String],
    partition_names: &[String],
    offsets: &[i64],
) -> Result<(), StorageError> {
    let keys: Vec<PartitionKey> = queues
        .iter()
        .zip(partition_names)
        .map(|(q, p)| PartitionKey::new(q, p))
        .collect();
    let refs: Vec<&PartitionKey> = keys.iter().collect();
    partitions::resolve_ids(conn, &refs).await?;
    sqlx::query(
        "INSERT INTO queen.partition_consumers
                (partition_id, consumer_group, queue_id, committed_offset)
         SELECT p.id, $1, q.id, r.committed
           FROM unnest($2::text[], $3::text[], $4::int8[]) AS r(queue, partition, committed)
           JOIN queen.queues q ON q.name = r.queue
           JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition
          ORDER BY p.id
         ON CONFLICT (partition_id, consumer_group)
         DO UPDATE SET committed_offset = EXCLUDED.committed_offset",
    )
    .bind(group)
    .bind(queues)
    .bind(partition_names)
    .bind(offsets)
    .execute(conn)
    .await?;
    Ok(())
}

/// The committed offsets of `group` on each `(queue, partition)`, in the order asked (`None`:
/// the group has none there).
///
/// # Errors
///
/// Any database error.
pub async fn committed_offsets(
    conn: &mut PgConnection,
    group: &str,
    queues: &[String],
    partition_names: &[String],
) -> Result<Vec<Option<i64>>, StorageError> {
    let rows: Vec<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT r.ord, c.committed_offset
           FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS r(queue, partition, ord)
           LEFT JOIN queen.queues q ON q.name = r.queue
           LEFT JOIN queen.partitions p ON p.queue_id = q.id AND p.name = r.partition
           LEFT JOIN queen.partition_consumers c
                  ON c.partition_id = p.id AND c.consumer_group = $1
          ORDER BY r.ord",
    )
    .bind(group)
    .bind(queues)
    .bind(partition_names)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|(_, offset)| offset).collect())
}

/// Every `(queue, partition, committed offset)` of `group` on partitions named by a decimal
/// number (what Kafka calls the group's committed offsets), in queue and partition order.
///
/// # Errors
///
/// Any database error.
pub async fn group_offsets(
    conn: &mut PgConnection,
    group: &str,
) -> Result<Vec<(String, String, i64)>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT q.name::text, p.name::text, c.committed_offset
           FROM queen.partition_consumers c
           JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE c.consumer_group = $1
            AND p.name ~ '^(0|[1-9][0-9]{0,8})$'
          ORDER BY q.name, p.name::int8",
    )
    .bind(group)
    .fetch_all(conn)
    .await?)
}

/// A new producer id, unique across every broker on this database.
///
/// # Errors
///
/// Any database error.
pub async fn next_producer_id(conn: &mut PgConnection) -> Result<i64, StorageError> {
    Ok(
        sqlx::query_scalar("SELECT nextval('queen.kafka_producer_ids')")
            .fetch_one(conn)
            .await?,
    )
}
