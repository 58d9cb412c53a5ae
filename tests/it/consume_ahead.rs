//! Leases claimed ahead of the next pop (`storage::consume::ahead`): an ack that ends its lease claims
//! the group's next hand-off while it commits, and the consumer's next pop delivers that lease
//! without a claim of its own; a lease no pop takes within the hold is released, and another
//! broker then serves its messages; a pop asking for another batch does not take it; and
//! consumers on two brokers popping and acking at once still get every message once, in order.

use std::time::Duration;

use queen_broker::storage::consume::QUEUE_MODE;
use uuid::Uuid;

use crate::support::consuming::*;
use crate::support::{eventually, fresh_db, spawn_app_with, test_settings, Reply, TestApp, TestDb};

/// The live lease of the queue-mode row of `partition`: id and owner (`None`: no live lease).
async fn live_lease(db: &TestDb, partition: &str) -> Option<(Uuid, String)> {
    let mut conn = db.conn().await;
    sqlx::query_as(
        "SELECT c.lease_id, c.lease_owner
           FROM queen.partition_consumers c
           JOIN queen.partitions p ON p.id = c.partition_id
          WHERE p.name = $1 AND c.consumer_group = $2 AND c.lease_expires_at > now()",
    )
    .bind(partition)
    .bind(QUEUE_MODE)
    .fetch_optional(&mut conn)
    .await
    .expect("reads")
}

/// The partition and lease of a pop reply's messages.
fn partition_and_lease(reply: &Reply) -> (String, String) {
    let m = &messages(reply)[0];
    (
        m["partition"].as_str().expect("partition").to_string(),
        m["leaseId"].as_str().expect("leaseId").to_string(),
    )
}

/// Two partitions of three messages; one message of each popped (batch 1) and both acked,
/// the second ack after the first released its partition with messages left. That release is
/// the hand-off the second ack claims ahead. Returns the partition of the first pop (the one
/// claimed ahead).
async fn ack_after_a_release(app: &TestApp) -> String {
    push_n(app, "q", "a", 0, 3).await;
    push_n(app, "q", "b", 100, 3).await;
    let first = pop(app, "q", "batch=1").await;
    let second = pop(app, "q", "batch=1").await;
    let (p1, _) = partition_and_lease(&first);
    let (p2, _) = partition_and_lease(&second);
    assert_ne!(p1, p2, "the second pop takes the other partition");
    assert!(all_succeeded(
        &ack_all(app, &first, "completed", None).await
    ));
    assert!(all_succeeded(
        &ack_all(app, &second, "completed", None).await
    ));
    p1
}

/// Waits until `app` holds one lease claimed ahead (its lease is in PostgreSQL a moment
/// before the broker's book holds it) and returns it: the live lease of `partition`, owned by
/// `app`.
async fn claimed_ahead(app: &TestApp, db: &TestDb, partition: &str) -> Uuid {
    eventually(Duration::from_secs(5), "a lease claimed ahead", || async {
        (app.broker.state.ahead.waiting("q", QUEUE_MODE) == 1).then_some(())
    })
    .await;
    let (lease, owner) = live_lease(db, partition)
        .await
        .expect("the released partition leased ahead");
    assert_eq!(owner, app.broker.state.broker_id);
    lease
}

/// A broker on `db` holding leases claimed ahead for `hold_ms`.
async fn broker(db: &TestDb, hold_ms: &str) -> TestApp {
    spawn_app_with(test_settings(db, &[("QUEEN_POP_AHEAD_MS", hold_ms)])).await
}

