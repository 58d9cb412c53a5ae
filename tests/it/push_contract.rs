//! The push contract over HTTP against a real PostgreSQL (reference §3, producing.md): what is
//! rejected and that nothing is then written, the response shape, verbatim payloads, ordering.

use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings};
use serde_json::{json, Value};
use uuid::Uuid;

async fn queue_count(db: &crate::support::TestDb) -> i64 {
    let mut conn = db.conn().await;
    sqlx::query_scalar("SELECT count(*) FROM queen.queues")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[actix_web::test]
async fn empty_items_answer_201_with_an_empty_array() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app.push(json!([])).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, json!([]));
}

#[actix_web::test]
async fn a_bad_request_writes_nothing_and_says_what_and_where() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "Empty request body"),
        (b"{\"items\": [".to_vec(), "Invalid JSON"),
        (b"{}".to_vec(), "items array is required"),
        (br#"{"items": {"queue": "q"}}"#.to_vec(), "items array is required"),
        (br#"{"items": [{"queue": "q", "payload": 1}, {"payload": 2}]}"#.to_vec(), "item 1: queue is required"),
        (br#"{"items": [{"queue": "q", "payload": 1}, {"queue": "q"}]}"#.to_vec(), "item 1: payload is required"),
        (br#"{"items": [{"queue": "q", "payload": 1}, {"queue": 7, "payload": 1}]}"#.to_vec(), "item 1: Queue must be a string"),
        (br#"{"items": [{"queue": "q", "partition": 7, "payload": 1}]}"#.to_vec(), "item 0: Partition must be a string"),
        (br#"{"items": [{"queue": "q", "transactionId": 7, "payload": 1}]}"#.to_vec(), "item 0: TransactionId must be a string"),
        (format!(r#"{{"items": [{{"queue": "q", "payload": 1}}, {{"queue": "q", "partition": "{}", "payload": 1}}]}}"#, "p".repeat(256)).into_bytes(), "item 1: partition is longer than 255 characters"),
        (format!(r#"{{"items": [{{"queue": "q", "transactionId": "{}", "payload": 1}}]}}"#, "t".repeat(256)).into_bytes(), "item 0: transactionId is longer than 255 characters"),
    ];
    for (body, expected) in cases {
        let reply = app.post_raw("/api/v1/push", body.clone()).await;
        assert_eq!(reply.status, 400, "body {}", String::from_utf8_lossy(&body));
        let error = reply.body["error"].as_str().expect("error text");
        assert!(
            error.starts_with(expected),
            "{error:?} should start with {expected:?}"
        );
    }
    assert_eq!(
        queue_count(&db).await,
        0,
        "a rejected request writes nothing"
    );
}

#[actix_web::test]
async fn a_body_above_the_limit_is_413() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_MAX_BODY_BYTES", "1000")])).await;
    let big = json!([{ "queue": "q", "payload": "x".repeat(2000) }]);
    let reply = app.push(big).await;
    assert_eq!(reply.status, 413);
    assert!(reply.body["error"]
        .as_str()
        .unwrap()
        .contains("QUEEN_MAX_BODY_BYTES"));
    let small = app
        .push(json!([{ "queue": "q", "payload": "x".repeat(100) }]))
        .await;
    assert_eq!(small.status, 201);
}

#[actix_web::test]
async fn results_come_back_in_request_order_with_the_wire_shape() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .push(json!([
            { "queue": "a", "partition": "p1", "payload": 1, "transactionId": "t-1" },
            { "queue": "b", "payload": 2 },
            { "queue": "a", "partition": "p2", "payload": 3, "transactionId": "t-3" },
            { "queue": "a", "partition": "p1", "payload": 4, "transactionId": "t-4" },
        ]))
        .await;
    assert_eq!(reply.status, 201);
    let results = reply.body.as_array().expect("a top-level array");
    assert_eq!(results.len(), 4);
    for (i, r) in results.iter().enumerate() {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 5, "{r}");
        assert_eq!(r["index"], i);
        assert_eq!(r["status"], "queued");
        Uuid::parse_str(r["message_id"].as_str().unwrap()).expect("message_id is a UUID");
    }
    assert_eq!(results[0]["queueName"], "a");
    assert_eq!(results[1]["queueName"], "b");
    assert_eq!(results[0]["transaction_id"], "t-1");
    // No transactionId: the minted message id is the key.
    assert_eq!(results[1]["transaction_id"], results[1]["message_id"]);
    let stored = db.stored("b", "Default").await;
    assert_eq!(
        stored[0].transaction_id,
        results[1]["message_id"].as_str().unwrap()
    );
    assert_eq!(
        stored[0].id.to_string(),
        results[1]["message_id"].as_str().unwrap()
    );
    assert_eq!(stored[0].producer_sub, None);
}

#[actix_web::test]
async fn payloads_are_stored_byte_for_byte() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let payloads = [
        r#"{"z":1,"a":{"y":[1.10,2.0e3]},"m":12345678901234567890123}"#,
        r#""tab\tquote\"nul\u0000 snow\u2603 ünï""#,
        "null",
        "[ 1 , 2 ]",
        "{}",
        "-0.000",
    ];
    let items: Vec<String> = payloads
        .iter()
        .map(|p| format!(r#"{{"queue":"v","payload":{p}}}"#))
        .collect();
    let body = format!(r#"{{"items":[{}]}}"#, items.join(","));
    let reply = app.post_raw("/api/v1/push", body.into_bytes()).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let stored: Vec<String> = db
        .stored("v", "Default")
        .await
        .into_iter()
        .map(|s| s.payload)
        .collect();
    assert_eq!(stored, payloads);
}

#[actix_web::test]
async fn one_body_for_one_partition_is_one_segment_in_body_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let items: Vec<Value> = (0..50)
        .map(|n| json!({ "queue": "o", "partition": "p", "payload": { "n": n } }))
        .collect();
    assert_eq!(app.push(Value::Array(items)).await.status, 201);
    let stored = db.stored("o", "p").await;
    assert_eq!(stored.len(), 50);
    for (n, s) in stored.iter().enumerate() {
        assert_eq!(s.offset, n as i64, "offsets start at 0 without gaps");
        assert_eq!(s.payload, format!(r#"{{"n":{n}}}"#));
        assert_eq!(s.segment_base, 0, "one segment");
    }
}

#[actix_web::test]
async fn trace_id_and_producer_sub_in_the_body_are_not_read() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .push(json!([{ "queue": "t", "payload": 1, "traceId": Uuid::new_v4(), "producerSub": "mallory" }]))
        .await;
    assert_eq!(reply.status, 201);
    let mut conn = db.conn().await;
    let frames: Vec<u8> = sqlx::query_scalar("SELECT frames FROM queen.segments")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let decoded = queen_broker::storage::segments::frames::decode(&frames).unwrap();
    assert_eq!(decoded[0].producer_sub, None);
    assert_eq!(decoded[0].trace_id, None);
}

#[actix_web::test]
async fn options_preflight_and_unknown_routes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app.get("/api/v1/nothing-here").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body["code"], "no_such_route");
    assert_eq!(
        reply.headers.get("access-control-allow-origin").unwrap(),
        "*"
    );
    let health = app.get("/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.body["status"], "healthy");
    assert_eq!(app.get("/health/live").await.status, 200);
}

#[actix_web::test]
async fn segments_are_compressed_with_lz4_and_read_back_verbatim() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // A compressible segment: 100 alike JSON payloads of a few hundred bytes each.
    let text = "the same words again and again ".repeat(12);
    let items: Vec<Value> = (0..100)
        .map(|i| json!({ "queue": "lz", "partition": "p", "payload": { "n": i, "text": text } }))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);

    let mut conn = db.conn().await;
    let (method, stored, raw): (Option<String>, i32, i32) = sqlx::query_as(
        "SELECT pg_column_compression(frames), pg_column_size(frames), octet_length(frames)
           FROM queen.segments",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(method.as_deref(), Some("lz4"));
    assert!(stored < raw / 2, "stored {stored} of {raw} bytes");

    let popped = app.get("/api/v1/pop/queue/lz?batch=100&autoAck=true").await;
    assert_eq!(popped.status, 200, "{:?}", popped.body);
    let messages = popped.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 100);
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["data"], json!({ "n": i, "text": text }));
    }
}
