//! Input an attacker (or a buggy client) sends: values PostgreSQL cannot hold, numbers that
//! overflow, deep payloads on the transaction route, encoded bodies. Each gets a 400 naming the
//! field (or 415 for an encoding), never a 500 with the database's text: the official SDKs
//! retry every 5xx three times.

use std::io::Write;

use serde_json::{json, Value};

use crate::support::consuming::{messages, pop};
use crate::support::{fresh_db, spawn_app, Reply, TestApp};

fn error_of(reply: &Reply) -> String {
    reply.body["error"].as_str().unwrap_or_default().to_string()
}

fn assert_400_naming(reply: &Reply, field: &str, what: &str) {
    assert_eq!(reply.status, 400, "{what}: {:?}", reply.body);
    let error = error_of(reply);
    assert!(
        error.contains(field),
        "{what}: {error:?} should name {field}"
    );
}

#[actix_web::test]
async fn nul_in_a_queue_or_partition_name_is_400_and_nothing_is_spooled() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for (item, field) in [
        (json!({"queue": "q\u{0}x", "payload": 1}), "queue"),
        (
            json!({"queue": "q", "partition": "p\u{0}", "payload": 1}),
            "partition",
        ),
        (
            json!({"queue": "q", "transactionId": "t\u{0}", "payload": 1}),
            "transactionId",
        ),
    ] {
        let reply = app.push(json!([{"queue": "q", "payload": 0}, item])).await;
        assert_400_naming(&reply, field, "push");
        assert!(error_of(&reply).contains("NUL"), "{:?}", reply.body);
    }
    assert_eq!(app.broker.state.spool.state.records(), 0);
    assert!(
        db.stored("q", "Default").await.is_empty(),
        "a rejected body writes nothing"
    );
    // The transaction route uses the same rules.
    let reply = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [{"type": "push", "items": [{"queue": "q\u{0}", "payload": 1}]}]}),
        )
        .await;
    assert_400_naming(&reply, "queue", "transaction");
}

#[actix_web::test]
async fn nul_and_overflow_on_the_other_routes_are_400_naming_the_field() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let long = "g".repeat(256);
    let gets = [
        (
            "/api/v1/pop/queue/q?consumerGroup=g%00".to_string(),
            "consumerGroup",
        ),
        (
            format!("/api/v1/pop/queue/q?consumerGroup={long}"),
            "consumerGroup",
        ),
        ("/api/v1/pop/queue/q%00".to_string(), "queue"),
        (
            "/api/v1/pop/queue/q/partition/p%00".to_string(),
            "partition",
        ),
        ("/api/v1/messages?queue=q%00".to_string(), "queue"),
        ("/api/v1/messages?status=%00".to_string(), "status"),
        ("/api/v1/dlq?queue=q%00".to_string(), "queue"),
        ("/api/v1/dlq?consumerGroup=%00".to_string(), "consumerGroup"),
        ("/api/v1/consumer-groups/g%00".to_string(), "group"),
        ("/api/v1/resources/queues/q%00".to_string(), "queue"),
        ("/api/v1/resources/overview?queue=%00".to_string(), "queue"),
        (
            "/api/v1/consumer-groups/lagging?minLagSeconds=9223372036854775807".to_string(),
            "minLagSeconds",
        ),
    ];
    for (path, field) in gets {
        let reply = app.get(&path).await;
        assert_400_naming(&reply, field, &path);
    }
    let reply = app.delete("/api/v1/consumer-groups/g%00").await;
    assert_400_naming(&reply, "group", "delete group");
    let reply = app
        .post("/api/v1/configure", &json!({"queue": "q\u{0}"}))
        .await;
    assert_400_naming(&reply, "queue", "configure");
    let reply = app
        .post(
            "/api/v1/consumer-groups/g/subscription",
            &json!({"subscriptionTimestamp": "2026-01-01T00:00:00Z\u{0}"}),
        )
        .await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
}

