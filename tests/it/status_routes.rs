//! The routes of reference §9.3–§9.6 the dashboard and the SDKs call beyond the core protocol:
//! traces, status and analytics, stats refresh, and deleting one message.

use serde_json::{json, Value};

use crate::support::consuming::{ack_all, messages, pop, pop_partition};
use crate::support::{fresh_db, spawn_app, TestApp};

/// Pushes `n` messages to `queue` and returns the first pop's message (leased).
async fn one_message(app: &TestApp, queue: &str, n: usize) -> Value {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({ "queue": queue, "payload": { "i": i }, "transactionId": format!("{queue}-{i}") }))
        .collect();
    let r = app.push(json!(items)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let popped = pop(app, queue, "").await;
    messages(&popped)[0].clone()
}

#[actix_web::test]
async fn traces_are_recorded_and_read_by_message_by_name_and_as_names() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let m = one_message(&app, "traced", 2).await;
    let (pid, txn) = (m["partitionId"].clone(), m["transactionId"].clone());
    let r = app
        .post(
            "/api/v1/traces",
            &json!({ "transactionId": txn, "partitionId": pid, "data": { "text": "started", "n": 1.50 },
                     "traceNames": ["order-7", "checkout"], "workerId": "w1" }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["success"], true);
    let first_id = r.body["traceId"].as_str().unwrap().to_string();
    let r = app
        .post(
            "/api/v1/traces",
            &json!({ "transactionId": txn, "partitionId": pid, "data": "done",
                     "eventType": "processing", "traceNames": "order-7", "consumerGroup": "g" }),
        )
        .await;
    assert_eq!(r.body["success"], true, "{:?}", r.body);
    // Another message of the queue filed under the same name.
    let other = app
        .post(
            "/api/v1/traces",
            &json!({ "transactionId": "traced-1", "partitionId": pid, "data": {}, "traceNames": ["order-7"] }),
        )
        .await;
    assert_eq!(other.body["success"], true, "{:?}", other.body);

    let pid_s = pid.as_str().unwrap();
    let txn_s = txn.as_str().unwrap();
    let r = app.get(&format!("/api/v1/traces/{pid_s}/{txn_s}")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let traces = r.body["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[0]["id"], first_id.as_str());
    assert_eq!(traces[0]["data"], json!({ "text": "started", "n": 1.50 }));
    assert_eq!(traces[0]["eventType"], "info");
    assert_eq!(traces[0]["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(traces[0]["workerId"], "w1");
    assert_eq!(traces[0]["traceNames"], json!(["checkout", "order-7"]));
    assert_eq!(traces[1]["eventType"], "processing");
    assert_eq!(traces[1]["consumerGroup"], "g");
    assert_eq!(traces[1]["queueName"], "traced");

    let r = app.get("/api/v1/traces/by-name/order-7?limit=2").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["total"], 3);
    assert_eq!(r.body["traces"].as_array().unwrap().len(), 2);
    let r = app.get("/api/v1/traces/names").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let names: Vec<(&str, i64, i64)> = r.body["traceNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["traceName"].as_str().unwrap(),
                n["traceCount"].as_i64().unwrap(),
                n["messageCount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, [("order-7", 3, 2), ("checkout", 1, 1)]);
    assert_eq!(r.body["total"], 2);
}

#[actix_web::test]
async fn a_trace_without_its_fields_or_of_an_unknown_message_is_refused() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let m = one_message(&app, "traced", 1).await;
    let r = app
        .post(
            "/api/v1/traces",
            &json!({ "partitionId": m["partitionId"], "data": 1 }),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["error"],
        "transactionId and partitionId are required"
    );
    let r = app
        .post(
            "/api/v1/traces",
            &json!({ "transactionId": m["transactionId"], "partitionId": m["partitionId"] }),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["error"], "data is required");
    let r = app
        .post(
            "/api/v1/traces",
            &json!({ "transactionId": "nope", "partitionId": m["partitionId"], "data": 1 }),
        )
        .await;
    assert_eq!(r.status, 404, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({ "success": false, "error": "Message not found" })
    );
    let r = app.post_raw("/api/v1/traces", b"{".to_vec()).await;
    assert_eq!(r.status, 400);
    let r = app.get("/api/v1/traces/not-a-uuid/x").await;
    assert_eq!((r.status, r.body["count"].as_i64()), (200, Some(0)));
}

#[actix_web::test]
async fn status_routes_count_what_is_stored_and_consumed() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app
        .push(json!([
            { "queue": "s1", "payload": 1 }, { "queue": "s1", "payload": 2 },
            { "queue": "s1", "partition": "b", "payload": 3 }, { "queue": "s2", "payload": 4 },
        ]))
        .await;
    assert_eq!(r.status, 201);
    let popped = pop_partition(&app, "s1", "Default", "batch=2").await;
    ack_all(&app, &popped, "completed", None).await;

    let r = app.get("/api/v1/status").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        (r.body["queues"].as_i64(), r.body["partitions"].as_i64()),
        (Some(2), Some(3))
    );
    assert_eq!(r.body["messages"]["total"], 4);
    assert_eq!(r.body["messages"]["completed"], 2);
    let written: i64 = r.body["throughput"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["messages"].as_i64().unwrap())
        .sum();
    assert_eq!(
        written, 4,
        "every message written in the last hour is in a bucket"
    );
    let r = app.get("/api/v1/status?queue=s2").await;
    assert_eq!(r.body["messages"]["total"], 1);

    let r = app.get("/api/v1/status/queues?limit=1&offset=1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["pagination"]["total"], 2);
    assert_eq!(r.body["queues"][0]["name"], "s2");
    let r = app.get("/api/v1/status/queues/s1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["partitions"], 2);
    assert_eq!(r.body["messages"]["pending"], 1);
    assert_eq!(r.body["queue"]["options"]["leaseTime"], 300);
    let r = app.get("/api/v1/status/queues/nope").await;
    assert_eq!(
        (r.status, &r.body["error"]),
        (404, &json!("Queue not found"))
    );
    let r = app.get("/api/v1/status/queues/s1/messages?limit=2").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let listed = r.body["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed
        .iter()
        .all(|m| m["queue"] == "s1" && m["status"].is_string()));

    let r = app.get("/api/v1/status/analytics?interval=day").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["interval"], "day");
    let r = app.get("/api/v1/status/analytics?interval=fortnight").await;
    assert_eq!(r.status, 400);
    assert!(
        r.body["error"].as_str().unwrap().contains("interval"),
        "{:?}",
        r.body
    );
    let r = app
        .get("/api/v1/status/analytics?interval=minute&from=2000-01-01T00:00:00Z")
        .await;
    assert_eq!(r.status, 400, "too many buckets: {:?}", r.body);
    let r = app.get("/api/v1/status/analytics?from=yesterday").await;
    assert_eq!(r.status, 400);

    let r = app.get("/api/v1/status/buffers").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.body["pending"].as_i64(), r.body["dbHealthy"].as_bool()),
        (Some(0), Some(true))
    );
}

#[actix_web::test]
async fn analytics_routes_answer_each_name_and_refuse_others() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let m = one_message(&app, "a1", 3).await;
    assert!(m["id"].is_string());
    for name in [
        "system-metrics",
        "worker-metrics",
        "queue-lag",
        "queue-ops",
        "queue-parked-replicas",
        "retention",
        "postgres-stats",
    ] {
        let r = app.get(&format!("/api/v1/analytics/{name}")).await;
        assert_eq!(r.status, 200, "{name}: {:?}", r.body);
    }
    let r = app.get("/api/v1/analytics/queue-ops").await;
    let pushed: i64 = r.body["dataPoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["queue"] == "a1")
        .map(|p| p["pushed"].as_i64().unwrap())
        .sum();
    assert_eq!(pushed, 3);
    let r = app.get("/api/v1/analytics/postgres-stats").await;
    let tables: Vec<&str> = r.body["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert!(tables.contains(&"segments"), "{tables:?}");
    let r = app.get("/api/v1/analytics/queue-lag").await;
    assert!(r.body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["queue"] == "a1" && g["consumerGroup"] == "__QUEUE_MODE__"));
    let r = app.get("/api/v1/analytics/nothing").await;
    assert_eq!(r.status, 404);
}

#[actix_web::test]
async fn stats_refresh_accepts_an_empty_body_and_says_there_is_nothing_to_refresh() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app.post_raw("/api/v1/stats/refresh", Vec::new()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        (r.body["success"].as_bool(), r.body["refreshed"].as_bool()),
        (Some(true), Some(false))
    );
}

