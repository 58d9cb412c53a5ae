//! The 2.x pop extensions (reference §2.8, docs/consuming-2x.md): autopilot, conflation, commit
//! at delivery, `leaseSeconds`, and unknown parameters, over raw HTTP against a real broker.

use serde_json::{json, Value};

use crate::support::consuming::*;
use crate::support::{eventually, fresh_db, spawn_app, TestApp, TestDb};

/// `(lease seconds, committed offset)` of the group's row on the partition named `partition`.
async fn row(db: &TestDb, partition: &str, group: &str) -> (Option<f64>, i64) {
    let mut conn = db.conn().await;
    sqlx::query_as(
        "SELECT extract(epoch FROM c.lease_expires_at - c.lease_acquired_at)::float8,
                c.committed_offset
           FROM queen.partition_consumers c
           JOIN queen.partitions p ON p.id = c.partition_id
          WHERE p.name = $1 AND c.consumer_group = $2",
    )
    .bind(partition)
    .bind(group)
    .fetch_one(&mut conn)
    .await
    .expect("a consumer row")
}

/// The `n` of every message, sorted.
fn sorted_ns(reply: &crate::support::Reply) -> Vec<i64> {
    let mut n = ns(reply);
    n.sort_unstable();
    n
}

#[actix_web::test]
async fn autopilot_sizes_what_the_query_leaves_out_and_says_what_it_chose() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..4 {
        push_n(&app, "q", &format!("p{p}"), p * 1000, 5).await;
    }
    // First sight: the four ready partitions are taken in one pop.
    let reply = pop(&app, "q", "autopilot=true&wait=false").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["partitionsClaimed"], 4, "{:?}", reply.body);
    assert_eq!(ns(&reply).len(), 20);
    let echo = &reply.body["autopilot"];
    assert_eq!(echo["partitions"], 4, "{echo}");
    assert!(echo["batch"].as_u64().unwrap() >= 20, "{echo}");
    assert_eq!(echo["waitMs"], 0);
    assert!(all_succeeded(
        &ack_all(&app, &reply, "completed", None).await
    ));

    // Nothing left: the answer is still a body, with a wait advice that grows.
    let mut waits = Vec::new();
    for _ in 0..3 {
        let empty = pop(&app, "q", "autopilot=true&wait=false").await;
        assert_eq!(empty.status, 200);
        assert_eq!(empty.body["messages"], json!([]));
        assert_eq!(empty.body["partitionsClaimed"], 0);
        waits.push(empty.body["autopilot"]["waitMs"].as_u64().unwrap());
    }
    assert_eq!(waits, vec![100, 200, 400]);
    // Without autopilot an empty pop stays a 204.
    assert_eq!(pop(&app, "q", "wait=false").await.status, 204);
}

#[actix_web::test]
async fn autopilot_never_changes_a_value_the_query_carries() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..3 {
        push_n(&app, "q", &format!("p{p}"), p * 1000, 10).await;
    }
    let reply = pop(&app, "q", "autopilot=true&batch=3&wait=false").await;
    assert_eq!(ns(&reply).len(), 3);
    assert_eq!(reply.body["autopilot"]["batch"], 3);
    assert!(all_succeeded(
        &ack_all(&app, &reply, "completed", None).await
    ));

    let reply = pop(&app, "q", "autopilot=true&partitions=1&wait=false").await;
    assert_eq!(reply.body["partitionsClaimed"], 1);
    assert_eq!(reply.body["autopilot"]["partitions"], 1);
    assert!(all_succeeded(
        &ack_all(&app, &reply, "completed", None).await
    ));

    // Both given: exactly those, whatever was learnt.
    let reply = pop(&app, "q", "autopilot=true&batch=2&partitions=2&wait=false").await;
    assert_eq!(reply.body["autopilot"]["batch"], 2);
    assert_eq!(reply.body["autopilot"]["partitions"], 2);
    assert!(ns(&reply).len() <= 2);

    // The partition route takes it too.
    let reply = pop_partition(&app, "q", "p2", "autopilot=true&wait=false").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["autopilot"]["partitions"], 1);
}

#[actix_web::test]
async fn unknown_pop_parameters_are_ignored_on_every_pop_route() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.post(
        "/api/v1/configure",
        &json!({ "queue": "q", "namespace": "ns", "task": "t" }),
    )
    .await;
    push_n(&app, "q", "p", 0, 3).await;
    let extra = "somethingNew=1&deliveryMode=x&autopilot=true&wait=false&batch=1";
    let queue = pop(&app, "q", extra).await;
    assert_eq!(ns(&queue), vec![0]);
    ack_all(&app, &queue, "completed", None).await;
    let partition = pop_partition(&app, "q", "p", extra).await;
    assert_eq!(ns(&partition), vec![1]);
    ack_all(&app, &partition, "completed", None).await;
    let matching = app
        .get(&format!("/api/v1/pop?namespace=ns&task=t&{extra}"))
        .await;
    assert_eq!(ns(&matching), vec![2]);
}

