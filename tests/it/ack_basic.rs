//! Acks (reference §5.1, §5.2): offset commits, lease checks, retries, dead letters.

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};
use serde_json::{json, Value};

#[actix_web::test]
async fn a_single_ack_answers_an_array_of_one_and_releases_the_finished_lease() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let reply = pop(&app, "q", "batch=2").await;
    let msgs = messages(&reply);

    let first = ack_one(&app, &msgs[0], "completed", None).await;
    assert_eq!(first["index"], 0);
    assert_eq!(first["success"], true);
    assert_eq!(first["error"], Value::Null);
    assert_eq!(first["transactionId"], msgs[0]["transactionId"]);
    assert_eq!(first["queueName"], "q");
    assert_eq!(first["partitionName"], "p");
    assert_eq!(first["leaseReleased"], false);
    assert_eq!(first["dlq"], false);
    // Still leased: the second message is not acked yet.
    assert_eq!(pop(&app, "q", "").await.status, 204);

    let second = ack_one(&app, &msgs[1], "success", None).await;
    assert_eq!(second["success"], true);
    assert_eq!(second["leaseReleased"], true);
    assert_eq!(
        pop(&app, "q", "").await.status,
        204,
        "everything is consumed"
    );
}

#[actix_web::test]
async fn acking_a_later_message_commits_everything_before_it_and_never_moves_back() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;
    let reply = pop(&app, "q", "batch=3").await;
    let msgs = messages(&reply);
    let last = ack_one(&app, &msgs[2], "completed", None).await;
    assert_eq!(last["leaseReleased"], true);
    // An older message acked afterwards is fine and changes nothing.
    let lease_free = json!({
        "transactionId": msgs[0]["transactionId"],
        "partitionId": msgs[0]["partitionId"],
    });
    let r = app.post("/api/v1/ack", &lease_free).await;
    assert_eq!(r.body[0]["success"], true);
    assert_eq!(pop(&app, "q", "batch=3").await.status, 204);
    let committed: i64 = {
        let mut conn = db.conn().await;
        sqlx::query_scalar("SELECT committed_offset FROM queen.partition_consumers")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(committed, 3);
}

#[actix_web::test]
async fn business_failures_are_items_with_success_false() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    let reply = pop(&app, "q", "").await;
    let m = &messages(&reply)[0];

    let wrong_lease = json!({
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "leaseId": uuid::Uuid::new_v4().to_string(),
    });
    let r = app.post("/api/v1/ack", &wrong_lease).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body[0]["success"], false);
    assert_eq!(r.body[0]["error"], "Invalid or expired lease");

    let unknown = json!({ "transactionId": "nope", "partitionId": m["partitionId"] });
    let r = app.post("/api/v1/ack", &unknown).await;
    let error = r.body[0]["error"].as_str().unwrap();
    assert!(error.starts_with("Message not found"), "{error}");
    assert!(error.contains("unresolvable"), "{error}");

    let unknown_partition = json!({
        "transactionId": "x", "partitionId": uuid::Uuid::new_v4().to_string(),
    });
    let r = app.post("/api/v1/ack", &unknown_partition).await;
    assert!(r.body[0]["error"]
        .as_str()
        .unwrap()
        .starts_with("Message not found"));
    assert_eq!(r.body[0]["queueName"], Value::Null);

    let odd_status = json!({
        "transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "weird",
    });
    let r = app.post("/api/v1/ack", &odd_status).await;
    assert_eq!(r.body[0]["success"], false);
    assert_eq!(r.body[0]["error"], Value::Null);
}

#[actix_web::test]
async fn malformed_requests_are_400() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let cases = [
        (
            "/api/v1/ack",
            json!({ "partitionId": uuid::Uuid::new_v4() }),
            "transactionId is required",
        ),
        (
            "/api/v1/ack",
            json!({ "transactionId": "t" }),
            "partitionId is required to ensure message uniqueness",
        ),
        (
            "/api/v1/ack",
            json!({ "transactionId": "t", "partitionId": "not-a-uuid" }),
            "UUID",
        ),
        (
            "/api/v1/ack/batch",
            json!({}),
            "acknowledgments array is required",
        ),
        (
            "/api/v1/ack/batch",
            json!({ "acknowledgments": [{ "partitionId": uuid::Uuid::new_v4() }] }),
            "Each acknowledgment must have a valid transactionId string",
        ),
        (
            "/api/v1/ack/batch",
            json!({ "acknowledgments": [{ "transactionId": "t", "partitionId": 5 }] }),
            "Each acknowledgment must have a valid partitionId string to ensure message uniqueness",
        ),
    ];
    for (path, body, text) in cases {
        let r = app.post(path, &body).await;
        assert_eq!(r.status, 400, "{path} {body}");
        assert!(
            r.body["error"].as_str().unwrap().contains(text),
            "{:?}",
            r.body
        );
    }
    let empty = post_raw(&app, "/api/v1/ack", "").await;
    assert_eq!(empty.status, 400);
}

