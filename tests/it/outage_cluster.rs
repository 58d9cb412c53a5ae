//! A real outage: the test's own PostgreSQL cluster is stopped (immediate shutdown) and started
//! again, including a broker that starts while PostgreSQL is down. The cluster is durable
//! (fsync on): an immediate stop of a cluster without durable commits would lose them.

use std::time::Duration;

use crate::support::{eventually, spawn_app_with, TestDb};
use queen_broker::pg::{free_port, PrivateCluster};
use serde_json::json;
use uuid::Uuid;

fn own_cluster() -> (PrivateCluster, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("queen-outage-{}", Uuid::new_v4().simple()));
    let cluster =
        PrivateCluster::new(&dir.join("pg"), free_port().unwrap()).expect("server binaries");
    cluster.start(true).expect("cluster starts");
    (cluster, dir)
}

struct Cleanup(PrivateCluster, std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.0.stop(true);
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

#[actix_web::test]
async fn stopping_postgresql_spools_and_starting_it_replays() {
    let (cluster, dir) = own_cluster();
    let _cleanup = Cleanup(cluster.clone(), dir);
    let db = TestDb {
        url: cluster.url("postgres"),
    };
    let app = spawn_app_with(crate::support::test_settings(&db, &[])).await;
    assert_eq!(
        app.push(json!([{ "queue": "s", "payload": 1, "transactionId": "before" }]))
            .await
            .body[0]["status"],
        "queued"
    );

    cluster.stop(true).unwrap();
    let reply = app
        .push(json!([{ "queue": "s", "payload": 2, "transactionId": "during" }]))
        .await;
    assert_eq!(reply.body[0]["status"], "buffered");
    assert_eq!(app.get("/health").await.status, 503);

    cluster.start(true).unwrap();
    app.drained().await;
    let keys: Vec<String> = db
        .stored("s", "Default")
        .await
        .into_iter()
        .map(|s| s.transaction_id)
        .collect();
    assert_eq!(keys, ["before", "during"]);
    // The pool recovers too.
    let app = &app;
    eventually(
        Duration::from_secs(10),
        "/health is 200 again",
        move || async move { (app.get("/health").await.status == 200).then_some(()) },
    )
    .await;
}

#[actix_web::test]
async fn a_broker_started_while_postgresql_is_down_spools_then_catches_up() {
    let (cluster, dir) = own_cluster();
    let _cleanup = Cleanup(cluster.clone(), dir);
    let db = TestDb {
        url: cluster.url("postgres"),
    };
    cluster.stop(true).unwrap();

    let app = spawn_app_with(crate::support::test_settings(
        &db,
        &[("DB_CONNECTION_TIMEOUT", "500")],
    ))
    .await;
    let reply = app
        .push(json!([{ "queue": "late", "payload": { "k": 1 }, "transactionId": "t1" }]))
        .await;
    assert_eq!(reply.status, 201);
    assert_eq!(reply.body[0]["status"], "buffered");
    assert_eq!(app.get("/health").await.status, 503);

    cluster.start(true).unwrap();
    app.drained().await; // migrations run once PostgreSQL answers, then the spool drains
    let stored = db.stored("late", "Default").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].payload, r#"{"k":1}"#);
    assert_eq!(
        stored[0].id.to_string(),
        reply.body[0]["message_id"].as_str().unwrap()
    );
}
