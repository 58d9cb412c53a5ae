//! Consumer groups (reference §4.2, §9.1, §12.4): own cursors, subscription modes on first
//! contact, and the group routes.

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, TestApp, TestDb};
use serde_json::{json, Value};

async fn db_now(db: &TestDb) -> String {
    let mut conn = db.conn().await;
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[actix_web::test]
async fn every_group_sees_every_message_with_its_own_cursor() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;
    let g1 = pop(&app, "q", "batch=10&consumerGroup=g1").await;
    let g2 = pop(&app, "q", "batch=10&consumerGroup=g2").await;
    let plain = pop(&app, "q", "batch=10").await;
    for reply in [&g1, &g2, &plain] {
        assert_eq!(ns(reply), vec![0, 1, 2]);
    }
    assert_eq!(g1.body["consumerGroup"], "g1");
    assert_eq!(messages(&g2)[0]["consumerGroup"], "g2");
    assert_eq!(plain.body["consumerGroup"], "__QUEUE_MODE__");

    ack_all(&app, &g1, "completed", Some("g1")).await;
    push_n(&app, "q", "p", 3, 1).await;
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&consumerGroup=g1").await),
        vec![3]
    );
    // g2 still holds its lease on the partition: its other consumers wait.
    assert_eq!(
        pop(&app, "q", "batch=10&consumerGroup=g2").await.status,
        204
    );
    ack_all(&app, &g2, "completed", Some("g2")).await;
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&consumerGroup=g2").await),
        vec![3]
    );
}

#[actix_web::test]
async fn subscription_new_skips_history_on_first_contact_only() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    a_late_group_sees_only_what_follows(&app, &db).await;

    // Queue mode always starts from the beginning; the choice is made on first contact.
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&subscriptionMode=new").await),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&consumerGroup=early").await),
        vec![0, 1, 2, 3, 4]
    );
    let other = pop(
        &app,
        "q",
        "batch=10&consumerGroup=other&subscriptionFrom=now",
    )
    .await;
    assert_eq!(other.status, 204, "subscriptionFrom=now is the same as new");
}

#[actix_web::test]
async fn subscription_from_a_timestamp_starts_there() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let t = db_now(&db).await;
    push_n(&app, "q", "p", 2, 2).await;
    let from = format!(
        "batch=10&consumerGroup=g&subscriptionFrom={}",
        t.replace('+', "%2B")
    );
    assert_eq!(ns(&pop(&app, "q", &from).await), vec![2, 3]);
    let bad = pop(
        &app,
        "q",
        "batch=10&consumerGroup=h&subscriptionFrom=garbage",
    )
    .await;
    assert_eq!(ns(&bad), vec![0, 1, 2, 3], "an unparsable start means all");
}

