//! The operators' message routes over HTTP against a real PostgreSQL (reference §9.3).

mod common;

use common::{fresh_db, spawn_app, TestApp};
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
