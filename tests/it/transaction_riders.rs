//! `POST /api/v1/transaction` with a `kv` rider, lock guards and lease fencing (reference 2.x
//! §2.4, docs/kv.md): the KV ops share the fate of the pushes and acks.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::consuming::*;
use crate::support::{eventually, fresh_db, spawn_app, TestApp};

const NS: &str = "test-kv-txn";

async fn kv_get(app: &TestApp, key: &str) -> Value {
    let r = app
        .post(
            "/api/v1/kv",
            &json!({"operations": [{"op": "get", "ns": NS, "key": key}]}),
        )
        .await;
    r.body["results"][0].clone()
}

fn once(key: &str) -> Value {
    json!({"op": "putIfAbsent", "ns": NS, "key": key, "value": true, "ttlSeconds": 300, "required": true})
}

#[actix_web::test]
async fn a_lost_gate_answers_kv_precondition_at_its_flat_index_and_pushes_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let bundle = |n: i64| {
        json!({
            "operations": [{"type": "push", "items": [{"queue": "gated", "payload": {"attempt": n}}]}],
            "kv": [once("gate:evt-1")],
        })
    };
    let first = app.post("/api/v1/transaction", &bundle(1)).await;
    assert_eq!(first.body["success"], true, "{:?}", first.body);
    let results = first.body["results"].as_array().unwrap();
    assert_eq!(results[1]["index"], 1);
    assert_eq!(results[1]["type"], "kv");
    assert_eq!(results[1]["applied"], true);

    let second = app.post("/api/v1/transaction", &bundle(2)).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body["success"], false);
    assert_eq!(second.body["reason"], "kv_precondition");
    assert_eq!(second.body["kvReason"], "exists");
    assert_eq!(second.body["failedIndex"], 1);
    assert_eq!(second.body["value"], true);
    assert!(second.body["version"].as_i64().unwrap() > 0);
    let stored = db.stored("gated", "Default").await;
    assert_eq!(stored.len(), 1, "the losing bundle pushed nothing");
}

#[actix_web::test]
async fn a_kv_write_is_undone_by_a_failing_ack_and_a_kv_only_bundle_commits() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "fate", "p", 0, 1).await;
    let m = messages(&pop(&app, "fate", "wait=false").await)[0].clone();
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({
                "operations": [{"type": "ack", "transactionId": "00000000-0000-4000-8000-000000000000",
                                "partitionId": m["partitionId"], "leaseId": m["leaseId"]}],
                "kv": [{"op": "put", "ns": NS, "key": "fate:marker", "value": 1, "ttlSeconds": 300}],
            }),
        )
        .await;
    assert_eq!(r.body["success"], false, "{:?}", r.body);
    assert!(r.body["error"].as_str().unwrap().contains("rolled back"));
    assert_eq!(kv_get(&app, "fate:marker").await["found"], false);

    let solo = app
        .post(
            "/api/v1/transaction",
            &json!({
                "operations": [],
                "kv": [
                    {"op": "put", "ns": NS, "key": "solo:a", "value": {"a": 1}, "ttlSeconds": 300},
                    {"op": "put", "ns": NS, "key": "solo:b", "value": {"b": 2}, "ttlSeconds": 300},
                    {"op": "get", "ns": NS, "key": "solo:a"},
                ],
            }),
        )
        .await;
    assert_eq!(solo.body["success"], true, "{:?}", solo.body);
    let idx: Vec<i64> = solo.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["index"].as_i64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2]);
    assert_eq!(solo.body["results"][2]["value"], json!({"a": 1}));
    assert_eq!(kv_get(&app, "solo:b").await["value"], json!({"b": 2}));
}

#[actix_web::test]
async fn get_prefix_and_timers_riders_and_empty_bundles_are_refused() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let prefix = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [], "kv": [{"op": "getPrefix", "ns": NS, "prefix": "solo:"}]}),
        )
        .await;
    assert_eq!(prefix.status, 400);
    assert_eq!(prefix.body["error"], "kv_bad_request");
    assert_eq!(prefix.body["reason"], "get_prefix_in_transaction");

    let timers = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [],
                    "kv": [{"op": "put", "ns": NS, "key": "t", "value": 1, "ttlSeconds": 9}],
                    "timers": [{"op": "schedule", "queue": "q", "key": "k"}]}),
        )
        .await;
    assert_eq!(timers.status, 400);
    assert_eq!(timers.body["error"], "timers_bad_request");
    assert_eq!(kv_get(&app, "t").await["found"], false);

    let empty = app
        .post("/api/v1/transaction", &json!({"operations": [], "kv": []}))
        .await;
    assert_eq!(empty.status, 400);
}

