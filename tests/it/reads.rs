//! Reads without a lease (2.x reference §2.6): `POST /api/v1/fetch` by offset and
//! `POST /api/v1/partitions/changed`, against a real PostgreSQL.

use crate::support::consuming::{messages, pop_partition, push_n};
use crate::support::{fresh_db, spawn_app, TestApp};
use serde_json::{json, Value};
use sqlx::Connection;

async fn fetch(app: &TestApp, entries: Value, max_bytes: Option<i64>) -> Value {
    let mut body = json!({ "entries": entries });
    if let Some(m) = max_bytes {
        body["maxBytes"] = m.into();
    }
    let reply = app.post("/api/v1/fetch", &body).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body
}

fn offsets(entry: &Value) -> Vec<i64> {
    entry["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["offset"].as_i64().expect("offset"))
        .collect()
}

#[actix_web::test]
async fn fetch_reads_by_offset_with_watermarks_and_moves_no_cursor() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "feed", "a", 0, 3).await;
    push_n(&app, "feed", "a", 3, 2).await; // a second segment
    push_n(&app, "feed", "b", 0, 1).await;

    let body = fetch(
        &app,
        json!([
            {"queue": "feed", "partition": "a", "offset": 0, "maxBytes": 1 << 20},
            {"queue": "feed", "partition": "a", "offset": 2},
            {"queue": "feed", "partition": "b", "offset": 1},
            {"queue": "feed", "partition": "nope", "offset": 0},
            {"queue": "no-such-queue", "partition": "a", "offset": 0},
            {"queue": "feed", "partition": "b", "offset": 5},
        ]),
        None,
    )
    .await;
    let e = body["entries"].as_array().expect("entries");
    assert_eq!(e.len(), 6, "index-aligned with the request");
    assert_eq!(offsets(&e[0]), [0, 1, 2, 3, 4], "across both segments");
    assert_eq!(e[0]["records"][3]["payload"], json!({"n": 3}));
    assert!(e[0]["records"][0]["transactionId"].is_string());
    let ts = e[0]["records"][0]["ts"].as_str().expect("ts");
    assert_eq!(ts.len(), "2024-01-01T00:00:00.000000Z".len(), "{ts}");
    assert_eq!(
        (
            e[0]["highWatermark"].as_i64(),
            e[0]["logStartOffset"].as_i64()
        ),
        (Some(5), Some(0))
    );
    assert_eq!(offsets(&e[1]), [2, 3, 4], "from the middle of a segment");
    assert_eq!(
        offsets(&e[2]),
        Vec::<i64>::new(),
        "at the high watermark: nothing new"
    );
    assert!(e[2].get("error").is_none());
    for unknown in [&e[3], &e[4]] {
        assert_eq!(unknown["error"], "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(unknown["records"], json!([]));
    }
    assert_eq!(e[5]["error"], "OFFSET_OUT_OF_RANGE");
    assert_eq!(
        e[5]["highWatermark"], 1,
        "an out-of-range entry carries its watermarks"
    );

    // No cursor moved: a pop still gets every message.
    let popped = pop_partition(&app, "feed", "a", "batch=10&wait=false").await;
    assert_eq!(messages(&popped).len(), 5);
}

#[actix_web::test]
async fn fetch_budgets_are_per_entry_and_per_call_and_the_first_record_always_comes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let big = "x".repeat(1000);
    for p in ["a", "b"] {
        let items: Vec<Value> = (0..4)
            .map(|_| json!({"queue": "sized", "partition": p, "payload": big}))
            .collect();
        assert_eq!(app.push(json!(items)).await.status, 201);
    }
    let entry =
        |p: &str, max: i64| json!({"queue": "sized", "partition": p, "offset": 0, "maxBytes": max});

    // Per entry: 2 500 bytes hold two 1 002-byte payloads.
    let body = fetch(&app, json!([entry("a", 2500), entry("b", 2500)]), None).await;
    assert_eq!(offsets(&body["entries"][0]), [0, 1]);
    assert_eq!(offsets(&body["entries"][1]), [0, 1]);

    // A budget smaller than one record still returns that record (ambiguity 12).
    let body = fetch(&app, json!([entry("a", 10), entry("b", 10)]), None).await;
    assert_eq!(offsets(&body["entries"][0]), [0]);
    assert_eq!(offsets(&body["entries"][1]), [0]);

    // Per call: the first entry spends the call's budget; the next answers empty, with its
    // watermarks.
    let body = fetch(
        &app,
        json!([entry("a", 8000), entry("b", 8000)]),
        Some(3100),
    )
    .await;
    assert_eq!(offsets(&body["entries"][0]), [0, 1, 2]);
    assert_eq!(
        offsets(&body["entries"][1]),
        [0],
        "room left in the call: its first record"
    );
    let body = fetch(
        &app,
        json!([entry("a", 8000), entry("b", 8000)]),
        Some(1002),
    )
    .await;
    assert_eq!(offsets(&body["entries"][0]), [0]);
    assert_eq!(
        offsets(&body["entries"][1]),
        Vec::<i64>::new(),
        "the call's budget is spent"
    );
    assert_eq!(body["entries"][1]["highWatermark"], 4);
}

