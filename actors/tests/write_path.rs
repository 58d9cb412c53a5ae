//! The write path's actors against a fake store (no PostgreSQL): group commit in a partition
//! actor, the committer pool's fill-then-spill routing and its group commit, the idle stop racing
//! a push, a failed commit going to the spool, and backpressure. Every wait is on an event (a
//! commit starting, an answer arriving), never on time.

#[allow(dead_code)] // support is shared with isolation, which uses other parts of it
mod support;

use std::time::Duration;

use actix::prelude::*;
use broker_actors::committer::{Committer, CommitterLimits, CommitterPool, SegmentReady, Serial};
use broker_actors::error::PushError;
use broker_actors::partition::{IdleCheck, PartitionLimits, Push};
use broker_actors::registry::{Registry, RETRY_AFTER};
use broker_actors::spool::{list_files, record, SpoolHandle};
use broker_actors::store::SegmentWrite;
use broker_actors::{PartitionKey, Verdict};
use support::{committer, gated_store, item, items, open_store, seg, FakeStore, TempSpool};
use tokio::sync::oneshot;

/// A registry on the current arbiter, writing through one committer over `store`.
fn registry(store: FakeStore, limits: PartitionLimits, spool: Option<SpoolHandle>) -> Registry {
    let pool = CommitterPool::new(
        vec![committer(0, store, CommitterLimits::default())],
        usize::MAX,
    );
    Registry::new(vec![Arbiter::current()], pool, limits, spool)
}

/// Hands `payloads` straight to a partition actor; resolves once the actor holds them (its
/// answer to the message), with the receiver of their verdicts.
async fn hand_over(
    addr: &Addr<broker_actors::partition::PartitionActor>,
    payloads: &[&str],
) -> oneshot::Receiver<broker_actors::partition::GroupResult> {
    let (reply, verdicts) = oneshot::channel();
    let taken = addr
        .send(Push {
            items: items(payloads),
            reply,
        })
        .await
        .expect("the actor is alive");
    assert!(taken.is_ok(), "the actor took the push: {taken:?}");
    verdicts
}

#[actix::test]
async fn pushes_arriving_while_a_write_is_in_flight_leave_together_as_one_segment_in_order() {
    let (store, mut probe) = gated_store();
    let registry = registry(store, PartitionLimits::default(), None);
    let key = PartitionKey::new("q", "p");

    let first = actix::spawn({
        let (registry, key) = (registry.clone(), key.clone());
        async move { registry.push(&key, items(&["a"])).await }
    });
    assert_eq!(probe.next_commit().await, vec![seg(&key, &["a"])]);

    // Three requests arrive while "a" is being committed.
    let addr = registry.actor(&key);
    let b = hand_over(&addr, &["b1", "b2"]).await;
    let c = hand_over(&addr, &["c"]).await;
    let d = hand_over(&addr, &["d1", "d2"]).await;

    probe.release(2);
    assert_eq!(first.await.unwrap().unwrap(), vec![Verdict::Queued]);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key, &["b1", "b2", "c", "d1", "d2"])],
        "one segment, in arrival order"
    );
    assert_eq!(b.await.unwrap().unwrap(), vec![Verdict::Queued; 2]);
    assert_eq!(c.await.unwrap().unwrap(), vec![Verdict::Queued; 1]);
    assert_eq!(d.await.unwrap().unwrap(), vec![Verdict::Queued; 2]);
    assert_eq!(probe.commits().len(), 2);
}

#[actix::test]
async fn a_segment_takes_whole_requests_up_to_the_item_limit() {
    let (store, mut probe) = gated_store();
    let limits = PartitionLimits {
        max_segment_items: 3,
        ..PartitionLimits::default()
    };
    let registry = registry(store, limits, None);
    let key = PartitionKey::new("q", "p");
    let addr = registry.actor(&key);

    let a = hand_over(&addr, &["a"]).await;
    assert_eq!(probe.next_commit().await, vec![seg(&key, &["a"])]);
    let b = hand_over(&addr, &["b1", "b2"]).await;
    let c = hand_over(&addr, &["c1", "c2"]).await; // would make 4: waits for the next segment
    let d = hand_over(&addr, &["d1", "d2", "d3", "d4"]).await; // alone, over the limit: whole
    probe.release(4);
    assert_eq!(probe.next_commit().await, vec![seg(&key, &["b1", "b2"])]);
    assert_eq!(probe.next_commit().await, vec![seg(&key, &["c1", "c2"])]);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key, &["d1", "d2", "d3", "d4"])]
    );
    for (answer, n) in [(a, 1), (b, 2), (c, 2), (d, 4)] {
        assert_eq!(answer.await.unwrap().unwrap(), vec![Verdict::Queued; n]);
    }
}