#[actix_web::test]
async fn ack_and_lease_fields_are_checked_before_the_database() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    assert_eq!(
        app.push(json!([{"queue": "q", "payload": 1}])).await.status,
        201
    );
    let popped = pop(&app, "q", "batch=1").await;
    let m = messages(&popped)[0].clone();
    let ack = |extra: Value| {
        let mut body = json!({
            "transactionId": m["transactionId"], "partitionId": m["partitionId"],
            "leaseId": m["leaseId"], "status": "failed",
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let reply = app
        .post("/api/v1/ack", &ack(json!({"error": "boom\u{0}"})))
        .await;
    assert_400_naming(&reply, "error", "ack error");
    let reply = app
        .post("/api/v1/ack", &ack(json!({"consumerGroup": "g\u{0}"})))
        .await;
    assert_400_naming(&reply, "consumerGroup", "ack group");
    let reply = app
        .post(
            "/api/v1/ack/batch",
            &json!({"acknowledgments": [ack(json!({"error": "x\u{0}"}))]}),
        )
        .await;
    assert_400_naming(&reply, "error", "ack batch error");

    let lease = m["leaseId"].as_str().unwrap();
    let path = format!("/api/v1/lease/{lease}/extend");
    for seconds in [
        json!(9_223_372_036_854_775_000_i64),
        json!(86_401),
        json!(0),
    ] {
        let reply = app.post(&path, &json!({ "seconds": seconds })).await;
        assert_400_naming(&reply, "seconds", "lease extend");
    }
    let fine = app.post(&path, &json!({"seconds": 120})).await;
    assert_eq!(fine.status, 200, "{:?}", fine.body);
    assert_eq!(fine.body[0]["success"], true);
    // The message is still leased and acks normally afterwards.
    let reply = app
        .post("/api/v1/ack", &ack(json!({"error": "plain"})))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

#[actix_web::test]
async fn the_transaction_route_takes_the_payloads_push_takes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // The deepest payload either route takes (docs/operations.md, "Payload nesting"); one level
    // more is refused by both (probe2).
    let payload = nested(128);
    let push = format!(r#"{{"items":[{{"queue":"deep","payload":{payload}}}]}}"#);
    let reply = app.post_raw("/api/v1/push", push.into_bytes()).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let txn = format!(
        r#"{{"operations":[{{"type":"push","items":[{{"queue":"deep","traceId":"t","payload":{payload}}}]}}]}}"#
    );
    let reply = app.post_raw("/api/v1/transaction", txn.into_bytes()).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["success"], true, "{:?}", reply.body);
    let stored = db.stored("deep", "Default").await;
    assert_eq!(stored.len(), 2);
}

async fn post_encoded(app: &TestApp, encoding: &str, body: Vec<u8>) -> Reply {
    let client = awc::Client::default();
    let mut res = client
        .post(format!("{}/api/v1/push", app.base))
        .insert_header(("content-type", "application/json"))
        .insert_header(("content-encoding", encoding))
        .send_body(body)
        .await
        .expect("request sent");
    let bytes = res.body().await.expect("body");
    Reply {
        status: res.status().as_u16(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers: res.headers().clone(),
    }
}

#[actix_web::test]
async fn a_gzip_body_is_decoded_and_an_unknown_encoding_is_415() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let body =
        serde_json::to_vec(&json!({"items": [{"queue": "gz", "payload": {"a": 1}}]})).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&body).unwrap();
    let reply = post_encoded(&app, "gzip", gz.finish().unwrap()).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    assert_eq!(reply.body[0]["status"], "queued");
    let reply = post_encoded(&app, "x-unknown", body.clone()).await;
    assert_eq!(reply.status, 415, "{:?}", reply.body);
    assert!(error_of(&reply).contains("x-unknown"), "{:?}", reply.body);
    let reply = post_encoded(&app, "identity", body).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    assert_eq!(db.stored("gz", "Default").await.len(), 2);
}

#[actix_web::test]
async fn a_gzip_bomb_is_cut_at_the_body_limit() {
    let db = fresh_db().await;
    let settings = crate::support::test_settings(&db, &[("QUEEN_MAX_BODY_BYTES", "100000")]);
    let app = crate::support::spawn_app_with(settings).await;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(br#"{"items":[{"queue":"gz","payload":""#)
        .unwrap();
    gz.write_all(&vec![b'a'; 10_000_000]).unwrap();
    gz.write_all(br#""}]}"#).unwrap();
    let compressed = gz.finish().unwrap();
    assert!(compressed.len() < 100_000);
    let reply = post_encoded(&app, "gzip", compressed).await;
    assert_eq!(reply.status, 413, "{:?}", reply.body);
}
