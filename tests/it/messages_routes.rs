//! The operators' message routes over HTTP against a real PostgreSQL (reference §9.3).

use crate::support::consuming::{ack_all, ack_one, messages, pop_partition};
use crate::support::{fresh_db, spawn_app, TestApp};
use serde_json::{json, Value};

/// Pushes one segment of raw items (JSON text, so payload bytes can be checked exactly).
async fn push_raw(app: &TestApp, items: &str) -> Value {
    let reply = app
        .post_raw(
            "/api/v1/push",
            format!(r#"{{"items":[{items}]}}"#).into_bytes(),
        )
        .await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    reply.body
}

fn txns(body: &Value) -> Vec<&str> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap())
        .collect()
}

#[actix_web::test]
async fn messages_are_listed_newest_first_with_payloads_exactly_as_pushed() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_raw(
        &app,
        r#"{"queue":"q","transactionId":"t1","payload":{"b":1, "a":1.10,"n":12345678901234567890123}},
           {"queue":"q","transactionId":"t2","payload":null}"#,
    )
    .await;
    push_raw(
        &app,
        r#"{"queue":"q","partition":"p","transactionId":"t3","payload":"\u0000x"}"#,
    )
    .await;

    let (status, text) = app.get_text("/api/v1/messages?queue=q").await;
    assert_eq!(status, 200);
    assert!(
        text.contains(r#""payload":{"b":1, "a":1.10,"n":12345678901234567890123}"#),
        "payload bytes kept: {text}"
    );
    assert!(text.contains(r#""payload":"\u0000x""#), "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(txns(&body), ["t3", "t2", "t1"]);
    let m = &body["messages"][0];
    assert_eq!(m["queue"], "q");
    assert_eq!(m["partition"], "p");
    assert_eq!(m["queuePath"], "q/p");
    assert_eq!(m["status"], "pending");
    assert_eq!(m["busStatus"], json!({"consumedBy": 0, "totalGroups": 0}));
    assert_eq!(m["producerSub"], Value::Null);
    assert!(m["createdAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(body["mode"]["type"], "none");
    assert_eq!(
        body["messages"][1]["payload"],
        Value::Null,
        "a null payload is listed as null"
    );
}

#[actix_web::test]
async fn the_list_pages_across_segments_and_filters() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_raw(
        &app,
        r#"{"queue":"a.x","transactionId":"1","payload":1},{"queue":"a.x","transactionId":"2","payload":2},
           {"queue":"a.x","transactionId":"3","payload":3}"#,
    )
    .await;
    push_raw(
        &app,
        r#"{"queue":"a.x","transactionId":"4","payload":4},{"queue":"a.x","transactionId":"5","payload":5}"#,
    )
    .await;
    push_raw(&app, r#"{"queue":"other","transactionId":"6","payload":6}"#).await;

    let all = app.get("/api/v1/messages").await;
    assert_eq!(txns(&all.body), ["6", "5", "4", "3", "2", "1"]);
    let page = app.get("/api/v1/messages?queue=a.x&limit=2&offset=1").await;
    assert_eq!(txns(&page.body), ["4", "3"]);
    let page = app
        .get("/api/v1/messages?queue=a.x&limit=10&offset=4")
        .await;
    assert_eq!(txns(&page.body), ["1"]);
    let by_ns = app.get("/api/v1/messages?ns=a&task=x&limit=3").await;
    assert_eq!(txns(&by_ns.body), ["5", "4", "3"]);
    let none = app.get("/api/v1/messages?queue=a.x&partition=nope").await;
    assert_eq!(txns(&none.body), Vec::<&str>::new());
    let completed = app.get("/api/v1/messages?status=completed").await;
    assert_eq!(
        txns(&completed.body),
        Vec::<&str>::new(),
        "nothing consumed yet"
    );
    let pending = app
        .get("/api/v1/messages?status=pending&limit=2&offset=1")
        .await;
    assert_eq!(txns(&pending.body), ["5", "4"]);

    // Outside the default window (the last hour) unless asked for.
    db.exec("UPDATE queen.segments SET created_at = created_at - interval '3 hours'")
        .await;
    assert_eq!(txns(&app.get("/api/v1/messages").await.body).len(), 0);
    let from = (chrono::Utc::now() - chrono::Duration::hours(4)).to_rfc3339();
    let old = app
        .get(&format!(
            "/api/v1/messages?from={}",
            from.replace('+', "%2B")
        ))
        .await;
    assert_eq!(old.status, 200, "{:?}", old.body);
    assert_eq!(txns(&old.body).len(), 6);
    let bad = app.get("/api/v1/messages?from=yesterday").await;
    assert_eq!(bad.status, 400);
}

#[actix_web::test]
async fn one_message_is_found_by_partition_and_transaction_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Dedup on (sidecar lookup) and off (segment scan).
    let off = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "nodedup", "options": {"dedupWindowSeconds": 0}}),
        )
        .await;
    assert_eq!(off.status, 200);
    for queue in ["q", "nodedup"] {
        push_raw(
            &app,
            &format!(r#"{{"queue":"{queue}","transactionId":"a","payload":{{"z":1,"y":[1, 2]}}}}"#),
        )
        .await;
        push_raw(
            &app,
            &format!(r#"{{"queue":"{queue}","transactionId":"b","payload":2}}"#),
        )
        .await;
        let listed = app.get(&format!("/api/v1/messages?queue={queue}")).await;
        let first = &listed.body["messages"][1];
        assert_eq!(first["transactionId"], "a");
        let partition = first["partitionId"].as_str().unwrap();

        let (status, text) = app
            .get_text(&format!("/api/v1/messages/{partition}/a"))
            .await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains(r#""payload":{"z":1,"y":[1, 2]}"#), "{text}");
        let detail: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(detail["id"], first["id"]);
        assert_eq!(detail["queue"], queue);
        assert_eq!(detail["status"], "pending");
        assert_eq!(detail["retryCount"], 0);
        assert_eq!(detail["isEncrypted"], false);
        assert_eq!(detail["queueConfig"]["leaseTime"], 300);
        assert_eq!(detail["consumerGroups"], json!([]));

        let missing = app.get(&format!("/api/v1/messages/{partition}/zzz")).await;
        assert_eq!(missing.status, 404);
        assert_eq!(missing.body, json!({"error": "Message not found"}));
    }
    let bad_partition = app.get("/api/v1/messages/not-a-uuid/a").await;
    assert_eq!(bad_partition.body, json!({"error": "Message not found"}));
}

/// Pushes one segment per call: messages with these transactionIds to one partition.
async fn push_txns(app: &TestApp, queue: &str, partition: &str, txns: &[&str]) {
    let items: Vec<Value> = txns
        .iter()
        .map(|t| json!({"queue": queue, "partition": partition, "transactionId": t, "payload": t}))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
}

/// Pops one partition for `group` (queue mode when `None`) and acks everything popped.
async fn consume(app: &TestApp, queue: &str, partition: &str, group: Option<&str>, batch: usize) {
    let query = match group {
        Some(g) => format!("batch={batch}&consumerGroup={g}"),
        None => format!("batch={batch}"),
    };
    let reply = pop_partition(app, queue, partition, &query).await;
    assert_eq!(messages(&reply).len(), batch);
    ack_all(app, &reply, "completed", group).await;
}

fn field<'a>(body: &'a Value, name: &str) -> Vec<&'a Value> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m[name])
        .collect()
}

#[actix_web::test]
async fn queue_mode_statuses_come_from_the_cursor_the_lease_and_the_dead_letters() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_txns(&app, "work", "p", &["t0", "t1", "t2"]).await;
    push_txns(&app, "work", "p", &["t3", "t4", "t5"]).await;
    consume(&app, "work", "p", None, 2).await;
    let leased = pop_partition(&app, "work", "p", "batch=3").await;
    let leased = messages(&leased);
    assert_eq!(ack_one(&app, &leased[0], "dlq", None).await["dlq"], true);

    let all = app.get("/api/v1/messages?queue=work").await.body;
    assert_eq!(txns(&all), ["t5", "t4", "t3", "t2", "t1", "t0"]);
    let statuses = [
        "pending",
        "processing",
        "processing",
        "dead_letter",
        "completed",
        "completed",
    ];
    assert_eq!(field(&all, "status"), statuses);
    assert_eq!(field(&all, "queueStatus"), statuses);
    let leases = field(&all, "leaseExpiresAt");
    assert!(
        leases[1].is_string() && leases[1] == leases[2],
        "{leases:?}"
    );
    assert!(leases[0].is_null() && leases[3].is_null() && leases[5].is_null());
    assert_eq!(
        all["messages"][0]["busStatus"],
        json!({"consumedBy": 0, "totalGroups": 0})
    );
    assert_eq!(
        all["mode"],
        json!({"hasQueueMode": true, "busGroupsCount": 0, "type": "queue"})
    );

    // The status filter applies before the page: offset and limit count matching messages.
    for (status, expected) in [
        ("completed", vec!["t1", "t0"]),
        ("processing", vec!["t4", "t3"]),
        ("dead_letter", vec!["t2"]),
        ("pending", vec!["t5"]),
        ("failed", vec![]),
    ] {
        let page = app
            .get(&format!("/api/v1/messages?queue=work&status={status}"))
            .await;
        assert_eq!(txns(&page.body), expected, "{status}");
    }
    let page = app
        .get("/api/v1/messages?queue=work&status=completed&offset=1&limit=1")
        .await;
    assert_eq!(txns(&page.body), ["t0"]);

    // The detail says the same, with the groups and the dead letter's reason.
    let partition = all["messages"][0]["partitionId"].as_str().unwrap();
    let dead = app
        .get(&format!("/api/v1/messages/{partition}/t2"))
        .await
        .body;
    assert_eq!(dead["status"], "dead_letter");
    assert_eq!(dead["errorMessage"], "Retries exhausted");
    assert_eq!(
        dead["mode"],
        json!({"hasQueueMode": true, "busGroupsCount": 0, "consumedByGroups": 0,
               "type": "queue"})
    );
    let groups = dead["consumerGroups"].as_array().unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["name"], "__QUEUE_MODE__");
    assert_eq!(groups[0]["consumed"], true);
    assert!(groups[0]["leaseExpiresAt"].is_string());
    let leased = app
        .get(&format!("/api/v1/messages/{partition}/t4"))
        .await
        .body;
    assert_eq!(leased["status"], "processing");
    assert_eq!(leased["leaseExpiresAt"], leases[1].clone());
    assert_eq!(leased["consumerGroups"][0]["consumed"], false);
}

