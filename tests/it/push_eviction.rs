//! Partition actors bounded by `QUEEN_PARTITION_ACTORS_MAX`, against real PostgreSQL: a push to
//! a partition whose actor was evicted starts a fresh actor, which looks the partition up again
//! and continues its offsets; order and dedup are PostgreSQL's, so they hold across evictions.

use serde_json::json;

use crate::support::{fresh_db, spawn_app_with, test_settings};

#[actix_web::test]
async fn partitions_whose_actors_were_evicted_keep_their_order_and_dedup() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_PARTITION_ACTORS_MAX", "2")])).await;
    // Six partitions written in turns: from the third on, every push evicts the least recently
    // used actor, so each partition's next push finds its actor gone.
    let mut first_ids = Vec::new();
    for round in 0..3 {
        for p in 0..6 {
            let reply = app
                .push(json!([
                    { "queue": "evict", "partition": format!("p{p}"),
                      "transactionId": format!("p{p}-{round}-a"), "payload": { "n": round * 2 } },
                    { "queue": "evict", "partition": format!("p{p}"),
                      "transactionId": format!("p{p}-{round}-b"), "payload": { "n": round * 2 + 1 } },
                ]))
                .await;
            assert_eq!(reply.status, 201, "{:?}", reply.body);
            for r in reply.body.as_array().expect("array") {
                assert_eq!(r["status"], "queued", "{r}");
            }
            if round == 0 {
                first_ids.push(reply.body[0]["message_id"].clone());
            }
        }
    }
    let registry = &app.broker.state.registry;
    assert!(registry.len() <= 2, "{} actors alive", registry.len());
    assert!(registry.evicted() >= 16, "{} evicted", registry.evicted());
    // The evictions are in /metrics/prometheus (as counted when scraped).
    let evicted = registry.evicted();
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    let line = text
        .lines()
        .find(|l| l.starts_with("queen_partition_actor_evictions_total "))
        .expect("the evictions counter is exported");
    let scraped: u64 = line
        .rsplit_once(' ')
        .expect("value")
        .1
        .parse()
        .expect("number");
    assert!(
        scraped >= evicted && scraped <= registry.evicted(),
        "{line} (registry said {evicted})"
    );

    // A transactionId of the first round, to a partition whose actor is long gone: duplicate,
    // naming the original, and nothing written.
    let again = app
        .push(json!([
            { "queue": "evict", "partition": "p0", "transactionId": "p0-0-a", "payload": { "n": 99 } },
            { "queue": "evict", "partition": "p0", "transactionId": "p0-3-a", "payload": { "n": 6 } },
        ]))
        .await;
    assert_eq!(again.body[0]["status"], "duplicate", "{:?}", again.body);
    assert_eq!(again.body[0]["message_id"], first_ids[0]);
    assert_eq!(again.body[1]["status"], "queued", "{:?}", again.body);

    for p in 0..6 {
        let stored = db.stored("evict", &format!("p{p}")).await;
        let txns: Vec<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
        let mut expected: Vec<String> = (0..3)
            .flat_map(|round| [format!("p{p}-{round}-a"), format!("p{p}-{round}-b")])
            .collect();
        if p == 0 {
            expected.push("p0-3-a".into());
        }
        assert_eq!(txns, expected, "partition p{p} in push order");
        let offsets: Vec<i64> = stored.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, (0..expected.len() as i64).collect::<Vec<_>>());
    }
}
