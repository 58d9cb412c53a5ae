//! `maxSize`: a queue's bound on messages not yet consumed (docs/operations.md, "Queue size
//! limit"), checked in the commit transaction, so it holds for one broker, for several brokers
//! on one database, for the spool replay and for `/transaction`.

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::support::consuming::{ack_all, messages, pop};
use crate::support::{fresh_db, spawn_app, TestApp};

async fn configure(app: &TestApp, queue: &str, options: Value) {
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": queue, "options": options }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
}

fn statuses(reply: &Value) -> Vec<&str> {
    reply
        .as_array()
        .expect("array")
        .iter()
        .map(|r| r["status"].as_str().expect("status"))
        .collect()
}

#[actix_web::test]
async fn a_push_beyond_the_limit_fails_naming_the_queue_and_leaves_the_rest_of_the_body_alone() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(&app, "bounded", json!({ "maxSize": 3 })).await;
    let r = app
        .push(json!([
            { "queue": "bounded", "partition": "a", "payload": 1, "transactionId": "t1" },
            { "queue": "other", "payload": 2 },
            { "queue": "bounded", "partition": "a", "payload": 3 },
            { "queue": "bounded", "partition": "a", "payload": 4, "transactionId": "t1" },
            { "queue": "bounded", "partition": "a", "payload": 5 },
            { "queue": "bounded", "partition": "a", "payload": 6 },
            { "queue": "bounded", "partition": "a", "payload": 7 },
        ]))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    // A duplicate is not stored, so it takes no room.
    assert_eq!(
        statuses(&r.body),
        [
            "queued",
            "queued",
            "queued",
            "duplicate",
            "queued",
            "failed",
            "failed"
        ]
    );
    for failed in &r.body.as_array().unwrap()[5..] {
        let error = failed["error"].as_str().expect("a failed item says why");
        assert!(
            error.contains("queue bounded") && error.contains("maxSize 3"),
            "{error}"
        );
    }
    assert!(r.body[0].get("error").is_none(), "{}", r.body[0]);
    assert_eq!(db.stored("bounded", "a").await.len(), 3);
    assert_eq!(db.stored("other", "Default").await.len(), 1);

    // Consuming makes room again: two acked, two more fit, the next one does not.
    let popped = pop(&app, "bounded", "batch=2").await;
    assert_eq!(messages(&popped).len(), 2);
    ack_all(&app, &popped, "completed", None).await;
    let r = app
        .push(json!([
            { "queue": "bounded", "partition": "c", "payload": 8 },
            { "queue": "bounded", "partition": "c", "payload": 9 },
            { "queue": "bounded", "partition": "c", "payload": 10 },
        ]))
        .await;
    assert_eq!(statuses(&r.body), ["queued", "queued", "failed"]);

    // Turning the limit off (a configure that leaves maxSize out) lets everything in.
    configure(&app, "bounded", json!({})).await;
    let r = app
        .push(json!([{ "queue": "bounded", "partition": "c", "payload": 11 }]))
        .await;
    assert_eq!(statuses(&r.body), ["queued"]);
}

#[actix_web::test]
async fn a_named_group_behind_holds_the_room_until_it_consumes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(&app, "fanout", json!({ "maxSize": 2 })).await;
    let r = app
        .push(json!([
            { "queue": "fanout", "payload": 1 },
            { "queue": "fanout", "payload": 2 },
        ]))
        .await;
    assert_eq!(statuses(&r.body), ["queued", "queued"]);
    // Queue mode and group "slow" both read the queue; only queue mode consumes.
    let slow = pop(&app, "fanout", "consumerGroup=slow&batch=1").await;
    assert_eq!(messages(&slow).len(), 1);
    let fast = pop(&app, "fanout", "batch=2").await;
    ack_all(&app, &fast, "completed", None).await;
    let r = app.push(json!([{ "queue": "fanout", "payload": 3 }])).await;
    assert_eq!(statuses(&r.body), ["failed"], "slow has consumed nothing");
    ack_all(&app, &slow, "completed", Some("slow")).await;
    let r = app
        .push(json!([
            { "queue": "fanout", "payload": 4 },
            { "queue": "fanout", "payload": 5 },
        ]))
        .await;
    assert_eq!(statuses(&r.body), ["queued", "failed"]);
}