#[actix_web::test]
async fn fetch_refuses_malformed_calls_and_reports_retention() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let too_many: Vec<Value> = (0..1025)
        .map(|i| json!({"queue": "q", "partition": format!("p{i}"), "offset": 0}))
        .collect();
    let reply = app
        .post("/api/v1/fetch", &json!({ "entries": too_many }))
        .await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    for bad in [
        json!({}),
        json!({"entries": [{"queue": "q"}]}),
        json!({"entries": [{"queue": "q", "partition": "p", "offset": -1}]}),
        json!({"entries": [{"queue": "", "partition": "p"}]}),
    ] {
        assert_eq!(app.post("/api/v1/fetch", &bad).await.status, 400, "{bad}");
    }

    // Retention removed the first segment: the log starts later and an older offset is out
    // of range.
    push_n(&app, "kept", "p", 0, 2).await;
    push_n(&app, "kept", "p", 2, 2).await;
    db.exec(
        "DELETE FROM queen.segments WHERE base_offset = 0
            AND partition_id = (SELECT id FROM queen.partitions WHERE name = 'p')",
    )
    .await;
    let body = fetch(
        &app,
        json!([{"queue": "kept", "partition": "p", "offset": 0}]),
        None,
    )
    .await;
    let e = &body["entries"][0];
    assert_eq!(e["error"], "OFFSET_OUT_OF_RANGE");
    assert_eq!(
        (e["logStartOffset"].as_i64(), e["highWatermark"].as_i64()),
        (Some(2), Some(4))
    );
    let body = fetch(
        &app,
        json!([{"queue": "kept", "partition": "p", "offset": 2}]),
        None,
    )
    .await;
    assert_eq!(offsets(&body["entries"][0]), [2, 3]);
}

async fn changed(app: &TestApp, entry: Value) -> Value {
    let reply = app
        .post("/api/v1/partitions/changed", &json!({ "entries": [entry] }))
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body
}

fn names(body: &Value) -> Vec<String> {
    body["entries"][0]["partitions"]
        .as_array()
        .expect("partitions")
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect()
}

