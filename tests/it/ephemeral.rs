//! Ephemeral queues (2.x reference §2.7): rings in one broker's memory, declarations in
//! PostgreSQL.

use std::time::{Duration, Instant};

use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, Reply, TestApp};
use serde_json::{json, Value};

async fn push(app: &TestApp, queue: &str, partition: Option<&str>, payloads: &[Value]) -> Reply {
    let mut body = json!({
        "queue": queue,
        "messages": payloads.iter().map(|p| json!({"payload": p})).collect::<Vec<_>>(),
    });
    if let Some(p) = partition {
        body["partition"] = p.into();
    }
    app.post("/api/v1/ephemeral/push", &body).await
}

async fn pop(app: &TestApp, query: &str) -> Vec<Value> {
    let reply = app.get(&format!("/api/v1/ephemeral/pop?{query}")).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body["messages"].as_array().expect("messages").clone()
}

async fn ack(app: &TestApp, queue: &str, group: Option<&str>, acks: Value) -> Vec<String> {
    let mut body = json!({"queue": queue, "acks": acks});
    if let Some(g) = group {
        body["group"] = g.into();
    }
    let reply = app.post("/api/v1/ephemeral/ack", &body).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["outcome"].as_str().expect("outcome").to_string())
        .collect()
}

fn payloads(messages: &[Value]) -> Vec<Value> {
    messages.iter().map(|m| m["payload"].clone()).collect()
}

#[actix_web::test]
async fn push_pop_ack_in_fifo_order_with_each_outcome() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = push(
        &app,
        "inbox",
        Some("p"),
        &[json!({"k": 1}), json!("two"), json!(null)],
    )
    .await;
    assert_eq!(reply.body, json!({"pushed": 3}));

    let got = pop(&app, "queue=inbox&batch=2").await;
    assert_eq!(payloads(&got), [json!({"k": 1}), json!("two")]);
    assert_eq!(got[0]["partition"], "p");
    assert_eq!(got[0]["attempts"], 1);
    let outcomes = ack(
        &app,
        "inbox",
        None,
        json!([{"id": got[0]["id"]}, {"id": got[1]["id"], "status": "failed"}, {"id": "garbage"}]),
    )
    .await;
    assert_eq!(outcomes, ["acked", "redelivered", "unknown"]);
    // The same ack again: that delivery is over.
    assert_eq!(
        ack(&app, "inbox", None, json!([{"id": got[0]["id"]}])).await,
        ["stale"]
    );

    // The given-back message comes first, with one more attempt; then the rest.
    let again = pop(&app, "queue=inbox&batch=5").await;
    assert_eq!(payloads(&again), [json!("two"), json!(null)]);
    assert_eq!(again[0]["attempts"], 2);
    // The old delivery of "two" is stale now; the new one acks.
    assert_eq!(
        ack(&app, "inbox", None, json!([{"id": got[1]["id"]}])).await,
        ["stale"]
    );
    let ids: Vec<Value> = again.iter().map(|m| json!({"id": m["id"]})).collect();
    assert_eq!(
        ack(&app, "inbox", None, json!(ids)).await,
        ["acked", "acked"]
    );
    assert!(
        pop(&app, "queue=inbox").await.is_empty(),
        "an empty list, never 204"
    );

    // autoAck: no lease, nothing comes back.
    push(&app, "inbox", None, &[json!(7)]).await;
    let got = pop(&app, "queue=inbox&autoAck=true").await;
    assert_eq!(got[0]["partition"], "Default");
    assert!(pop(&app, "queue=inbox").await.is_empty());
}

