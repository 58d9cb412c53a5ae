//! Hand-offs (`storage::consume::handoff`): an ack that releases a lease with messages left behind
//! hands the partition to the next pop of the queue and group on this broker, which claims it
//! by its id. The hand-off is only a hint: PostgreSQL still decides whether the lease is free,
//! what waits and what the queue's options allow. Proven here: the next pop takes the
//! partition from where the ack left it; a hand-off another broker made stale claims nothing;
//! a lease that ran out is served while hand-offs keep coming; a queue whose options the
//! one-statement pop leaves to the full pop is not served through a hand-off; a partition
//! written by this or another broker is offered to the groups that pop its queue here; a
//! long-poll woken while nothing is handed off still gets a lease that ran out.

use crate::support::consuming::*;
use std::time::{Duration, Instant};

use crate::support::{eventually, fresh_db, spawn_app_with, test_settings, Reply, TestApp, TestDb};
use queen_broker::storage::consume::handoff::ONE_STATEMENT_EVERY;
use queen_broker::storage::consume::QUEUE_MODE;
use queen_broker::storage::segments::cache::FULL_SCAN_EVERY;

fn waiting(app: &TestApp) -> usize {
    app.broker.state.handoffs.waiting("q", QUEUE_MODE)
}

/// Acks every message of `reply` as completed; every ack must succeed.
async fn ack_ok(app: &TestApp, reply: &Reply) {
    let acked = ack_all(app, reply, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
}

/// A pop of `q` that finds nothing (`why`), made again until one surely tried the hand-offs
/// waiting. A queue-level pop runs the full pop instead of the one-statement pop once per
/// [`FULL_SCAN_EVERY`] per broker and group (`storage::consume::look`), and the full pop reads
/// no hand-off: it leaves them waiting for the next pop, which tries them. On a loaded machine
/// the steps before a pop can outlast that interval (a CI run once read one hand-off still
/// waiting after such a pop). The turn is taken here just before each pop, so a pop answered
/// within the interval cannot have been the full pop's; a slower one is made again.
async fn pop_nothing_trying_hand_offs(app: &TestApp, query: &str, why: &str) {
    for _ in 0..20 {
        let started = Instant::now();
        app.broker.state.cache.full_scan_due("q", QUEUE_MODE);
        assert_eq!(pop(app, "q", query).await.status, 204, "{why}");
        if started.elapsed() < FULL_SCAN_EVERY {
            return;
        }
    }
    panic!("no pop came back within {FULL_SCAN_EVERY:?} of taking the full pop's turn");
}

/// A broker whose acks hand partitions off but claim nothing ahead (`QUEEN_POP_AHEAD_MS=0`):
/// a claim ahead races the hand-off these tests count (tests/it/consume_ahead.rs covers it).
async fn without_claims_ahead(db: &TestDb) -> TestApp {
    spawn_app_with(test_settings(db, &[("QUEEN_POP_AHEAD_MS", "0")])).await
}

/// A broker with a consumer subscribed to `q` and `n` messages in partition `p`.
async fn subscribed_with(db: &TestDb, n: i64) -> TestApp {
    let app = without_claims_ahead(db).await;
    assert_eq!(pop(&app, "q", "batch=2").await.status, 204);
    push_n(&app, "q", "p", 0, n).await;
    // The commit's NOTIFY offers the partition to the group popping here. Waiting for that
    // offer before the first pop keeps a late one from counting as a hand-off (it came once
    // after the pop on a loaded machine, and the count after the pop read 1).
    eventually(Duration::from_secs(5), "the write offered", || async {
        (waiting(&app) == 1).then_some(())
    })
    .await;
    app
}

#[actix_web::test]
async fn an_ack_that_leaves_messages_hands_the_partition_to_the_next_pop() {
    let db = fresh_db().await;
    let app = subscribed_with(&db, 5).await;
    let first = pop(&app, "q", "batch=2").await;
    assert_eq!(ns(&first), vec![0, 1]);
    assert_eq!(waiting(&app), 0);
    ack_ok(&app, &first).await;
    assert_eq!(waiting(&app), 1, "released with 2..4 left: handed off");

    let second = pop(&app, "q", "batch=2").await;
    assert_eq!(ns(&second), vec![2, 3]);
    assert_ne!(second.body["leaseId"], first.body["leaseId"]);
    ack_ok(&app, &second).await;
    let last = pop(&app, "q", "batch=2").await;
    assert_eq!(ns(&last), vec![4]);
    ack_ok(&app, &last).await;
    assert_eq!(pop(&app, "q", "batch=2").await.status, 204);
}

#[actix_web::test]
async fn a_hand_off_another_broker_made_stale_claims_nothing() {
    let db = fresh_db().await;
    let here = subscribed_with(&db, 4).await;
    let there = without_claims_ahead(&db).await;
    let first = pop(&here, "q", "batch=2").await;
    assert_eq!(ns(&first), vec![0, 1]);
    ack_ok(&here, &first).await;
    assert_eq!(waiting(&here), 1);

    // The other broker takes the partition first; the hand-off here is now stale.
    let taken = pop(&there, "q", "batch=2").await;
    assert_eq!(ns(&taken), vec![2, 3]);
    assert_eq!(waiting(&here), 1);
    pop_nothing_trying_hand_offs(
        &here,
        "batch=2",
        "the lease is held elsewhere: nothing for this broker",
    )
    .await;
    assert_eq!(waiting(&here), 0, "tried and dropped");
    ack_ok(&there, &taken).await;
    assert_eq!(pop(&here, "q", "batch=2").await.status, 204);
}

#[actix_web::test]
async fn a_lease_that_ran_out_is_served_while_hand_offs_keep_coming() {
    let db = fresh_db().await;
    let app = subscribed_with(&db, 4 * ONE_STATEMENT_EVERY as i64 + 6).await;
    let first = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&first), vec![0]);
    ack_ok(&app, &first).await;
    assert_eq!(waiting(&app), 1);
    push_n(&app, "q", "stuck", 0, 1).await;
    // Its write offers `stuck` too; only the hand-offs of `p` may be left, so that nothing
    // but the one-statement pop can find the lease that runs out. The claim below drops the
    // offer (a pop that holds the partition has no use for it).
    eventually(
        Duration::from_secs(5),
        "the write of stuck offered",
        || async { (waiting(&app) == 2).then_some(()) },
    )
    .await;
    let stuck = pop_partition(&app, "q", "stuck", "batch=1").await;
    assert_eq!(ns(&stuck), vec![0]);
    assert_eq!(waiting(&app), 1, "the claim of stuck dropped its offer");
    let stuck_id = partition_id(&db, "stuck").await;
    db.exec(&format!(
        "UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'
          WHERE partition_id = {stuck_id}"
    ))
    .await;

    // Every ack of `p` hands it off again; within ONE_STATEMENT_EVERY pops the one-statement
    // pop runs and takes the lease that ran out first. Only pops that certainly were not the
    // full pop count (its turn taken just before, the pop back within FULL_SCAN_EVERY): on a
    // loaded machine every pop can outlast the turn.
    let mut redelivered = false;
    let (mut counted, mut tries) = (0, 0);
    while counted <= ONE_STATEMENT_EVERY && tries < 4 * (ONE_STATEMENT_EVERY + 1) {
        tries += 1;
        let started = Instant::now();
        app.broker.state.cache.full_scan_due("q", QUEUE_MODE);
        let reply = pop(&app, "q", "batch=1").await;
        if started.elapsed() < FULL_SCAN_EVERY {
            counted += 1;
        }
        let partition = messages(&reply)[0]["partition"].clone();
        ack_ok(&app, &reply).await;
        if partition == "stuck" {
            redelivered = true;
            break;
        }
        assert_eq!(partition, "p");
    }
    assert!(
        redelivered,
        "the lease that ran out waited behind the hand-offs"
    );
}

