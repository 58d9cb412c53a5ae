//! `POST /api/v1/configure` over HTTP against a real PostgreSQL (reference §7).

use crate::support::{fresh_db, spawn_app};
use serde_json::{json, Value};
use uuid::Uuid;

fn defaults() -> Value {
    json!({
        "priority": 0, "leaseTime": 300, "retryLimit": 3, "retryDelay": 1000, "maxSize": 0,
        "ttl": 3600, "deadLetterQueue": false, "dlqAfterMaxRetries": false,
        "delayedProcessing": 0, "windowBuffer": 0, "retentionSeconds": 0,
        "completedRetentionSeconds": 0, "retentionEnabled": false, "encryptionEnabled": false,
        "maxWaitTimeSeconds": 0, "dedupWindowSeconds": 3600
    })
}

#[actix_web::test]
async fn configure_creates_the_queue_with_its_default_partition_and_echoes_every_option() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .post("/api/v1/configure", &json!({"queue": "orders"}))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["configured"], true);
    assert_eq!(reply.body["queue"], "orders");
    assert_eq!(reply.body["namespace"], "");
    assert_eq!(reply.body["task"], "");
    assert_eq!(reply.body["options"], defaults());

    let mut conn = db.conn().await;
    let (queue_uuid, partition_uuid): (Uuid, Uuid) = sqlx::query_as(
        "SELECT q.uuid, p.uuid FROM queen.queues q
           JOIN queen.partitions p ON p.queue_id = q.id AND p.name = 'Default'
          WHERE q.name = 'orders'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(reply.body["queueId"], queue_uuid.to_string());
    assert_eq!(reply.body["partitionId"], partition_uuid.to_string());

    // Configuring again keeps the same queue and partition.
    let again = app
        .post("/api/v1/configure", &json!({"queue": "orders"}))
        .await;
    assert_eq!(again.body["queueId"], reply.body["queueId"]);
    assert_eq!(again.body["partitionId"], reply.body["partitionId"]);
}

#[actix_web::test]
async fn configure_is_a_full_replace_and_the_response_shows_the_reset() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "jobs", "namespace": "billing", "task": "invoices", "options": {
                "leaseTime": 60, "retryLimit": 7, "priority": 5, "delayedProcessing": 2,
                "windowBuffer": 3, "retentionEnabled": true, "retentionSeconds": 600,
                "completedRetentionSeconds": 120, "maxWaitTimeSeconds": 900,
                "dedupWindowSeconds": 0, "ttl": 10, "retryDelay": 50, "deadLetterQueue": true,
                "dlqAfterMaxRetries": true
            }}),
        )
        .await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let o = &first.body["options"];
    assert_eq!(
        (
            o["leaseTime"].clone(),
            o["dedupWindowSeconds"].clone(),
            o["priority"].clone()
        ),
        (json!(60), json!(0), json!(5))
    );
    assert_eq!(o["completedRetentionSeconds"], 120);
    assert_eq!(first.body["namespace"], "billing");

    let second = app
        .post("/api/v1/configure", &json!({"queue": "jobs"}))
        .await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["options"], defaults());
    assert_eq!(second.body["namespace"], "");
    assert_eq!(second.body["task"], "");

    // The row says the same as the response.
    let mut conn = db.conn().await;
    let row: (String, String, i32, i32, i32, bool, i32) = sqlx::query_as(
        "SELECT namespace, task, lease_time, retry_limit, dedup_window_seconds,
                retention_enabled, max_wait_time_seconds
           FROM queen.queues WHERE name = 'jobs'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(row, ("".into(), "".into(), 300, 3, 3600, false, 0));
}

#[actix_web::test]
async fn the_dedup_window_set_by_configure_rules_the_next_push() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let off = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"dedupWindowSeconds": 0}}),
        )
        .await;
    assert_eq!(off.body["options"]["dedupWindowSeconds"], 0);
    let item = json!({"queue": "q", "transactionId": "a", "payload": 1});
    for _ in 0..2 {
        let r = app.push(json!([item])).await;
        assert_eq!(r.body[0]["status"], "queued", "dedup is off: {:?}", r.body);
    }

    // A configure that leaves the window out puts it back to 3600, and the response says so.
    let reset = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "q", "options": {"leaseTime": 30}}),
        )
        .await;
    assert_eq!(reset.body["options"]["dedupWindowSeconds"], 3600);
    let item = json!({"queue": "q", "transactionId": "b", "payload": 2});
    let first = app.push(json!([item])).await;
    let second = app.push(json!([item])).await;
    assert_eq!(first.body[0]["status"], "queued");
    assert_eq!(second.body[0]["status"], "duplicate");
    assert_eq!(second.body[0]["message_id"], first.body[0]["message_id"]);
}

#[actix_web::test]
async fn what_the_sdks_send_on_create_is_accepted() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "sdk", "namespace": null, "task": null, "options": {
                "leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0,
                "windowBuffer": 0, "maxSize": 0, "retentionSeconds": 0,
                "completedRetentionSeconds": 0, "encryptionEnabled": false
            }}),
        )
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.body["options"], defaults());
}

#[actix_web::test]
async fn bad_requests_are_400_and_store_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let cases = [
        (json!({"options": {}}), "queue is required"),
        (json!({"queue": 12}), "queue is required"),
        (
            json!({"queue": "q", "options": {"leaseTime": "300"}}),
            "option leaseTime must be a non-negative integer",
        ),
        (
            json!({"queue": "q", "options": {"retentionEnabled": 1}}),
            "option retentionEnabled must be a boolean",
        ),
        (
            json!({"queue": "q", "options": {"encryptionEnabled": true}}),
            "option encryptionEnabled needs QUEEN_ENCRYPTION_KEY (64 hexadecimal characters) on the broker, and none is set",
        ),
        (
            json!({"queue": "q", "options": {"maxSize": -5}}),
            "option maxSize must be a non-negative integer",
        ),
    ];
    for (body, error) in cases {
        let reply = app.post("/api/v1/configure", &body).await;
        assert_eq!(reply.status, 400, "{body}");
        assert_eq!(reply.body, json!({ "error": error }), "{body}");
    }
    let empty = app.post_raw("/api/v1/configure", Vec::new()).await;
    assert_eq!(empty.body, json!({"error": "Empty request body"}));
    let broken = app.post_raw("/api/v1/configure", b"{".to_vec()).await;
    assert_eq!(broken.status, 400);
    assert!(broken.body["error"]
        .as_str()
        .unwrap()
        .starts_with("Invalid JSON"));

    let mut conn = db.conn().await;
    let queues: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.queues")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(queues, 0, "a refused configure creates nothing");
}
