//! Pop over HTTP against a real PostgreSQL (reference §4): shape, order, leases, autoAck,
//! partition route, verbatim payloads.

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app};
use serde_json::{json, Value};

#[actix_web::test]
async fn nothing_to_pop_is_204_with_an_empty_body() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let raw = get_raw(&app, "/api/v1/pop/queue/nowhere").await;
    assert_eq!(raw.status, 204);
    assert!(raw.body.is_empty());
    let raw = get_raw(&app, "/api/v1/pop/queue/nowhere/partition/p").await;
    assert_eq!(raw.status, 204);
}

#[actix_web::test]
async fn a_pop_returns_the_messages_in_order_with_every_field() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "orders", "p1", 0, 5).await;

    let reply = pop(&app, "orders", "batch=10").await;
    assert_eq!(ns(&reply), vec![0, 1, 2, 3, 4]);
    let body = &reply.body;
    let uuid: String = {
        let mut conn = db.conn().await;
        sqlx::query_scalar("SELECT uuid::text FROM queen.partitions WHERE name = 'p1'")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(body["success"], true);
    assert_eq!(body["queue"], "orders");
    assert_eq!(body["partition"], "p1");
    assert_eq!(body["partitionId"], uuid.as_str());
    assert_eq!(body["consumerGroup"], "__QUEUE_MODE__");
    assert_eq!(body["partitionsClaimed"], 1);
    let lease = body["leaseId"].as_str().unwrap();
    assert!(!lease.is_empty());
    let stored = db.stored("orders", "p1").await;
    for (m, s) in messages(&reply).iter().zip(&stored) {
        assert_eq!(m["id"], s.id.to_string());
        assert_eq!(m["transactionId"], s.transaction_id.as_str());
        assert_eq!(m["partitionId"], uuid.as_str());
        assert_eq!(m["partition"], "p1");
        assert_eq!(m["queue"], "orders");
        assert_eq!(m["leaseId"], lease);
        assert_eq!(m["consumerGroup"], "__QUEUE_MODE__");
        assert_eq!(m["producerSub"], Value::Null);
        assert_eq!(m["traceId"], Value::Null);
        assert_eq!(m["retryCount"], 0);
        let created = m["createdAt"].as_str().unwrap();
        assert_eq!(
            created.len(),
            "2024-01-01T00:00:00.000000Z".len(),
            "{created}"
        );
        assert!(created.ends_with('Z') && created.as_bytes()[19] == b'.');
        chrono::DateTime::parse_from_rfc3339(created).expect("ISO-8601");
    }

    // The lease is held: nobody else of the group gets the partition.
    assert_eq!(pop(&app, "orders", "batch=10").await.status, 204);
    ack_all(&app, &reply, "completed", None).await;
    assert_eq!(pop(&app, "orders", "batch=10").await.status, 204);

    push_n(&app, "orders", "p1", 5, 2).await;
    assert_eq!(ns(&pop(&app, "orders", "batch=10").await), vec![5, 6]);
}

#[actix_web::test]
async fn batch_bounds_the_messages_and_the_rest_follows_after_the_ack() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 7).await;
    let first = pop(&app, "q", "batch=3").await;
    assert_eq!(ns(&first), vec![0, 1, 2]);
    ack_all(&app, &first, "completed", None).await;
    // Each ack claims the partition ahead for a pop of the same batch; a pop asking for
    // another batch leaves that lease to run out its hold (`QUEEN_POP_AHEAD_MS`), so these
    // pops long-poll until it is released instead of racing it.
    let second = pop(&app, "q", "batch=0&wait=true&timeout=2000").await; // < 1 behaves as 1
    assert_eq!(ns(&second), vec![3]);
    ack_all(&app, &second, "completed", None).await;
    assert_eq!(
        ns(&pop(&app, "q", "batch=100&wait=true&timeout=2000").await),
        vec![4, 5, 6]
    );
}

