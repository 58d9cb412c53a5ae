//! `producerSub` is stamped, not accepted (producing.md; reference §3.6): the `sub` of the
//! verified token on every pushed item, whatever the body says; `null` without auth or `sub`.
//! Read back from the stored segments, through the spool, and popped back.

use crate::support::auth::{call, claims, hs256, SECRET};
use crate::support::{fresh_db, spawn_app_with, test_settings};
use serde_json::json;

fn forged_items() -> serde_json::Value {
    json!({"items": [
        {"queue": "subs", "partition": "a", "payload": {"n": 1}, "producerSub": "mallory"},
        {"queue": "subs", "partition": "b", "payload": {"n": 2}, "producer_sub": "mallory"},
        {"queue": "subs", "partition": "a", "payload": {"producerSub": "kept-as-payload"},
         "transactionId": "t-3", "producerSub": null},
    ]})
}

#[actix_web::test]
async fn producer_sub_is_the_tokens_sub_and_the_body_cannot_forge_it() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)],
    ))
    .await;
    let token = hs256(&claims("alice@example", "write-only"));
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some(&token),
        Some(&forged_items()),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let a = db.stored("subs", "a").await;
    let b = db.stored("subs", "b").await;
    assert_eq!(a.len() + b.len(), 3);
    for stored in a.iter().chain(&b) {
        assert_eq!(
            stored.producer_sub.as_deref(),
            Some("alice@example"),
            "{stored:?}"
        );
    }
    // The body's own field stays what it was: payload, untouched.
    assert_eq!(a[1].payload, r#"{"producerSub":"kept-as-payload"}"#);

    // Another caller's pushes carry that caller's sub, not the previous one's.
    let token = hs256(&claims("bob", "read-write"));
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some(&token),
        Some(&forged_items()),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let subs: Vec<Option<String>> = db
        .stored("subs", "b")
        .await
        .into_iter()
        .map(|s| s.producer_sub)
        .collect();
    assert_eq!(subs, [Some("alice@example".into()), Some("bob".into())]);
}

#[actix_web::test]
async fn a_token_without_sub_stamps_null() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)],
    ))
    .await;
    let token = hs256(&json!({"role": "write-only"}));
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some(&token),
        Some(&forged_items()),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    for stored in db.stored("subs", "a").await {
        assert_eq!(stored.producer_sub, None, "{stored:?}");
    }
}

#[actix_web::test]
async fn with_auth_off_producer_sub_is_null_even_when_a_token_is_sent() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[])).await;
    // Not verified, so not trusted: its sub must not be stamped.
    let token = hs256(&claims("alice", "admin"));
    let reply = call(
        &app,
        "POST",
        "/api/v1/push",
        Some(&token),
        Some(&forged_items()),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    for stored in db
        .stored("subs", "a")
        .await
        .into_iter()
        .chain(db.stored("subs", "b").await)
    {
        assert_eq!(stored.producer_sub, None, "{stored:?}");
    }
}

#[actix_web::test]
async fn producer_sub_survives_the_spool_and_pops_back() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)],
    ))
    .await;
    let admin = hs256(&claims("ops", "admin"));
    let writer = hs256(&claims("svc-writer", "write-only"));
    let on = call(
        &app,
        "POST",
        "/api/v1/system/maintenance",
        Some(&admin),
        Some(&json!({ "enabled": true })),
    )
    .await;
    assert_eq!(on.status, 200);
    let body =
        json!({ "items": [{ "queue": "spooled-subs", "payload": 1, "producerSub": "mallory" }] });
    let reply = call(&app, "POST", "/api/v1/push", Some(&writer), Some(&body)).await;
    assert_eq!(reply.body[0]["status"], "buffered");
    let off = call(
        &app,
        "POST",
        "/api/v1/system/maintenance",
        Some(&admin),
        Some(&json!({ "enabled": false })),
    )
    .await;
    assert_eq!(off.status, 200);
    app.drained().await;

    let stored = db.stored("spooled-subs", "Default").await;
    assert_eq!(stored[0].producer_sub.as_deref(), Some("svc-writer"));
    let popped = call(
        &app,
        "GET",
        "/api/v1/pop/queue/spooled-subs?autoAck=true",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(popped.status, 200, "{}", popped.body);
    assert_eq!(popped.body["messages"][0]["producerSub"], "svc-writer");
}
