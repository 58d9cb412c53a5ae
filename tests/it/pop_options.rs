//! Queue options that change pop (reference §4.6) and pop maintenance mode (§8.1).

use std::time::{Duration, Instant};

use crate::support::consuming::*;
use crate::support::{eventually, fresh_db, spawn_app};

#[actix_web::test]
async fn a_delayed_message_is_invisible_until_its_delay_has_passed() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await; // creates the queue
    let first = pop(&app, "q", "").await;
    ack_all(&app, &first, "completed", None).await;
    db.exec("UPDATE queen.queues SET delayed_processing = 1 WHERE name = 'q'")
        .await;

    let pushed = Instant::now();
    push_n(&app, "q", "p", 1, 2).await;
    assert_eq!(pop(&app, "q", "batch=2").await.status, 204, "still delayed");
    assert_eq!(pop_partition(&app, "q", "p", "batch=2").await.status, 204);
    let reply = pop(&app, "q", "batch=2&wait=true&timeout=5000").await;
    assert_eq!(ns(&reply), vec![1, 2]);
    assert!(
        pushed.elapsed() >= Duration::from_millis(900),
        "{:?}",
        pushed.elapsed()
    );
}

#[actix_web::test]
async fn a_partition_inside_its_window_buffer_is_not_handed_out() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    db.exec("UPDATE queen.queues SET window_buffer = 1 WHERE name = 'q'")
        .await;
    let pushed = Instant::now();
    push_n(&app, "q", "p", 1, 1).await;
    assert_eq!(
        pop(&app, "q", "batch=5").await.status,
        204,
        "inside the window"
    );
    assert_eq!(pop_partition(&app, "q", "p", "batch=5").await.status, 204);
    // The burst is delivered together once the newest message is a second old.
    let reply = pop(&app, "q", "batch=5&wait=true&timeout=5000").await;
    assert_eq!(ns(&reply), vec![0, 1]);
    assert!(
        pushed.elapsed() >= Duration::from_millis(900),
        "{:?}",
        pushed.elapsed()
    );
}

#[actix_web::test]
async fn pop_maintenance_mode_answers_204_at_once() {
    let db = fresh_db().await;
    db.exec(
        "INSERT INTO queen.system_state (key, value) VALUES ('pop_maintenance_mode', '{\"enabled\": true}')",
    )
    .await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    let started = Instant::now();
    let paused = pop(&app, "q", "wait=true&timeout=10000").await;
    assert_eq!(paused.status, 204);
    assert!(started.elapsed() < Duration::from_secs(2));

    db.exec("UPDATE queen.system_state SET value = '{\"enabled\": false}' WHERE key = 'pop_maintenance_mode'")
        .await;
    // The flag is cached for a second: poll until the broker has seen the change.
    let app = &app;
    let reply = eventually(
        Duration::from_secs(10),
        "pop maintenance ends",
        move || async move { Some(pop(app, "q", "").await).filter(|r| r.status == 200) },
    )
    .await;
    assert_eq!(ns(&reply), vec![0]);
}