#[actix_web::test]
async fn group_routes_list_lag_seek_and_delete() {
    let db = fresh_db().await;
    // No claim ahead after the ack: `leaseActive` below is about the popped lease only.
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_AHEAD_MS", "0")])).await;
    push_n(&app, "q", "p", 0, 4).await;
    let got = pop(&app, "q", "batch=1&consumerGroup=g").await;
    ack_all(&app, &got, "completed", Some("g")).await;
    pop(&app, "q", "batch=1").await; // queue mode subscribes too

    let list = app.get("/api/v1/consumer-groups").await;
    assert_eq!(list.status, 200);
    let entries = list.body.as_array().unwrap();
    let g = entries.iter().find(|e| e["name"] == "g").expect("g listed");
    assert_eq!(g["queueName"], "q");
    assert_eq!(g["topics"], json!(["q"]));
    assert_eq!(g["partitionsWithLag"], 1);
    assert_eq!(g["subscriptionMode"], "all");
    assert_eq!(g["state"], "Stable");
    assert_eq!(g["totalLag"], Value::Null);
    assert!(entries.iter().any(|e| e["name"] == "__QUEUE_MODE__"));

    let one = app.get("/api/v1/consumer-groups/g").await;
    let parts = one.body["q"]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["partition"], "p");
    assert_eq!(parts[0]["offsetLag"], 3);
    assert_eq!(parts[0]["totalConsumed"], 1);
    assert_eq!(parts[0]["leaseActive"], false);
    assert_eq!(
        app.get("/api/v1/consumer-groups/nobody").await.body,
        json!({})
    );

    let lagging = app
        .get("/api/v1/consumer-groups/lagging?minLagSeconds=0")
        .await;
    let rows = lagging.body.as_array().unwrap();
    let row = rows.iter().find(|r| r["consumer_group"] == "g").unwrap();
    assert_eq!(row["queue_name"], "q");
    assert_eq!(row["partition_name"], "p");
    assert_eq!(row["offset_lag"], 3);
    let none = app.get("/api/v1/consumer-groups/lagging").await;
    assert_eq!(none.body, json!([]), "nothing is an hour old");

    // Seek to the end: nothing left; seek back to a time before everything: all again.
    let r = app
        .post(
            "/api/v1/consumer-groups/g/queues/q/seek",
            &json!({ "toEnd": true }),
        )
        .await;
    assert_eq!(r.body["partitionsUpdated"], 1);
    assert_eq!(r.body["seekToEnd"], true);
    assert_eq!(pop(&app, "q", "consumerGroup=g").await.status, 204);
    let r = app
        .post(
            "/api/v1/consumer-groups/g/queues/q/seek",
            &json!({ "timestamp": "2000-01-01T00:00:00Z" }),
        )
        .await;
    assert_eq!(r.body["partitionsUpdated"], 1);
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&consumerGroup=g").await),
        vec![0, 1, 2, 3]
    );
    let bad = app
        .post("/api/v1/consumer-groups/g/queues/q/seek", &json!({}))
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.body["error"],
        "Must specify either 'toEnd': true or 'timestamp'"
    );

    let r = post_raw(
        &app,
        "/api/v1/consumer-groups/g/queues/q/partitions/p/seek",
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(pop(&app, "q", "consumerGroup=g").await.status, 204);
    let r = post_raw(
        &app,
        "/api/v1/consumer-groups/g/queues/q/partitions/zz/seek",
        "",
    )
    .await;
    assert_eq!(r.status, 500);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        body,
        json!({ "success": false, "error": "Partition not found" })
    );

    // Deleting the group's state: it starts over (mode all: from the beginning).
    let r = delete(
        &app,
        "/api/v1/consumer-groups/g/queues/q?deleteMetadata=false",
    )
    .await;
    assert_eq!(r.body["deletedPartitions"], 1);
    assert_eq!(r.body["metadataDeleted"], false);
    assert_eq!(
        ns(&pop(&app, "q", "batch=10&consumerGroup=g").await),
        vec![0, 1, 2, 3]
    );
    let r = delete(&app, "/api/v1/consumer-groups/g").await;
    assert_eq!(r.body["success"], true);
    assert_eq!(r.body["metadataDeleted"], true);
    assert_eq!(
        pop(&app, "q", "consumerGroup=g&subscriptionMode=new")
            .await
            .status,
        204,
        "with its metadata gone the group chooses its start again"
    );

    let r = app
        .post("/api/v1/consumer-groups/g/subscription", &json!({}))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error"],
        "Missing subscriptionTimestamp in request body"
    );
    let r = app
        .post(
            "/api/v1/consumer-groups/g/subscription",
            &json!({ "subscriptionTimestamp": "2000-01-01T00:00:00Z" }),
        )
        .await;
    assert_eq!(r.body["rowsUpdated"], 1);
    assert_eq!(r.body["newTimestamp"], "2000-01-01T00:00:00.000Z");
}

/// A `new` group whose first look meets partitions written before it subscribed (here still in
/// its scan, because a transaction older than them was running) takes no row on them: one later
/// pop of several partitions then gathers everything written since, old partition and new alike,
/// as a first contact does.
#[actix_web::test]
async fn a_new_group_takes_no_row_on_history_it_skips() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // A transaction with an id, older than every write below, holds the snapshots' xmin back.
    let mut old = db.conn().await;
    sqlx::query("BEGIN").execute(&mut old).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut old)
        .await
        .unwrap();
    a_late_group_sees_only_what_follows(&app, &db).await;
    sqlx::query("ROLLBACK").execute(&mut old).await.unwrap();
}

/// Partition `p` has a history, then group `late` subscribes `new` (nothing for it, and no row
/// on the history it skips), then `p` and a new partition are written: pops of several
/// partitions bring exactly what followed the subscription (the new partition, joined by the
/// group when it was created, may come in a pop of its own).
async fn a_late_group_sees_only_what_follows(app: &TestApp, db: &TestDb) {
    push_n(app, "q", "p", 0, 3).await;
    assert_eq!(
        pop(app, "q", "consumerGroup=late&subscriptionMode=new")
            .await
            .status,
        204
    );
    let rows: i64 = {
        let mut conn = db.conn().await;
        sqlx::query_scalar(
            "SELECT count(*) FROM queen.partition_consumers WHERE consumer_group = 'late'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    assert_eq!(rows, 0, "a row on history the group skips");
    push_n(app, "q", "p", 3, 2).await;
    push_n(app, "q", "fresh", 10, 1).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let got = pop(app, "q", "batch=10&partitions=5&consumerGroup=late").await;
        if got.status == 204 {
            break;
        }
        seen.extend(ns(&got));
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![3, 4, 10]);
}