/// Hands a segment of `n` items of partition `name` to the pool; the receiver gets its outcome.
fn submit(
    pool: &CommitterPool,
    name: &str,
    n: usize,
) -> oneshot::Receiver<broker_actors::committer::SegmentResult> {
    let (reply, outcome) = oneshot::channel();
    let payloads: Vec<String> = (0..n).map(|i| format!("{name}{i}")).collect();
    pool.submit(SegmentReady {
        write: SegmentWrite {
            key: PartitionKey::new("q", name),
            partition_id: None,
            items: payloads.iter().map(|p| item(p)).collect(),
        },
        reply,
    });
    outcome
}

#[actix::test]
async fn the_pool_fills_one_committer_before_the_next_one_starts() {
    let (first_store, mut first) = gated_store();
    let (second_store, mut second) = gated_store();
    let pool = CommitterPool::new(
        vec![
            committer(0, first_store, CommitterLimits::default()),
            committer(1, second_store, CommitterLimits::default()),
        ],
        3,
    );
    let key = |name: &str| PartitionKey::new("q", name);

    let s1 = submit(&pool, "s1-", 2); // first: 0 < 3
    assert_eq!(
        first.next_commit().await,
        vec![seg(&key("s1-"), &["s1-0", "s1-1"])]
    );
    let s2 = submit(&pool, "s2-", 1); // first: 2 < 3, waits behind its transaction
    let s3 = submit(&pool, "s3-", 1); // first holds 3: spills to the second
    assert_eq!(
        second.next_commit().await,
        vec![seg(&key("s3-"), &["s3-0"])]
    );
    let s4 = submit(&pool, "s4-", 2); // second: 1 < 3
    let s5 = submit(&pool, "s5-", 1); // both hold 3: the least loaded, the first
    assert_eq!(pool.backlog(), 7);

    first.release(2);
    second.release(2);
    assert_eq!(
        first.next_commit().await,
        vec![seg(&key("s2-"), &["s2-0"]), seg(&key("s5-"), &["s5-0"])],
        "segments waiting behind a transaction leave together in the next one"
    );
    assert_eq!(
        second.next_commit().await,
        vec![seg(&key("s4-"), &["s4-0", "s4-1"])]
    );
    for (outcome, n) in [(s1, 2), (s2, 1), (s3, 1), (s4, 2), (s5, 1)] {
        let outcome = outcome.await.unwrap().expect("committed");
        assert_eq!(outcome.verdicts, vec![Verdict::Queued; n]);
    }
    assert_eq!(pool.backlog(), 0, "every answered item left the counters");

    // Under light load everything goes to the first committer again.
    let s6 = submit(&pool, "s6-", 1);
    first.release(1);
    assert_eq!(first.next_commit().await, vec![seg(&key("s6-"), &["s6-0"])]);
    assert!(s6.await.unwrap().is_ok());
    assert_eq!(second.commits().len(), 2);
}

#[actix::test]
async fn while_serialized_nothing_spills_and_the_waiting_segments_leave_together() {
    let (first_store, mut first) = gated_store();
    let (second_store, second) = gated_store();
    let pool = CommitterPool::new(
        vec![
            committer(0, first_store, CommitterLimits::default()),
            committer(1, second_store, CommitterLimits::default()),
        ],
        3,
    );
    let key = |name: &str| PartitionKey::new("q", name);
    assert!(pool.spills());
    pool.serialize_for(
        std::time::Duration::from_secs(60),
        std::time::Duration::ZERO,
    );
    assert!(!pool.spills());

    let s1 = submit(&pool, "s1-", 3);
    assert_eq!(
        first.next_commit().await,
        vec![seg(&key("s1-"), &["s1-0", "s1-1", "s1-2"])]
    );
    // The first committer holds 3 (its spill limit), and still takes the next two.
    let s2 = submit(&pool, "s2-", 2);
    let s3 = submit(&pool, "s3-", 1);
    first.release(3);
    assert_eq!(
        first.next_commit().await,
        vec![
            seg(&key("s2-"), &["s2-0", "s2-1"]),
            seg(&key("s3-"), &["s3-0"])
        ],
        "segments waiting behind the one transaction leave together in the next one"
    );
    for (outcome, n) in [(s1, 3), (s2, 2), (s3, 1)] {
        let outcome = outcome.await.unwrap().expect("committed");
        assert_eq!(outcome.verdicts, vec![Verdict::Queued; n]);
    }
    assert!(
        second.commits().is_empty(),
        "the second committer never started"
    );

    // A shorter period never cuts a longer one short; once over, the pool spills again.
    let (store, _probe) = gated_store();
    let pool = CommitterPool::new(vec![committer(2, store, CommitterLimits::default())], 3);
    pool.serialize_for(
        std::time::Duration::from_millis(30),
        std::time::Duration::ZERO,
    );
    pool.serialize_for(
        std::time::Duration::from_millis(1),
        std::time::Duration::ZERO,
    );
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert!(!pool.spills());
    std::thread::sleep(std::time::Duration::from_millis(40));
    assert!(pool.spills());
}

