//! Leases (reference §4.5, §5.3): one per (partition, group), expiry → redelivery in order,
//! extension, exclusivity across consumers and across brokers on one database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};
use futures_util::future::join_all;
use serde_json::{json, Value};

#[actix_web::test]
async fn an_expired_lease_hands_the_unacked_messages_out_again_in_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 5).await;
    let first = pop(&app, "q", "batch=5").await;
    assert_eq!(ns(&first), vec![0, 1, 2, 3, 4]);
    // Two of five are done before the consumer disappears.
    ack_one(&app, &messages(&first)[1], "completed", None).await;
    assert_eq!(pop(&app, "q", "batch=5").await.status, 204);

    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'")
        .await;
    let second = pop(&app, "q", "batch=5").await;
    assert_eq!(ns(&second), vec![2, 3, 4]);
    assert_ne!(second.body["leaseId"], first.body["leaseId"]);

    // The first consumer's lease is gone: its acks naming it are refused.
    let late = ack_one(&app, &messages(&first)[2], "completed", None).await;
    assert_eq!(late["success"], false);
    assert_eq!(late["error"], "Invalid or expired lease");
}

#[actix_web::test]
async fn the_lease_lasts_the_queues_lease_time() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    db.exec("UPDATE queen.queues SET lease_time = 7").await;
    pop(&app, "q", "").await;
    let secs: f64 = {
        let mut conn = db.conn().await;
        sqlx::query_scalar(
            "SELECT extract(epoch FROM lease_expires_at - lease_acquired_at)::float8
               FROM queen.partition_consumers",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    assert!((secs - 7.0).abs() < 0.01, "{secs}");

    db.exec("UPDATE queen.queues SET lease_time = 0").await;
    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'")
        .await;
    pop(&app, "q", "").await;
    let mut conn = db.conn().await;
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM lease_expires_at - lease_acquired_at)::float8
           FROM queen.partition_consumers",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        (secs - 60.0).abs() < 0.01,
        "lease time 0 means 60 s, got {secs}"
    );
}

#[actix_web::test]
async fn extending_a_lease_accepts_an_empty_body_and_reports_dead_leases() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    db.exec("UPDATE queen.queues SET lease_time = 5").await;
    let reply = pop(&app, "q", "").await;
    let lease = reply.body["leaseId"].as_str().unwrap().to_string();

    let r = post_raw(&app, &format!("/api/v1/lease/{lease}/extend"), "").await;
    assert_eq!(r.status, 200);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body[0]["success"], true);
    assert_eq!(body[0]["leaseId"], lease.as_str());
    let expires = body[0]["expiresAt"].as_str().unwrap();
    assert_eq!(expires.len(), "2024-01-01T00:00:00.000Z".len());
    let expires = chrono::DateTime::parse_from_rfc3339(expires).unwrap();
    let ahead = expires
        .signed_duration_since(chrono::Utc::now())
        .num_seconds();
    assert!((55..=61).contains(&ahead), "{ahead}");

    let r = app
        .post(
            &format!("/api/v1/lease/{lease}/extend"),
            &json!({ "seconds": 120 }),
        )
        .await;
    assert_eq!(r.body[0]["success"], true);

    let unknown = app
        .post(
            &format!("/api/v1/lease/{}/extend", uuid::Uuid::new_v4()),
            &json!({}),
        )
        .await;
    assert_eq!(unknown.body[0]["error"], "Lease not found");
    let garbage = app.post("/api/v1/lease/xyz/extend", &json!({})).await;
    assert_eq!(garbage.body[0]["error"], "Lease not found");

    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'")
        .await;
    let expired = app
        .post(&format!("/api/v1/lease/{lease}/extend"), &json!({}))
        .await;
    assert_eq!(expired.body[0]["error"], "Lease already expired");

    let again = pop(&app, "q", "").await;
    ack_all(&app, &again, "completed", None).await;
    let lease2 = again.body["leaseId"].as_str().unwrap();
    let released = app
        .post(&format!("/api/v1/lease/{lease2}/extend"), &json!({}))
        .await;
    assert_eq!(released.body[0]["error"], "Lease not active");
}

async fn race_for_one_partition(apps: &[&crate::support::TestApp]) -> usize {
    let pops = (0..12).map(|n| pop(apps[n % apps.len()], "q", "batch=10"));
    let replies = join_all(pops).await;
    let winners: Vec<_> = replies.iter().filter(|r| r.status == 200).collect();
    assert!(replies.iter().all(|r| r.status == 200 || r.status == 204));
    winners.len()
}

#[actix_web::test]
async fn two_consumers_of_a_group_never_hold_one_partition_at_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 10).await;
    assert_eq!(race_for_one_partition(&[&app]).await, 1);
}

#[actix_web::test]
async fn two_brokers_on_one_database_never_lease_one_partition_twice() {
    let db = fresh_db().await;
    let a = spawn_app(&db).await;
    let b = spawn_app(&db).await;
    push_n(&a, "q", "p", 0, 10).await;
    assert_eq!(race_for_one_partition(&[&a, &b]).await, 1);
    // And after an expiry, again exactly one of them gets it.
    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'")
        .await;
    assert_eq!(race_for_one_partition(&[&b, &a]).await, 1);
}

#[actix_web::test]
async fn ten_concurrent_consumers_see_each_partition_in_order_exactly_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let partitions = 8;
    let per_partition = 30;
    for p in 0..partitions {
        push_n(&app, "q", &format!("p{p}"), 0, per_partition).await;
    }
    let seen: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let consumers = (0..10).map(|_| {
        let seen = seen.clone();
        let app = &app;
        async move {
            let mut empty = 0;
            while empty < 3 {
                let reply = pop(app, "q", "batch=4").await;
                if reply.status == 204 {
                    empty += 1;
                    continue;
                }
                empty = 0;
                let partition = reply.body["partition"].as_str().unwrap().to_string();
                // Recorded before the ack: nobody else can get this partition until then.
                seen.lock()
                    .unwrap()
                    .entry(partition)
                    .or_default()
                    .extend(ns(&reply));
                ack_all(app, &reply, "completed", None).await;
            }
        }
    });
    join_all(consumers).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), partitions);
    for (p, list) in seen.iter() {
        assert_eq!(
            list,
            &(0..per_partition).collect::<Vec<_>>(),
            "partition {p}"
        );
    }
}
