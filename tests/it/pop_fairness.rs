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

/// A partition created after groups subscribed to its queue is theirs from its first write:
/// the push that creates it gives each subscribed group a row asking for attention (offset 0;
/// none for a group whose start lies ahead), so the next pops serve it rather than the
/// backlog the one-statement pop always finds, without waiting for the periodic full pop.
#[actix_web::test]
async fn a_partition_created_after_the_groups_subscribed_is_served_by_their_next_pops() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "fresh", "backlog", 0, 200).await;
    let first = pop(&app, "fresh", "consumerGroup=g&batch=1").await;
    assert_eq!(ns(&first), vec![0]);
    ack_all(&app, &first, "completed", Some("g")).await;
    // A group that starts a day from now.
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let later = format!(
        "consumerGroup=later&batch=1&subscriptionFrom={}",
        tomorrow.format("%Y-%m-%dT%H:%M:%SZ")
    );
    let first = pop(&app, "fresh", &later).await;
    assert_eq!(first.status, 204, "{:?}", first.body);
    push_n(&app, "fresh", "new", 1000, 1).await;

    let rows: Vec<(String, i64, bool)> = {
        let mut conn = db.conn().await;
        sqlx::query_as(
            "SELECT c.consumer_group, c.committed_offset, c.attention_at IS NOT NULL
               FROM queen.partition_consumers c
               JOIN queen.partitions p ON p.id = c.partition_id
              WHERE p.name = 'new'
              ORDER BY c.consumer_group",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap()
    };
    assert_eq!(rows, vec![("g".to_string(), 0, true)]);

    // Right away (well inside the full pop's period, 250 ms): the backlog's release and the
    // new partition are the two rows asking for attention, served in turn.
    let mut served = Vec::new();
    for _ in 0..3 {
        let r = pop(&app, "fresh", "consumerGroup=g&batch=1").await;
        let partition = r.body["partition"].as_str().unwrap_or("").to_string();
        ack_all(&app, &r, "completed", Some("g")).await;
        if partition == "new" {
            assert_eq!(ns(&r), vec![1000]);
        }
        served.push(partition);
    }
    assert!(
        served.iter().any(|p| p == "new"),
        "the new partition waited behind the backlog: {served:?}"
    );
}

/// A group's first look at a queue gives it a row on every partition it never touched that
/// holds messages for it (no lease; a request for attention; the start its subscription asks
/// for; an empty partition gets none),
/// so the one-statement pop serves them all instead of one full pop per partition: each
/// following long-poll brings another partition's messages, each exactly once.
#[actix_web::test]
async fn a_new_group_joins_every_untouched_partition_at_its_first_look() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..40 {
        push_n(&app, "join", &format!("p{p}"), p * 10, 2).await;
    }
    // An empty partition: nothing for the group there, so no row.
    {
        let mut conn = db.conn().await;
        sqlx::query(
            "INSERT INTO queen.partitions (queue_id, name)
             SELECT id, 'empty' FROM queen.queues WHERE name = 'join'",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let first = pop(&app, "join", "consumerGroup=g&batch=2").await;
    assert_eq!(messages(&first).len(), 2);

    let rows: Vec<(String, i64, bool, bool)> = {
        let mut conn = db.conn().await;
        sqlx::query_as(
            "SELECT p.name, c.committed_offset, c.attention_at IS NOT NULL,
                    COALESCE(c.lease_expires_at > now(), false)
               FROM queen.partition_consumers c
               JOIN queen.partitions p ON p.id = c.partition_id
              WHERE c.consumer_group = 'g'
              ORDER BY p.name",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap()
    };
    assert_eq!(rows.len(), 40, "{rows:?}");
    assert!(rows.iter().all(|r| r.0 != "empty"), "{rows:?}");
    let leased: Vec<&String> = rows.iter().filter(|r| r.3).map(|r| &r.0).collect();
    assert_eq!(leased, vec![first.body["partition"].as_str().unwrap()]);
    for (name, committed, attention, live) in &rows {
        assert_eq!(*committed, 0, "{name}");
        assert_eq!(
            *attention, !live,
            "{name}: attention {attention}, leased {live}"
        );
    }
    ack_all(&app, &first, "completed", Some("g")).await;

    let mut seen: Vec<i64> = ns(&first);
    for _ in 0..39 {
        let reply = pop(
            &app,
            "join",
            "consumerGroup=g&batch=2&wait=true&timeout=5000",
        )
        .await;
        let got = ns(&reply);
        assert_eq!(got.len(), 2, "{:?}", reply.body);
        assert_eq!(got[1], got[0] + 1, "in order within the partition");
        ack_all(&app, &reply, "completed", Some("g")).await;
        seen.extend(got);
    }
    seen.sort_unstable();
    let want: Vec<i64> = (0..40).flat_map(|p| [p * 10, p * 10 + 1]).collect();
    assert_eq!(seen, want);
    let rest = pop(&app, "join", "consumerGroup=g&batch=2").await;
    assert_eq!(rest.status, 204, "{:?}", rest.body);
}
