//! Concurrency: many producers on one partition, racing duplicates, several brokers on one
//! database. Correctness must come from PostgreSQL (row lock + transaction), not broker memory.

use std::collections::{HashMap, HashSet};

use crate::support::{fresh_db, spawn_app};
use futures_util::future::join_all;
use serde_json::json;

#[actix_web::test]
async fn thirty_two_producers_on_one_partition_lose_nothing_and_keep_their_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let per_producer = 25;
    let producers = (0..32).map(|p| {
        let app = &app;
        async move {
            for seq in 0..per_producer {
                let reply = app.push(json!([{ "queue": "c", "partition": "one", "payload": { "p": p, "s": seq } }])).await;
                assert_eq!(reply.status, 201);
                assert_eq!(reply.body[0]["status"], "queued");
            }
        }
    });
    join_all(producers).await;
    let stored = db.stored("c", "one").await;
    assert_eq!(stored.len(), 32 * per_producer);
    let offsets: Vec<i64> = stored.iter().map(|s| s.offset).collect();
    assert_eq!(
        offsets,
        (0..(32 * per_producer) as i64).collect::<Vec<_>>(),
        "contiguous offsets"
    );
    let mut last: HashMap<i64, i64> = HashMap::new();
    for s in &stored {
        let v: serde_json::Value = serde_json::from_str(&s.payload).unwrap();
        let (p, seq) = (v["p"].as_i64().unwrap(), v["s"].as_i64().unwrap());
        if let Some(prev) = last.insert(p, seq) {
            assert_eq!(seq, prev + 1, "producer {p} kept its order");
        }
    }
    let mut conn = db.conn().await;
    let segments: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.segments")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(segments <= (32 * per_producer) as i64);
}

#[actix_web::test]
async fn sixteen_racing_pushes_of_one_key_store_it_once() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.push(json!([{ "queue": "race", "payload": 0 }])).await; // the partition exists
    let replies =
        join_all((0..16).map(|n| {
            app.push(json!([{ "queue": "race", "payload": n, "transactionId": "same" }]))
        }))
        .await;
    let queued = replies
        .iter()
        .filter(|r| r.body[0]["status"] == "queued")
        .count();
    let ids: HashSet<&str> = replies
        .iter()
        .map(|r| r.body[0]["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(queued, 1);
    assert_eq!(ids.len(), 1, "every reply names the same message");
    let stored = db.stored("race", "Default").await;
    assert_eq!(
        stored.iter().filter(|s| s.transaction_id == "same").count(),
        1
    );
    assert_eq!(
        stored
            .iter()
            .find(|s| s.transaction_id == "same")
            .unwrap()
            .id
            .to_string(),
        *ids.iter().next().unwrap()
    );
}

#[actix_web::test]
async fn three_brokers_on_one_database_share_offsets_and_dedup() {
    let db = fresh_db().await;
    let brokers = [
        spawn_app(&db).await,
        spawn_app(&db).await,
        spawn_app(&db).await,
    ];
    let rounds = 20;
    // Every broker pushes every key of every round to both partitions at the same time.
    let work = brokers.iter().enumerate().map(|(b, app)| async move {
        let mut queued = Vec::new();
        for round in 0..rounds {
            let reply = app
                .push(json!([
                    { "queue": "multi", "partition": "x", "payload": { "b": b }, "transactionId": format!("k{round}") },
                    { "queue": "multi", "partition": "y", "payload": { "b": b }, "transactionId": format!("k{round}") },
                    { "queue": "multi", "partition": "x", "payload": { "b": b }, "transactionId": format!("own-{b}-{round}") },
                ]))
                .await;
            assert_eq!(reply.status, 201, "{:?}", reply.body);
            for r in reply.body.as_array().unwrap() {
                if r["status"] == "queued" {
                    queued.push(r["transaction_id"].as_str().unwrap().to_string());
                }
            }
        }
        queued
    });
    let accepted: Vec<String> = join_all(work).await.into_iter().flatten().collect();
    for partition in ["x", "y"] {
        let stored = db.stored("multi", partition).await;
        let offsets: Vec<i64> = stored.iter().map(|s| s.offset).collect();
        assert_eq!(
            offsets,
            (0..stored.len() as i64).collect::<Vec<_>>(),
            "partition {partition} is contiguous"
        );
        let keys: HashSet<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
        assert_eq!(
            keys.len(),
            stored.len(),
            "no key stored twice in {partition}"
        );
    }
    assert_eq!(db.stored("multi", "x").await.len(), rounds + 3 * rounds);
    assert_eq!(db.stored("multi", "y").await.len(), rounds);
    assert_eq!(
        accepted.len(),
        rounds * 2 + 3 * rounds,
        "exactly one broker queued each shared key"
    );
}
