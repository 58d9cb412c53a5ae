//! Under load the one-statement pop always finds a partition the group already has a row for;
//! a partition the group never touched must still get its turn (a few times a second per
//! broker the full pop runs, looking at written and untouched partitions first).

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};

#[actix_web::test]
async fn a_partition_never_touched_is_served_while_others_always_have_messages() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // A partition with a long backlog, already consumed from (it always has messages).
    push_n(&app, "busy", "backlog", 0, 200).await;
    let first = pop(&app, "busy", "batch=1").await;
    assert_eq!(ns(&first), vec![0]);
    ack_all(&app, &first, "completed", None).await;
    // A new partition the group has never seen.
    push_n(&app, "busy", "new", 1000, 1).await;

    let mut served = Vec::new();
    for _ in 0..40 {
        let r = pop(&app, "busy", "batch=1").await;
        let partition = r.body["partition"].as_str().unwrap_or("").to_string();
        ack_all(&app, &r, "completed", None).await;
        served.push(partition);
        if served.last().map(String::as_str) == Some("new") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(
        served.last().map(String::as_str),
        Some("new"),
        "the untouched partition waited behind the backlog: {served:?}"
    );
}
