//! Retention against a real PostgreSQL: whole segments go by age, never part of one; the
//! dedup sidecar outlives them inside its window. Segments are aged with SQL, and the sweep is
//! called directly (no sleeps).

use crate::support::consuming::{ack_all, messages, pop_partition};
use crate::support::{fresh_db, spawn_app, TestApp, TestDb};
use queen_broker::storage::{push::dedup, queues::retention};
use serde_json::{json, Value};
use uuid::Uuid;

async fn configure(app: &TestApp, queue: &str, options: Value) {
    let reply = app
        .post(
            "/api/v1/configure",
            &json!({"queue": queue, "options": options}),
        )
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
}

/// One push per call, so each call is its own segment.
async fn push_segment(app: &TestApp, queue: &str, txns: &[&str]) -> Vec<Value> {
    let items: Vec<Value> = txns
        .iter()
        .map(|t| json!({"queue": queue, "transactionId": t, "payload": {"t": t}}))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201);
    reply.body.as_array().unwrap().clone()
}

/// Moves a queue's segments with these base offsets two hours into the past.
async fn age_segments(db: &TestDb, queue: &str, bases: &[i64]) {
    let list = bases
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    db.exec(&format!(
        "UPDATE queen.segments s SET created_at = s.created_at - interval '2 hours'
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
          WHERE s.partition_id = p.id AND q.name = '{queue}' AND s.base_offset IN ({list})"
    ))
    .await;
}

async fn sweep(app: &TestApp) -> retention::Removed {
    retention::sweep(&app.broker.state.pool, 2)
        .await
        .expect("retention sweep")
}

fn offsets(stored: &[crate::support::Stored]) -> Vec<i64> {
    stored.iter().map(|s| s.offset).collect()
}

#[actix_web::test]
async fn retention_removes_whole_expired_segments_and_nothing_younger() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(
        &app,
        "kept-an-hour",
        json!({"retentionEnabled": true, "retentionSeconds": 3600}),
    )
    .await;
    push_segment(&app, "kept-an-hour", &["a", "b", "c"]).await; // offsets 0..3
    push_segment(&app, "kept-an-hour", &["d", "e"]).await; // 3..5
    push_segment(&app, "kept-an-hour", &["f"]).await; // 5
    push_segment(&app, "kept-an-hour", &["g"]).await; // 6
    push_segment(&app, "forever", &["x", "y"]).await; // no retention configured
    age_segments(&db, "kept-an-hour", &[0, 3, 5]).await;
    age_segments(&db, "forever", &[0]).await;

    // A batch of 2 segments per statement: the sweep loops until done.
    let removed = sweep(&app).await;
    assert_eq!(
        removed,
        retention::Removed {
            segments: 3,
            messages: 6
        }
    );
    assert_eq!(
        offsets(&db.stored("kept-an-hour", "Default").await),
        vec![6]
    );
    assert_eq!(offsets(&db.stored("forever", "Default").await), vec![0, 1]);
    assert_eq!(sweep(&app).await, retention::Removed::default());
}

#[actix_web::test]
async fn retention_needs_retention_enabled_but_max_wait_time_does_not() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(&app, "switched-off", json!({"retentionSeconds": 60})).await;
    configure(&app, "max-wait", json!({"maxWaitTimeSeconds": 60})).await;
    for queue in ["switched-off", "max-wait"] {
        push_segment(&app, queue, &["a", "b"]).await;
        push_segment(&app, queue, &["c"]).await;
        age_segments(&db, queue, &[0]).await;
    }
    assert_eq!(sweep(&app).await.segments, 1);
    assert_eq!(
        offsets(&db.stored("switched-off", "Default").await),
        vec![0, 1, 2]
    );
    assert_eq!(offsets(&db.stored("max-wait", "Default").await), vec![2]);
}

#[actix_web::test]
async fn a_partition_loses_only_a_prefix_of_its_segments() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(
        &app,
        "q",
        json!({"retentionEnabled": true, "retentionSeconds": 3600}),
    )
    .await;
    push_segment(&app, "q", &["a"]).await;
    push_segment(&app, "q", &["b"]).await;
    push_segment(&app, "q", &["c"]).await;
    // Only the middle one is old (a clock oddity): removing it would punch a hole, so it waits
    // until the segments before it go.
    age_segments(&db, "q", &[1]).await;
    assert_eq!(sweep(&app).await.segments, 0);
    age_segments(&db, "q", &[0]).await;
    assert_eq!(sweep(&app).await.segments, 2);
    assert_eq!(offsets(&db.stored("q", "Default").await), vec![2]);
}

