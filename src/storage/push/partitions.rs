//! Queues and partitions: created on first use, resolved to their compact integer ids.

use std::collections::HashMap;

use broker_actors::PartitionKey;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::storage::error::StorageError;

/// Namespace and task derived from a queue name on auto-create: the text before the first `.`,
/// and the text between the first and second `.` (both empty without a dot).
pub fn derived_namespace_task(queue: &str) -> (&str, &str) {
    let mut parts = queue.splitn(3, '.');
    let first = parts.next().unwrap_or("");
    match parts.next() {
        None => ("", ""),
        Some(second) => (first, second),
    }
}

/// Returns the ids of these partitions, creating queues and partitions that do not exist yet.
/// A partition created here gets a row for each group already subscribed to its queue, so
/// consumers claim it without waiting for a full pop to meet it.
///
/// Runs outside the commit transaction (each statement commits on its own), with rows in key
/// order so two brokers creating overlapping sets never deadlock.
///
/// # Errors
///
/// Any database error.
pub async fn resolve_ids(
    conn: &mut PgConnection,
    keys: &[&PartitionKey],
) -> Result<HashMap<PartitionKey, i64>, StorageError> {
    let mut sorted: Vec<&PartitionKey> = keys.to_vec();
    sorted.sort();
    sorted.dedup();
    let queues: Vec<String> = sorted.iter().map(|k| k.queue.to_string()).collect();
    let partitions: Vec<String> = sorted.iter().map(|k| k.partition.to_string()).collect();

    let mut queue_names = queues.clone();
    queue_names.dedup();
    let (namespaces, tasks): (Vec<String>, Vec<String>) = queue_names
        .iter()
        .map(|q| {
            let (ns, task) = derived_namespace_task(q);
            (ns.to_string(), task.to_string())
        })
        .unzip();
    sqlx::query(
        "INSERT INTO queen.queues (name, namespace, task)
         SELECT name, namespace, task
           FROM unnest($1::text[], $2::text[], $3::text[]) AS x(name, namespace, task)
          ORDER BY name
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(&queue_names)
    .bind(&namespaces)
    .bind(&tasks)
    .execute(&mut *conn)
    .await?;

    // A partition created by another broker after this statement's snapshot is neither
    // inserted (conflict) nor visible; the next round sees it.
    let mut ids = HashMap::with_capacity(sorted.len());
    let (mut queues, mut partitions) = (queues, partitions);
    for _ in 0..5 {
        let rows: Vec<(String, String, Option<i64>)> = sqlx::query_as(
            "WITH wanted AS (
                 SELECT q.id AS queue_id, q.name AS queue, x.partition
                   FROM unnest($1::text[], $2::text[]) AS x(queue, partition)
                   JOIN queen.queues q ON q.name = x.queue
             ), created AS (
                 INSERT INTO queen.partitions (queue_id, name)
                 SELECT queue_id, partition FROM wanted ORDER BY queue, partition
                 ON CONFLICT (queue_id, name) DO NOTHING
                 RETURNING queue_id, name, id
             ), joined AS (
                 -- The groups already subscribed to the queue get their row on the new
                 -- partition at once, asking for attention: the one-statement pop serves it
                 -- as soon as its first write commits, instead of a full pop first finding
                 -- the partition untouched (storage::consume::group_rows). A group starts a
                 -- partition created after its subscription began at offset 0; one whose
                 -- start lies ahead is left to its first claim.
                 INSERT INTO queen.partition_consumers
                        (partition_id, consumer_group, queue_id, committed_offset, attention_at)
                 SELECT c.id, s.consumer_group, c.queue_id, 0, now()
                   FROM created c
                   JOIN queen.consumer_subscriptions s ON s.queue_id = c.queue_id
                  WHERE s.subscription_from IS NULL OR s.subscription_from <= now()
                  ORDER BY c.id, s.consumer_group
                 ON CONFLICT (partition_id, consumer_group) DO NOTHING
             )
             SELECT w.queue, w.partition, COALESCE(c.id, p.id)
               FROM wanted w
               LEFT JOIN created c ON c.queue_id = w.queue_id AND c.name = w.partition
               LEFT JOIN queen.partitions p ON p.queue_id = w.queue_id AND p.name = w.partition",
        )
        .bind(&queues)
        .bind(&partitions)
        .fetch_all(&mut *conn)
        .await?;
        let (mut retry_q, mut retry_p) = (Vec::new(), Vec::new());
        for (queue, partition, id) in rows {
            match id {
                Some(id) => {
                    ids.insert(PartitionKey::new(&queue, &partition), id);
                }
                None => {
                    retry_q.push(queue);
                    retry_p.push(partition);
                }
            }
        }
        if retry_q.is_empty() {
            break;
        }
        queues = retry_q;
        partitions = retry_p;
    }
    Ok(ids)
}

