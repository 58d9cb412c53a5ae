//! The resource routes over HTTP against a real PostgreSQL (reference §9.5).

use crate::support::consuming::{ack_all, ack_one, messages, pop_partition};
use crate::support::{fresh_db, spawn_app, TestApp};
use serde_json::{json, Value};

async fn push(app: &TestApp, queue: &str, partition: &str, n: usize) {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"queue": queue, "partition": partition, "payload": i}))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
}

fn counts(total: i64) -> Value {
    json!({"total": total, "pending": total, "processing": 0, "completed": 0, "failed": 0,
           "deadLetter": 0})
}

#[actix_web::test]
async fn queues_are_listed_with_partitions_and_message_counts() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push(&app, "orders", "a", 3).await;
    push(&app, "orders", "a", 1).await;
    push(&app, "orders", "b", 2).await;
    let configured = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "urgent", "namespace": "ops", "options": {"priority": 9}}),
        )
        .await;
    assert_eq!(configured.status, 200);

    let reply = app.get("/api/v1/resources/queues").await;
    assert_eq!(reply.status, 200);
    let queues = reply.body["queues"].as_array().unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["urgent", "orders"], "highest priority first");
    assert_eq!(queues[0]["id"], configured.body["queueId"]);
    assert_eq!(queues[0]["namespace"], "ops");
    assert_eq!(queues[0]["partitions"], 1);
    assert_eq!(
        queues[0]["messages"],
        json!({"total": 0, "pending": 0, "processing": 0})
    );
    assert_eq!(queues[1]["partitions"], 2);
    assert_eq!(
        queues[1]["messages"],
        json!({"total": 6, "pending": 6, "processing": 0})
    );
    let created = queues[1]["createdAt"].as_str().unwrap();
    assert!(
        created.ends_with('Z') && created.len() == 24,
        "milliseconds, UTC: {created}"
    );
}

#[actix_web::test]
async fn queue_detail_shows_each_partition_and_the_totals() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push(&app, "orders", "a", 3).await;
    push(&app, "orders", "b", 2).await;
    push(&app, "orders", "b", 2).await;

    let reply = app.get("/api/v1/resources/queues/orders").await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["name"], "orders");
    assert_eq!(reply.body["totals"], counts(7));
    assert_eq!(reply.body["options"]["dedupWindowSeconds"], 3600);
    let partitions = reply.body["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 2);
    assert_eq!(partitions[0]["name"], "a");
    assert_eq!(partitions[0]["stats"], counts(3));
    assert_eq!(partitions[1]["stats"], counts(4));
    assert!(
        partitions[1]["oldestMessage"].as_str().unwrap()
            <= partitions[1]["newestMessage"].as_str().unwrap()
    );

    let mut conn = db.conn().await;
    let uuid: uuid::Uuid = sqlx::query_scalar("SELECT uuid FROM queen.partitions WHERE name = 'a'")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(partitions[0]["id"], uuid.to_string());

    let missing = app.get("/api/v1/resources/queues/nope").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body, json!({"error": "Queue not found"}));
}

#[actix_web::test]
async fn deleting_a_queue_removes_everything_it_held_and_a_later_push_recreates_it() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push(&app, "doomed", "a", 3).await;
    push(&app, "doomed", "b", 1).await;
    push(&app, "kept", "a", 1).await;

    let reply = app.delete("/api/v1/resources/queues/doomed").await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        json!({"deleted": true, "queue": "doomed", "existed": true})
    );
    let mut conn = db.conn().await;
    let left: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM queen.partitions),
                (SELECT count(*) FROM queen.segments),
                (SELECT count(*) FROM queen.dedup_keys)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, (1, 1, 1), "only queue 'kept' remains");
    assert_eq!(app.get("/api/v1/resources/queues/doomed").await.status, 404);
    let again = app.delete("/api/v1/resources/queues/doomed").await;
    assert_eq!(again.body["existed"], false);

    // The partition actors still hold the deleted partitions' ids: the push path notices and
    // creates fresh partitions.
    let reply = app
        .push(json!([{"queue": "doomed", "partition": "a", "payload": "again"}]))
        .await;
    assert_eq!(reply.body[0]["status"], "queued", "{:?}", reply.body);
    let stored = db.stored("doomed", "a").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].offset, stored[0].payload.as_str()),
        (0, "\"again\"")
    );
}

#[actix_web::test]
async fn namespaces_tasks_and_overview_sum_their_queues() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Auto-created queues take namespace and task from their dotted names.
    push(&app, "billing.invoices", "Default", 2).await;
    push(&app, "billing.refunds.eu", "x", 1).await;
    push(&app, "plain", "Default", 4).await;

    let ns = app.get("/api/v1/resources/namespaces").await;
    assert_eq!(
        ns.body,
        json!({"namespaces": [{"namespace": "billing", "queues": 2, "partitions": 2,
                               "messages": {"total": 3, "pending": 3}}],
               "partitionsExact": true, "messagesExact": true})
    );
    let tasks = app.get("/api/v1/resources/tasks").await;
    let names: Vec<&str> = tasks.body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["invoices", "refunds"]);

    let overview = app.get("/api/v1/resources/overview").await;
    assert_eq!(overview.status, 200);
    let o = &overview.body;
    assert_eq!(
        (
            o["queues"].clone(),
            o["partitions"].clone(),
            o["namespaces"].clone(),
            o["tasks"].clone()
        ),
        (json!(3), json!(3), json!(1), json!(2))
    );
    assert_eq!(o["messages"], counts(7));
    assert!(o["throughput"]["ingestedPerSecond"].as_f64().unwrap() > 0.0);
    assert_eq!(
        o["lag"]["time"],
        json!({"avg": 0.0, "median": 0.0, "min": 0.0, "max": 0.0}),
        "nobody consumes, so nobody lags"
    );
}

