//! The 2.x ack window (reference §2.5, docs/consuming-2x.md): an ack is an offset commit, a nack
//! in an ack call is never skipped by a later ack of the same call, acks below the committed
//! offset are no-ops (flagged) or refused (nacks), acks of unknown transactions fail, and a
//! lease renew reports what it renewed.

use serde_json::{json, Value};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, TestApp, TestDb};

/// The group's committed offset on the only partition of these tests.
async fn committed(db: &TestDb) -> i64 {
    let mut conn = db.conn().await;
    sqlx::query_scalar("SELECT committed_offset FROM queen.partition_consumers")
        .fetch_one(&mut conn)
        .await
        .expect("one consumer row")
}

/// One batch ack call with a status per message, in delivery order.
async fn ack_each(app: &TestApp, msgs: &[Value], statuses: &[&str]) -> Vec<Value> {
    let acks: Vec<Value> = msgs
        .iter()
        .zip(statuses)
        .map(|(m, status)| {
            json!({
                "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                "leaseId": m["leaseId"], "status": status, "error": "window test",
            })
        })
        .collect();
    let r = app
        .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body.as_array().expect("one result per ack").clone()
}

#[actix_web::test]
async fn a_nack_is_never_skipped_by_a_later_completed_ack_of_the_same_call() {
    for nack in ["failed", "retry"] {
        let db = fresh_db().await;
        let app = spawn_app(&db).await;
        push_n(&app, "q", "p", 0, 5).await;
        let reply = pop(&app, "q", "batch=5").await;
        let msgs = messages(&reply);
        assert_eq!(msgs.len(), 5);

        let results = ack_each(
            &app,
            &msgs,
            &["completed", nack, "completed", "completed", "completed"],
        )
        .await;
        assert_eq!(results[0]["success"], true, "{nack}: {results:?}");
        assert_eq!(results[1]["success"], true, "{nack}: {results:?}");
        assert_eq!(results[1]["leaseReleased"], true, "{nack}: {results:?}");
        // The completed acks above the nack are not committed, and say so.
        for r in &results[2..] {
            assert_eq!(r["success"], false, "{nack}: {r}");
            assert!(
                r["error"].as_str().unwrap().contains("delivered again"),
                "{r}"
            );
        }
        // The cursor stops just before the nacked message; the rest comes again at once.
        assert_eq!(committed(&db).await, 1, "{nack}");
        let again = pop(&app, "q", "batch=10").await;
        assert_eq!(ns(&again), vec![1, 2, 3, 4], "{nack}");
        let dlq = app.get("/api/v1/dlq?queue=q").await;
        assert_eq!(dlq.body["total"], 0, "{nack}: nothing dead-lettered");
    }
}

#[actix_web::test]
async fn a_retry_is_not_charged_to_the_retry_budget() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    db.exec("UPDATE queen.queues SET retry_limit = 1 WHERE name = 'q'")
        .await;
    for _ in 0..3 {
        let reply = pop(&app, "q", "batch=2").await;
        assert_eq!(ns(&reply), vec![0, 1]);
        let results = ack_each(&app, &messages(&reply), &["retry", "completed"]).await;
        assert_eq!(results[0]["dlq"], false);
    }
    let reply = pop(&app, "q", "batch=2").await;
    assert_eq!(messages(&reply)[0]["retryCount"], 0);
}

#[actix_web::test]
async fn below_the_cursor_a_completed_ack_is_a_flagged_noop_and_a_nack_is_refused() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 4).await;
    let reply = pop(&app, "q", "batch=4").await;
    let msgs = messages(&reply);

    // The middle message commits everything before it; the lease stays live.
    let mid = ack_one(&app, &msgs[1], "completed", None).await;
    assert_eq!(mid["success"], true);
    assert_eq!(mid.get("noop"), None, "an in-range ack carries no noop");
    assert_eq!(committed(&db).await, 2);

    let late_nack = ack_one(&app, &msgs[0], "failed", None).await;
    assert_eq!(late_nack["success"], false);
    assert!(
        late_nack["error"].as_str().unwrap().contains("committed"),
        "{late_nack}"
    );
    for status in ["retry", "dlq"] {
        let refused = ack_one(&app, &msgs[0], status, None).await;
        assert_eq!(refused["success"], false, "{status}: {refused}");
    }
    let late_ack = ack_one(&app, &msgs[0], "completed", None).await;
    assert_eq!(late_ack["success"], true);
    assert_eq!(late_ack["noop"], true);

    // Nothing of that moved the cursor, charged a retry or released the lease.
    assert_eq!(committed(&db).await, 2);
    assert_eq!(pop(&app, "q", "").await.status, 204, "still leased");
    let dlq = app.get("/api/v1/dlq?queue=q").await;
    assert_eq!(dlq.body["total"], 0);

    // A batch of the grouped ack's kind (all completed, one lease) with one message below the
    // cursor: that one is flagged, the others are committed as usual.
    let results = ack_each(&app, &msgs[1..], &["completed", "completed", "completed"]).await;
    assert_eq!(results[0]["noop"], true, "{results:?}");
    for r in &results[1..] {
        assert_eq!(r["success"], true, "{r}");
        assert_eq!(r.get("noop"), None, "{r}");
    }
    assert_eq!(results[2]["leaseReleased"], true);
    assert_eq!(committed(&db).await, 4);
}

