//! The scan watermark of the queue-level pop never passes a write that was still being
//! committed when the scan looked: such a write has a transaction id at or above the scan
//! snapshot's xmin, so the watermark stops there, however far above it the scan saw other
//! writes. (Seen under a paced load with several committers: a commit that started first and
//! finished last lost its partitions' messages behind the watermark.)

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};
use broker_actors::Item;
use queen_broker::storage::segments::frames;

#[actix_web::test]
async fn a_commit_that_started_before_the_scan_and_ends_after_it_is_not_passed() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Partition x: written and consumed once, so the group has its row, caught up.
    push_n(&app, "wm", "x", 0, 1).await;
    let first = pop(&app, "wm", "").await;
    assert_eq!(ns(&first), vec![0]);
    ack_all(&app, &first, "completed", None).await;
    let x = partition_id(&db, "x").await;

    // A committer's transaction takes its id now and commits last (as one of several
    // committers can): it writes x's next message only after the pop below has scanned.
    let mut slow = db.conn().await;
    sqlx::query("BEGIN").execute(&mut slow).await.unwrap();
    let slow_xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::int8")
        .fetch_one(&mut slow)
        .await
        .unwrap();

    // Meanwhile a later transaction writes partition y and commits; a pop scans, claims y and
    // would like to move the watermark past y.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    push_n(&app, "wm", "y", 100, 1).await;
    let second = pop(&app, "wm", "").await;
    assert_eq!(ns(&second), vec![100]);
    ack_all(&app, &second, "completed", None).await;
    let (scan_xid,): (i64,) = {
        let mut conn = db.conn().await;
        sqlx::query_as(
            "SELECT s.scan_xid FROM queen.consumer_subscriptions s
               JOIN queen.queues q ON q.id = s.queue_id WHERE q.name = 'wm'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
    };
    assert!(
        scan_xid <= slow_xid,
        "the watermark ({scan_xid}) passed a transaction still running ({slow_xid})"
    );

    // The slow transaction commits x's message 1 the way a committer does.
    let item = Item {
        message_id: uuid::Uuid::now_v7(),
        transaction_id: "slow-1".into(),
        payload: r#"{"n":1}"#.into(),
        producer_sub: None,
        trace_id: None,
        arrived_at_micros: queen_broker::protocol::time::now_micros(),
    };
    let bytes = frames::encode(std::iter::once(&item));
    sqlx::query(
        "UPDATE queen.partitions
            SET next_offset = 2, last_write_at = now(),
                last_write_xid = pg_current_xact_id()::text::int8
          WHERE id = $1",
    )
    .bind(x)
    .execute(&mut slow)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO queen.segments (partition_id, base_offset, msg_count, frames)
         VALUES ($1, 1, 1, $2)",
    )
    .bind(x)
    .bind(&bytes)
    .execute(&mut slow)
    .await
    .unwrap();
    sqlx::query("COMMIT").execute(&mut slow).await.unwrap();

    // The next pop finds it.
    let third = pop(&app, "wm", "").await;
    assert_eq!(
        ns(&third),
        vec![1],
        "the slow commit's message was passed over"
    );
}