#[actix_web::test]
async fn the_next_pop_delivers_the_lease_an_ack_claimed_ahead() {
    let db = fresh_db().await;
    let app = broker(&db, "30000").await;
    let ahead_partition = ack_after_a_release(&app).await;
    let lease = claimed_ahead(&app, &db, &ahead_partition).await;

    let next = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&next).len(), 1);
    let (partition, lease_id) = partition_and_lease(&next);
    assert_eq!(partition, ahead_partition);
    assert_eq!(
        lease_id,
        lease.to_string(),
        "the pop hands out the lease claimed ahead"
    );
    assert_eq!(app.broker.state.ahead.waiting("q", QUEUE_MODE), 0);
    let acked = ack_all(&app, &next, "completed", None).await;
    assert!(all_succeeded(&acked), "the lease acks as any: {acked}");
    let counts = app.broker.state.ahead.counts();
    assert!(counts.claimed >= 1 && counts.taken >= 1, "{counts:?}");
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    assert!(
        text.contains(&format!(
            "queen_pop_leases_ahead_total{{outcome=\"taken\"}} {}",
            counts.taken
        )),
        "{text}"
    );
}

#[actix_web::test]
async fn a_lease_claimed_ahead_that_no_pop_takes_is_released_for_any_broker() {
    let db = fresh_db().await;
    let app = broker(&db, "300").await;
    let ahead_partition = ack_after_a_release(&app).await;
    claimed_ahead(&app, &db, &ahead_partition).await;
    // A pop asking for another batch leaves it (its range was claimed for batch 1): it gets
    // the other partition.
    let other = pop(&app, "q", "batch=5").await;
    let (partition, _) = partition_and_lease(&other);
    assert_ne!(partition, ahead_partition);
    assert_eq!(app.broker.state.ahead.waiting("q", QUEUE_MODE), 1);

    eventually(
        Duration::from_secs(5),
        "the lease nobody took released",
        || async {
            live_lease(&db, &ahead_partition)
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(app.broker.state.ahead.counts().released, 1);
    // Another broker (which claims nothing ahead) serves the two messages left there.
    let second = broker(&db, "0").await;
    let reply = pop_partition(&second, "q", &ahead_partition, "batch=5").await;
    assert_eq!(ns(&reply).len(), 2, "{:?}", reply.body);
}

#[actix_web::test]
async fn consumers_on_two_brokers_claiming_ahead_get_every_message_once_in_order() {
    let db = fresh_db().await;
    let brokers = [broker(&db, "50").await, broker(&db, "50").await];
    const PARTITIONS: i64 = 8;
    const EACH: i64 = 40;
    for p in 0..PARTITIONS {
        push_n(&brokers[0], "q", &format!("p{p}"), p * 1000, EACH).await;
    }
    // Four consumers per broker, long-polling and acking small batches: nearly every ack
    // claims ahead, and the claims of two brokers race for the same partitions.
    let consumer = |app: &'static TestApp| async move {
        let mut got: Vec<i64> = Vec::new();
        loop {
            let reply = pop(app, "q", "batch=3&wait=true&timeout=1000").await;
            if reply.status == 204 {
                break;
            }
            got.extend(ns(&reply));
            let acked = ack_all(app, &reply, "completed", None).await;
            assert!(all_succeeded(&acked), "{acked}");
        }
        got
    };
    let brokers: &'static [TestApp; 2] = Box::leak(Box::new(brokers));
    let all = futures_util::future::join_all((0..8).map(|n| consumer(&brokers[n % 2]))).await;
    assert_each_once_in_order(&all, PARTITIONS, EACH);
    let taken: u64 = brokers
        .iter()
        .map(|b| b.broker.state.ahead.counts().taken)
        .sum();
    assert!(taken > 0, "some pops delivered leases claimed ahead");
}

#[actix_web::test]
async fn a_stopping_broker_releases_what_it_claimed_ahead() {
    let db = fresh_db().await;
    let app = broker(&db, "30000").await;
    let ahead_partition = ack_after_a_release(&app).await;
    claimed_ahead(&app, &db, &ahead_partition).await;
    // What `app::run` does once the server stopped.
    app.broker.state.ahead.release_all().await;
    assert_eq!(live_lease(&db, &ahead_partition).await, None);
    assert_eq!(app.broker.state.ahead.waiting("q", QUEUE_MODE), 0);
    // Nothing more is claimed ahead: the next pop claims for itself and gets a fresh lease.
    let next = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&next).len(), 1);
    assert!(all_succeeded(
        &ack_all(&app, &next, "completed", None).await
    ));
    assert_eq!(app.broker.state.ahead.counts().claimed, 1);
}