#[actix_web::test]
async fn groups_compete_within_and_fan_out_across() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push(&app, "fan", Some("p"), &[json!(1), json!(2)]).await;
    let w1 = pop(&app, "queue=fan&group=workers").await;
    let w2 = pop(&app, "queue=fan&group=workers").await;
    assert_eq!(payloads(&w1), [json!(1)]);
    assert_eq!(payloads(&w2), [json!(2)], "same group: competing consumers");
    assert!(pop(&app, "queue=fan&group=workers").await.is_empty());
    let tail = pop(&app, "queue=fan&group=tail&batch=10").await;
    assert_eq!(
        payloads(&tail),
        [json!(1), json!(2)],
        "own group: every message"
    );
    // An ack names its group: a group that never popped the partition does not know it.
    assert_eq!(
        ack(&app, "fan", Some("other"), json!([{"id": w1[0]["id"]}])).await,
        ["unknown"]
    );
    assert_eq!(
        ack(&app, "fan", Some("workers"), json!([{"id": w1[0]["id"]}])).await,
        ["acked"]
    );
}

#[actix_web::test]
async fn a_waiting_pop_is_woken_by_a_push() {
    let db = fresh_db().await;
    let app = std::rc::Rc::new(spawn_app(&db).await);
    let waiter = {
        let app = app.clone();
        actix_web::rt::spawn(async move {
            let started = Instant::now();
            let got = pop(&app, "queue=live&wait=true&timeout=10000").await;
            (got, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    push(&app, "live", Some("p"), &[json!("hello")]).await;
    let (got, took) = waiter.await.expect("waiter");
    assert_eq!(payloads(&got), [json!("hello")]);
    assert!(
        took < Duration::from_secs(5),
        "woken by the push, not the timeout: {took:?}"
    );

    // Nothing comes: the pop answers empty at its timeout.
    let started = Instant::now();
    assert!(pop(&app, "queue=live&wait=true&timeout=300")
        .await
        .is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[actix_web::test]
async fn bounds_reject_or_drop_the_oldest() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let conf = app
        .post(
            "/api/v1/ephemeral/configure",
            &json!({"queue": "strict", "options": {"maxLength": 2}}),
        )
        .await;
    assert_eq!(conf.status, 200, "{:?}", conf.body);
    assert_eq!(conf.body["options"]["policy"], "reject");
    assert_eq!(
        push(&app, "strict", None, &[json!(1), json!(2)])
            .await
            .status,
        200
    );
    let full = push(&app, "strict", None, &[json!(3)]).await;
    assert_eq!(full.status, 429, "{:?}", full.body);
    assert_eq!(full.body["code"], "ephemeral_queue_full");
    assert_eq!(
        full.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        push(&app, "strict", None, &[json!(1), json!(2), json!(3)])
            .await
            .status,
        400
    );

    app.post(
        "/api/v1/ephemeral/configure",
        &json!({"queue": "feed", "options": {"maxLength": 2, "policy": "drop_oldest"}}),
    )
    .await;
    for n in 1..=4 {
        assert_eq!(push(&app, "feed", Some("p"), &[json!(n)]).await.status, 200);
    }
    assert_eq!(
        payloads(&pop(&app, "queue=feed&batch=10").await),
        [json!(3), json!(4)]
    );
    let depth = app.get("/api/v1/ephemeral/queues/feed/depth").await;
    assert_eq!(depth.body["dropped"]["policy"], 2);

    let bad = app
        .post(
            "/api/v1/ephemeral/configure",
            &json!({"queue": "x", "options": {"ttl_second": 1}}),
        )
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["code"], "ephemeral_bad_request");
}

#[actix_web::test]
async fn the_memory_budget_answers_503() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_EPHEMERAL_MAX_BYTES", "1000")])).await;
    let big = json!("y".repeat(600));
    assert_eq!(
        push(&app, "a", None, std::slice::from_ref(&big))
            .await
            .status,
        200
    );
    let reply = push(&app, "b", None, &[big]).await;
    assert_eq!(reply.status, 503, "{:?}", reply.body);
    assert_eq!(reply.body["code"], "ephemeral_memory_exhausted");
    assert!(reply.headers.get("retry-after").is_some());
    // Consuming frees the memory.
    let got = pop(&app, "queue=a&autoAck=true").await;
    assert_eq!(got.len(), 1);
    assert_eq!(push(&app, "b", None, &[json!(1)]).await.status, 200);
    let metrics = app.get_text("/metrics/prometheus").await.1;
    assert!(
        metrics.contains("queen_ephemeral_budget_bytes 1000"),
        "{metrics}"
    );
    assert!(metrics.contains("queen_ephemeral_messages 1"), "{metrics}");
}

#[actix_web::test]
async fn ttl_and_leases_run_out() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.post(
        "/api/v1/ephemeral/configure",
        &json!({"queue": "brief", "options": {"ttlSeconds": 1, "leaseSeconds": 1}}),
    )
    .await;
    push(&app, "brief", None, &[json!("old")]).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(pop(&app, "queue=brief").await.is_empty(), "past its TTL");

    app.post(
        "/api/v1/ephemeral/configure",
        &json!({"queue": "leased", "options": {"leaseSeconds": 1}}),
    )
    .await;
    push(&app, "leased", None, &[json!("m")]).await;
    let first = pop(&app, "queue=leased").await;
    // The lease runs out: a waiting pop gets the message back, one attempt more.
    let again = pop(&app, "queue=leased&wait=true&timeout=5000").await;
    assert_eq!(again[0]["attempts"], 2);
    assert_eq!(
        ack(&app, "leased", None, json!([{"id": first[0]["id"]}])).await,
        ["stale"]
    );
}

#[actix_web::test]
async fn routes_for_queues_depth_reset_and_delete() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let missing = app.get("/api/v1/ephemeral/queues/ghost/depth").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body["code"], "ephemeral_queue_not_found");
    assert_eq!(
        app.post("/api/v1/ephemeral/reset", &json!({"queue": "ghost"}))
            .await
            .body,
        json!({"dropped": 0})
    );
    assert_eq!(
        app.delete("/api/v1/ephemeral/queue/ghost").await.body,
        json!({"deleted": false})
    );

    push(&app, "r", Some("p"), &[json!(1), json!(2)]).await;
    let leased = pop(&app, "queue=r&group=g").await;
    let depth = app.get("/api/v1/ephemeral/queues/r/depth").await.body;
    assert_eq!(depth["length"], 2);
    assert_eq!(
        depth["groups"][0],
        json!({"group": "g", "pending": 1, "leased": 1, "redeliveries": 0})
    );
    let list = app.get("/api/v1/ephemeral/queues").await.body;
    assert_eq!(list["queues"][0]["queue"], "r");
    assert_eq!(
        app.post("/api/v1/ephemeral/reset", &json!({"queue": "r"}))
            .await
            .body,
        json!({"dropped": 2})
    );
    assert_eq!(
        ack(&app, "r", Some("g"), json!([{"id": leased[0]["id"]}])).await,
        ["stale"]
    );
    assert!(pop(&app, "queue=r&group=g").await.is_empty());
    assert_eq!(
        app.delete("/api/v1/ephemeral/queue/r").await.body,
        json!({"deleted": true})
    );
    assert_eq!(
        app.get("/api/v1/ephemeral/queues/r/depth").await.status,
        404
    );
}

#[actix_web::test]
async fn a_restart_keeps_the_declaration_and_drops_the_contents() {
    let db = fresh_db().await;
    let first = spawn_app(&db).await;
    first
        .post(
            "/api/v1/ephemeral/configure",
            &json!({"queue": "keep", "options": {"maxLength": 5, "retryLimit": 1}}),
        )
        .await;
    push(&first, "keep", None, &[json!(1)]).await;
    let old = pop(&first, "queue=keep").await;
    drop(first);

    let second = spawn_app(&db).await;
    let depth =
        crate::support::eventually(Duration::from_secs(10), "declarations loaded", || async {
            let reply = second.get("/api/v1/ephemeral/queues/keep/depth").await;
            (reply.status == 200).then_some(reply.body)
        })
        .await;
    assert_eq!(depth["length"], 0, "contents survive nothing");
    assert_eq!(depth["options"]["maxLength"], 5);
    assert_eq!(depth["options"]["retryLimit"], 1);
    assert_eq!(
        ack(&second, "keep", None, json!([{"id": old[0]["id"]}])).await,
        ["stale"]
    );
    assert!(pop(&second, "queue=keep").await.is_empty());
}
