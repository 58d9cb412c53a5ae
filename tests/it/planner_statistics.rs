//! A table the broker grows from nothing gets the planner's statistics from the broker itself
//! (`storage::cluster::statistics`), without waiting for autovacuum's next visit, so the pop's
//! write-order scan is planned on its index from the first seconds of a new database.

use std::time::{Duration, Instant};

use crate::support::consuming::*;
use crate::support::{fresh_db, plan_nodes, spawn_app};
use queen_broker::storage::cluster::statistics::{analyze_grown, Tries, MIN_ROWS};
use queen_broker::storage::consume::statements::READY_SQL;
use serde_json::{json, Value};

/// Manual analyses of `table` (autovacuum's are counted apart) and the rows it is planned with.
async fn analyzed(conn: &mut sqlx::PgConnection, table: &str) -> (i64, f32) {
    sqlx::query_as(
        "SELECT s.analyze_count, c.reltuples
           FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
          WHERE s.relid = $1::text::regclass",
    )
    .bind(table)
    .fetch_one(conn)
    .await
    .unwrap()
}

#[actix_web::test]
async fn a_table_grown_from_nothing_is_analyzed_by_the_broker() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let mut conn = db.conn().await;
    assert_eq!(analyzed(&mut conn, "queen.partitions").await.0, 0);

    // One queue, 1 500 partitions written once, read by a group (so its rows exist too).
    let partitions = MIN_ROWS + 500;
    assert_eq!(pop(&app, "grown", "consumerGroup=g").await.status, 204);
    let items: Vec<Value> = (0..partitions)
        .map(|i| json!({ "queue": "grown", "partition": format!("p-{i}"), "payload": { "n": i } }))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);

    // The broker looks every 2 s; the statistics collector may take up to 10 s to count the
    // rows.
    let deadline = Instant::now() + Duration::from_secs(60);
    for table in ["queen.partitions", "queen.segments"] {
        loop {
            let (count, rows) = analyzed(&mut conn, table).await;
            if count >= 1 {
                assert!(
                    rows >= partitions as f32,
                    "{table} planned with {rows} rows"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the broker did not analyze {table} within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // Analyzed and not grown since: a look finds nothing due.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let again = analyze_grown(&pool, &mut Tries::default()).await.unwrap();
    assert!(
        again.iter().all(|s| s.table != "queen.partitions"),
        "{again:?}"
    );

    // The pop's write-order scan reads the index in write order: no bitmap scan sorting every
    // partition written since the watermark.
    let plan: Value = sqlx::query_scalar(&format!("EXPLAIN (FORMAT JSON) {READY_SQL}"))
        .bind("grown")
        .bind("g")
        .bind(uuid::Uuid::now_v7())
        .bind("test")
        .bind(100_i64)
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .bind(Vec::<i64>::new())
        .bind(16_i64)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let all = plan_nodes(&plan[0]["Plan"]);
    assert!(
        all.iter()
            .any(|n| n["Index Name"] == "partitions_write_order" && n["Node Type"] == "Index Scan"),
        "{plan}"
    );
    assert!(
        !all.iter()
            .any(|n| n["Relation Name"] == "partitions" && n["Node Type"] == "Bitmap Heap Scan"),
        "{plan}"
    );
}
