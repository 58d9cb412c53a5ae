//! With PostgreSQL unreachable, pop and ack answer 503 quickly (clients retry) and never hang;
//! once it is back, they work again. The outage is real: a TCP proxy between the broker and
//! PostgreSQL is cut.

use std::time::{Duration, Instant};

use crate::support::consuming::*;
use crate::support::proxy::Proxy;
use crate::support::{fresh_db, pg, spawn_app_with, test_settings};
use serde_json::json;

#[actix_web::test]
async fn pop_and_ack_answer_503_quickly_while_postgresql_is_away() {
    let db = fresh_db().await;
    let proxy = Proxy::start(pg().port()).await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("DB_CONNECTION_TIMEOUT", "1000"),
            ("DATABASE_URL", &proxy.url(&db)),
        ],
    ))
    .await;

    push_n(&app, "q", "p", 0, 1).await;
    let reply = pop(&app, "q", "").await;
    assert_eq!(ns(&reply), vec![0]);

    proxy.cut();
    for path in [
        "/api/v1/pop/queue/q",
        "/api/v1/pop/queue/q?wait=true&timeout=20000",
    ] {
        let started = Instant::now();
        let r = app.get(path).await;
        assert_eq!(r.status, 503, "{path}: {:?}", r.body);
        assert!(r.body["error"].is_string());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{path}: {:?}",
            started.elapsed()
        );
    }
    let started = Instant::now();
    let m = &messages(&reply)[0];
    let r = app
        .post(
            "/api/v1/ack",
            &json!({ "transactionId": m["transactionId"], "partitionId": m["partitionId"] }),
        )
        .await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert!(started.elapsed() < Duration::from_secs(5));

    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = app
            .post(
                "/api/v1/ack",
                &json!({ "transactionId": m["transactionId"], "partitionId": m["partitionId"] }),
            )
            .await;
        if r.status == 200 {
            assert_eq!(r.body[0]["success"], true);
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {:?}", r.body);
    }
}
