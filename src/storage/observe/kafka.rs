//! What the Kafka views show (`GET /api/v1/kafka/topics`, `/api/v1/kafka/groups`;
//! docs/kafka.md, "Views"): the topics made over Kafka with each partition's log start and end
//! offsets, and the Kafka groups' committed offsets with their lag. Group membership is not
//! here: it lives in the memory of the group's coordinator (`crate::state::KafkaMembership`).
//!
//! A topic here is a queue with a `kafka_topics` row (made by CreateTopics or auto-create); a
//! queue made over HTTP is readable as a topic too but is not listed. A Kafka group is a
//! consumer group with a cursor on such a topic's numbered partitions (an HTTP group of the
//! same name shares it; queue mode is left out). Every statement reads one page: topics by
//! name, groups by name, through indexes, never every partition.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::storage::consume::QUEUE_MODE;
use crate::storage::error::StorageError;
use crate::storage::queues::catalog::contains_pattern;

/// A numbered partition name: Kafka partition `i` is the queue's partition `"i"`.
const NUMBERED: &str = "'^(0|[1-9][0-9]{0,8})$'";

/// A topic made over Kafka.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TopicRow {
    /// Its queue's internal id.
    pub queue_id: i64,
    /// Name.
    pub name: String,
    /// Kafka partitions `0 .. partitions`.
    pub partitions: i32,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

/// One page of the topics made over Kafka, by name, of those whose name contains `search`,
/// and how many match in all.
///
/// # Errors
///
/// Any database error.
pub async fn topics(
    conn: &mut PgConnection,
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<TopicRow>, i64), StorageError> {
    let pattern = search.map(contains_pattern);
    let rows = sqlx::query_as(
        "SELECT q.id AS queue_id, q.name::text AS name, kt.partitions, kt.created_at
           FROM queen.kafka_topics kt
           JOIN queen.queues q ON q.id = kt.queue_id
          WHERE $1::text IS NULL OR q.name ILIKE $1
          ORDER BY q.name
          LIMIT $2 OFFSET $3",
    )
    .bind(&pattern)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = sqlx::query_scalar(
        "SELECT count(*)::int8
           FROM queen.kafka_topics kt
           JOIN queen.queues q ON q.id = kt.queue_id
          WHERE $1::text IS NULL OR q.name ILIKE $1",
    )
    .bind(&pattern)
    .fetch_one(conn)
    .await?;
    Ok((rows, total))
}

/// One Kafka partition's offsets.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PartitionOffsets {
    /// Its topic's queue id.
    pub queue_id: i64,
    /// Kafka partition number.
    pub partition: i32,
    /// The oldest offset still stored (the end offset when none is).
    pub log_start: i64,
    /// The next offset to be written (Kafka's high watermark).
    pub end: i64,
}

/// The offsets of the numbered partitions `0 .. partitions` of these topics (queue ids), by
/// topic and partition; a partition never written is absent. Two primary-key probes per
/// partition.
///
/// # Errors
///
/// Any database error.
pub async fn partition_offsets(
    conn: &mut PgConnection,
    queue_ids: &[i64],
) -> Result<Vec<PartitionOffsets>, StorageError> {
    Ok(sqlx::query_as(&format!(
        "SELECT p.queue_id, p.name::int4 AS partition,
                COALESCE(f.base_offset, p.next_offset) AS log_start, p.next_offset AS end
           FROM queen.partitions p
           JOIN queen.kafka_topics kt ON kt.queue_id = p.queue_id
           LEFT JOIN LATERAL (
                SELECT base_offset FROM queen.segments
                 WHERE partition_id = p.id ORDER BY base_offset LIMIT 1
           ) f ON TRUE
          WHERE p.queue_id = ANY($1)
            AND p.name ~ {NUMBERED}
            AND p.name::int8 < kt.partitions
          ORDER BY p.queue_id, p.name::int8"
    ))
    .bind(queue_ids)
    .fetch_all(conn)
    .await?)
}