#[actix_web::test]
async fn lease_seconds_sets_this_pops_lease_and_is_bounded() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    db.exec("UPDATE queen.queues SET lease_time = 300").await;
    for (route, query) in [
        ("queue", "leaseSeconds=0"),
        ("queue", "leaseSeconds=86401"),
        ("queue", "leaseSeconds=soon"),
        ("partition", "leaseSeconds=-1"),
        ("matching", "leaseSeconds=1e3"),
    ] {
        let r = match route {
            "queue" => pop(&app, "q", query).await,
            "partition" => pop_partition(&app, "q", "p", query).await,
            _ => app.get(&format!("/api/v1/pop?{query}")).await,
        };
        assert_eq!(r.status, 400, "{route} {query}");
        assert!(r.body.to_string().contains("leaseSeconds"), "{:?}", r.body);
    }

    let first = pop(&app, "q", "subscriptionMode=all&leaseSeconds=1&wait=false").await;
    let (secs, _) = row(&db, "p", "__QUEUE_MODE__").await;
    assert!((secs.unwrap() - 1.0).abs() < 0.5, "{secs:?}");
    // Once it ran out, the message is delivered again under another lease.
    let app_ref = &app;
    let again = eventually(
        std::time::Duration::from_secs(10),
        "the 1 s lease runs out",
        move || async move {
            Some(pop(app_ref, "q", "leaseSeconds=86400&wait=false").await)
                .filter(|r| r.status == 200)
        },
    )
    .await;
    assert_eq!(
        messages(&again)[0]["transactionId"],
        messages(&first)[0]["transactionId"]
    );
    assert_ne!(again.body["leaseId"], first.body["leaseId"]);
    let (secs, _) = row(&db, "p", "__QUEUE_MODE__").await;
    assert!((secs.unwrap() - 86_400.0).abs() < 5.0, "{secs:?}");
}

#[actix_web::test]
async fn auto_ack_commits_at_delivery_and_holds_no_lease() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let reply = pop(&app, "q", "autoAck=true&autopilot=true&batch=1&wait=false").await;
    let m = &messages(&reply)[0];
    assert_eq!(m["leaseId"], "");
    assert_eq!(reply.body["leaseId"], "");
    let (lease, committed) = row(&db, "p", "__QUEUE_MODE__").await;
    assert_eq!((lease, committed), (None, 1));
    let detail = app
        .get(&format!(
            "/api/v1/messages/{}/{}",
            m["partitionId"].as_str().unwrap(),
            m["transactionId"].as_str().unwrap()
        ))
        .await;
    let groups = detail.body["consumerGroups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{:?}", detail.body);
    assert_eq!(groups[0]["consumed"], true);
    assert_eq!(groups[0]["leaseExpiresAt"], Value::Null);
    assert_eq!(
        ns(&pop(&app, "q", "autoAck=true&wait=false").await),
        vec![1]
    );
}

/// Pushes `n` messages `{"n": i}` to one partition, each in a push of its own (so each its own
/// segment).
async fn push_each(app: &TestApp, queue: &str, partition: &str, first: i64, n: i64) {
    for i in first..first + n {
        push_n(app, queue, partition, i, 1).await;
    }
}

#[actix_web::test]
async fn a_conflating_group_gets_the_newest_message_of_each_partition_and_retires_the_rest() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "a", 0, 5).await;
    push_each(&app, "q", "b", 1000, 3).await;

    let reply = pop(
        &app,
        "q",
        "consumerGroup=last&conflation=true&partitions=2&batch=10&wait=false",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["conflation"], true);
    assert_eq!(sorted_ns(&reply), vec![4, 1002]);
    // The depth route reads the stored policy: one position left per partition, two
    // partitions to retire.
    let depth = app
        .get("/api/v1/resources/queues/q/depth?group=last")
        .await
        .body;
    assert_eq!(depth["conflation"], true, "{depth}");
    assert_eq!(depth["pending"], 2);
    assert_eq!(depth["effectivePending"], 2);
    assert!(all_succeeded(
        &ack_all(&app, &reply, "completed", Some("last")).await
    ));
    assert_eq!(row(&db, "a", "last").await.1, 5);

    // Empty answers say so too: a 200, never a 204.
    let empty = pop(&app, "q", "consumerGroup=last&conflation=true&wait=false").await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body["messages"], json!([]));
    assert_eq!(empty.body["conflation"], true);

    // Another group is not affected: it reads everything.
    let all = pop(
        &app,
        "q",
        "consumerGroup=every&partitions=2&batch=10&wait=false",
    )
    .await;
    assert_eq!(sorted_ns(&all), vec![0, 1, 2, 3, 4, 1000, 1001, 1002]);
    assert_eq!(all.body.get("conflation"), None);
    let depth = app
        .get("/api/v1/resources/queues/q/depth?group=every")
        .await
        .body;
    assert_eq!(depth["conflation"], false);
    assert_eq!(depth["effectivePending"], 8);

    // A long-poll of the conflating group is woken by a burst and gets its newest message.
    push_n(&app, "q", "a", 5, 3).await;
    let woken = pop(
        &app,
        "q",
        "consumerGroup=last&conflation=true&wait=true&timeout=5000",
    )
    .await;
    assert_eq!(ns(&woken), vec![7]);
    assert_eq!(woken.body["conflation"], true);
}

