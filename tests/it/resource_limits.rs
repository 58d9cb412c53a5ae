//! Limits that keep one client from taking the broker down: request bodies that stall or
//! trickle are cut off, body bytes being received are counted against a global cap before
//! they are read, and client connections stay below the open-file limit.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{fresh_db, spawn_app_with, test_settings, TestApp};

/// Opens a connection and sends a push's headers declaring `declared` body bytes, then `sent`
/// of them.
async fn start_upload(app: &TestApp, declared: usize, sent: usize) -> TcpStream {
    let addr = app.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

/// Reads whatever the broker answers on `stream` within `within`; the status line's code.
async fn status_of(stream: &mut TcpStream, within: Duration) -> Option<u16> {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(within, stream.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split_whitespace().nth(1)?.parse().ok()
}

#[actix_web::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_BODY_TIMEOUT_MS", "500")])).await;
    let started = Instant::now();
    let mut stalled = start_upload(&app, 100_000, 10).await;
    let status = status_of(&mut stalled, Duration::from_secs(10)).await;
    assert_eq!(status, Some(408), "a stalled body is cut off");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A body trickling in (1 KB every 100 ms) is cut at the same deadline.
    let mut trickle = start_upload(&app, 1_000_000, 0).await;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = status_of(&mut trickle, Duration::from_millis(100)).await {
            break Some(status);
        }
        if trickle.write_all(&[b' '; 1024]).await.is_err()
            || started.elapsed() > Duration::from_secs(10)
        {
            break None;
        }
    };
    assert_eq!(status, Some(408));
    // The broker still serves.
    assert_eq!(
        app.push(json!([{"queue": "q", "payload": 1}])).await.status,
        201
    );
}

#[actix_web::test]
async fn body_bytes_being_received_are_capped_before_they_are_read() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_MAX_READING_BYTES", "1000000"),
            ("QUEEN_MAX_BODY_BYTES", "900000"),
        ],
    ))
    .await;
    // Two stalled uploads declaring 600 KB each: the second does not fit beside the first.
    let mut first = start_upload(&app, 600_000, 1000).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut second = start_upload(&app, 600_000, 1000).await;
    assert_eq!(
        status_of(&mut second, Duration::from_secs(5)).await,
        Some(503),
        "the second body is refused before it is read"
    );
    assert_eq!(
        status_of(&mut first, Duration::from_millis(300)).await,
        None,
        "the first is still being received"
    );
    // A small push fits beside the stalled one.
    assert_eq!(
        app.push(json!([{"queue": "q", "payload": 1}])).await.status,
        201
    );
    drop(first);
    // Once the stalled upload is gone, its bytes are released.
    crate::support::eventually(Duration::from_secs(5), "reading bytes released", || async {
        (app.broker
            .state
            .reading
            .load(std::sync::atomic::Ordering::Acquire)
            == 0)
            .then_some(())
    })
    .await;
    let big = json!([{"queue": "q", "payload": "x".repeat(550_000)}]);
    assert_eq!(app.push(big).await.status, 201);
}
