//! The push contract over HTTP against a real PostgreSQL (reference §3, producing.md).

mod common;

use common::{fresh_db, spawn_app};
use serde_json::json;

#[actix_web::test]
async fn empty_items_answer_201_with_an_empty_array() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app.push(json!([])).await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body, json!([]));
}