#[actix_web::test]
async fn a_duplicate_of_a_message_removed_by_retention_answers_the_all_zero_uuid() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Retention shorter than the dedup window (3600 by default).
    configure(
        &app,
        "q",
        json!({"retentionEnabled": true, "retentionSeconds": 60}),
    )
    .await;
    let original = push_segment(&app, "q", &["k"]).await;
    assert_eq!(original[0]["status"], "queued");
    age_segments(&db, "q", &[0]).await;
    db.exec("UPDATE queen.dedup_keys SET created_at = created_at - interval '2 minutes'")
        .await;
    assert_eq!(sweep(&app).await.segments, 1);
    assert!(db.stored("q", "Default").await.is_empty());

    // The sidecar row is still inside its window: the key is still known, its original is not.
    let again = push_segment(&app, "q", &["k"]).await;
    assert_eq!(again[0]["status"], "duplicate");
    assert_eq!(again[0]["message_id"], Uuid::nil().to_string());
    assert!(
        db.stored("q", "Default").await.is_empty(),
        "nothing written"
    );

    // Once the window has passed, the dedup sweep removes the row and the key is new again.
    db.exec("UPDATE queen.dedup_keys SET created_at = created_at - interval '2 hours'")
        .await;
    let mut conn = db.conn().await;
    assert_eq!(dedup::sweep_expired(&mut conn, 100).await.unwrap(), 1);
    let later = push_segment(&app, "q", &["k"]).await;
    assert_eq!(later[0]["status"], "queued");
}

/// Pushes one segment to a partition (one push = one segment).
async fn push_to(app: &TestApp, queue: &str, partition: &str, txns: &[&str]) {
    let items: Vec<Value> = txns
        .iter()
        .map(|t| {
            json!({"queue": queue, "partition": partition, "transactionId": t,
                        "payload": {"t": t}})
        })
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
}

/// Pops up to `batch` messages of one partition for `group` (queue mode when `None`) and acks
/// them all; returns their transactionIds.
async fn consume(
    app: &TestApp,
    queue: &str,
    partition: &str,
    group: Option<&str>,
    batch: usize,
) -> Vec<String> {
    let query = match group {
        Some(g) => format!("batch={batch}&consumerGroup={g}"),
        None => format!("batch={batch}"),
    };
    let reply = pop_partition(app, queue, partition, &query).await;
    let txns: Vec<String> = messages(&reply)
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_string())
        .collect();
    if !txns.is_empty() {
        let acks = ack_all(app, &reply, "completed", group).await;
        for a in acks.as_array().unwrap() {
            assert_eq!(a["success"], true, "{a}");
        }
    }
    txns
}

/// Ages every segment of a queue by two hours.
async fn age_queue(db: &TestDb, queue: &str) {
    db.exec(&format!(
        "UPDATE queen.segments s SET created_at = s.created_at - interval '2 hours'
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
          WHERE s.partition_id = p.id AND q.name = '{queue}'"
    ))
    .await;
}

#[actix_web::test]
async fn completed_retention_removes_old_segments_below_the_queue_mode_cursor() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let options = json!({"retentionEnabled": true, "completedRetentionSeconds": 60});
    configure(&app, "done", options).await;
    push_to(&app, "done", "p", &["a", "b"]).await; // 0..2
    push_to(&app, "done", "p", &["c", "d"]).await; // 2..4
    push_to(&app, "done", "p", &["e"]).await; // 4
    push_to(&app, "done", "p", &["f"]).await; // 5, stays young
    push_to(&app, "done", "untouched", &["x"]).await;
    // Consumed but completed retention is off without the master switch (as in Queen).
    configure(
        &app,
        "switched-off",
        json!({"completedRetentionSeconds": 60}),
    )
    .await;
    push_to(&app, "switched-off", "p", &["s"]).await;
    // Old, but nobody ever consumed it.
    configure(
        &app,
        "never-popped",
        json!({"retentionEnabled": true,
                                            "completedRetentionSeconds": 60}),
    )
    .await;
    push_to(&app, "never-popped", "p", &["n"]).await;

    assert_eq!(consume(&app, "done", "p", None, 3).await, ["a", "b", "c"]);
    assert_eq!(consume(&app, "switched-off", "p", None, 10).await, ["s"]);
    age_segments(&db, "done", &[0, 2, 4]).await;
    for queue in ["switched-off", "never-popped"] {
        age_queue(&db, queue).await;
    }
    db.exec(
        "UPDATE queen.segments s SET created_at = s.created_at - interval '2 hours'
           FROM queen.partitions p
          WHERE s.partition_id = p.id AND p.name = 'untouched'",
    )
    .await;

    // Committed offset 3: only the first segment lies wholly below it; the second is half
    // consumed and stays whole. The partition queue mode never touched consumed nothing.
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 1,
            messages: 2
        }
    );
    assert_eq!(offsets(&db.stored("done", "p").await), vec![2, 3, 4, 5]);
    assert_eq!(offsets(&db.stored("done", "untouched").await), vec![0]);
    assert_eq!(offsets(&db.stored("switched-off", "p").await), vec![0]);
    assert_eq!(offsets(&db.stored("never-popped", "p").await), vec![0]);

    // Everything consumed: the old segments go, the young one stays.
    assert_eq!(consume(&app, "done", "p", None, 10).await, ["d", "e", "f"]);
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 2,
            messages: 3
        }
    );
    assert_eq!(offsets(&db.stored("done", "p").await), vec![5]);
    assert_eq!(sweep(&app).await, retention::Removed::default());
}

