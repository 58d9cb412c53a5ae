//! Long-poll (`wait=true`, reference §4.2): a push wakes a waiting pop at once, in-process and
//! from another broker through LISTEN/NOTIFY; nothing until the timeout is a 204 at the timeout.

use std::time::{Duration, Instant};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, TestApp};
use queen_broker::storage::consume::QUEUE_MODE;
use queen_broker::wake::WakeKey;

/// Resolves once `app` has a pop registered for `key` (polled, not slept on: the registration
/// is the event).
async fn registered(app: &TestApp, key: &WakeKey) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.broker.state.wake.waiting(key) == 0 {
        assert!(Instant::now() < deadline, "the pop never started waiting");
        tokio::task::yield_now().await;
        actix_web::rt::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The push wakes the waiting pop: with the pop's own re-read 5 s apart, an answer within 1 s
/// can only come from the push's wake-up. (How fast the wake-up is, is measured by the bench:
/// docs/benchmarks.md, "long-poll wake-up after a push"; a 50 ms bound here failed once on a
/// loaded 2-core machine at 62 ms.)
#[actix_web::test]
async fn a_waiting_pop_is_answered_by_the_push_not_its_own_re_read() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_RECHECK_MS", "5000")])).await;
    push_n(&app, "q", "other", 0, 1).await; // the queue exists; the waiter watches all of it
    let first = pop(&app, "q", "").await;
    ack_all(&app, &first, "completed", None).await;

    let waiting = async {
        let reply = pop(&app, "q", "wait=true&timeout=10000").await;
        (reply, Instant::now())
    };
    let pushing = async {
        registered(&app, &WakeKey::Queue("q".into())).await;
        push_n(&app, "q", "p", 7, 1).await;
        Instant::now()
    };
    let ((reply, popped_at), pushed_at) = futures_util::join!(waiting, pushing);
    assert_eq!(ns(&reply), vec![7]);
    let late = popped_at.saturating_duration_since(pushed_at);
    assert!(
        late < Duration::from_secs(1),
        "pop answered {late:?} after the push"
    );
}

#[actix_web::test]
async fn a_partition_waiter_and_a_named_group_are_woken_too() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let waiting = async {
        futures_util::join!(
            pop_partition(&app, "q", "p", "wait=true&timeout=10000"),
            pop(&app, "q", "wait=true&timeout=10000&consumerGroup=g"),
        )
    };
    let pushing = async {
        registered(&app, &WakeKey::Partition("q".into(), "p".into())).await;
        registered(&app, &WakeKey::Group("q".into(), "g".into())).await;
        push_n(&app, "q", "p", 0, 1).await;
        Instant::now()
    };
    let started = Instant::now();
    let ((by_partition, by_group), _) = futures_util::join!(waiting, pushing);
    assert_eq!(ns(&by_partition), vec![0]);
    assert_eq!(ns(&by_group), vec![0]);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[actix_web::test]
async fn nothing_until_the_timeout_is_a_204_at_the_timeout() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let started = Instant::now();
    let reply = get_raw(&app, "/api/v1/pop/queue/empty?wait=true&timeout=300").await;
    let took = started.elapsed();
    assert_eq!(reply.status, 204);
    assert!(reply.body.is_empty());
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_millis(1_500), "{took:?}");
    assert_eq!(
        app.broker
            .state
            .wake
            .waiting(&WakeKey::Queue("empty".into())),
        0
    );
}

#[actix_web::test]
async fn a_push_through_another_broker_wakes_the_waiting_pop() {
    let db = fresh_db().await;
    // The waiter re-reads PostgreSQL only every 5 s: an answer within 1 s is the NOTIFY's.
    let waiter_side = spawn_app_with(test_settings(&db, &[("QUEEN_POP_RECHECK_MS", "5000")])).await;
    let pusher_side = spawn_app(&db).await;
    let waiting = async {
        let reply = pop(&waiter_side, "q", "wait=true&timeout=10000").await;
        (reply, Instant::now())
    };
    let pushing = async {
        registered(&waiter_side, &WakeKey::Queue("q".into())).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !waiter_side.broker.state.wake.listening() {
            assert!(Instant::now() < deadline, "LISTEN never connected");
            actix_web::rt::time::sleep(Duration::from_millis(1)).await;
        }
        push_n(&pusher_side, "q", "p", 3, 1).await;
        Instant::now()
    };
    let ((reply, popped_at), pushed_at) = futures_util::join!(waiting, pushing);
    assert_eq!(ns(&reply), vec![3]);
    // Well under the 5 s periodic re-check: the NOTIFY woke it.
    let late = popped_at.saturating_duration_since(pushed_at);
    assert!(
        late < Duration::from_secs(1),
        "pop answered {late:?} after the push"
    );
}

/// A long-poll's look may skip the full pop when this broker ran one for the group a moment
/// ago (most wake-ups find nothing, and the full pop is several statements); it then looks in
/// full a moment later. So a partition the group never touched (only the full pop finds
/// those) is handed out at once, not after the recheck interval.
#[actix_web::test]
async fn a_look_that_skipped_the_full_pop_looks_in_full_a_moment_later() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_RECHECK_MS", "30000")])).await;
    push_n(&app, "q", "a", 0, 1).await;
    let first = pop(&app, "q", "").await;
    ack_all(&app, &first, "completed", None).await;
    push_n(&app, "q", "b", 1, 1).await; // a partition the group never touched

    // A full pop for the group has just run on this broker: the next look skips its own.
    assert!(app.broker.state.cache.woken_full_pop_due("q", QUEUE_MODE));
    let started = Instant::now();
    let reply = pop(&app, "q", "wait=true&timeout=20000").await;
    let took = started.elapsed();
    assert_eq!(ns(&reply), vec![1]);
    assert!(
        took < Duration::from_secs(2),
        "the untouched partition waited {took:?} (recheck interval 30 s)"
    );
}

/// An ack that ends a lease with messages left in the partition wakes a waiting consumer: the
/// messages are handed out at once, not at the next push or re-check (30 s here) nor by the
/// last look a long-poll takes at its timeout (20 s here).
#[actix_web::test]
async fn an_ack_that_leaves_messages_behind_wakes_a_waiting_pop() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_POP_RECHECK_MS", "30000")])).await;
    push_n(&app, "q", "p", 0, 2).await;
    let first = pop(&app, "q", "batch=1").await;
    assert_eq!(ns(&first), vec![0]);

    let waiting = async {
        let reply = pop(&app, "q", "batch=1&wait=true&timeout=20000").await;
        (reply, Instant::now())
    };
    let acking = async {
        registered(&app, &WakeKey::Queue("q".into())).await;
        // Past the waiting pop's first looks (a long-poll's first look is followed by a full
        // one 20 ms later): from here on only a wake-up or the 30 s re-check moves it.
        actix_web::rt::time::sleep(Duration::from_millis(300)).await;
        let acked = ack_all(&app, &first, "completed", None).await;
        assert_eq!(acked[0]["success"], true, "{acked}");
        Instant::now()
    };
    let ((reply, popped_at), acked_at) = futures_util::join!(waiting, acking);
    assert_eq!(ns(&reply), vec![1], "{:?}", reply.body);
    let late = popped_at.saturating_duration_since(acked_at);
    assert!(
        late < Duration::from_secs(5),
        "the message left behind was handed out {late:?} after the ack"
    );
}
