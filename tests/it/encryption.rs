//! `encryptionEnabled`: payloads sealed at rest with `QUEEN_ENCRYPTION_KEY` (AES-256-GCM, Queen's
//! stored shape), opened on pop and on the message routes; no key, another key or changed bytes
//! never deliver the sealed text.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::consuming::{ack_all, get_raw, messages, pop};
use crate::support::{
    eventually, fresh_db, spawn_app, spawn_app_with, test_settings, TestApp, TestDb,
};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const OTHER_KEY: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1eff";

async fn broker(db: &TestDb, key: Option<&str>) -> TestApp {
    let extra: Vec<(&str, &str)> = key
        .map(|k| ("QUEEN_ENCRYPTION_KEY", k))
        .into_iter()
        .collect();
    spawn_app_with(test_settings(db, &extra)).await
}

async fn configure_encrypted(app: &TestApp, queue: &str, lease_time: i64) {
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": queue, "options": { "encryptionEnabled": true, "leaseTime": lease_time } }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["options"]["encryptionEnabled"], true);
}

#[actix_web::test]
async fn configuring_encryption_without_a_key_is_refused() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "secret", "options": { "encryptionEnabled": true } }),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let error = r.body["error"].as_str().unwrap();
    assert!(
        error.contains("encryptionEnabled") && error.contains("QUEEN_ENCRYPTION_KEY"),
        "{error}"
    );
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "secret", "options": { "encryptionEnabled": "yes" } }),
        )
        .await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    assert_eq!(
        r.body["error"],
        "option encryptionEnabled must be a boolean"
    );
    assert!(db.stored("secret", "Default").await.is_empty());
}

