//! `GET /api/v1/resources/queues/{queue}/depth` (2.x reference §2.8): a group's backlog per
//! partition, against a real PostgreSQL.

use crate::support::consuming::{ack_all, pop_partition, push_n};
use crate::support::{fresh_db, spawn_app};
use serde_json::json;

#[actix_web::test]
async fn depth_counts_what_each_group_has_left() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "deep", "a", 0, 3).await;
    push_n(&app, "deep", "b", 0, 2).await;
    push_n(&app, "deep", "c", 0, 1).await;

    // A group that consumed partition a entirely.
    let popped = pop_partition(&app, "deep", "a", "batch=10&wait=false&consumerGroup=g1").await;
    ack_all(&app, &popped, "completed", Some("g1")).await;

    let reply = app
        .get("/api/v1/resources/queues/deep/depth?group=g1")
        .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let body = reply.body;
    assert_eq!(body["queue"], "deep");
    assert_eq!(body["group"], "g1");
    assert_eq!(body["pending"], 3);
    assert_eq!(body["partitionsPending"], 2);
    assert_eq!(body["conflation"], false);
    assert_eq!(body["effectivePending"], 3);
    assert_eq!(
        body["partitions"],
        json!([{"partition": "b", "pending": 2}, {"partition": "c", "pending": 1}])
    );
    assert_eq!(body["truncated"], false);

    // Queue mode (no group) has consumed nothing.
    let body = app.get("/api/v1/resources/queues/deep/depth").await.body;
    assert_eq!(
        (body["pending"].as_i64(), body["partitionsPending"].as_i64()),
        (Some(6), Some(3))
    );
    assert!(body["group"].is_null());

    // A bounded list: the totals stay, the list is cut and says so.
    let body = app
        .get("/api/v1/resources/queues/deep/depth?limit=1")
        .await
        .body;
    assert_eq!(
        body["partitions"],
        json!([{"partition": "a", "pending": 3}])
    );
    assert_eq!(body["pending"], 6);
    assert_eq!(body["truncated"], true);

    let missing = app.get("/api/v1/resources/queues/nowhere/depth").await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        app.get("/api/v1/resources/queues/deep/depth?limit=x")
            .await
            .status,
        400
    );
}