#[actix_web::test]
async fn an_ack_of_an_unknown_transaction_fails_and_leaves_the_lease_alone() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;
    let reply = pop(&app, "q", "batch=3").await;
    let msgs = messages(&reply);
    for status in ["completed", "failed", "retry", "dlq"] {
        let ghost = json!({
            "transactionId": "never-pushed", "partitionId": msgs[0]["partitionId"],
            "leaseId": msgs[0]["leaseId"], "status": status,
        });
        let r = app.post("/api/v1/ack", &ghost).await;
        assert_eq!(r.body[0]["success"], false, "{status}");
        assert!(
            r.body[0]["error"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("unresolv"),
            "{status}: {:?}",
            r.body
        );
    }
    assert_eq!(committed(&db).await, 0);
    let results = ack_all(&app, &reply, "completed", None).await;
    assert!(all_succeeded(&results), "{results}");
    assert_eq!(committed(&db).await, 3);
}

#[actix_web::test]
async fn a_batch_under_a_foreign_lease_fails_item_by_item() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let reply = pop(&app, "q", "batch=2").await;
    let msgs = messages(&reply);
    let foreign: Vec<Value> = msgs
        .iter()
        .map(|m| {
            json!({
                "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                "leaseId": "01a00000-0000-7000-8000-000000000000", "status": "completed",
            })
        })
        .collect();
    let r = app
        .post("/api/v1/ack/batch", &json!({ "acknowledgments": foreign }))
        .await;
    assert_eq!(r.status, 200);
    for item in r.body.as_array().unwrap() {
        assert_eq!(item["success"], false, "{item}");
        assert!(item["error"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("lease"));
    }
    assert!(all_succeeded(
        &ack_all(&app, &reply, "completed", None).await
    ));
}

#[actix_web::test]
async fn a_nack_past_the_retry_limit_dead_letters_and_releases_the_rest_at_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;
    db.exec("UPDATE queen.queues SET retry_limit = 0 WHERE name = 'q'")
        .await;
    let reply = pop(&app, "q", "batch=3").await;
    let msgs = messages(&reply);
    let r = ack_one(&app, &msgs[0], "failed", None).await;
    assert_eq!(
        (r["success"].clone(), r["dlq"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(r["leaseReleased"], true);
    // The cursor passed the dead letter, and the rest is not held until the lease runs out.
    assert_eq!(ns(&pop(&app, "q", "batch=3").await), vec![1, 2]);
}

#[actix_web::test]
async fn a_renew_counts_the_partitions_it_extended_and_reports_a_released_lease() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "a", 0, 1).await;
    push_n(&app, "q", "b", 1000, 1).await;
    let reply = pop(&app, "q", "batch=10&partitions=2").await;
    assert_eq!(reply.body["partitionsClaimed"], 2);
    let lease = reply.body["leaseId"].as_str().unwrap().to_string();

    let live = app
        .post(&format!("/api/v1/lease/{lease}/extend"), &json!({}))
        .await;
    let live = &live.body[0];
    assert_eq!(live["success"], true);
    assert_eq!(live["renewed"], 2, "one lease over two partitions: {live}");
    assert!(live["newExpiresAt"].is_string());
    assert_eq!(live["newExpiresAt"], live["expiresAt"]);
    assert_eq!(live["newExpiresAt"], live["lease_expires_at"]);

    let results = ack_all(&app, &reply, "completed", None).await;
    assert!(all_succeeded(&results), "{results}");
    let gone = app
        .post(&format!("/api/v1/lease/{lease}/extend"), &json!({}))
        .await;
    let gone = &gone.body[0];
    assert_eq!(gone["success"], false);
    assert_eq!(gone["renewed"], 0);
    for key in ["newExpiresAt", "expiresAt", "lease_expires_at"] {
        assert_eq!(gone[key], Value::Null, "{key}: {gone}");
    }
}
