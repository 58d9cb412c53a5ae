//! Fast acks grouped into shared commits (`storage::consume::ack_group`): many consumers' acks applied
//! by one statement each, every one exactly once, and a plan that a concurrent one already
//! applied never applied again.

use queen_broker::storage::consume::ack_group::AckGroup;
use queen_broker::storage::consume::acks::{self, Ack, AckStatus};
use queen_broker::storage::consume::QUEUE_MODE;
use serde_json::Value;
use uuid::Uuid;

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, TestDb};

/// The committed offset of every partition of `queue` for `group`, by partition name.
async fn committed(db: &TestDb, queue: &str, group: &str) -> Vec<(String, i64)> {
    let mut conn = db.conn().await;
    sqlx::query_as(
        "SELECT p.name, c.committed_offset
           FROM queen.partition_consumers c
           JOIN queen.partitions p ON p.id = c.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1 AND c.consumer_group = $2
          ORDER BY p.name",
    )
    .bind(queue)
    .bind(group)
    .fetch_all(&mut conn)
    .await
    .expect("reads")
}

#[actix_web::test]
async fn sixteen_consumers_acking_at_once_each_commit_exactly_their_range() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..16 {
        push_n(&app, "q", &format!("p{p:02}"), p * 100, 10).await;
    }
    // Sixteen pops, one partition each (a pop takes one partition).
    let mut popped = Vec::new();
    for _ in 0..16 {
        popped.push(pop(&app, "q", "batch=10").await);
    }
    assert!(popped.iter().all(|r| messages(r).len() == 10));
    let answers =
        futures_util::future::join_all(popped.iter().map(|r| ack_all(&app, r, "completed", None)))
            .await;
    for answer in &answers {
        let items = answer.as_array().expect("array");
        assert_eq!(items.len(), 10);
        assert!(items.iter().all(|i| i["success"] == true), "{answer}");
        // The last item of each batch says the lease ended with it.
        assert_eq!(items[9]["leaseReleased"], true, "{answer}");
    }
    let offsets = committed(&db, "q", QUEUE_MODE).await;
    assert_eq!(offsets.len(), 16);
    assert!(offsets.iter().all(|(_, c)| *c == 10), "{offsets:?}");
    // The same acks again: the leases are gone, so the general path refuses them.
    let again = ack_all(&app, &popped[0], "completed", None).await;
    assert!(
        again
            .as_array()
            .expect("array")
            .iter()
            .all(|i| i["success"] == false),
        "{again}"
    );
    assert!(pop(&app, "q", "batch=10").await.status == 204);
}

#[actix_web::test]
async fn a_plan_applied_once_is_not_applied_again_by_its_twins() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 5).await;
    let reply = pop(&app, "q", "batch=5").await;
    let list: Vec<Ack> = messages(&reply)
        .iter()
        .enumerate()
        .map(|(index, m): (usize, &Value)| Ack {
            index,
            partition: Uuid::parse_str(m["partitionId"].as_str().expect("id")).expect("uuid"),
            partition_number: None,
            transaction_id: m["transactionId"].as_str().expect("txn").to_string(),
            status: AckStatus::Completed,
            group: QUEUE_MODE.to_string(),
            lease_id: m["leaseId"].as_str().map(str::to_string),
            error: None,
        })
        .collect();
    let plan = acks::plan_completed_fast(&app.broker.state.cache, &list)
        .expect("decodes")
        .expect("the common ack");
    assert_eq!((plan.ack.from, plan.ack.end, plan.ack.to), (0, 5, 5));
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connects");
    let group = AckGroup::start(pool, 2, std::time::Duration::from_secs(30));
    // Three copies at once: in one statement (the twins are refused before it) or in several
    // (the offset has moved): applied exactly once either way.
    let (a, b, c) = futures_util::join!(
        group.apply(plan.ack.clone()),
        group.apply(plan.ack.clone()),
        group.apply(plan.ack.clone())
    );
    let applied: Vec<bool> = [a, b, c]
        .into_iter()
        .flatten()
        .map(|applied| applied.released)
        .collect();
    assert_eq!(applied, vec![true], "one applied, releasing the lease");
    assert_eq!(
        committed(&db, "q", QUEUE_MODE).await,
        vec![("p".to_string(), 5)]
    );
}