#[actix_web::test]
async fn failures_retry_up_to_the_limit_then_dead_letter_with_the_reason() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    db.exec("UPDATE queen.queues SET retry_limit = 2 WHERE name = 'q'")
        .await;

    // Delivered retry_limit + 1 times, each time failed with a reason.
    for attempt in 0..3 {
        let reply = pop(&app, "q", "batch=2").await;
        assert_eq!(ns(&reply), vec![0, 1], "delivery {attempt}");
        for m in messages(&reply) {
            assert_eq!(m["retryCount"], attempt);
        }
        let acks: Vec<Value> = messages(&reply)
            .iter()
            .map(|m| {
                json!({
                    "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "status": "failed", "error": "boom",
                })
            })
            .collect();
        let r = app
            .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
            .await;
        let results = r.body.as_array().unwrap();
        assert!(results.iter().all(|x| x["success"] == true), "{results:?}");
        let dead = attempt == 2;
        assert!(results.iter().all(|x| x["dlq"] == dead), "{results:?}");
    }
    assert_eq!(pop(&app, "q", "batch=2").await.status, 204);

    let dlq = app.get("/api/v1/dlq?queue=q&partition=Default").await;
    assert_eq!(dlq.status, 200);
    assert_eq!(dlq.body["total"], 2);
    let letters = dlq.body["messages"].as_array().unwrap();
    assert_eq!(letters.len(), 2);
    for l in letters {
        assert_eq!(l["errorMessage"], "boom");
        assert_eq!(l["retryCount"], 2);
        assert_eq!(l["queue"], "q");
        assert_eq!(l["partition"], "p");
        assert_eq!(l["consumerGroup"], "__QUEUE_MODE__");
        assert!(l["data"]["n"].is_i64());
    }
    assert_eq!(dlq.body["pagination"], json!({ "limit": 100, "offset": 0 }));
    let other = app.get("/api/v1/dlq?queue=elsewhere").await;
    assert_eq!(other.body["total"], 0);
}

#[actix_web::test]
async fn retry_redelivers_without_counting_and_dlq_dead_letters_at_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let reply = pop(&app, "q", "").await;
    let r = ack_one(&app, &messages(&reply)[0], "retry", None).await;
    assert_eq!(r["success"], true);
    assert_eq!(r["leaseReleased"], true);
    let again = pop(&app, "q", "").await;
    assert_eq!(ns(&again), vec![0]);
    assert_eq!(messages(&again)[0]["retryCount"], 0);

    let r = ack_one(&app, &messages(&again)[0], "dlq", None).await;
    assert_eq!(r["dlq"], true);
    let next = pop(&app, "q", "").await;
    assert_eq!(ns(&next), vec![1]);
    let dlq = app.get("/api/v1/dlq").await;
    assert_eq!(dlq.body["messages"][0]["errorMessage"], "Retries exhausted");
    assert_eq!(dlq.body["messages"][0]["data"], json!({ "n": 0 }));
}

#[actix_web::test]
async fn ten_thousand_messages_are_acked_in_one_batch() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for chunk in 0..10 {
        push_n(&app, "big", "p", chunk * 1000, 1000).await;
    }
    let reply = pop(&app, "big", "batch=10000").await;
    assert_eq!(ns(&reply), (0..10_000).collect::<Vec<_>>());
    let results = ack_all(&app, &reply, "completed", None).await;
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 10_000);
    assert!(results.iter().all(|r| r["success"] == true));
    assert_eq!(
        results
            .iter()
            .filter(|r| r["leaseReleased"] == true)
            .count(),
        1
    );
    assert_eq!(pop(&app, "big", "batch=10000").await.status, 204);
}
