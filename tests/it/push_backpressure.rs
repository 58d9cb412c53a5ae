//! Backpressure: a saturated write path answers 503 with Retry-After instead of growing.

use std::time::Duration;

use crate::support::{fresh_db, spawn_app_with, test_settings};
use serde_json::json;
use sqlx::Connection;

#[actix_web::test]
async fn a_saturated_write_path_answers_503_with_retry_after() {
    let db = fresh_db().await;
    // Room for one small push (≈ 1.1 KB of admitted memory), not two.
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_MAX_INFLIGHT_BYTES", "1500")])).await;
    assert_eq!(
        app.push(json!([{ "queue": "bp", "payload": 0 }]))
            .await
            .status,
        201
    );

    // Hold the partition's row lock so the next commit waits inside PostgreSQL.
    let mut locker = db.conn().await;
    let mut tx = locker.begin().await.unwrap();
    sqlx::query("SELECT id FROM queen.partitions FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();

    let stuck = app.push(json!([{ "queue": "bp", "payload": 1 }]));
    let observe = async {
        // Wait for the event "the first push holds admitted bytes".
        while queen_broker::app::inflight_bytes(&app.broker.state) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let refused = app.push(json!([{ "queue": "other", "payload": 2 }])).await;
        assert_eq!(refused.status, 503);
        assert_eq!(refused.headers.get("retry-after").unwrap(), "1");
        assert!(refused.body["error"]
            .as_str()
            .unwrap()
            .contains("overloaded"));
        tx.commit().await.unwrap();
    };
    let (first, ()) = futures_util::join!(stuck, observe);
    assert_eq!(first.status, 201);
    assert_eq!(first.body[0]["status"], "queued");
    assert_eq!(
        queen_broker::app::inflight_bytes(&app.broker.state),
        0,
        "admission is released"
    );
}

#[actix_web::test]
async fn many_small_items_are_admitted_for_what_they_cost_not_for_their_bytes() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[("QUEEN_MAX_INFLIGHT_BYTES", "1000000")],
    ))
    .await;
    // 2 000 items in ≈ 60 KB: the bytes fit the limit many times over, the items do not.
    let many: Vec<_> = (0..2_000)
        .map(|i| json!({ "queue": "amp", "payload": i }))
        .collect();
    let reply = app.push(json!(many)).await;
    assert_eq!(reply.status, 413, "{:?}", reply.body);
    assert!(reply.body["error"]
        .as_str()
        .unwrap()
        .contains("QUEEN_MAX_INFLIGHT_BYTES"));
    assert!(db.stored("amp", "Default").await.is_empty());
    let few: Vec<_> = (0..500)
        .map(|i| json!({ "queue": "amp", "payload": i }))
        .collect();
    assert_eq!(app.push(json!(few)).await.status, 201);
    assert_eq!(queen_broker::app::inflight_bytes(&app.broker.state), 0);
}