#[actix_web::test]
async fn an_encrypted_queue_stores_sealed_payloads_and_pops_them_as_pushed() {
    let db = fresh_db().await;
    let app = broker(&db, Some(KEY)).await;
    configure_encrypted(&app, "vault", 300).await;
    let r = app
        .push(json!([
            { "queue": "vault", "payload": { "card": "4111-1111", "n": 1 }, "transactionId": "a" },
            { "queue": "plain", "payload": { "card": "4111-1111", "n": 2 } },
        ]))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    // A payload whose exact bytes must come back: key order, number spelling.
    let raw = r#"{"items":[{"queue":"vault","payload":{"z":1,"a":1.10},"transactionId":"b"}]}"#;
    let r = app.post_raw("/api/v1/push", raw.as_bytes().to_vec()).await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    let r = app
        .post(
            "/api/v1/transaction",
            &json!({ "operations": [{ "type": "push", "items": [
                { "queue": "vault", "payload": "from a transaction", "transactionId": "c" }] }] }),
        )
        .await;
    assert_eq!(r.body["success"], true, "{:?}", r.body);

    let stored = db.stored("vault", "Default").await;
    assert_eq!(stored.len(), 3);
    let mut ivs = Vec::new();
    for s in &stored {
        assert!(
            !s.payload.contains("4111")
                && !s.payload.contains("1.10")
                && !s.payload.contains("transaction")
        );
        let shape: Value = serde_json::from_str(&s.payload).expect("the stored shape is JSON");
        let keys: Vec<&String> = shape.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["authTag", "encrypted", "iv"], "{shape}");
        ivs.push(shape["iv"].as_str().unwrap().to_string());
    }
    ivs.sort();
    ivs.dedup();
    assert_eq!(ivs.len(), 3, "a fresh nonce per message");
    assert!(db.stored("plain", "Default").await[0]
        .payload
        .contains("4111"));

    let popped = get_raw(&app, "/api/v1/pop/queue/vault?batch=10").await;
    assert_eq!(popped.status, 200);
    let text = String::from_utf8(popped.body).unwrap();
    assert!(
        text.contains(r#""data":{"card":"4111-1111","n":1}"#),
        "{text}"
    );
    assert!(text.contains(r#""data":{"z":1,"a":1.10}"#), "{text}");
    assert!(text.contains(r#""data":"from a transaction""#), "{text}");

    // The message routes open the payload too, and say it was encrypted.
    let list = app.get("/api/v1/messages?queue=vault").await;
    assert_eq!(list.status, 200, "{:?}", list.body);
    let listed = list.body["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed
        .iter()
        .any(|m| m["payload"] == json!({"card": "4111-1111", "n": 1})));
    let pid = listed[0]["partitionId"].as_str().unwrap();
    let detail = app.get(&format!("/api/v1/messages/{pid}/a")).await;
    assert_eq!(detail.status, 200, "{:?}", detail.body);
    assert_eq!(detail.body["payload"], json!({"card": "4111-1111", "n": 1}));
    assert_eq!(detail.body["isEncrypted"], true);
    let plain = app.get("/api/v1/messages?queue=plain").await;
    let pid = plain.body["messages"][0]["partitionId"]
        .as_str()
        .unwrap()
        .to_string();
    let txn = plain.body["messages"][0]["transactionId"]
        .as_str()
        .unwrap()
        .to_string();
    let detail = app.get(&format!("/api/v1/messages/{pid}/{txn}")).await;
    assert_eq!(detail.body["isEncrypted"], false);
}

#[actix_web::test]
async fn a_broker_with_another_key_delivers_nothing_sealed_and_the_right_key_still_reads_it() {
    let db = fresh_db().await;
    let right = broker(&db, Some(KEY)).await;
    let wrong = broker(&db, Some(OTHER_KEY)).await;
    configure_encrypted(&right, "vault", 1).await;
    let r = right
        .push(json!([{ "queue": "vault", "payload": { "secret": 42 }, "transactionId": "s" }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);

    // The wrong key authenticates nothing: no message, never the sealed text.
    let popped = pop(&wrong, "vault", "").await;
    assert_eq!(popped.status, 204, "{:?}", popped.body);
    let list = wrong.get("/api/v1/messages?queue=vault").await;
    assert_eq!(list.body["messages"][0]["payload"], Value::Null);

    // The message was not lost: once the lease (1 s) runs out the right key delivers it.
    let delivered = eventually(
        Duration::from_secs(10),
        "redelivery with the right key",
        || {
            let right = &right;
            async move {
                let reply = pop(right, "vault", "").await;
                (reply.status == 200).then_some(reply)
            }
        },
    )
    .await;
    assert_eq!(messages(&delivered)[0]["data"], json!({ "secret": 42 }));
    ack_all(&right, &delivered, "completed", None).await;
}

#[actix_web::test]
async fn a_broker_without_a_key_refuses_pushes_to_an_encrypted_queue() {
    let db = fresh_db().await;
    let keyed = broker(&db, Some(KEY)).await;
    let keyless = broker(&db, None).await;
    configure_encrypted(&keyed, "vault", 300).await;
    let r = keyless
        .push(json!([
            { "queue": "vault", "payload": 1 },
            { "queue": "plain", "payload": 2 },
        ]))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body[0]["status"], "failed");
    let error = r.body[0]["error"].as_str().unwrap();
    assert!(
        error.contains("queue vault") && error.contains("QUEEN_ENCRYPTION_KEY"),
        "{error}"
    );
    assert_eq!(r.body[1]["status"], "queued");
    assert!(
        db.stored("vault", "Default").await.is_empty(),
        "no plaintext stored"
    );
}

#[actix_web::test]
async fn a_changed_stored_byte_is_caught_and_not_delivered() {
    let db = fresh_db().await;
    // No segment cache, so the pop reads the changed bytes from PostgreSQL.
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_ENCRYPTION_KEY", KEY),
            ("QUEEN_SEGMENT_CACHE_BYTES", "0"),
        ],
    ))
    .await;
    configure_encrypted(&app, "vault", 300).await;
    let r = app
        .push(json!([{ "queue": "vault", "payload": { "amount": 100 } }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    // Flip one bit of the authentication tag's base64 text ('authTag":"' + first character).
    db.exec(
        "UPDATE queen.segments
            SET frames = overlay(frames PLACING set_byte(substring(frames FROM
                             position('authTag'::bytea IN frames) + 10 FOR 1), 0,
                             get_byte(substring(frames FROM position('authTag'::bytea IN frames) + 10 FOR 1), 0) # 1)
                         FROM position('authTag'::bytea IN frames) + 10 FOR 1)",
    )
    .await;
    let popped = pop(&app, "vault", "").await;
    assert_eq!(popped.status, 204, "{:?}", popped.body);
}

#[test]
fn a_key_that_is_not_64_hex_characters_stops_the_start_without_showing_it() {
    let db = TestDb {
        url: "postgres://u:p@127.0.0.1:1/db".into(),
    };
    for bad in ["abc", &"g".repeat(64), &"0".repeat(66)] {
        let env: std::collections::HashMap<String, String> = [
            ("DATABASE_URL", db.url.as_str()),
            ("QUEEN_CONFIG", ""),
            ("QUEEN_ENCRYPTION_KEY", bad),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let err = queen_broker::settings::Settings::from_map(env)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("QUEEN_ENCRYPTION_KEY") && err.contains("64"),
            "{err}"
        );
        assert!(!err.contains(bad), "{err}");
    }
}

#[actix_web::test]
async fn the_start_up_check_names_a_message_the_key_does_not_open() {
    use queen_broker::storage::segments::crypto::{CryptoError, PayloadKey};
    use queen_broker::storage::segments::key_check::{check_key, KeyCheck};
    let db = fresh_db().await;
    let app = broker(&db, Some(KEY)).await;
    let mut conn = db.conn().await;
    let right = PayloadKey::new(&[0u8; 32]);
    assert_eq!(
        check_key(&mut conn, Some(&right)).await.unwrap(),
        KeyCheck::NothingSealed
    );
    configure_encrypted(&app, "vault", 300).await;
    let r = app.push(json!([{ "queue": "vault", "payload": 1 }])).await;
    let id: uuid::Uuid = r.body[0]["message_id"].as_str().unwrap().parse().unwrap();
    let mut bytes = [0u8; 32];
    for (n, b) in bytes.iter_mut().enumerate() {
        *b = n as u8; // KEY
    }
    let right = PayloadKey::new(&bytes);
    assert_eq!(
        check_key(&mut conn, Some(&right)).await.unwrap(),
        KeyCheck::Opens
    );
    let wrong = PayloadKey::new(&[7u8; 32]);
    assert_eq!(
        check_key(&mut conn, Some(&wrong)).await.unwrap(),
        KeyCheck::Fails {
            message_id: id,
            queue: "vault".into(),
            error: CryptoError::Authentication
        }
    );
    assert_eq!(
        check_key(&mut conn, None).await.unwrap(),
        KeyCheck::Fails {
            message_id: id,
            queue: "vault".into(),
            error: CryptoError::NoKey
        }
    );
}

#[actix_web::test]
async fn a_dead_letter_of_an_encrypted_queue_is_listed_decrypted() {
    let db = fresh_db().await;
    let app = broker(&db, Some(KEY)).await;
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "vault", "options": { "encryptionEnabled": true, "retryLimit": 0 } }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    app.push(json!([{ "queue": "vault", "payload": { "poison": true } }]))
        .await;
    let popped = pop(&app, "vault", "").await;
    ack_all(&app, &popped, "failed", None).await;
    let dlq = app.get("/api/v1/dlq?queue=vault").await;
    assert_eq!(dlq.status, 200, "{:?}", dlq.body);
    assert_eq!(dlq.body["messages"][0]["data"], json!({ "poison": true }));
    let mut conn = db.conn().await;
    let (stored, sealed): (String, bool) =
        sqlx::query_as("SELECT payload, payload_sealed FROM queen.dead_letters")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(sealed && !stored.contains("poison"), "{stored}");
}

/// Pops `vault` on `app` until it answers 200 (a stopped partition is held a few seconds), acks
/// what it got and returns the transactionIds.
async fn pop_and_ack(app: &TestApp, what: &str) -> Vec<String> {
    let reply = eventually(Duration::from_secs(20), what, || async move {
        let reply = pop(app, "vault", "batch=10").await;
        (reply.status == 200).then_some(reply)
    })
    .await;
    let answer = ack_all(app, &reply, "completed", None).await;
    assert!(
        crate::support::consuming::all_succeeded(&answer),
        "{answer:?}"
    );
    messages(&reply)
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap().to_string())
        .collect()
}

#[actix_web::test]
async fn a_message_another_key_sealed_stops_the_partition_and_is_delivered_by_the_right_key() {
    let db = fresh_db().await;
    let right = broker(&db, Some(KEY)).await;
    let wrong = broker(&db, Some(OTHER_KEY)).await;
    configure_encrypted(&right, "vault", 1).await;
    for (app, txn) in [(&right, "a"), (&wrong, "b"), (&right, "c")] {
        let r = app
            .push(json!([{ "queue": "vault", "payload": { "t": txn }, "transactionId": txn }]))
            .await;
        assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    }

    // `a` does not open here: nothing from it on is delivered (not `b` alone, whose ack would
    // move the cursor past `a`).
    let first = pop(&wrong, "vault", "batch=10").await;
    if first.status == 200 {
        ack_all(&wrong, &first, "completed", None).await;
    }
    assert_eq!(first.status, 204, "{:?}", first.body);
    let stopped = wrong.get("/api/v1/system/undecryptable").await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    assert_eq!(stopped.body["count"], 1, "{:?}", stopped.body);
    let entry = &stopped.body["partitions"][0];
    assert_eq!(
        (&entry["queue"], &entry["partition"], &entry["offset"]),
        (&json!("vault"), &json!("Default"), &json!(0)),
        "{entry:?}"
    );
    assert!(entry["error"].as_str().unwrap().contains("authentication"));
    let (_, text) = wrong.get_text("/metrics/prometheus").await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("queen_undecryptable_stops_total ") && !l.ends_with(" 0")),
        "{text}"
    );

    // Each key delivers what it opens, in order, and stops in front of the other's message.
    let mut seen = pop_and_ack(&right, "the right key delivers a").await;
    seen.extend(pop_and_ack(&wrong, "the other key delivers b").await);
    seen.extend(pop_and_ack(&right, "the right key delivers c").await);
    assert_eq!(seen, ["a", "b", "c"]);
    // Each broker lists what it met last: the right key's stop at `b` went when it delivered
    // `c`; the other key last stopped at `c`.
    let stopped = right.get("/api/v1/system/undecryptable").await;
    assert_eq!(stopped.body["count"], 0, "{:?}", stopped.body);
    let stopped = wrong.get("/api/v1/system/undecryptable").await;
    assert_eq!(
        stopped.body["partitions"][0]["offset"], 2,
        "{:?}",
        stopped.body
    );
}

#[actix_web::test]
async fn an_auto_ack_pop_does_not_pass_a_message_it_cannot_open() {
    let db = fresh_db().await;
    let right = broker(&db, Some(KEY)).await;
    let wrong = broker(&db, Some(OTHER_KEY)).await;
    configure_encrypted(&right, "vault", 1).await;
    for (app, txn) in [(&wrong, "a"), (&right, "b")] {
        let r = app
            .push(json!([{ "queue": "vault", "payload": { "t": txn }, "transactionId": txn }]))
            .await;
        assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    }
    // `a` opens here, `b` does not: autoAck commits `a` only.
    let got = pop(&wrong, "vault", "batch=10&autoAck=true").await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    let txns: Vec<Value> = messages(&got)
        .iter()
        .map(|m| m["transactionId"].clone())
        .collect();
    assert_eq!(txns, [json!("a")]);
    let got = eventually(Duration::from_secs(20), "b with the right key", || {
        let right = &right;
        async move {
            let reply = pop(right, "vault", "batch=10&autoAck=true").await;
            (reply.status == 200).then_some(reply)
        }
    })
    .await;
    assert_eq!(messages(&got)[0]["transactionId"], "b", "{:?}", got.body);
}

#[actix_web::test]
async fn buffered_pushes_a_keyless_broker_cannot_seal_are_quarantined_not_dropped() {
    let db = fresh_db().await;
    let keyed = broker(&db, Some(KEY)).await;
    let keyless = broker(&db, None).await;
    configure_encrypted(&keyed, "vault", 300).await;
    let r = keyless
        .post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let items: Vec<Value> = (0..3)
        .map(|n| json!({ "queue": "vault", "payload": { "n": n }, "transactionId": format!("t{n}") }))
        .collect();
    let r = keyless.push(json!(items)).await;
    let statuses: Vec<&str> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["buffered"; 3], "{:?}", r.body);
    let r = keyless
        .post("/api/v1/system/maintenance", &json!({ "enabled": false }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    keyless.drained().await;
    assert!(db.stored("vault", "Default").await.is_empty());
    let q = keyless.get("/api/v1/system/quarantine").await;
    assert_eq!(q.status, 200, "{:?}", q.body);
    assert_eq!(q.body["count"], 3, "{:?}", q.body);
    let records = q.body["records"].as_array().unwrap();
    assert_eq!(records.len(), 3, "{:?}", q.body);
    let text = q.body.to_string();
    for n in 0..3 {
        assert!(text.contains(&format!("t{n}")), "{text}");
    }
    assert!(text.contains("QUEEN_ENCRYPTION_KEY"), "{text}");
}