/// One page of the Kafka groups' names (those with a committed offset on a topic made over
/// Kafka, and those named in `also`: the groups with members on this broker), by name, of
/// those containing `search`, and how many match in all.
///
/// # Errors
///
/// Any database error.
pub async fn group_names(
    conn: &mut PgConnection,
    also: &[String],
    search: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<String>, i64), StorageError> {
    let pattern = search.map(contains_pattern);
    let names = format!(
        "SELECT DISTINCT c.consumer_group::text AS name
           FROM queen.kafka_topics kt
           JOIN queen.partitions p ON p.queue_id = kt.queue_id AND p.name ~ {NUMBERED}
           JOIN queen.partition_consumers c ON c.partition_id = p.id
          WHERE c.consumer_group <> '{QUEUE_MODE}'
         UNION
         SELECT unnest($1::text[])"
    );
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT name, count(*) OVER ()::int8
           FROM ({names}) g
          WHERE $2::text IS NULL OR name ILIKE $2
          ORDER BY name
          LIMIT $3 OFFSET $4"
    ))
    .bind(also)
    .bind(&pattern)
    .bind(limit)
    .bind(offset)
    .fetch_all(&mut *conn)
    .await?;
    let total = match rows.first() {
        Some((_, n)) => *n,
        None => {
            sqlx::query_scalar(&format!(
                "SELECT count(*)::int8 FROM ({names}) g WHERE $2::text IS NULL OR name ILIKE $2"
            ))
            .bind(also)
            .bind(&pattern)
            .fetch_one(conn)
            .await?
        }
    };
    Ok((rows.into_iter().map(|(name, _)| name).collect(), total))
}

/// One committed offset of a Kafka group.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct GroupOffset {
    /// Group id.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Kafka partition number.
    pub partition: i32,
    /// The committed offset (the next the group reads).
    pub committed: i64,
    /// The partition's end offset.
    pub end: i64,
    /// Records past the committed offset (`end - committed`, at least 0).
    pub lag: i64,
}

/// The committed offsets of these groups on the topics made over Kafka, by group, topic and
/// partition.
///
/// # Errors
///
/// Any database error.
pub async fn group_offsets(
    conn: &mut PgConnection,
    groups: &[String],
) -> Result<Vec<GroupOffset>, StorageError> {
    Ok(sqlx::query_as(&format!(
        "SELECT c.consumer_group::text AS \"group\", q.name::text AS topic,
                p.name::int4 AS partition, c.committed_offset AS committed,
                p.next_offset AS end, GREATEST(p.next_offset - c.committed_offset, 0) AS lag
           FROM queen.partition_consumers c
           JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.kafka_topics kt ON kt.queue_id = p.queue_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE c.consumer_group = ANY($1)
            AND p.name ~ {NUMBERED}
          ORDER BY c.consumer_group, q.name, p.name::int8"
    ))
    .bind(groups)
    .fetch_all(conn)
    .await?)
}

/// The broker coordinating a Kafka group: the holder of the group's running lease
/// (`queen.kafka_coordinators`, src/kafka/cluster.rs).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct GroupCoordinator {
    /// Group id.
    pub group: String,
    /// The coordinating broker's Kafka node id.
    pub node_id: i32,
    /// The address it advertises to Kafka clients.
    pub host: String,
    /// Its Kafka port.
    pub port: i32,
    /// When its lease on the group runs out unless renewed (PostgreSQL's clock).
    pub lease_until: DateTime<Utc>,
}

/// The coordinators of these groups whose lease is running (a group no broker holds, or
/// whose holder's lease ran out, has none: the next FindCoordinator claims it).
///
/// # Errors
///
/// Any database error.
pub async fn group_coordinators(
    conn: &mut PgConnection,
    groups: &[String],
) -> Result<Vec<GroupCoordinator>, StorageError> {
    Ok(sqlx::query_as(
        "SELECT c.group_id AS \"group\", c.node_id, b.host, b.port, c.lease_until
           FROM queen.kafka_coordinators c
           JOIN queen.kafka_brokers b ON b.node_id = c.node_id
          WHERE c.group_id = ANY($1) AND c.lease_until > now()",
    )
    .bind(groups)
    .fetch_all(conn)
    .await?)
}
