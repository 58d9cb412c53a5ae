//! With PostgreSQL unreachable, pop and ack answer 503 quickly (clients retry) and never hang;
//! once it is back, they work again. The outage is real: a TCP proxy between the broker and
//! PostgreSQL is cut.

mod common;
mod consuming;

use std::time::{Duration, Instant};

use common::{fresh_db, spawn_app_with, test_settings};
use consuming::*;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A TCP proxy to `upstream` that can be cut (every connection dropped, new ones refused)
/// and restored.
struct Proxy {
    port: u16,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = watch::channel(false);
        actix_web::rt::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    continue; // refused: dropped at once
                }
                let upstream = upstream.clone();
                let mut cut_rx = cut_rx.clone();
                actix_web::rt::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut_rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Proxy { port, cut }
    }
}

#[actix_web::test]
async fn pop_and_ack_answer_503_quickly_while_postgresql_is_away() {
    let db = fresh_db().await;
    // postgres://user@127.0.0.1:PORT/name → the same through the proxy.
    let (head, tail) = db.url.rsplit_once('@').unwrap();
    let (host_port, name) = tail.split_once('/').unwrap();
    let proxy = Proxy::start(host_port.to_string()).await;
    let url = format!("{head}@127.0.0.1:{}/{name}", proxy.port);
    let mut settings = test_settings(&db, &[("DB_CONNECTION_TIMEOUT", "1000")]);
    settings.database = queen_broker::settings::Database::Url(url);
    let app = spawn_app_with(settings).await;

    push_n(&app, "q", "p", 0, 1).await;
    let reply = pop(&app, "q", "").await;
    assert_eq!(ns(&reply), vec![0]);

    proxy.cut.send(true).unwrap();
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
    assert_eq!(r.status, 503);
    assert!(started.elapsed() < Duration::from_secs(5));

    proxy.cut.send(false).unwrap();
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