#[actix_web::test]
async fn a_queue_turned_to_delayed_processing_is_not_served_through_a_hand_off() {
    let db = fresh_db().await;
    let app = subscribed_with(&db, 4).await;
    let first = pop(&app, "q", "batch=2").await;
    assert_eq!(ns(&first), vec![0, 1]);
    ack_ok(&app, &first).await;
    assert_eq!(waiting(&app), 1);

    // Messages 2 and 3 were written just now: an hour's delay holds them back.
    db.exec("UPDATE queen.queues SET delayed_processing = 3600 WHERE name = 'q'")
        .await;
    assert_eq!(pop(&app, "q", "batch=2").await.status, 204);
    // A look that tries the hand-off (the first may have been the full pop's, which reads
    // none) is held back too, and leaves no hand-off behind.
    pop_nothing_trying_hand_offs(&app, "batch=2", "held back").await;
    assert_eq!(waiting(&app), 0);
}

#[actix_web::test]
async fn a_partition_written_by_any_broker_is_offered_to_the_groups_popping_here() {
    let db = fresh_db().await;
    let here = subscribed_with(&db, 1).await;
    let there = without_claims_ahead(&db).await;
    let first = pop(&here, "q", "batch=10").await;
    assert_eq!(ns(&first), vec![0]);
    ack_ok(&here, &first).await;
    assert_eq!(waiting(&here), 0, "nothing left behind");

    // Another broker writes a partition: its commit's NOTIFY names the partition's id, and
    // this broker offers it to the group that pops `q` here.
    push_n(&there, "q", "w", 0, 3).await;
    eventually(Duration::from_secs(5), "the write offered", || async {
        (waiting(&here) == 1).then_some(())
    })
    .await;
    let w = pop(&here, "q", "batch=10").await;
    assert_eq!(ns(&w), vec![0, 1, 2]);
    assert_eq!(messages(&w)[0]["partition"], "w");
    // The pop took the offer, or, when it was the full pop's turn, claimed the partition and
    // dropped the offer.
    assert_eq!(waiting(&here), 0, "taken");

    // Written while leased: the offer is tried and dropped, the messages wait for the ack,
    // which hands the partition on.
    push_n(&here, "q", "w", 3, 2).await;
    eventually(
        Duration::from_secs(5),
        "the second write offered",
        || async { (waiting(&here) == 1).then_some(()) },
    )
    .await;
    // A commit's NOTIFY can come late on a loaded machine (a CI run read one offer still
    // waiting after the pop that dropped the first), so pops are made until none waits: an
    // offer of a leased partition that a pop kept would keep this from ending.
    eventually(Duration::from_secs(5), "tried and dropped", || async {
        pop_nothing_trying_hand_offs(&here, "batch=10", "leased here").await;
        (waiting(&here) == 0).then_some(())
    })
    .await;
    ack_ok(&here, &w).await;
    assert_eq!(waiting(&here), 1, "released with 3..4 left");
    let rest = pop(&here, "q", "batch=10").await;
    assert_eq!(ns(&rest), vec![3, 4]);
    ack_ok(&here, &rest).await;
    assert_eq!(pop(&here, "q", "batch=10").await.status, 204);
}