#[actix_web::test]
async fn bus_mode_counts_the_groups_that_consumed_each_message() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for t in ["e0", "e1", "e2", "e3"] {
        push_txns(&app, "events", "e", &[t]).await;
    }
    consume(&app, "events", "e", Some("g1"), 3).await;
    consume(&app, "events", "e", Some("g2"), 1).await;
    // A live lease of a named group is not `processing`.
    let held = pop_partition(&app, "events", "e", "batch=1&consumerGroup=g2").await;
    assert_eq!(messages(&held).len(), 1);

    let all = app.get("/api/v1/messages?queue=events").await.body;
    assert_eq!(txns(&all), ["e3", "e2", "e1", "e0"]);
    assert_eq!(
        field(&all, "status"),
        ["pending", "pending", "pending", "completed"]
    );
    assert_eq!(field(&all, "queueStatus"), ["pending"; 4]);
    let consumed_by: Vec<&Value> = field(&all, "busStatus")
        .into_iter()
        .map(|b| &b["consumedBy"])
        .collect();
    assert_eq!(consumed_by, [0, 1, 1, 2]);
    assert_eq!(all["messages"][0]["busStatus"]["totalGroups"], 2);
    assert_eq!(
        all["mode"],
        json!({"hasQueueMode": false, "busGroupsCount": 2, "type": "bus"})
    );
    let completed = app
        .get("/api/v1/messages?queue=events&status=completed")
        .await;
    assert_eq!(txns(&completed.body), ["e0"]);

    // A group that subscribed but never touched the partition has consumed nothing of it.
    push_txns(&app, "events", "elsewhere", &["x"]).await;
    consume(&app, "events", "elsewhere", Some("g3"), 1).await;
    let all = app
        .get("/api/v1/messages?queue=events&partition=e")
        .await
        .body;
    assert_eq!(field(&all, "status"), ["pending"; 4]);
    assert_eq!(
        all["messages"][3]["busStatus"],
        json!({"consumedBy": 2, "totalGroups": 3})
    );

    // Queue mode joins: hybrid, and queue mode's cursor decides the status.
    consume(&app, "events", "e", None, 2).await;
    let all = app
        .get("/api/v1/messages?queue=events&partition=e")
        .await
        .body;
    assert_eq!(
        field(&all, "status"),
        ["pending", "pending", "completed", "completed"]
    );
    assert_eq!(
        all["mode"],
        json!({"hasQueueMode": true, "busGroupsCount": 3, "type": "hybrid"})
    );
    let partition = all["messages"][0]["partitionId"].as_str().unwrap();
    let detail = app
        .get(&format!("/api/v1/messages/{partition}/e1"))
        .await
        .body;
    assert_eq!(detail["mode"]["consumedByGroups"], 1);
    assert_eq!(detail["mode"]["type"], "hybrid");
    let names: Vec<(&str, bool)> = detail["consumerGroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap(),
                g["consumed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("__QUEUE_MODE__", true),
            ("g1", true),
            ("g2", false),
            ("g3", false)
        ]
    );
}

#[actix_web::test]
async fn a_status_filter_reads_past_many_segments_of_other_statuses() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_txns(&app, "many", "p", &["first"]).await;
    consume(&app, "many", "p", None, 1).await;
    // More single-message segments than the first chunk of heads a filtered listing reads.
    for n in 0..300 {
        push_txns(&app, "many", "p", &[&format!("m{n}")]).await;
    }
    let completed = app
        .get("/api/v1/messages?queue=many&status=completed")
        .await;
    assert_eq!(txns(&completed.body), ["first"]);
    let tail = app
        .get("/api/v1/messages?queue=many&status=pending&offset=298&limit=5")
        .await;
    assert_eq!(txns(&tail.body), ["m1", "m0"]);
}
