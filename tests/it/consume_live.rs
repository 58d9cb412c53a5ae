//! Producers and consumers at the same time (the bench's end-to-end shape, small): every
//! pushed message is consumed exactly once, in order per partition, and nothing is left
//! behind unfound when the producers stop; consumers that fall behind make pushes commit one
//! transaction at a time for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings};
use futures_util::future::join_all;
use serde_json::json;

#[actix_web::test]
async fn live_producers_and_consumers_leave_nothing_behind() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let partitions = 20;
    let producers = 6;
    let pushes_each = 40;
    let per_push = 25;

    let producing = (0..producers).map(|p| {
        let app = &app;
        async move {
            for k in 0..pushes_each {
                let part = (p * 7 + k * 3) % partitions;
                let first = ((p * pushes_each + k) * per_push) as i64;
                let items: Vec<_> = (first..first + per_push as i64)
                    .map(|n| {
                        json!({"queue": "q", "partition": format!("p{part}"), "payload": {"n": n}})
                    })
                    .collect();
                let r = app.push(json!(items)).await;
                assert_eq!(r.status, 201, "{:?}", r.body);
            }
        }
    });
    let total = producers * pushes_each * per_push;
    let seen: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let consuming = (0..8).map(|_| {
        let seen = seen.clone();
        let app = &app;
        async move {
            loop {
                let done = seen.lock().unwrap().values().map(Vec::len).sum::<usize>() >= total;
                if done || Instant::now() > deadline {
                    break;
                }
                let reply = pop(app, "q", "batch=30&wait=true&timeout=200").await;
                if reply.status == 204 {
                    continue;
                }
                for m in messages(&reply) {
                    seen.lock()
                        .unwrap()
                        .entry(m["partition"].as_str().unwrap().to_string())
                        .or_default()
                        .push(m["data"]["n"].as_i64().unwrap());
                }
                let acked = ack_all(app, &reply, "completed", None).await;
                for a in acked.as_array().unwrap() {
                    assert_eq!(a["success"], true, "{a}");
                }
            }
        }
    });
    futures_util::join!(join_all(producing), join_all(consuming));

    let seen = seen.lock().unwrap().clone();
    let mut all: Vec<i64> = seen.values().flatten().copied().collect();
    all.sort_unstable();
    let count = all.len();
    all.dedup();
    assert_eq!(all.len(), count, "a message was delivered twice");
    if count < total {
        let mut conn = db.conn().await;
        let rows: Vec<(String, i64, i64, Option<bool>, bool)> = sqlx::query_as(
            "SELECT p.name, p.next_offset, c.committed_offset, c.lease_expires_at > now(),
                    c.attention_at IS NOT NULL
               FROM queen.partitions p
               JOIN queen.partition_consumers c ON c.partition_id = p.id
              WHERE c.committed_offset < p.next_offset",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        panic!("{} of {total} consumed; left behind: {rows:?}", count);
    }
    // Order within each partition is the push order of that partition.
    for (partition, ns) in seen.iter() {
        let stored = db.stored("q", partition).await;
        let pushed: Vec<i64> = stored
            .iter()
            .map(|s| {
                serde_json::from_str::<serde_json::Value>(&s.payload).unwrap()["n"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ns, &pushed, "partition {partition}");
    }
}

#[actix_web::test]
async fn consumers_that_fall_behind_make_pushes_commit_one_transaction_at_a_time() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_CONSUMER_LAG_MS", "200")])).await;
    let committers = &app.broker.state.committers;
    push_n(&app, "q", "p", 0, 2).await;
    // Popped at once: the consumers keep up, pushes may spill into parallel transactions.
    let first = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&first), vec![0]);
    assert!(committers.spills());
    ack_all(&app, &first, "completed", None).await;
    // A message that waited longer than the lag: the consumers are behind.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&second), vec![1]);
    assert!(!committers.spills());
    // And pause between transactions: the message waited ≥ 50 ms beyond the lag.
    assert!(
        committers.rest() >= Duration::from_millis(12),
        "{:?}",
        committers.rest()
    );
    assert!(
        committers.rest() <= Duration::from_millis(30),
        "{:?}",
        committers.rest()
    );
    ack_all(&app, &second, "completed", None).await;
    // For a while only: then pushes spill again, and what they wrote is consumed as usual.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(committers.spills());
    assert_eq!(committers.rest(), Duration::ZERO);
    push_n(&app, "q", "p", 2, 3).await;
    assert_eq!(ns(&pop(&app, "q", "batch=10").await), vec![2, 3, 4]);

    // Turned off, a late pop changes nothing.
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_CONSUMER_LAG_MS", "0")])).await;
    push_n(&app, "q", "p", 0, 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(ns(&pop(&app, "q", "batch=1").await), vec![0]);
    assert!(app.broker.state.committers.spills());
}
