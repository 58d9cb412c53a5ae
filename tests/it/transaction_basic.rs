//! `POST /api/v1/transaction` (reference §6): pushes and acks in one database transaction.

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};
use serde_json::{json, Value};

async fn committed(db: &crate::support::TestDb) -> Vec<i64> {
    let mut conn = db.conn().await;
    sqlx::query_scalar(
        "SELECT committed_offset FROM queen.partition_consumers ORDER BY partition_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap()
}

#[actix_web::test]
async fn pushes_and_acks_commit_together_and_trace_ids_pop_back() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "in", "p", 0, 1).await;
    let reply = pop(&app, "in", "").await;
    let m = &messages(&reply)[0];
    let trace = uuid::Uuid::new_v4().to_string();
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({
                "operations": [
                    { "type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                      "leaseId": m["leaseId"] },
                    { "type": "push", "items": [
                        { "queue": "out", "partition": "x", "payload": {"b": 1, "a": 2}, "traceId": trace },
                        { "queue": "out", "payload": [1.10], "transactionId": "fixed" },
                    ]},
                ],
                "requiredLeases": [m["leaseId"]],
            }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["success"], true, "{:?}", r.body);
    assert!(r.body["transactionId"].is_string());
    let results = r.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["type"], "ack");
    assert_eq!(results[0]["success"], true);
    assert_eq!(results[0]["index"], 0);
    assert_eq!(results[1]["type"], "push");
    assert_eq!(results[1]["queueName"], "out");
    assert_eq!(results[1]["status"], "queued");
    assert_eq!(results[2]["transactionId"], "fixed");
    assert_eq!(results[2]["index"], 2);

    assert_eq!(pop(&app, "in", "").await.status, 204, "the ack committed");
    let x = pop_partition(&app, "out", "x", "").await;
    let xm = &messages(&x)[0];
    assert_eq!(xm["traceId"], trace.as_str());
    assert_eq!(xm["data"], json!({"b": 1, "a": 2}));
    assert_eq!(xm["id"], results[1]["messageId"]);
    assert_eq!(xm["partitionId"], results[1]["partitionId"]);
    let body = r#"{"operations":[{"type":"push","items":[
        {"queue":"out","partition":"raw","payload":{"z":1,"a":1.10,"n":12345678901234567890123}}]}]}"#;
    assert_eq!(
        post_raw(&app, "/api/v1/transaction", body).await.status,
        200
    );
    let raw = get_raw(&app, "/api/v1/pop/queue/out/partition/raw").await;
    let text = String::from_utf8(raw.body).unwrap();
    assert!(
        text.contains(r#""data":{"z":1,"a":1.10,"n":12345678901234567890123}"#),
        "{text}"
    );
}

#[actix_web::test]
async fn a_failing_ack_rolls_back_every_push_and_ack_of_the_transaction() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "in", "p", 0, 2).await;
    let reply = pop(&app, "in", "batch=2").await;
    let msgs = messages(&reply);
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [
                { "type": "push", "items": [{ "queue": "out", "payload": 1 }] },
                { "type": "ack", "transactionId": msgs[0]["transactionId"],
                  "partitionId": msgs[0]["partitionId"] },
                { "type": "ack", "transactionId": msgs[1]["transactionId"],
                  "partitionId": msgs[1]["partitionId"], "leaseId": uuid::Uuid::new_v4().to_string() },
            ]}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["success"], false, "{:?}", r.body);
    assert!(
        r.body["error"]
            .as_str()
            .unwrap()
            .contains("Invalid or expired lease"),
        "{:?}",
        r.body
    );
    assert!(
        db.stored("out", "Default").await.is_empty(),
        "the push was rolled back"
    );
    assert_eq!(
        committed(&db).await,
        vec![0],
        "the first ack was rolled back"
    );

    let unknown = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [
                { "type": "push", "items": [{ "queue": "out", "payload": 2 }] },
                { "type": "ack", "transactionId": "nope", "partitionId": msgs[0]["partitionId"] },
            ]}),
        )
        .await;
    assert_eq!(unknown.body["success"], false);
    assert!(unknown.body["error"]
        .as_str()
        .unwrap()
        .contains("Message not found"));
    assert!(db.stored("out", "Default").await.is_empty());

    let odd = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [
                { "type": "ack", "transactionId": msgs[0]["transactionId"],
                  "partitionId": msgs[0]["partitionId"], "status": "retry" },
            ]}),
        )
        .await;
    assert_eq!(
        odd.body["success"], false,
        "only completed, failed and dlq are allowed here"
    );
}

