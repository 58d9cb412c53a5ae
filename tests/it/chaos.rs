//! The broker's own chaos run: producers with deterministic transactionIds that retry until
//! every item is accepted, an acking consumer, three brokers on one database, and faults
//! injected while they work: every broker connection terminated (`pg_terminate_backend`) and
//! maintenance mode toggled. The checker then reads PostgreSQL: per partition every produced
//! key is stored (lost = 0), once (twice = 0), in production order (order = 0); and no message
//! is delivered again after its ack succeeded. Each producer stays with one broker (order is
//! promised per broker: a `buffered` batch replays from that broker's spool).
//!
//! CI size by default (4 partitions × 2 000 messages, about 20 s); the long form is
//! `QUEEN_CHAOS_MESSAGES=10000000 cargo test --release --test it chaos:: -- --nocapture`.

use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{fresh_db, spawn_app_with, test_settings, TestApp};

const QUEUE: &str = "chaos";
const PARTITIONS: usize = 4;
const BATCH: usize = 10;

fn messages_wanted() -> usize {
    std::env::var("QUEEN_CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8_000)
}

/// Pushes one partition's keys in order, each batch retried until every item is accepted.
async fn produce(apps: Rc<Vec<TestApp>>, partition: usize, count: usize) -> usize {
    let mut retries = 0;
    let mut seq = 0;
    while seq < count {
        let end = (seq + BATCH).min(count);
        let items: Vec<Value> = (seq..end)
            .map(|s| {
                json!({"queue": QUEUE, "partition": format!("p{partition}"),
                       "transactionId": format!("p{partition}-{s:09}"), "payload": {"s": s}})
            })
            .collect();
        // A producer stays with its broker: order is promised per broker (a `buffered` batch
        // replays from that broker's spool; another broker would not wait for it).
        let app = &apps[partition % apps.len()];
        let reply = app.push(json!(items)).await;
        let accepted = reply.status == 201
            && reply.body.as_array().is_some_and(|r| {
                r.iter().all(|i| {
                    matches!(
                        i["status"].as_str(),
                        Some("queued" | "duplicate" | "buffered")
                    )
                })
            });
        if accepted {
            seq = end;
        } else {
            retries += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    retries
}

#[derive(Default)]
struct Consumed {
    acked: HashSet<String>,
    after_ack: usize,
    deliveries: usize,
}

/// Pops and acks until told to stop and nothing is left.
async fn consume(apps: Rc<Vec<TestApp>>, done: Arc<AtomicBool>, seen: Arc<Mutex<Consumed>>) {
    let mut turn = 0usize;
    let mut idle_after_done = 0;
    loop {
        turn += 1;
        let app = &apps[turn % apps.len()];
        let reply = app
            .get(&format!("/api/v1/pop/queue/{QUEUE}?batch=50"))
            .await;
        let messages: Vec<Value> = if reply.status == 200 {
            reply.body["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if messages.is_empty() {
            if done.load(Ordering::Acquire) {
                idle_after_done += 1;
                if idle_after_done > 20 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        idle_after_done = 0;
        for m in messages {
            let key = m["transactionId"].as_str().unwrap_or_default().to_string();
            {
                let mut seen = seen.lock().unwrap();
                seen.deliveries += 1;
                if seen.acked.contains(&key) {
                    seen.after_ack += 1;
                }
            }
            let ack = json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "status": "completed"});
            // An ack that did not get through is retried; its lease keeps the message ours.
            for _ in 0..50 {
                let r = app.post("/api/v1/ack", &ack).await;
                if r.status == 200 {
                    if r.body[0]["success"] == true {
                        seen.lock().unwrap().acked.insert(key.clone());
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Injects faults until `done`: terminate every broker connection, toggle maintenance mode.
async fn inject(db_url: String, apps: Rc<Vec<TestApp>>, done: Arc<AtomicBool>) -> (usize, usize) {
    use sqlx::Connection;
    let (mut terminations, mut toggles) = (0, 0);
    let mut round = 0;
    while !done.load(Ordering::Acquire) {
        round += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if round % 3 == 0 {
            let app = &apps[round % apps.len()];
            app.post("/api/v1/system/maintenance", &json!({"enabled": true}))
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            app.post("/api/v1/system/maintenance", &json!({"enabled": false}))
                .await;
            toggles += 1;
        } else if let Ok(mut conn) = sqlx::PgConnection::connect(&db_url).await {
            let _ = sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .execute(&mut conn)
            .await;
            terminations += 1;
        }
    }
    (terminations, toggles)
}

#[actix_web::test]
async fn chaos_nothing_lost_nothing_twice_order_kept() {
    let db = fresh_db().await;
    let per_partition = messages_wanted() / PARTITIONS;
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(spawn_app_with(test_settings(&db, &[("QUEEN_FLAG_POLL_MS", "100")])).await);
    }
    let apps = Rc::new(apps);
    let started = Instant::now();
    let producing = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(Mutex::new(Consumed::default()));
    let faults = actix_web::rt::spawn(inject(db.url.clone(), apps.clone(), producing.clone()));
    let consumer_done = Arc::new(AtomicBool::new(false));
    let consumer = actix_web::rt::spawn(consume(
        apps.clone(),
        consumer_done.clone(),
        consumed.clone(),
    ));
    let producers: Vec<_> = (0..PARTITIONS)
        .map(|p| actix_web::rt::spawn(produce(apps.clone(), p, per_partition)))
        .collect();
    let mut retries = 0;
    for p in producers {
        retries += p.await.unwrap();
    }
    producing.store(true, Ordering::Release);
    let (terminations, toggles) = faults.await.unwrap();
    // Faults over: maintenance off for good, every spool drained.
    apps[0]
        .post("/api/v1/system/maintenance", &json!({"enabled": false}))
        .await;
    for app in apps.iter() {
        app.drained().await;
    }
    consumer_done.store(true, Ordering::Release);
    consumer.await.unwrap();

    let (mut lost, mut twice, mut order) = (0, 0, 0);
    for p in 0..PARTITIONS {
        let stored = db.stored(QUEUE, &format!("p{p}")).await;
        let keys: Vec<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
        let unique: HashSet<&str> = keys.iter().copied().collect();
        twice += keys.len() - unique.len();
        lost += (0..per_partition)
            .filter(|s| !unique.contains(format!("p{p}-{s:09}").as_str()))
            .count();
        order += keys.windows(2).filter(|w| w[0] >= w[1]).count();
    }
    let consumed = consumed.lock().unwrap();
    let total = per_partition * PARTITIONS;
    eprintln!(
        "chaos: {total} messages, 3 brokers, {terminations} connection terminations, {toggles} maintenance toggles, \
         {retries} producer retries, {} deliveries, {} acked; lost {lost}, twice {twice}, order {order}, \
         delivered after ack {}; {:.1} s",
        consumed.deliveries,
        consumed.acked.len(),
        consumed.after_ack,
        started.elapsed().as_secs_f64()
    );
    assert!(terminations > 0 && toggles > 0, "faults were injected");
    assert_eq!((lost, twice, order), (0, 0, 0));
    assert_eq!(
        consumed.after_ack, 0,
        "no message is delivered again after its ack"
    );
    assert_eq!(
        consumed.acked.len(),
        total,
        "every message consumed and acked once"
    );
}