/// The acks of every message of `reply` (all `completed`), as the ack routes read them.
fn completed_acks(reply: &crate::support::Reply) -> Vec<Ack> {
    messages(reply)
        .iter()
        .enumerate()
        .map(|(index, m)| Ack {
            index,
            partition: m["partitionId"].as_str().unwrap().parse().unwrap(),
            partition_number: None,
            transaction_id: m["transactionId"].as_str().unwrap().to_string(),
            status: AckStatus::Completed,
            group: m["consumerGroup"].as_str().unwrap().to_string(),
            lease_id: m["leaseId"].as_str().map(str::to_string),
            error: None,
        })
        .collect()
}

/// A pop of three partitions under one lease and its batch ack, with the segment cache of
/// `cache_bytes` (`"0"`: none, so every ack takes the general path): the ack's answer with the
/// transaction ids left out, and the committed offsets after it.
async fn multi_partition_ack(cache_bytes: &str) -> (Value, Vec<(String, i64)>, usize) {
    let db = fresh_db().await;
    let app = crate::support::spawn_app_with(crate::support::test_settings(
        &db,
        &[("QUEEN_SEGMENT_CACHE_BYTES", cache_bytes)],
    ))
    .await;
    for (p, n) in [("a", 2), ("b", 3), ("c", 1)] {
        push_n(&app, "q", p, 0, n).await;
    }
    let reply = pop(&app, "q", "batch=100&partitions=3").await;
    assert_eq!(reply.body["partitionsClaimed"], 3, "{:?}", reply.body);
    let plans =
        acks::plan_completed_fast_by_partition(&app.broker.state.cache, &completed_acks(&reply))
            .unwrap()
            .map_or(0, |plans| plans.len());
    let mut answer = ack_all(&app, &reply, "completed", None).await;
    for item in answer.as_array_mut().unwrap() {
        item.as_object_mut().unwrap().remove("transactionId");
    }
    (answer, committed(&db, "q", QUEUE_MODE).await, plans)
}

#[actix_web::test]
async fn the_batch_ack_of_a_multi_partition_lease_is_grouped_and_answers_as_the_general_path() {
    let (fast, fast_committed, plans) = multi_partition_ack("8388608").await;
    assert_eq!(plans, 3, "one plan per partition of the lease");
    let (general, general_committed, none) = multi_partition_ack("0").await;
    assert_eq!(none, 0, "without a cache nothing is planned");
    assert_eq!(fast, general);
    assert_eq!(fast_committed, general_committed);
    assert_eq!(
        fast_committed,
        vec![("a".into(), 2), ("b".into(), 3), ("c".into(), 1)]
    );
    // Each partition's lease ends with its last ack.
    let released: Vec<bool> = fast
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["leaseReleased"] == true)
        .collect();
    assert_eq!(released.iter().filter(|r| **r).count(), 3, "{fast}");
}

#[actix_web::test]
async fn a_partition_whose_plan_does_not_apply_is_decided_by_the_general_path_alone() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "a", 0, 2).await;
    push_n(&app, "q", "b", 0, 2).await;
    let reply = pop(&app, "q", "batch=100&partitions=2").await;
    assert_eq!(reply.body["partitionsClaimed"], 2);
    // Partition b's lease runs out before the ack: its plan is not applied.
    db.exec(
        "UPDATE queen.partition_consumers c
            SET lease_expires_at = now() - interval '1 second'
           FROM queen.partitions p
          WHERE p.id = c.partition_id AND p.name = 'b'",
    )
    .await;
    let answer = ack_all(&app, &reply, "completed", None).await;
    for (m, r) in messages(&reply).iter().zip(answer.as_array().unwrap()) {
        assert_eq!(r["transactionId"], m["transactionId"], "in request order");
        if m["partition"] == "a" {
            assert_eq!(r["success"], true, "{r}");
        } else {
            assert_eq!(r["success"], false, "{r}");
            assert_eq!(r["error"], "Invalid or expired lease");
        }
    }
    assert_eq!(
        committed(&db, "q", QUEUE_MODE).await,
        vec![("a".into(), 2), ("b".into(), 0)]
    );
}