#[actix_web::test]
async fn a_deleted_message_is_never_handed_out_nor_shown_and_its_neighbours_flow_on() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let items: Vec<Value> = (0..6)
        .map(|i| {
            json!({ "queue": "del", "partition": "p", "payload": { "n": i },
                         "transactionId": format!("del-{i}") })
        })
        .collect();
    assert_eq!(app.push(json!(items)).await.status, 201);
    let pid: uuid::Uuid = {
        let mut conn = db.conn().await;
        sqlx::query_scalar("SELECT uuid FROM queen.partitions WHERE name = 'p'")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    // The first, a middle and the last message.
    for txn in ["del-0", "del-2", "del-5"] {
        let r = app.delete(&format!("/api/v1/messages/{pid}/{txn}")).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(
            (
                &r.body["success"],
                &r.body["message"],
                &r.body["transactionId"]
            ),
            (&json!(true), &json!("Message deleted"), &json!(txn))
        );
    }
    for txn in ["del-2", "unknown"] {
        let r = app.delete(&format!("/api/v1/messages/{pid}/{txn}")).await;
        assert_eq!(
            (r.status, &r.body["success"], &r.body["message"]),
            (200, &json!(false), &json!("Message not found"))
        );
    }
    let r = app.delete("/api/v1/messages/not-a-uuid/del-1").await;
    assert_eq!((r.status, &r.body["success"]), (200, &json!(false)));
    // The message routes no longer show it.
    assert_eq!(
        app.get(&format!("/api/v1/messages/{pid}/del-2"))
            .await
            .status,
        404
    );
    assert_eq!(
        app.get(&format!("/api/v1/messages/{pid}/del-1"))
            .await
            .status,
        200
    );
    let listed = app.get("/api/v1/messages?queue=del&limit=10").await;
    let mut txns: Vec<String> = listed.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_string())
        .collect();
    txns.sort();
    assert_eq!(txns, ["del-1", "del-3", "del-4"], "{:?}", listed.body);

    // Queue mode and a consumer group each get exactly the others, and the group's cursor
    // moves past the deleted tail.
    for query in ["batch=10", "batch=10&consumerGroup=g"] {
        let popped = pop(&app, "del", query).await;
        let ns: Vec<i64> = messages(&popped)
            .iter()
            .map(|m| m["data"]["n"].as_i64().unwrap())
            .collect();
        assert_eq!(ns, [1, 3, 4], "{query}");
        let group = query.contains("consumerGroup").then_some("g");
        let acked = ack_all(&app, &popped, "completed", group).await;
        assert!(
            acked
                .as_array()
                .unwrap()
                .iter()
                .all(|a| a["success"] == true),
            "{acked}"
        );
        assert_eq!(pop(&app, "del", query).await.status, 204, "{query}");
    }
    let mut conn = db.conn().await;
    let committed: Vec<i64> = sqlx::query_scalar(
        "SELECT committed_offset FROM queen.partition_consumers ORDER BY consumer_group",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(committed, [6, 6]);
}
