//! Backpressure: a saturated write path answers 503 with Retry-After instead of growing.

use std::time::Duration;

use crate::support::{fresh_db, spawn_app_with, test_settings};
use serde_json::json;
use sqlx::Connection;

#[actix_web::test]
async fn a_saturated_write_path_answers_503_with_retry_after() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_MAX_INFLIGHT_BYTES", "10")])).await;
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
