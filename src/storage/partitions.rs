//! Queues and partitions: created on first use, resolved to their compact integer ids.

use std::collections::HashMap;

use broker_actors::PartitionKey;
use sqlx::PgConnection;
use uuid::Uuid;

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
) -> sqlx::Result<HashMap<PartitionKey, i64>> {
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
pub async fn uuids(conn: &mut PgConnection, ids: &[i64]) -> sqlx::Result<HashMap<i64, Uuid>> {
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

#[cfg(test)]
mod tests {
    use super::derived_namespace_task;

    #[test]
    fn namespace_and_task_come_from_dots() {
        assert_eq!(derived_namespace_task("orders"), ("", ""));
        assert_eq!(
            derived_namespace_task("billing.invoices"),
            ("billing", "invoices")
        );
        assert_eq!(derived_namespace_task("a.b.c"), ("a", "b"));
    }
}