/// The public ids (`uuid`) of these partitions, by internal id; deleted ones are left out.
///
/// # Errors
///
/// Any database error.
pub async fn uuids(
    conn: &mut PgConnection,
    ids: &[i64],
) -> Result<HashMap<i64, Uuid>, StorageError> {
    let rows: Vec<(i64, Uuid)> = sqlx::query_as(
        "SELECT id, uuid
           FROM queen.partitions
          WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// The UUIDs of the partitions with these 64-bit ids (those that exist).
///
/// # Errors
///
/// Any database error.
pub async fn uuids_by_id(conn: &mut PgConnection, ids: &[i64]) -> sqlx::Result<Vec<(i64, Uuid)>> {
    sqlx::query_as(
        "SELECT id, uuid
           FROM queen.partitions
          WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(conn)
    .await
}

/// The UUID of the partition with this 64-bit id: from the cache of ids this broker handed
/// out, else read (and noted). The nil UUID, which no partition has, when none has the id.
///
/// # Errors
///
/// Any database error.
pub async fn uuid_by_id(
    conn: &mut PgConnection,
    cache: &crate::storage::segments::cache::SegmentCache,
    id: i64,
) -> sqlx::Result<Uuid> {
    if let Some(uuid) = cache.partition_uuid(id) {
        return Ok(uuid);
    }
    Ok(match uuids_by_id(conn, &[id]).await?.first() {
        Some((_, uuid)) => {
            cache.note_partition(id, *uuid);
            *uuid
        }
        None => Uuid::nil(),
    })
}

/// The UUID of the partition a route names by `text`: its UUID, or its 64-bit id as decimal
/// text (the form a framed pop gives). `None` when the text is neither or no partition has
/// that id.
///
/// # Errors
///
/// Any database error.
pub async fn uuid_of_text(conn: &mut PgConnection, text: &str) -> sqlx::Result<Option<Uuid>> {
    if let Ok(uuid) = Uuid::parse_str(text) {
        return Ok(Some(uuid));
    }
    let Some(id) = id_of_text(text) else {
        return Ok(None);
    };
    Ok(uuids_by_id(conn, &[id]).await?.first().map(|(_, u)| *u))
}

/// A partition's 64-bit id as decimal text (`1` .. `i64::MAX`, ASCII digits only, no sign);
/// `None` for anything else.
pub fn id_of_text(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok().filter(|id| *id > 0)
}

#[cfg(test)]
mod tests {
    use super::{derived_namespace_task, id_of_text};

    #[test]
    fn namespace_and_task_come_from_dots() {
        assert_eq!(derived_namespace_task("orders"), ("", ""));
        assert_eq!(
            derived_namespace_task("billing.invoices"),
            ("billing", "invoices")
        );
        assert_eq!(derived_namespace_task("a.b.c"), ("a", "b"));
    }

    #[test]
    fn only_plain_positive_decimal_reads_as_a_partition_id() {
        assert_eq!(id_of_text("1"), Some(1));
        assert_eq!(id_of_text("9223372036854775807"), Some(i64::MAX));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            " 1",
            "1 ",
            "1.0",
            "9223372036854775808",
            "00000000000000000001x",
        ] {
            assert_eq!(id_of_text(bad), None, "{bad:?}");
        }
    }
}