#[actix_web::test]
async fn a_guard_commits_while_its_lock_is_held_and_an_expired_guard_commits_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let acquire = |owner: &str| json!({"operations": [{"op": "acquire", "name": "job", "ttlSeconds": 30, "owner": owner}]});
    let old = app.post("/api/v1/locks", &acquire("old")).await.body["results"][0].clone();
    let guarded = |guard: &Value, n: i64| {
        json!({
            "operations": [{"type": "push", "items": [{"queue": "steps", "payload": {"n": n}}]}],
            "kv": [guard],
        })
    };
    let ok = app
        .post("/api/v1/transaction", &guarded(&old["guard"], 1))
        .await;
    assert_eq!(ok.body["success"], true, "{:?}", ok.body);

    db.exec("UPDATE queen.kv SET expires_at = now() - interval '1 second' WHERE namespace = 'queen-locks'").await;
    let next = app.post("/api/v1/locks", &acquire("next")).await.body["results"][0].clone();
    assert_eq!(next["acquired"], true);
    let stale = app
        .post("/api/v1/transaction", &guarded(&old["guard"], 2))
        .await;
    assert_eq!(stale.body["reason"], "kv_precondition", "{:?}", stale.body);
    assert_eq!(stale.body["kvReason"], "version");
    assert_eq!(stale.body["failedIndex"], 1);
    assert_eq!(
        stale.body["value"]["owner"], "next",
        "the permit row's value, for the client's retry rule"
    );
    let fresh = app
        .post("/api/v1/transaction", &guarded(&next["guard"], 3))
        .await;
    assert_eq!(fresh.body["success"], true);
    let ns: Vec<i64> = db
        .stored("steps", "Default")
        .await
        .iter()
        .map(|s| {
            serde_json::from_str::<Value>(&s.payload).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, [1, 3], "only the holders' steps exist");
}

async fn pop_one(app: &TestApp, queue: &str) -> Value {
    let reply = eventually(Duration::from_secs(10), "a message to pop", || async {
        let r = pop(app, queue, "wait=false").await;
        (r.status == 200).then_some(r)
    })
    .await;
    messages(&reply)[0].clone()
}

fn ack(m: &Value, with_lease: bool) -> Value {
    let mut a = json!({"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"]});
    if with_lease {
        a["leaseId"] = m["leaseId"].clone();
    }
    a
}

#[actix_web::test]
async fn an_ack_under_a_lease_that_expired_and_was_taken_over_refuses_the_whole_bundle() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "fence-a", "p", 0, 1).await;
    push_n(&app, "fence-b", "p", 0, 1).await;
    let a = pop_one(&app, "fence-a").await;
    let b = pop_one(&app, "fence-b").await;
    // Lease A runs out and another consumer takes the message.
    db.exec(&format!(
        "UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_id = '{}'",
        a["leaseId"].as_str().unwrap()
    ))
    .await;
    let taken = pop_one(&app, "fence-a").await;
    assert_eq!(taken["transactionId"], a["transactionId"]);
    assert_ne!(taken["leaseId"], a["leaseId"]);

    let refused = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [ack(&a, true), ack(&b, true)],
                    "requiredLeases": [a["leaseId"], b["leaseId"]],
                    "kv": [{"op": "put", "ns": NS, "key": "fenced", "value": 1, "ttlSeconds": 60}]}),
        )
        .await;
    assert_eq!(
        refused.status, 200,
        "a definite no, never a 5xx the client would resend"
    );
    assert_eq!(refused.body["success"], false);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("rolled back"),
        "{:?}",
        refused.body
    );
    assert_eq!(kv_get(&app, "fenced").await["found"], false);

    // Nothing applied: each holder settles its own message.
    for m in [&taken, &b] {
        let r = app
            .post(
                "/api/v1/transaction",
                &json!({"operations": [ack(m, true)], "requiredLeases": [m["leaseId"]]}),
            )
            .await;
        assert_eq!(r.body["success"], true, "{:?}", r.body);
    }
    assert_eq!(pop(&app, "fence-a", "wait=false").await.status, 204);
    assert_eq!(pop(&app, "fence-b", "wait=false").await.status, 204);
}

#[actix_web::test]
async fn an_ack_without_a_lease_borrows_the_only_required_lease_and_is_unfenced_among_several() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "borrow-a", "p", 0, 1).await;
    push_n(&app, "borrow-b", "p", 0, 1).await;
    let a = pop_one(&app, "borrow-a").await;
    let b = pop_one(&app, "borrow-b").await;
    // The one lease named is B's: A's ack borrows it and is refused.
    let borrowed = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [ack(&a, false)], "requiredLeases": [b["leaseId"]]}),
        )
        .await;
    assert_eq!(borrowed.body["success"], false, "{:?}", borrowed.body);
    assert!(borrowed.body["error"]
        .as_str()
        .unwrap()
        .contains("rolled back"));
    // Two leases named: the acks without a lease apply unfenced.
    let both = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [ack(&a, false), ack(&b, false)],
                    "requiredLeases": [a["leaseId"], b["leaseId"]]}),
        )
        .await;
    assert_eq!(both.body["success"], true, "{:?}", both.body);
    assert_eq!(pop(&app, "borrow-a", "wait=false").await.status, 204);
    assert_eq!(pop(&app, "borrow-b", "wait=false").await.status, 204);
}