#[actix::test]
async fn while_serialized_with_a_rest_the_next_transaction_waits_for_it() {
    let serial = std::sync::Arc::new(Serial::default());
    let (store, mut probe) = open_store();
    let load = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addr = Committer::new(0, store, load.clone(), CommitterLimits::default())
        .with_serial(serial.clone())
        .start();
    let pool = CommitterPool::with_serial(vec![(addr.recipient(), load)], 3, serial);
    let key = |name: &str| PartitionKey::new("q", name);
    let rest = Duration::from_millis(300);

    // Not serialized: no rest, whatever was asked before.
    assert_eq!(pool.rest(), Duration::ZERO);
    let a = submit(&pool, "a-", 1);
    assert_eq!(probe.next_commit().await, vec![seg(&key("a-"), &["a-0"])]);
    a.await.unwrap().expect("committed");

    pool.serialize_for(Duration::from_secs(60), rest);
    assert_eq!(pool.rest(), rest);
    let b = submit(&pool, "b-", 1);
    assert_eq!(probe.next_commit().await, vec![seg(&key("b-"), &["b-0"])]);
    let committed = std::time::Instant::now();
    b.await.unwrap().expect("committed");
    // Two segments arrive during the rest; they leave together when it ends.
    let c = submit(&pool, "c-", 1);
    let d = submit(&pool, "d-", 2);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key("c-"), &["c-0"]), seg(&key("d-"), &["d-0", "d-1"])]
    );
    assert!(
        committed.elapsed() >= rest - Duration::from_millis(20),
        "the next transaction started {:?} after the last, within the rest",
        committed.elapsed()
    );
    c.await.unwrap().expect("committed");
    d.await.unwrap().expect("committed");
}

#[actix::test]
async fn a_committer_batch_stops_at_its_item_limit_without_splitting_a_segment() {
    let (store, mut probe) = gated_store();
    let limits = CommitterLimits {
        max_batch_segments: 10,
        max_batch_items: 3,
    };
    let pool = CommitterPool::new(vec![committer(0, store, limits)], usize::MAX);
    let key = |name: &str| PartitionKey::new("q", name);
    let s1 = submit(&pool, "a", 1);
    assert_eq!(probe.next_commit().await, vec![seg(&key("a"), &["a0"])]);
    let s2 = submit(&pool, "b", 2);
    let s3 = submit(&pool, "c", 2);
    probe.release(3);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key("b"), &["b0", "b1"])]
    );
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key("c"), &["c0", "c1"])]
    );
    for s in [s1, s2, s3] {
        assert!(s.await.unwrap().is_ok());
    }
}

#[actix::test]
async fn a_push_on_its_way_to_an_idle_actor_is_not_lost() {
    let (store, probe) = open_store();
    let limits = PartitionLimits {
        idle_after: Duration::ZERO,
        ..PartitionLimits::default()
    };
    let registry = registry(store, limits, None);
    let key = PartitionKey::new("q", "p");
    let idle = registry.actor(&key);

    // The stop request reaches the actor first, the push right behind it in the same mailbox.
    // (A stopped actor's queued messages are dropped: the actor must not stop under it.)
    idle.do_send(IdleCheck);
    let verdicts = registry.push(&key, items(&["x"])).await;

    assert_eq!(
        verdicts.expect("the push is not lost"),
        vec![Verdict::Queued]
    );
    assert_eq!(probe.commits(), vec![vec![seg(&key, &["x"])]]);
    // Idle again with nothing on its way: it leaves the registry and stops (the sweeper, every
    // 10 ms here, may have done so already).
    let _ = idle.send(IdleCheck).await;
    assert!(registry.is_empty());
    let fresh = registry.actor(&key);
    assert_ne!(fresh, idle);
    assert_eq!(
        registry.push(&key, items(&["y"])).await.unwrap(),
        vec![Verdict::Queued]
    );
}

