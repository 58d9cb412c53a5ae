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

#[actix_web::test]
async fn heavy_admin_reads_cannot_take_health_pushes_or_pops_down() {
    use sqlx::Connection;
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_ADMIN_POOL_SIZE", "1"),
            ("QUEEN_ADMIN_STATEMENT_TIMEOUT_MS", "4000"),
        ],
    ))
    .await;
    assert_eq!(
        app.push(json!([{"queue": "q", "payload": 0}])).await.status,
        201
    );
    // Admin reads that cannot finish: the dead-letter table is locked by another session.
    let mut locker = db.conn().await;
    let mut tx = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE queen.dead_letters IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let reads: Vec<_> = (0..12).map(|_| app.get("/api/v1/dlq")).collect();
    let probe = async {
        // The reads are now holding (or waiting for) every connection they can get.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let health = app.get("/health").await;
        assert_eq!(health.status, 200, "{:?}", health.body);
        let pushed = app.push(json!([{"queue": "q", "payload": 1}])).await;
        assert_eq!(pushed.status, 201, "{:?}", pushed.body);
        let popped = crate::support::consuming::pop(&app, "q", "batch=2").await;
        assert_eq!(popped.status, 200, "{:?}", popped.body);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    };
    let (answers, ()) = futures_util::join!(futures_util::future::join_all(reads), probe);
    tx.rollback().await.unwrap();
    // The blocked reads were answered (503 once they waited too long), not left hanging.
    assert!(answers.iter().all(|r| r.status == 503 || r.status == 200));
    assert!(answers.iter().any(|r| r.status == 503));
    assert_eq!(app.get("/api/v1/dlq").await.status, 200);
}

/// Reads one HTTP response from `stream` (headers and a `Content-Length` body).
async fn read_response(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let n = tokio::time::timeout(left, stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Some(text);
            }
        }
    }
}

#[actix_web::test]
async fn idle_connections_cannot_use_up_the_file_descriptors_the_broker_needs() {
    let db = fresh_db().await;
    let port = queen_broker::pg::free_port().unwrap();
    let spool = std::env::temp_dir().join(format!("queen-fd-{}", uuid::Uuid::new_v4().simple()));
    let mut child = std::process::Command::new("prlimit")
        .arg("--nofile=300:300")
        .arg(env!("CARGO_BIN_EXE_queen-broker"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("DATABASE_URL", &db.url)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("NUM_WORKERS", "2")
        .env("FILE_BUFFER_DIR", &spool)
        .env("LOG_LEVEL", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prlimit runs the broker");
    let addr = format!("127.0.0.1:{port}");
    let mut kept = None;
    for _ in 0..200 {
        if let Ok(mut s) = TcpStream::connect(&addr).await {
            let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            if read_response(&mut s, Duration::from_secs(5))
                .await
                .is_some_and(|r| r.contains(" 200 "))
            {
                kept = Some(s);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut kept = kept.expect("the broker answers");
    // 400 connections that never send a request: more than the open-file limit allows.
    let mut idle = Vec::new();
    for _ in 0..400 {
        if let Ok(s) = TcpStream::connect(&addr).await {
            idle.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A push on the connection opened before: its commit needs a new PostgreSQL connection.
    let body = r#"{"items":[{"queue":"fd","payload":1}]}"#;
    let req = format!(
        "POST /api/v1/push HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    kept.write_all(req.as_bytes()).await.unwrap();
    let answer = read_response(&mut kept, Duration::from_secs(10)).await;
    let elapsed = started.elapsed();
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&spool);
    let answer = answer.expect("the push is answered");
    assert!(
        answer.contains(" 201 ") && answer.contains("queued"),
        "{answer}"
    );
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert_eq!(db.stored("fd", "Default").await.len(), 1);
}
