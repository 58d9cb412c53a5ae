//! What a second hostile probe found, one test each: label sets a client can grow without
//! bound, status ranges that hold a connection for seconds, a long-poll whose client hung up
//! taking a message, payloads nested without limit, a damaged segment hiding every message of
//! the listing, a deleted message's transactionId, and cross-origin writes a browser sends
//! without asking.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::consuming::{messages, pop};
use crate::support::{fresh_db, spawn_app, TestApp};

/// Sends `request` as it is on a fresh connection and returns the answer's text.
async fn raw(app: &TestApp, request: &str) -> String {
    let mut stream = TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn port(app: &TestApp) -> &str {
    app.base.rsplit(':').next().unwrap()
}

#[actix_web::test]
async fn invented_methods_fold_into_one_metric_label() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for n in 0..20 {
        let answer = raw(
            &app,
            &format!("INVENTED{n} /api/v1/push HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
    }
    let (_, text) = app.get_text("/metrics/prometheus").await;
    assert!(!text.contains("INVENTED"), "one series per invented method");
    assert!(
        text.lines()
            .any(|l| l.starts_with("queen_http_requests_total") && l.contains("method=\"other\"")),
        "{text}"
    );
}

#[actix_web::test]
async fn a_status_range_of_centuries_is_refused_at_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let started = Instant::now();
    for path in [
        "/api/v1/status?from=0001-01-01T00:00:00Z&to=9999-12-31T00:00:00Z",
        "/api/v1/status/analytics?from=0001-01-01T00:00:00Z&to=9999-12-31T00:00:00Z&interval=minute",
        "/api/v1/analytics/queue-ops?from=0001-01-01T00:00:00Z&to=9999-12-31T00:00:00Z",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, 400, "{path}: {:?}", r.body);
        assert!(
            r.body["error"].as_str().unwrap().contains("buckets"),
            "{:?}",
            r.body
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A range within the bound still answers.
    let r = app
        .get("/api/v1/status/analytics?from=2024-01-01T00:00:00Z&to=2024-01-02T00:00:00Z&interval=hour")
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
}

#[actix_web::test]
async fn a_long_poll_whose_client_hung_up_takes_no_message() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "gone", "options": { "leaseTime": 300 } }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A consumer long-polls, then hangs up.
    let mut stream = TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let request = format!(
        "GET /api/v1/pop/queue/gone?wait=true&timeout=20000 HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        port(&app)
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = app
        .push(json!([{ "queue": "gone", "payload": { "n": 1 } }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next consumer gets it, not after the gone one's lease (300 s).
    let got = pop(&app, "gone", "").await;
    assert_eq!(messages(&got).len(), 1, "{:?}", got.body);
}

fn nested(levels: usize) -> String {
    format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
}

#[actix_web::test]
async fn payloads_nested_deeper_than_the_limit_are_refused_on_every_push_route() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let ok = format!(
        r#"{{"items":[{{"queue":"deep","payload":{}}}]}}"#,
        nested(128)
    );
    let r = app.post_raw("/api/v1/push", ok.into_bytes()).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    for levels in [129, 100_000] {
        let body = format!(
            r#"{{"items":[{{"queue":"deep","payload":{}}}]}}"#,
            nested(levels)
        );
        let r = app.post_raw("/api/v1/push", body.into_bytes()).await;
        assert_eq!(r.status, 400, "{levels}: {:?}", r.body);
        assert!(
            r.body["error"].as_str().unwrap().contains("128"),
            "{:?}",
            r.body
        );
        let body = format!(
            r#"{{"operations":[{{"type":"push","items":[{{"queue":"deep","payload":{}}}]}}]}}"#,
            nested(levels)
        );
        let r = app.post_raw("/api/v1/transaction", body.into_bytes()).await;
        assert_eq!(r.status, 400, "{levels}: {:?}", r.body);
        assert!(
            r.body["error"].as_str().unwrap().contains("128"),
            "{:?}",
            r.body
        );
    }
    assert_eq!(db.stored("deep", "Default").await.len(), 1);
}

#[actix_web::test]
async fn a_damaged_segment_leaves_the_other_messages_listed() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for q in ["whole", "damaged"] {
        let r = app
            .push(json!([{ "queue": q, "payload": { "q": q } }]))
            .await;
        assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    }
    db.exec(
        "UPDATE queen.segments s SET frames = '\\x09deadbeef'::bytea
           FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
          WHERE s.partition_id = p.id AND q.name = 'damaged'",
    )
    .await;
    let r = app.get("/api/v1/messages").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let queues: Vec<&Value> = r.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["queue"])
        .collect();
    assert_eq!(queues, [&json!("whole")], "{:?}", r.body);
    assert_eq!(r.body["damagedSegments"], 1, "{:?}", r.body);
}

#[actix_web::test]
async fn a_deleted_message_frees_its_transaction_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app
        .push(json!([{ "queue": "del", "payload": 1, "transactionId": "k1" }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    let listed = app.get("/api/v1/messages?queue=del").await;
    let pid = listed.body["messages"][0]["partitionId"]
        .as_str()
        .unwrap()
        .to_string();
    let r = app.delete(&format!("/api/v1/messages/{pid}/k1")).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = app
        .push(json!([{ "queue": "del", "payload": 2, "transactionId": "k1" }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    let got = pop(&app, "del", "").await;
    assert_eq!(messages(&got)[0]["data"], 2, "{:?}", got.body);
}

#[actix_web::test]
async fn a_cross_origin_text_plain_write_is_refused() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let body = r#"{"enabled":true}"#;
    let forged = format!(
        "POST /api/v1/system/maintenance HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        port(&app),
        body.len()
    );
    let answer = raw(&app, &forged).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("QUEEN_CORS_ORIGINS"), "{answer}");
    let r = app.get("/api/v1/system/maintenance").await;
    assert_eq!(r.body["maintenanceMode"], false, "{:?}", r.body);
    // The broker's own pages (same origin) and JSON writes are not affected.
    let same = format!(
        "POST /api/v1/system/maintenance HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nOrigin: http://127.0.0.1:{p}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        p = port(&app),
    );
    let answer = raw(&app, &same).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