#[actix_web::test]
async fn a_failed_ack_in_a_transaction_dead_letters_at_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "in", "p", 0, 1).await;
    let reply = pop(&app, "in", "").await;
    let m = &messages(&reply)[0];
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [
                { "type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                  "status": "failed", "error": "bad input" },
            ]}),
        )
        .await;
    assert_eq!(r.body["success"], true, "{:?}", r.body);
    assert_eq!(r.body["results"][0]["dlq"], true);
    let dlq = app.get("/api/v1/dlq?queue=in").await;
    assert_eq!(dlq.body["messages"][0]["errorMessage"], "bad input");
    assert_eq!(pop(&app, "in", "").await.status, 204);
}

#[actix_web::test]
async fn a_duplicate_push_is_a_duplicate_result_not_a_failure() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = app
        .push(json!([{ "queue": "q", "payload": 1, "transactionId": "once" }]))
        .await;
    let original = first.body[0]["message_id"].clone();
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [{ "type": "push", "items": [
                { "queue": "q", "payload": 2, "transactionId": "once" },
                { "queue": "q", "payload": 3, "transactionId": "twice" },
            ]}]}),
        )
        .await;
    assert_eq!(r.body["success"], true, "{:?}", r.body);
    assert_eq!(r.body["results"][0]["status"], "duplicate");
    assert_eq!(r.body["results"][0]["messageId"], original);
    assert_eq!(r.body["results"][1]["status"], "queued");
    let stored: Vec<String> = db
        .stored("q", "Default")
        .await
        .into_iter()
        .map(|s| s.payload)
        .collect();
    assert_eq!(stored, vec!["1", "3"]);
}

#[actix_web::test]
async fn required_leases_must_be_live() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({
                "operations": [{ "type": "push", "items": [{ "queue": "q", "payload": 1 }] }],
                "requiredLeases": [uuid::Uuid::new_v4().to_string()],
            }),
        )
        .await;
    assert_eq!(r.body["success"], false);
    assert!(r.body["error"].as_str().unwrap().contains("is not live"));
    assert!(db.stored("q", "Default").await.is_empty());
}

#[actix_web::test]
async fn malformed_transactions_are_400() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let cases: [(Value, &str); 5] = [
        (json!({}), "operations array required"),
        (json!({ "operations": 3 }), "operations array required"),
        (
            json!({ "operations": [] }),
            "operations array cannot be empty",
        ),
        (
            json!({ "operations": [{ "type": "drop" }] }),
            "type must be",
        ),
        (
            json!({ "operations": [{ "type": "push", "items": [{ "queue": "q" }] }] }),
            "payload is required",
        ),
    ];
    for (body, text) in cases {
        let r = app.post("/api/v1/transaction", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert!(
            r.body["error"].as_str().unwrap().contains(text),
            "{:?}",
            r.body
        );
    }
}

/// A push inside a transaction wakes a waiting consumer through the commit's notice (and is
/// handed to it), not only at the consumer's re-check (30 s here).
#[actix_web::test]
async fn a_push_in_a_transaction_wakes_a_waiting_consumer() {
    let db = fresh_db().await;
    let app = crate::support::spawn_app_with(crate::support::test_settings(
        &db,
        &[("QUEEN_POP_RECHECK_MS", "30000")],
    ))
    .await;
    push_n(&app, "q", "p", 0, 1).await;
    let first = pop(&app, "q", "").await;
    ack_all(&app, &first, "completed", None).await;

    let waiting = async {
        let started = std::time::Instant::now();
        let reply = pop(&app, "q", "wait=true&timeout=20000").await;
        (reply, started.elapsed())
    };
    let pushing = async {
        // Once the pop waits, the transaction pushes.
        crate::support::eventually(
            std::time::Duration::from_secs(10),
            "the pop waits",
            || async {
                (app.broker
                    .state
                    .wake
                    .waiting(&queen_broker::wake::WakeKey::Queue("q".into()))
                    > 0)
                .then_some(())
            },
        )
        .await;
        let r = app
            .post(
                "/api/v1/transaction",
                &json!({"operations": [
                    { "type": "push", "items": [{ "queue": "q", "partition": "t", "payload": {"n": 1} }] }
                ]}),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    };
    let ((reply, took), ()) = futures_util::join!(waiting, pushing);
    assert_eq!(ns(&reply), vec![1], "{:?}", reply.body);
    assert!(
        took < std::time::Duration::from_secs(10),
        "woken after {took:?}"
    );
}