#[actix_web::test]
async fn the_stored_policy_wins_and_a_conflicting_pop_is_told() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 3).await;

    // `plain` registers without conflation; asking for it later is a conflict, served plainly.
    let first = pop(&app, "q", "consumerGroup=plain&batch=1&wait=false").await;
    ack_all(&app, &first, "completed", Some("plain")).await;
    let conflict = pop(
        &app,
        "q",
        "consumerGroup=plain&conflation=true&batch=10&wait=false",
    )
    .await;
    assert_eq!(conflict.body["conflationConflict"], true);
    assert_eq!(conflict.body.get("conflation"), None);
    assert_eq!(ns(&conflict), vec![1, 2]);
    ack_all(&app, &conflict, "completed", Some("plain")).await;
    let empty = pop(&app, "q", "consumerGroup=plain&conflation=true&wait=false").await;
    assert_eq!(empty.status, 200);
    assert_eq!(empty.body["conflationConflict"], true);

    // `last` registers conflating; a pop that does not ask is still served conflated.
    let reply = pop(&app, "q", "consumerGroup=last&conflation=true&wait=false").await;
    assert_eq!(ns(&reply), vec![2]);
    ack_all(&app, &reply, "completed", Some("last")).await;
    push_n(&app, "q", "p", 3, 2).await;
    let unasked = pop(&app, "q", "consumerGroup=last&batch=10&wait=false").await;
    assert_eq!(ns(&unasked), vec![4]);
    assert_eq!(unasked.body["conflation"], true);

    // Deleting the group with its metadata forgets the policy.
    let deleted = delete(&app, "/api/v1/consumer-groups/last?deleteMetadata=true").await;
    assert_eq!(deleted.status, 200, "{:?}", deleted.body);
    let fresh = pop(&app, "q", "consumerGroup=last&batch=10&wait=false").await;
    assert_eq!(ns(&fresh), vec![0, 1, 2, 3, 4]);
    let depth = app
        .get("/api/v1/resources/queues/q/depth?group=last")
        .await
        .body;
    assert_eq!(depth["conflation"], false);
}

#[actix_web::test]
async fn conflation_is_refused_without_a_group_or_with_auto_ack() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 1).await;
    for query in [
        "conflation=true",
        "conflation=true&consumerGroup=",
        "conflation=true&consumerGroup=g&autoAck=true",
    ] {
        let r = pop(&app, "q", query).await;
        assert_eq!(r.status, 400, "{query}");
        assert!(r.body.to_string().contains("conflation"), "{:?}", r.body);
        let r = pop_partition(&app, "q", "p", query).await;
        assert_eq!(r.status, 400, "{query}");
    }
    // Nothing was registered or handed out.
    assert_eq!(
        ns(&pop(&app, "q", "consumerGroup=g&wait=false").await),
        vec![0]
    );
}

#[actix_web::test]
async fn a_failed_conflated_message_comes_back_unless_a_newer_one_retired_it() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "q", "p", 0, 2).await;
    let q = "consumerGroup=last&conflation=true&wait=false";
    let reply = pop(&app, "q", q).await;
    assert_eq!(ns(&reply), vec![1]);
    let failed = ack_one(&app, &messages(&reply)[0], "failed", Some("last")).await;
    assert_eq!(failed["success"], true, "{failed}");
    let again = pop(&app, "q", q).await;
    assert_eq!(ns(&again), vec![1]);
    assert_eq!(messages(&again)[0]["retryCount"], 1);
    ack_one(&app, &messages(&again)[0], "retry", Some("last")).await;

    // A newer message retires the one that failed; the count starts over.
    push_n(&app, "q", "p", 2, 1).await;
    let newer = pop(&app, "q", q).await;
    assert_eq!(ns(&newer), vec![2]);
    assert_eq!(messages(&newer)[0]["retryCount"], 0);
    ack_one(&app, &messages(&newer)[0], "completed", Some("last")).await;

    // A message deleted one by one is never the newest handed out.
    push_n(&app, "q", "p", 3, 2).await;
    let stored = db.stored("q", "p").await;
    let newest = stored.last().expect("stored messages");
    assert_eq!(newest.payload, r#"{"n":4}"#);
    let d = delete(
        &app,
        &format!(
            "/api/v1/messages/{}/{}",
            messages(&newer)[0]["partitionId"].as_str().unwrap(),
            newest.transaction_id
        ),
    )
    .await;
    assert_eq!(d.status, 200, "{:?}", d.body);
    assert_eq!(ns(&pop(&app, "q", q).await), vec![3]);
}
