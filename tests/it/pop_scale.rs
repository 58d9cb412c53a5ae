//! A queue-level pop on a queue with 100 000 partitions finds the one with messages through
//! indexes: the write-order scan reads only partitions written since the group's watermark.
//! `QUEEN_POP_SCALE_PARTITIONS=1000000 cargo test --test it pop_scale` runs the same checks
//! over a million partitions (opt-in: filling them takes most of a minute; docs/history/benchmarks.md);
//! there the group's first walk over the whole consumed history takes more than one pop's
//! deadline and is finished by retries (see the test).

use crate::support::consuming::*;
use crate::support::{fresh_db, plan_nodes, spawn_app, TestDb};
use queen_broker::storage::consume::statements::{READY_SQL, SCAN_SQL};
use queen_broker::storage::consume::QUEUE_MODE;
use serde_json::Value;
use sqlx::Row;

/// Partitions of the queue: 100 000, or `QUEEN_POP_SCALE_PARTITIONS`.
fn partitions() -> i64 {
    std::env::var("QUEEN_POP_SCALE_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 100_000)
        .unwrap_or(100_000)
}

/// Queue `wide` with [`partitions`] partitions of one message each, written once long ago
/// (write marker xid 1).
async fn wide_queue(db: &TestDb) {
    db.exec("INSERT INTO queen.queues (name) VALUES ('wide')")
        .await;
    db.exec(&format!(
        "INSERT INTO queen.partitions (queue_id, name, next_offset, last_write_xid, last_write_at)
         SELECT q.id, 'p-' || g, 1, 1, now() - interval '1 hour'
           FROM queen.queues q, generate_series(0, {}) g
          WHERE q.name = 'wide'",
        partitions() - 1
    ))
    .await;
}

/// The partitions with a live lease, newest first, with their leased ranges.
async fn leased(conn: &mut sqlx::PgConnection) -> Vec<(String, Option<i64>, Option<i64>)> {
    sqlx::query_as(
        "SELECT p.name, c.leased_from, c.leased_to
           FROM queen.partition_consumers c JOIN queen.partitions p ON p.id = c.partition_id
          WHERE c.lease_expires_at > now()
          ORDER BY p.id DESC",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

/// `sql` (`READY_SQL`, or a statement wrapping it) with its parameters for a queue-mode pop of
/// `wide` with a batch of `batch` and room for `room` partitions, holding no segments.
fn ready_pop(
    sql: &str,
    batch: i64,
    room: i64,
) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind("wide")
        .bind(QUEUE_MODE)
        .bind(uuid::Uuid::now_v7())
        .bind("test")
        .bind(batch)
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .bind(room)
}

#[actix_web::test]
async fn a_queue_pop_among_100_000_consumed_partitions_reads_only_what_was_written() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // 100 000 partitions, each written once long ago and fully consumed by queue mode.
    wide_queue(&db).await;
    db.exec(
        "INSERT INTO queen.partition_consumers (partition_id, consumer_group, queue_id, committed_offset)
         SELECT id, '__QUEUE_MODE__', queue_id, 1 FROM queen.partitions",
    )
    .await;
    db.exec("ANALYZE queen.partitions").await;
    db.exec("ANALYZE queen.partition_consumers").await;

    // The group's first pop walks the history once and leaves its watermark behind it. At a
    // million consumed partitions the walk does not fit one pop's deadline (10 s) on a 2-core
    // machine; it records how far it got every half second, so a retry goes on from there
    // instead of starting over, and a few retries get through.
    push_n(&app, "wide", "p-77777", 1, 1).await;
    let mut first = pop(&app, "wide", "autoAck=true").await;
    let mut retries = 0;
    while first.status == 503 && retries < 20 {
        retries += 1;
        first = pop(&app, "wide", "autoAck=true").await;
    }
    assert_eq!(
        ns(&first),
        vec![1],
        "after {retries} retries: {:?}",
        first.body
    );
    assert_eq!(pop(&app, "wide", "").await.status, 204);

    // From now on a pop looks only at partitions written since.
    push_n(&app, "wide", "p-123", 2, 1).await;
    let (queue_id, xid, pid): (i64, i64, i64) = {
        let mut conn = db.conn().await;
        sqlx::query_as(
            "SELECT s.queue_id, s.scan_xid, s.scan_pid
               FROM queen.consumer_subscriptions s
               JOIN queen.queues q ON q.id = s.queue_id
              WHERE q.name = 'wide'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    let mut conn = db.conn().await;
    let plan: Value = sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {SCAN_SQL}"))
        .bind(queue_id)
        .bind(QUEUE_MODE)
        .bind(xid)
        .bind(pid)
        .bind(1000_i64)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let all = plan_nodes(&plan[0]["Plan"]);
    let on_partitions: Vec<&&Value> = all
        .iter()
        .filter(|n| n["Relation Name"] == "partitions")
        .collect();
    assert_eq!(on_partitions.len(), 1, "{plan}");
    let scan = on_partitions[0];
    assert_eq!(scan["Index Name"], "partitions_write_order", "{plan}");
    let rows = scan["Actual Rows"].as_f64().unwrap();
    assert!(rows <= 2.0, "the scan read {rows} partitions: {plan}");
    let removed = scan["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
    assert!(removed <= 2.0, "{plan}");

    let reply = pop(&app, "wide", "").await;
    assert_eq!(ns(&reply), vec![2]);
    assert_eq!(reply.body["partition"], "p-123");
}

#[actix_web::test]
async fn an_expired_lease_among_100_000_partitions_is_found_through_its_index() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    wide_queue(&db).await;
    db.exec(
        "INSERT INTO queen.partition_consumers (partition_id, consumer_group, queue_id, committed_offset)
         SELECT id, '__QUEUE_MODE__', queue_id, 1 FROM queen.partitions",
    )
    .await;
    // The queue-mode watermark is already past all of them.
    db.exec(
        "INSERT INTO queen.consumer_subscriptions (consumer_group, queue_id, subscription_mode, scan_xid)
         SELECT '__QUEUE_MODE__', id, 'all', 2 FROM queen.queues WHERE name = 'wide'",
    )
    .await;
    db.exec("ANALYZE queen.partitions").await;
    db.exec("ANALYZE queen.partition_consumers").await;
    push_n(&app, "wide", "p-5", 1, 2).await;
    let first = pop(&app, "wide", "").await;
    assert_eq!(ns(&first), vec![1]);
    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_expires_at IS NOT NULL")
        .await;
    let again = pop(&app, "wide", "batch=2").await;
    assert_eq!(ns(&again), vec![1, 2], "redelivered after expiry");

    let mut conn = db.conn().await;
    let plan: Value = sqlx::query_scalar(
        "EXPLAIN (FORMAT JSON)
         SELECT a.partition_id FROM queen.partition_consumers a
          WHERE a.queue_id = 1 AND a.consumer_group = '__QUEUE_MODE__'
            AND a.lease_expires_at <= now()
          ORDER BY a.lease_expires_at LIMIT 64",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let text = plan.to_string();
    assert!(text.contains("partition_consumers_expiry"), "{text}");
}

#[actix_web::test]
async fn the_one_statement_pop_reads_a_few_rows_when_100_000_partitions_wait() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // 100 000 partitions of one message each, every one released with that message left
    // behind (a backlog waiting for consumers), at distinct times.
    wide_queue(&db).await;
    db.exec(
        "INSERT INTO queen.partition_consumers
                (partition_id, consumer_group, queue_id, committed_offset, attention_at)
         SELECT id, '__QUEUE_MODE__', queue_id, 0, now() - id * interval '1 millisecond'
           FROM queen.partitions",
    )
    .await;
    db.exec(
        "INSERT INTO queen.consumer_subscriptions (consumer_group, queue_id, subscription_mode, scan_xid)
         SELECT '__QUEUE_MODE__', id, 'all', 2 FROM queen.queues WHERE name = 'wide'",
    )
    .await;
    db.exec("ANALYZE queen.partitions").await;
    db.exec("ANALYZE queen.partition_consumers").await;
    drop(app);

    let mut conn = db.conn().await;
    // One pop with room for 4 partitions and a batch of 10.
    let explain = format!("EXPLAIN (ANALYZE, FORMAT JSON) {READY_SQL}");
    let plan: Value = ready_pop(&explain, 10, 4)
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    let all = plan_nodes(&plan[0]["Plan"]);
    // Every scan of the two big tables reads a handful of rows (each list as far as the 4
    // partitions the pop has room for), never the waiting backlog.
    for n in all.iter().filter(|n| {
        n["Relation Name"] == "partition_consumers" || n["Relation Name"] == "partitions"
    }) {
        let rows = n["Actual Rows"].as_f64().unwrap_or(0.0);
        let loops = n["Actual Loops"].as_f64().unwrap_or(0.0);
        let removed = n["Rows Removed by Filter"].as_f64().unwrap_or(0.0);
        assert!(
            rows * loops.max(1.0) + removed <= 8.0,
            "a scan of {} read {rows} rows × {loops} loops (+{removed} removed): {plan}",
            n["Relation Name"]
        );
        assert_ne!(n["Node Type"], "Seq Scan", "{plan}");
    }
    // It claimed the 4 partitions released first (the oldest attention), one message each.
    let last = |from_end: i64| {
        (
            format!("p-{}", partitions() - 1 - from_end),
            Some(0),
            Some(1),
        )
    };
    let claimed = leased(&mut conn).await;
    assert_eq!(claimed, (0..4).map(last).collect::<Vec<_>>());
    // A batch of 2 with room for 4 partitions claims the next 2: what is left of the batch is
    // shared out in order, and a partition nothing is left for is not claimed.
    let rows = ready_pop(READY_SQL, 2, 4)
        .fetch_all(&mut conn)
        .await
        .unwrap();
    // One row per claimed partition (they hold no segments).
    assert_eq!(rows.len(), 2);
    let claimed = leased(&mut conn).await;
    assert_eq!(claimed, (0..6).map(last).collect::<Vec<_>>());
}
