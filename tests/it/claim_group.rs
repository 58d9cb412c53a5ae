//! Hand-off claims grouped into shared statements (`storage::consume::claim_group`): every claim in a
//! group is decided as the single statement decides it (a free lease with messages waiting is
//! taken, a live lease or a partition of another queue is not), two claims of one row never
//! both take it, and consumers whose pops claim through the group at the same time get every
//! message once, in order.

use std::collections::BTreeMap;

use queen_broker::storage::consume::claim_group::{ClaimGroup, ClaimJob};
use queen_broker::storage::consume::QUEUE_MODE;
use uuid::Uuid;

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, TestDb};

/// The database id of each partition of `queue`, by name.
async fn partition_ids(db: &TestDb, queue: &str) -> BTreeMap<String, i64> {
    let mut conn = db.conn().await;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT p.name, p.id
           FROM queen.partitions p
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1",
    )
    .bind(queue)
    .fetch_all(&mut conn)
    .await
    .expect("reads");
    rows.into_iter().collect()
}

/// The lease of the queue-mode row of a partition: id, owner and leased range.
async fn lease_of(db: &TestDb, partition_id: i64) -> (Option<Uuid>, Option<String>, i64, i64) {
    let mut conn = db.conn().await;
    sqlx::query_as(
        "SELECT lease_id, lease_owner, leased_from, leased_to
           FROM queen.partition_consumers
          WHERE partition_id = $1 AND consumer_group = $2",
    )
    .bind(partition_id)
    .bind(QUEUE_MODE)
    .fetch_one(&mut conn)
    .await
    .expect("the group's row")
}

fn job(queue: &str, partition_id: i64, want: i64) -> ClaimJob {
    ClaimJob {
        queue: queue.to_string(),
        group: QUEUE_MODE.to_string(),
        lease: Uuid::now_v7(),
        want,
        partition_id,
        held: None,
    }
}

#[actix_web::test]
async fn claims_run_together_are_each_decided_as_alone() {
    let db = fresh_db().await;
    // The acks below must leave their partitions free for the claims this test sends: no
    // lease is claimed ahead for a next pop (`storage::consume::ahead`, tested in `consume_ahead`).
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_AHEAD_MS", "0")])).await;
    for p in ["p0", "p1", "p2", "p3"] {
        push_n(&app, "q", p, 0, 3).await;
    }
    // One message of each partition consumed (four leases at once, so four partitions): every
    // row exists, free, with two messages left.
    let mut replies = Vec::new();
    for _ in 0..4 {
        let reply = pop(&app, "q", "batch=1").await;
        assert_eq!(messages(&reply).len(), 1);
        replies.push(reply);
    }
    for reply in &replies {
        let acked = ack_all(&app, reply, "completed", None).await;
        assert!(all_succeeded(&acked), "{acked}");
    }
    let ids = partition_ids(&db, "q").await;
    let mut conn = db.conn().await;
    // p2's lease is live (another consumer holds it).
    let held = Uuid::now_v7();
    sqlx::query(
        "UPDATE queen.partition_consumers
            SET lease_id = $2, lease_expires_at = now() + interval '1 minute'
          WHERE partition_id = $1",
    )
    .bind(ids["p2"])
    .bind(held)
    .execute(&mut conn)
    .await
    .expect("updates");

    let pool = sqlx::PgPool::connect(&db.url).await.expect("connects");
    // One worker, and every claim sent before it runs: one group, one statement.
    let group = ClaimGroup::start(
        pool,
        "broker-test".to_string(),
        1,
        std::time::Duration::from_secs(30),
    );
    let (twin_a, twin_b, p1, p2, p3) = (
        job("q", ids["p0"], 10),
        job("q", ids["p0"], 10),
        job("q", ids["p1"], 1),
        job("q", ids["p2"], 10),
        job("other", ids["p3"], 10),
    );
    let (a, b, one, live, elsewhere) = futures_util::join!(
        group.claim(twin_a.clone()),
        group.claim(twin_b.clone()),
        group.claim(p1.clone()),
        group.claim(p2),
        group.claim(p3),
    );
    let (a, b) = (a.expect("ran"), b.expect("ran"));
    assert_eq!(
        usize::from(!a.is_empty()) + usize::from(!b.is_empty()),
        1,
        "one of two claims of the same row takes it"
    );
    let winner = if a.is_empty() { &twin_b } else { &twin_a };
    assert_eq!(
        lease_of(&db, ids["p0"]).await,
        (Some(winner.lease), Some("broker-test".to_string()), 1, 3),
        "p0 leased from its committed offset to its end"
    );
    assert!(!one.expect("ran").is_empty());
    assert_eq!(
        lease_of(&db, ids["p1"]).await,
        (Some(p1.lease), Some("broker-test".to_string()), 1, 2),
        "p1 leased for the one message asked"
    );
    assert!(live.expect("ran").is_empty(), "a live lease is not taken");
    assert_eq!(lease_of(&db, ids["p2"]).await.0, Some(held));
    assert!(
        elsewhere.expect("ran").is_empty(),
        "a partition of another queue is not taken"
    );
    assert_ne!(
        lease_of(&db, ids["p3"]).await.1.as_deref(),
        Some("broker-test")
    );
}

#[actix_web::test]
async fn consumers_claiming_together_get_every_message_once_in_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    const PARTITIONS: i64 = 8;
    const EACH: i64 = 30;
    for p in 0..PARTITIONS {
        push_n(&app, "q", &format!("p{p}"), p * 1000, EACH).await;
    }
    // Eight consumers popping and acking small batches: each ack hands its partition off, and
    // the next pops claim those hand-offs at the same time.
    let consumer = || async {
        let mut got: Vec<i64> = Vec::new();
        let mut empty = 0;
        while empty < 3 {
            let reply = pop(&app, "q", "batch=4").await;
            if reply.status == 204 {
                empty += 1;
                continue;
            }
            empty = 0;
            got.extend(ns(&reply));
            let acked = ack_all(&app, &reply, "completed", None).await;
            assert!(all_succeeded(&acked), "{acked}");
        }
        got
    };
    let all = futures_util::future::join_all((0..8).map(|_| consumer())).await;
    assert_each_once_in_order(&all, PARTITIONS, EACH);
}