#[actix_web::test]
async fn completed_retention_waits_for_every_group_of_the_partition() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let options = json!({"retentionEnabled": true, "completedRetentionSeconds": 60});
    configure(&app, "bus", options).await;
    push_to(&app, "bus", "a", &["a0", "a1"]).await; // 0..2
    push_to(&app, "bus", "a", &["a2"]).await; // 2
    push_to(&app, "bus", "b", &["b0"]).await; // 0

    assert_eq!(consume(&app, "bus", "a", Some("g1"), 10).await.len(), 3);
    assert_eq!(consume(&app, "bus", "a", Some("g2"), 2).await.len(), 2);
    assert_eq!(consume(&app, "bus", "b", Some("g3"), 10).await.len(), 1);
    age_queue(&db, "bus").await;
    // g3 subscribed to the queue but has no cursor on `a`: it has consumed nothing of it. On
    // `b`, g1 and g2 have consumed nothing.
    assert_eq!(sweep(&app).await, retention::Removed::default());

    assert_eq!(consume(&app, "bus", "a", Some("g3"), 10).await.len(), 3);
    // a: g1 3, g2 2, g3 3 — the first segment is below all of them, the second is not.
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 1,
            messages: 2
        }
    );
    assert_eq!(offsets(&db.stored("bus", "a").await), vec![2]);
    assert_eq!(offsets(&db.stored("bus", "b").await), vec![0]);

    // A group subscribing now, starting after the stored history, has no cursor on `a` yet
    // and so has consumed nothing of it: it holds the segment g1, g2 and g3 are done with.
    assert_eq!(
        pop_partition(&app, "bus", "a", "consumerGroup=g4&subscriptionMode=new")
            .await
            .status,
        204
    );
    assert_eq!(consume(&app, "bus", "a", Some("g2"), 10).await, ["a2"]);
    assert_eq!(sweep(&app).await, retention::Removed::default());
    // Once it touches the partition its cursor starts after what was there before it
    // subscribed, so that history counts as consumed by it.
    push_to(&app, "bus", "a", &["a3"]).await; // 3, young
    assert_eq!(consume(&app, "bus", "a", Some("g4"), 10).await, ["a3"]);
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 1,
            messages: 1
        }
    );
    assert_eq!(offsets(&db.stored("bus", "a").await), vec![3]);

    // Queue mode is a group like any other: its first pop elsewhere holds `a` again.
    assert_eq!(consume(&app, "bus", "b", None, 10).await, ["b0"]);
    for g in ["g1", "g2", "g3"] {
        assert_eq!(consume(&app, "bus", "a", Some(g), 10).await, ["a3"]);
    }
    age_queue(&db, "bus").await;
    assert_eq!(sweep(&app).await, retention::Removed::default());
    // It starts at the oldest message still stored.
    assert_eq!(consume(&app, "bus", "a", None, 10).await, ["a3"]);
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 1,
            messages: 1
        }
    );
    assert!(db.stored("bus", "a").await.is_empty());
}

#[actix_web::test]
async fn a_sweep_in_small_batches_reaches_every_partition() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(
        &app,
        "q",
        json!({"retentionEnabled": true, "retentionSeconds": 3600}),
    )
    .await;
    for partition in ["a", "b", "c"] {
        for n in 0..3 {
            let item = json!({"queue": "q", "partition": partition, "payload": n});
            assert_eq!(app.push(json!([item])).await.status, 201);
        }
    }
    db.exec("UPDATE queen.segments SET created_at = created_at - interval '2 hours'")
        .await;
    // Batches of 2 segments: statements stop mid-partition and resume there.
    assert_eq!(
        sweep(&app).await,
        retention::Removed {
            segments: 9,
            messages: 9
        }
    );
    for partition in ["a", "b", "c"] {
        assert!(db.stored("q", partition).await.is_empty());
    }
}

#[actix_web::test]
async fn the_completed_retention_migration_rolls_back_and_forward() {
    let db = fresh_db().await;
    let mut conn = db.conn().await;
    let consumed = "SELECT count(*) FROM queen.partition_consumed";
    db.exec("INSERT INTO queen.queues (name) VALUES ('q')")
        .await;
    db.exec("INSERT INTO queen.partitions (queue_id, name) SELECT id, 'p' FROM queen.queues")
        .await;
    let rows: i64 = sqlx::query_scalar(consumed)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 1, "one row per partition");
    queen_broker::storage::MIGRATOR
        .undo(&mut conn, 3)
        .await
        .expect("down to 0003");
    let rows: i64 = sqlx::query_scalar(consumed)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the placeholder again");
    queen_broker::storage::MIGRATOR
        .run(&mut conn)
        .await
        .expect("up again");
    let row: (i64,) = sqlx::query_as("SELECT consumed_below FROM queen.partition_consumed")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row, (0,), "nobody consumed anything");
}