#[actix_web::test]
async fn changed_pages_in_creation_order_and_since_safe_time_lists_only_new_writes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for i in 0..5 {
        push_n(&app, "disc", &format!("p{i}"), 0, 1).await;
    }
    // All of them, two per page, in creation order.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut entry = json!({"queue": "disc", "limit": 2});
        if let Some(a) = &after {
            entry["after"] = a.clone().into();
        }
        let body = changed(&app, entry).await;
        assert!(body["safeTime"].is_string());
        seen.extend(names(&body));
        pages += 1;
        match body["entries"][0]["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ["p0", "p1", "p2", "p3", "p4"]);
    assert_eq!(pages, 3);

    let body = changed(&app, json!({"queue": "disc"})).await;
    let p0 = &body["entries"][0]["partitions"][0];
    assert_eq!(
        (p0["lastOffset"].as_i64(), p0["logStart"].as_i64()),
        (Some(0), Some(0))
    );
    assert!(p0["id"].is_string());
    let safe = body["safeTime"].as_str().expect("safeTime").to_string();
    assert_eq!(safe.len(), "2024-01-01T00:00:00.000000Z".len(), "{safe}");

    // After that safeTime, only what is written later. (safeTime stays a little behind the
    // database's clock, so a write just before the call may be listed once more: leave room.)
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let body = changed(&app, json!({"queue": "disc"})).await;
    let safe = body["safeTime"].as_str().expect("safeTime").to_string();
    push_n(&app, "disc", "p3", 1, 1).await;
    let body = changed(&app, json!({"queue": "disc", "since": safe})).await;
    assert_eq!(names(&body), ["p3"]);
    let p3 = &body["entries"][0]["partitions"][0];
    assert_eq!(p3["lastOffset"], 1);
    assert!(p3["lastWriteAt"].as_str().expect("lastWriteAt") >= safe.as_str());

    // A since without an offset is UTC; unknown queues answer the protocol's error.
    let naive = safe.trim_end_matches('Z');
    assert_eq!(
        names(&changed(&app, json!({"queue": "disc", "since": naive})).await),
        ["p3"]
    );
    let body = changed(&app, json!({"queue": "nobody"})).await;
    assert_eq!(body["entries"][0]["error"], "UNKNOWN_TOPIC_OR_PARTITION");
    let reply = app
        .post(
            "/api/v1/partitions/changed",
            &json!({"entries": [{"queue": "disc", "since": "soon"}]}),
        )
        .await;
    assert_eq!(reply.status, 400);
}

#[actix_web::test]
async fn safe_time_stays_behind_an_open_writing_transaction() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "open", "p", 0, 1).await;
    // A transaction that started before the call and has not committed: a commit stamps
    // last_write_at with its start time, so safeTime must not pass that start.
    let mut writer = db.conn().await;
    let mut tx = writer.begin().await.expect("begin");
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await
        .expect("now");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let body = changed(&app, json!({"queue": "open"})).await;
    let safe = chrono::DateTime::parse_from_rfc3339(body["safeTime"].as_str().unwrap())
        .expect("rfc3339")
        .with_timezone(&chrono::Utc);
    assert!(
        safe <= started,
        "safeTime {safe} passed an open transaction's start {started}"
    );
    tx.rollback().await.expect("rollback");
    let body = changed(&app, json!({"queue": "open"})).await;
    let later =
        chrono::DateTime::parse_from_rfc3339(body["safeTime"].as_str().unwrap()).expect("rfc3339");
    assert!(
        later > started,
        "with the transaction gone, safeTime moves on"
    );
}

#[actix_web::test]
async fn the_changed_and_fetch_statements_use_indexes() {
    let db = fresh_db().await;
    let mut conn = db.conn().await;
    // 2 000 partitions of one queue, 20 of them written recently; statistics taken.
    sqlx::raw_sql(
        "INSERT INTO queen.queues (name) VALUES ('plan');
         INSERT INTO queen.partitions (queue_id, name, next_offset, last_write_at)
         SELECT (SELECT id FROM queen.queues WHERE name = 'plan'), 'p' || g, 1,
                now() - make_interval(hours => CASE WHEN g % 100 = 0 THEN 0 ELSE 5 END)
           FROM generate_series(1, 2000) g;
         ANALYZE queen.partitions; ANALYZE queen.segments;",
    )
    .execute(&mut conn)
    .await
    .expect("fixture");
    let since = queen_broker::storage::queues::reads::CHANGED_SINCE_SQL
        .replace("$1", "(SELECT id FROM queen.queues WHERE name = 'plan')")
        .replace("$2", "now() - interval '1 hour'")
        .replace("$3", "0")
        .replace("$4", "1001");
    let text = explain(&mut conn, &since).await;
    assert!(text.contains("partitions_changed"), "{text}");
    assert!(!text.contains("Seq Scan on partitions"), "{text}");
    let all = queen_broker::storage::queues::reads::CHANGED_ALL_SQL
        .replace("$1", "(SELECT id FROM queen.queues WHERE name = 'plan')")
        .replace("$2", "0")
        .replace("$3", "1001");
    let text = explain(&mut conn, &all).await;
    assert!(!text.contains("Seq Scan on partitions"), "{text}");
}

async fn explain(conn: &mut sqlx::PgConnection, sql: &str) -> String {
    let rows: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN {sql}"))
        .fetch_all(conn)
        .await
        .expect("explain");
    rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join("\n")
}