/// Woken looks with nothing handed off skip the lists (at most one reads them every
/// `WOKEN_FULL_POP_EVERY`), and a long-poll's first look counts as woken; a lease that runs
/// out rings nothing and is only in the lists, so the long-poll must still get it at its
/// re-check.
#[actix_web::test]
async fn a_long_poll_woken_with_nothing_handed_off_still_gets_a_lease_that_ran_out() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_RECHECK_MS", "200")])).await;
    push_n(&app, "q", "p", 0, 1).await;
    let leased = pop(&app, "q", "batch=10").await;
    assert_eq!(ns(&leased), vec![0]);
    let p = partition_id(&db, "p").await;

    let waiting = async { pop(&app, "q", "batch=10&wait=true&timeout=10000").await };
    let meanwhile = async {
        db.exec(&format!(
            "UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'
              WHERE partition_id = {p}"
        ))
        .await;
    };
    let (reply, ()) = futures_util::join!(waiting, meanwhile);
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(messages(&reply)[0]["partition"], "p", "{:?}", reply.body);
    assert_eq!(ns(&reply), vec![0], "redelivered after the lease ran out");
}

/// A commit that writes more partitions than one notice can name hands off those the notice
/// names (with their ids) and wakes the queue's pops for the rest, which the lists serve.
#[actix_web::test]
async fn a_commit_too_large_for_one_notice_offers_what_it_names_and_the_rest_is_served() {
    let db = fresh_db().await;
    let app = subscribed_with(&db, 1).await;
    let first = pop(&app, "q", "batch=10").await;
    assert_eq!(ns(&first), vec![0]);
    ack_ok(&app, &first).await;
    assert_eq!(waiting(&app), 0);

    // 150 partitions with 200-character names: ≈ 35 kB of names, more than one notice holds.
    let long = "n".repeat(196);
    let items: Vec<serde_json::Value> = (0..150)
        .map(|i| serde_json::json!({"queue": "q", "partition": format!("{i:03}-{long}"), "payload": {"n": i}}))
        .collect();
    let reply = app.push(serde_json::json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let offered = eventually(Duration::from_secs(10), "partitions offered", || async {
        let n = waiting(&app);
        (n > 0).then_some(n)
    })
    .await;
    assert!(offered < 150, "{offered} named in one notice");

    let mut got = Vec::new();
    while got.len() < 150 {
        let reply = pop(&app, "q", "batch=10&wait=true&timeout=5000").await;
        assert_eq!(reply.status, 200, "after {} messages", got.len());
        got.extend(ns(&reply));
        ack_ok(&app, &reply).await;
    }
    got.sort_unstable();
    assert_eq!(got, (0..150).collect::<Vec<i64>>());
}