#[actix_web::test]
async fn the_partition_route_pops_only_that_partition() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "a", 0, 2).await;
    push_n(&app, "q", "b", 10, 2).await;
    let b = pop_partition(&app, "q", "b", "batch=10").await;
    assert_eq!(ns(&b), vec![10, 11]);
    assert_eq!(pop_partition(&app, "q", "b", "batch=10").await.status, 204);
    assert_eq!(pop_partition(&app, "q", "missing", "").await.status, 204);
    let a = pop(&app, "q", "batch=10").await;
    assert_eq!(ns(&a), vec![0, 1]);
}

#[actix_web::test]
async fn auto_ack_moves_the_cursor_at_delivery_without_a_lease() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;
    let first = pop(&app, "q", "autoAck=true").await;
    assert_eq!(ns(&first), vec![0]);
    assert_eq!(first.body["leaseId"], "");
    assert_eq!(messages(&first)[0]["leaseId"], "");
    assert_eq!(ns(&pop(&app, "q", "autoAck=1&batch=5").await), vec![1, 2]);
    assert_eq!(pop(&app, "q", "autoAck=true").await.status, 204);
}

#[actix_web::test]
async fn payloads_come_back_byte_for_byte() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let payloads = [
        r#"{"z":1,"a":{"y":[1.10,2.500,-0.0]},"big":12345678901234567890123,"s":"\u0000é\"x"}"#,
        r#"1.10"#,
        r#"null"#,
        r#"[3,2,1E+2, 4 ]"#,
        r#""text""#,
    ];
    let items: Vec<String> = payloads
        .iter()
        .map(|p| format!(r#"{{"queue":"raw","partition":"p","payload":{p}}}"#))
        .collect();
    let body = format!(r#"{{"items":[{}]}}"#, items.join(","));
    assert_eq!(post_raw(&app, "/api/v1/push", &body).await.status, 201);

    let raw = get_raw(&app, "/api/v1/pop/queue/raw?batch=10").await;
    assert_eq!(raw.status, 200);
    let text = String::from_utf8(raw.body).unwrap();
    let mut at = 0;
    for p in payloads {
        let needle = format!(r#""data":{p},"#);
        let found = text[at..]
            .find(&needle)
            .unwrap_or_else(|| panic!("{needle} verbatim after {at} in {text}"));
        at += found + needle.len();
    }
    let parsed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed["messages"][2]["data"], json!(null));
}

#[actix_web::test]
async fn several_partitions_in_one_pop_share_one_lease() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in ["a", "b", "c"] {
        push_n(&app, "q", p, 0, 2).await;
    }
    let reply = pop(&app, "q", "batch=5&partitions=3").await;
    let msgs = messages(&reply);
    assert_eq!(msgs.len(), 5);
    assert_eq!(reply.body["partitionsClaimed"], 3);
    let lease = reply.body["leaseId"].as_str().unwrap();
    assert!(msgs.iter().all(|m| m["leaseId"] == lease));
    let results = ack_all(&app, &reply, "completed", None).await;
    assert!(results
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["success"] == true));
    assert_eq!(
        messages(&pop(&app, "q", "batch=5&partitions=3").await).len(),
        1
    );
}

#[actix_web::test]
async fn namespace_and_task_pops_take_the_highest_priority_matching_queue() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "billing.invoices", "p", 0, 1).await;
    push_n(&app, "billing.refunds", "p", 10, 1).await;
    push_n(&app, "shipping.labels", "p", 20, 1).await;
    db.exec("UPDATE queen.queues SET priority = 5 WHERE name = 'billing.refunds'")
        .await;

    let r = app.get("/api/v1/pop?namespace=billing").await;
    assert_eq!(ns(&r), vec![10]);
    assert_eq!(r.body["queue"], "billing.refunds");
    assert_eq!(messages(&r)[0]["queue"], "billing.refunds");
    let r = app.get("/api/v1/pop?namespace=billing&task=invoices").await;
    assert_eq!(ns(&r), vec![0]);
    let r = app.get("/api/v1/pop?task=labels").await;
    assert_eq!(ns(&r), vec![20]);
    assert_eq!(app.get("/api/v1/pop?namespace=billing").await.status, 204);
    assert_eq!(app.get("/api/v1/pop?namespace=nobody").await.status, 204);
}
