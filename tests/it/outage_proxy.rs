//! PostgreSQL going away between the broker and the database (a cut TCP proxy): pushes are
//! spooled and answered `buffered`, `/health` says 503, and on recovery every item becomes
//! visible once, in order, with its original ids.

use crate::support::proxy::Proxy;
use crate::support::{fresh_db, pg, spawn_app_with, test_settings};
use serde_json::{json, Value};

fn item(n: usize) -> Value {
    json!({ "queue": "out", "partition": "A", "payload": { "n": n }, "transactionId": format!("A{n}") })
}

/// A broker whose database connections all go through a proxy the test can cut.
async fn behind_proxy(db: &crate::support::TestDb) -> (Proxy, crate::support::TestApp) {
    let proxy = Proxy::start(pg().port()).await;
    let app = spawn_app_with(test_settings(db, &[("DATABASE_URL", &proxy.url(db))])).await;
    (proxy, app)
}

#[actix_web::test]
async fn an_outage_spools_and_recovery_replays_in_order_exactly_once() {
    let db = fresh_db().await;
    let (proxy, app) = behind_proxy(&db).await;

    let mut ids = Vec::new();
    for n in 1..=5 {
        let reply = app.push(json!([item(n)])).await;
        assert_eq!(reply.body[0]["status"], "queued");
        ids.push(reply.body[0]["message_id"].as_str().unwrap().to_string());
    }

    proxy.cut();
    for n in 6..=10 {
        let reply = app.push(json!([item(n)])).await;
        assert_eq!(reply.status, 201, "a spooled push is still 201");
        assert_eq!(reply.body[0]["status"], "buffered", "item {n}");
        assert_eq!(reply.body[0]["transaction_id"], format!("A{n}"));
        ids.push(reply.body[0]["message_id"].as_str().unwrap().to_string());
    }
    assert!(!app.spool_files().is_empty(), "spool files exist on disk");
    assert_eq!(app.get("/health").await.status, 503);
    assert_eq!(
        app.get("/health/live").await.status,
        200,
        "liveness never touches the database"
    );
    let metrics = app.get("/metrics").await;
    assert_eq!(metrics.body["spool"]["records"], 5, "{}", metrics.body);
    assert!(metrics.body["spool"]["bytes"].as_u64().unwrap() > 0);
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    assert!(text.contains("queen_file_buffer_pending 5"), "{text}");
    assert!(text.contains("queen_file_buffer_db_healthy 0"), "{text}");

    proxy.restore();
    // Pushed at once after recovery: behind the spooled items, never before them.
    let burst: Vec<Value> = (11..=15).map(item).collect();
    let reply = app.push(Value::Array(burst)).await;
    for r in reply.body.as_array().unwrap() {
        assert!(r["status"] == "queued" || r["status"] == "buffered", "{r}");
        ids.push(r["message_id"].as_str().unwrap().to_string());
    }
    app.drained().await;

    let stored = db.stored("out", "A").await;
    let keys: Vec<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
    let expected: Vec<String> = (1..=15).map(|n| format!("A{n}")).collect();
    assert_eq!(keys, expected, "A1…A15 in order, each once");
    let stored_ids: Vec<String> = stored.iter().map(|s| s.id.to_string()).collect();
    assert_eq!(
        stored_ids, ids,
        "stored messages carry the ids their verdicts named"
    );
    assert!(app.spool_files().is_empty(), "replayed files are removed");
    assert_eq!(app.get("/health").await.status, 200);

    let again = app.push(json!([item(7)])).await;
    assert_eq!(again.body[0]["status"], "duplicate");
    assert_eq!(again.body[0]["message_id"], ids[6].as_str());
}

#[actix_web::test]
async fn a_commit_whose_answer_was_lost_is_not_stored_twice() {
    let db = fresh_db().await;
    let (proxy, app) = behind_proxy(&db).await;
    assert_eq!(
        app.push(json!([{ "queue": "u", "payload": 0, "transactionId": "warm" }]))
            .await
            .body[0]["status"],
        "queued"
    );

    proxy.drop_next_commit();
    let reply = app
        .push(json!([{ "queue": "u", "payload": 1, "transactionId": "unknown-outcome" }]))
        .await;
    assert_eq!(proxy.commits_dropped(), 1);
    assert_eq!(
        reply.body[0]["status"], "buffered",
        "the broker could not know the commit landed"
    );
    let mut conn = db.conn().await;
    let answered_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    app.drained().await;
    let committed_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT created_at FROM queen.segments WHERE base_offset = 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(
        committed_at < answered_at,
        "the stored copy is the original commit, not the replay"
    );

    let stored = db.stored("u", "Default").await;
    let copies = stored
        .iter()
        .filter(|s| s.transaction_id == "unknown-outcome")
        .count();
    assert_eq!(
        copies, 1,
        "replay met the committed original and wrote nothing"
    );
}

#[actix_web::test]
async fn several_partitions_keep_their_own_order_through_an_outage() {
    let db = fresh_db().await;
    let (proxy, app) = behind_proxy(&db).await;
    let push_round = |round: usize| {
        let items: Vec<Value> = (0..4)
            .map(|p| json!({ "queue": "multi", "partition": format!("p{p}"), "payload": round, "transactionId": format!("r{round}") }))
            .collect();
        app.push(Value::Array(items))
    };
    for round in 0..3 {
        push_round(round).await;
    }
    proxy.cut();
    for round in 3..6 {
        let reply = push_round(round).await;
        assert!(reply
            .body
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "buffered"));
    }
    proxy.restore();
    for round in 6..9 {
        push_round(round).await;
    }
    app.drained().await;
    for p in 0..4 {
        let payloads: Vec<String> = db
            .stored("multi", &format!("p{p}"))
            .await
            .into_iter()
            .map(|s| s.payload)
            .collect();
        assert_eq!(
            payloads,
            (0..9).map(|r| r.to_string()).collect::<Vec<_>>(),
            "partition p{p}"
        );
    }
}
