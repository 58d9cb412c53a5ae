//! The operator views of the 2.x state: `GET /api/v1/kv/namespaces`, `/api/v1/locks`,
//! `/api/v1/timers` and `/streams/v1/queries` show what the KV, lock, timer and stream routes
//! wrote, and nothing that expired.

use base64::Engine;
use serde_json::{json, Value};

use crate::support::{fresh_db, spawn_app, TestApp};

async fn post_ok(app: &TestApp, path: &str, body: Value) -> Value {
    let r = app.post(path, &body).await;
    assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    r.body
}

async fn get_ok(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    assert_eq!(r.body["truncated"], false, "{path}");
    r.body
}

#[actix_web::test]
async fn the_operator_views_show_namespaces_locks_timers_and_stream_queries() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;

    // Empty at first, and said so with empty lists.
    assert_eq!(
        get_ok(&app, "/api/v1/kv/namespaces").await["namespaces"],
        json!([])
    );
    assert_eq!(get_ok(&app, "/api/v1/locks").await["locks"], json!([]));
    assert_eq!(get_ok(&app, "/api/v1/timers").await["queues"], json!([]));
    assert_eq!(
        get_ok(&app, "/streams/v1/queries").await["queries"],
        json!([])
    );

    post_ok(
        &app,
        "/api/v1/kv",
        json!({ "operations": [
            { "op": "put", "ns": "carts", "key": "c1", "value": { "items": 2 }, "ttlSeconds": 30 },
            { "op": "put", "ns": "carts", "key": "c2", "value": 1, "ttlSeconds": 3600 },
            { "op": "put", "ns": "carts", "key": "c3", "value": "x", "forever": true },
            { "op": "put", "ns": "flags", "key": "dark", "value": true, "forever": true },
        ] }),
    )
    .await;
    // A key that expired is not counted (its row may still wait for the sweeper).
    post_ok(
        &app,
        "/api/v1/kv",
        json!({ "operations": [{ "op": "put", "ns": "flags", "key": "old", "value": 0, "ttlSeconds": 60 }] }),
    )
    .await;
    db.exec("UPDATE queen.kv SET expires_at = now() - interval '1 second' WHERE key = 'old'")
        .await;
    let lock = post_ok(
        &app,
        "/api/v1/locks",
        json!({ "operations": [{ "op": "acquire", "name": "nightly-report", "ttlSeconds": 30, "owner": "worker-7" }] }),
    )
    .await;
    let token = lock["results"][0]["token"].as_i64().expect("a token");
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    post_ok(
        &app,
        "/api/v1/timers",
        json!({ "operations": [
            { "op": "schedule", "queue": "reminders", "timerKey": "a", "payload": b64(json!({"n": 1})), "delayMs": 3_600_000 },
            { "op": "schedule", "queue": "reminders", "timerKey": "b", "payload": b64(json!({"n": 2})), "delayMs": 7_200_000 },
        ] }),
    )
    .await;
    post_ok(
        &app,
        "/streams/v1/queries",
        json!({ "name": "totals", "source_queue": "src", "sink_queue": "sink", "config_hash": "h1" }),
    )
    .await;

    let ns = get_ok(&app, "/api/v1/kv/namespaces").await;
    let by_name = |name: &str| {
        ns["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["namespace"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing: {ns}"))
    };
    let carts = by_name("carts");
    assert_eq!(
        (
            carts["keys"].clone(),
            carts["expiring"].clone(),
            carts["expiringSoon"].clone()
        ),
        (json!(3), json!(2), json!(1))
    );
    // Keys and values as JSON text: c1 {"items":2}, c2 1, c3 "x".
    assert_eq!(carts["bytes"], json!(2 + 11 + 2 + 1 + 2 + 3));
    assert_eq!(
        by_name("flags")["keys"],
        1,
        "the expired key is not counted"
    );
    assert_eq!(by_name("queen-locks")["keys"], 1, "the permit is a KV row");
    assert_eq!(ns["namespaces"][0]["namespace"], "carts", "most keys first");

    let locks = get_ok(&app, "/api/v1/locks").await;
    let held = &locks["locks"][0];
    assert_eq!(held["name"], "nightly-report");
    assert_eq!(held["slot"], 0);
    assert_eq!(held["owner"], "worker-7");
    assert_eq!(held["token"], token);
    assert!(
        held["expiresAt"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{held}"
    );

    let timers = get_ok(&app, "/api/v1/timers").await;
    assert_eq!(timers["queues"].as_array().unwrap().len(), 1, "{timers}");
    let reminders = &timers["queues"][0];
    assert_eq!(reminders["queue"], "reminders");
    assert_eq!(reminders["pending"], 2);
    assert_eq!(reminders["lateSeconds"], 0.0, "not due yet");
    assert_eq!(reminders["refused"], 0);
    // Past due: the lateness shows (the firing task would fire it; the view is read first).
    db.exec("UPDATE queen.timers SET deliver_at = now() - interval '1 hour' WHERE timer_key = 'a'")
        .await;
    let late = get_ok(&app, "/api/v1/timers").await;
    if let Some(q) = late["queues"].as_array().unwrap().first() {
        // Either still pending and late, or already fired by the broker's timer task.
        if q["pending"] == 2 {
            assert!(q["lateSeconds"].as_f64().unwrap() >= 3000.0, "{q}");
        }
    }

    let queries = get_ok(&app, "/streams/v1/queries").await;
    let q = &queries["queries"][0];
    assert_eq!(q["name"], "totals");
    assert_eq!(q["sourceQueue"], "src");
    assert_eq!(q["sinkQueue"], "sink");
    assert_eq!(
        (q["partitions"].clone(), q["cycles"].clone()),
        (json!(0), json!(0))
    );
    assert_eq!(q["lastCycle"], Value::Null);
}