#[actix::test]
async fn a_failed_commit_goes_to_the_spool_and_is_answered_buffered() {
    let (store, probe) = open_store();
    probe.fail_commit(1);
    let spool = TempSpool::open();
    let state = spool.handle.state.clone();
    let registry = registry(
        store,
        PartitionLimits::default(),
        Some(spool.handle.clone()),
    );
    let key = PartitionKey::new("q", "p");

    let sent = items(&["a", "b"]);
    let verdicts = registry.push(&key, sent.clone()).await.expect("answered");
    assert_eq!(verdicts, vec![Verdict::Buffered; 2]);
    assert_eq!(state.records(), 2);
    assert!(
        state.db_down_for().is_some(),
        "an unreachable store marks the database down"
    );

    // What the spool holds: the same items, ids and all, in order.
    let files = list_files(&spool.dir).unwrap();
    assert_eq!(files.len(), 1);
    let (records, damage) = record::decode_all(&std::fs::read(&files[0]).unwrap());
    assert!(damage.is_empty());
    assert!(records.iter().all(|r| r.key == key));
    let spooled: Vec<_> = records.into_iter().map(|r| r.item).collect();
    assert_eq!(spooled, sent);

    // The partition now has spooled items: a new push queues behind them, not in the store.
    let later = registry.push(&key, items(&["c"])).await.expect("answered");
    assert_eq!(later, vec![Verdict::Buffered]);
    assert_eq!(state.records(), 3);
    assert_eq!(
        probe.commits().len(),
        1,
        "nothing overtakes the spooled items"
    );
    // Another partition still writes to the store, and its commit marks the database up.
    let other = PartitionKey::new("q", "other");
    let fine = registry
        .push(&other, items(&["d"]))
        .await
        .expect("answered");
    assert_eq!(fine, vec![Verdict::Queued]);
    assert!(state.db_down_for().is_none());
}

#[actix::test]
async fn without_a_spool_a_failed_commit_is_an_error_for_the_producer() {
    let (store, probe) = open_store();
    probe.fail_commit(1);
    let registry = registry(store, PartitionLimits::default(), None);
    let key = PartitionKey::new("q", "p");
    match registry.push(&key, items(&["a"])).await {
        Err(PushError::CommitFailed(reason)) => assert!(reason.contains("connection refused")),
        other => panic!("expected a commit failure, got {other:?}"),
    }
    // The next write goes through.
    assert_eq!(
        registry.push(&key, items(&["b"])).await.unwrap(),
        vec![Verdict::Queued]
    );
}

#[actix::test]
async fn pending_items_over_the_limit_are_refused_as_overloaded() {
    let (store, mut probe) = gated_store();
    let limits = PartitionLimits {
        max_pending_items: 3,
        ..PartitionLimits::default()
    };
    let registry = registry(store, limits, None);
    let key = PartitionKey::new("q", "p");
    let addr = registry.actor(&key);

    let a = hand_over(&addr, &["a"]).await;
    assert_eq!(probe.next_commit().await, vec![seg(&key, &["a"])]);
    let b = hand_over(&addr, &["b1", "b2"]).await; // 2 waiting
    let c = hand_over(&addr, &["c"]).await; // 3 waiting: the limit
    match registry.push(&key, items(&["d"])).await {
        Err(PushError::Overloaded(after)) => assert_eq!(after, RETRY_AFTER),
        other => panic!("expected overloaded, got {other:?}"),
    }

    probe.release(2);
    assert_eq!(
        probe.next_commit().await,
        vec![seg(&key, &["b1", "b2", "c"])],
        "the refused push left nothing behind"
    );
    for (answer, n) in [(a, 1), (b, 2), (c, 1)] {
        assert_eq!(answer.await.unwrap().unwrap(), vec![Verdict::Queued; n]);
    }
    // With nothing waiting, one request larger than the limit is taken whole.
    probe.release(1);
    let big = registry
        .push(&key, items(&["e1", "e2", "e3", "e4", "e5"]))
        .await;
    assert_eq!(big.unwrap(), vec![Verdict::Queued; 5]);
}

/// Counts what committers report.
#[derive(Default)]
struct Reports(std::sync::Mutex<Vec<broker_actors::observe::CommitReport>>);

impl broker_actors::observe::CommitObserver for Reports {
    fn committed(&self, report: &broker_actors::observe::CommitReport) {
        self.0.lock().unwrap().push(*report);
    }
}

#[actix::test]
async fn a_committer_reports_each_commit_to_its_observer() {
    let (store, probe) = open_store();
    let reports = std::sync::Arc::new(Reports::default());
    let load = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let addr = broker_actors::committer::Committer::new(
        0,
        store,
        load.clone(),
        CommitterLimits::default(),
    )
    .with_observer(reports.clone())
    .start();
    let pool = CommitterPool::new(vec![(addr.recipient(), load)], usize::MAX);
    submit(&pool, "a", 3).await.unwrap().unwrap();
    probe.fail_commit(2);
    assert!(submit(&pool, "b", 2).await.unwrap().is_err());
    let got = reports.0.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].segments, got[0].items, got[0].committed),
        (1, 3, true)
    );
    assert_eq!(
        (got[1].segments, got[1].items, got[1].committed),
        (1, 2, false)
    );
}