#[actix_web::test]
async fn concurrent_pushes_from_two_brokers_never_store_more_than_the_limit() {
    let db = fresh_db().await;
    let brokers = [spawn_app(&db).await, spawn_app(&db).await];
    configure(&brokers[0], "shared", json!({ "maxSize": 50 })).await;
    let work = brokers.iter().enumerate().map(|(b, app)| async move {
        let mut queued = 0;
        for round in 0..8 {
            // Requests of both brokers at once, over four partitions of the queue.
            let requests = (0..4).map(|p| {
                let items: Vec<Value> = (0..3)
                    .map(|i| {
                        json!({ "queue": "shared", "partition": format!("p{p}"),
                                     "payload": { "b": b, "round": round, "i": i } })
                    })
                    .collect();
                app.push(json!(items))
            });
            for reply in join_all(requests).await {
                assert_eq!(reply.status, 201, "{:?}", reply.body);
                queued += statuses(&reply.body)
                    .iter()
                    .filter(|s| **s == "queued")
                    .count();
            }
        }
        queued
    });
    let queued: usize = join_all(work).await.into_iter().sum();
    let mut stored = 0;
    for p in 0..4 {
        stored += db.stored("shared", &format!("p{p}")).await.len();
    }
    assert_eq!(stored, 50, "2 × 8 × 4 × 3 = 192 pushed, the limit is 50");
    assert_eq!(
        queued, 50,
        "every stored item was answered queued, no other"
    );
}

#[actix_web::test]
async fn a_transaction_whose_push_does_not_fit_fails_whole() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(&app, "tiny", json!({ "maxSize": 1 })).await;
    let r = app.push(json!([{ "queue": "tiny", "payload": 1 }])).await;
    assert_eq!(statuses(&r.body), ["queued"]);
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [
                { "type": "push", "items": [{ "queue": "elsewhere", "payload": 1 }] },
                { "type": "push", "items": [{ "queue": "tiny", "payload": 2 }] },
            ]}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["success"], false, "{:?}", r.body);
    let error = r.body["error"].as_str().expect("error");
    assert!(
        error.contains("queue tiny") && error.contains("maxSize 1"),
        "{error}"
    );
    assert_eq!(db.stored("tiny", "Default").await.len(), 1);
    assert!(
        db.stored("elsewhere", "Default").await.is_empty(),
        "rolled back"
    );
}

#[actix_web::test]
async fn the_spool_replay_stores_every_buffered_item_past_the_limit() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    configure(&app, "replayed", json!({ "maxSize": 2 })).await;
    let r = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let items: Vec<Value> = (0..5)
        .map(|n| json!({ "queue": "replayed", "payload": { "n": n } }))
        .collect();
    let r = app.push(json!(items)).await;
    assert_eq!(statuses(&r.body), ["buffered"; 5]);
    let r = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": false }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    app.drained().await;
    let stored = db.stored("replayed", "Default").await;
    let ns: Vec<String> = stored.iter().map(|s| s.payload.clone()).collect();
    // `buffered` is a promise: the bound applies at admission, not at replay.
    let all: Vec<String> = (0..5).map(|n| format!(r#"{{"n":{n}}}"#)).collect();
    assert_eq!(ns, all, "every buffered item, in order");
    // The queue is over its bound now: the next push is refused.
    let r = app
        .push(json!([{ "queue": "replayed", "payload": { "n": 5 } }]))
        .await;
    assert_eq!(statuses(&r.body), ["failed"]);
}