fn stats(total: i64, pending: i64, processing: i64, completed: i64, dead: i64) -> Value {
    json!({"total": total, "pending": pending, "processing": processing, "completed": completed,
           "failed": 0, "deadLetter": dead})
}

/// Pops one partition for `group` (queue mode when `None`) and acks everything popped.
async fn consume(app: &TestApp, queue: &str, partition: &str, group: Option<&str>, batch: usize) {
    let query = match group {
        Some(g) => format!("batch={batch}&consumerGroup={g}"),
        None => format!("batch={batch}"),
    };
    let reply = pop_partition(app, queue, partition, &query).await;
    assert_eq!(messages(&reply).len(), batch);
    ack_all(app, &reply, "completed", group).await;
}

#[actix_web::test]
async fn counts_follow_the_consumers() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Queue mode on `work/p`: 2 consumed, 1 dead-lettered, 2 under a live lease, 1 pending.
    push(&app, "work", "p", 2).await;
    push(&app, "work", "p", 4).await;
    consume(&app, "work", "p", None, 2).await;
    let leased = pop_partition(&app, "work", "p", "batch=3").await;
    let leased = messages(&leased);
    assert_eq!(ack_one(&app, &leased[0], "dlq", None).await["dlq"], true);
    // Queue mode subscribed to `work` but never touched `idle`: all pending.
    push(&app, "work", "idle", 2).await;
    // Bus mode on `events/e`: g1 consumed 3, g2 1 and holds a lease on the next 2 (a named
    // group's lease is not `processing`): completed is what both consumed.
    push(&app, "events", "e", 4).await;
    consume(&app, "events", "e", Some("g1"), 3).await;
    consume(&app, "events", "e", Some("g2"), 1).await;
    let held = pop_partition(&app, "events", "e", "batch=2&consumerGroup=g2").await;
    assert_eq!(messages(&held).len(), 2);

    let work = app.get("/api/v1/resources/queues/work").await;
    assert_eq!(work.status, 200, "{:?}", work.body);
    let partitions = work.body["partitions"].as_array().unwrap();
    assert_eq!(partitions[0]["name"], "idle");
    assert_eq!(partitions[0]["stats"], stats(2, 2, 0, 0, 0));
    assert_eq!(partitions[1]["name"], "p");
    assert_eq!(partitions[1]["stats"], stats(6, 1, 2, 2, 1));
    assert_eq!(work.body["totals"], stats(8, 3, 2, 2, 1));

    let events = app.get("/api/v1/resources/queues/events").await;
    assert_eq!(events.body["totals"], stats(4, 3, 0, 1, 0));

    let list = app.get("/api/v1/resources/queues").await;
    let by_name = |name: &str| {
        list.body["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == name)
            .unwrap()["messages"]
            .clone()
    };
    assert_eq!(
        by_name("work"),
        json!({"total": 8, "pending": 3, "processing": 2})
    );
    assert_eq!(
        by_name("events"),
        json!({"total": 4, "pending": 3, "processing": 0})
    );

    let overview = app.get("/api/v1/resources/overview").await.body;
    assert_eq!(overview["messages"], stats(12, 6, 2, 3, 1));
    // Pairs with something unconsumed: queue mode on p (3 left: offsets 3..6) and idle (2),
    // g1 on e (1), g2 on e (3).
    assert_eq!(
        overview["lag"]["offset"],
        json!({"avg": 2.25, "median": 2.5, "min": 1.0, "max": 3.0})
    );
    let time = &overview["lag"]["time"];
    assert!(time["max"].as_f64().unwrap() >= 0.0 && time["max"].as_f64().unwrap() < 60.0);
    assert_eq!(overview["throughput"]["processedPerSecond"], 0);

    // Completed retention takes p's first segment (consumed): the rest is counted from the
    // stored range.
    db.exec(
        "UPDATE queen.queues SET retention_enabled = true, completed_retention_seconds = 60
          WHERE name = 'work'",
    )
    .await;
    db.exec("UPDATE queen.segments SET created_at = created_at - interval '2 hours'")
        .await;
    let removed = queen_broker::storage::queues::retention::sweep(&app.broker.state.pool, 100)
        .await
        .unwrap();
    assert_eq!((removed.segments, removed.messages), (1, 2));
    let work = app.get("/api/v1/resources/queues/work").await;
    assert_eq!(work.body["partitions"][1]["stats"], stats(4, 1, 2, 0, 1));
}
