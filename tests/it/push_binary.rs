//! The binary bodies of the 2.x clients (reference 2.x §2.9, docs/binary-wire.md): `QPB1` on
//! `/push` answers and deduplicates exactly as the JSON body, with or without zstd; a malformed
//! body is a 400 naming the byte offset; `QTB1` commits a bundle like its JSON form.

use std::time::Duration;

use queen_broker::protocol::push_binary::{
    encode_push, encode_push_frames, encode_transaction, Group, CONTENT_TYPE, FLAG_COUNTS,
    FLAG_TXN, FLAG_ZSTD,
};
use serde_json::{json, Value};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, Reply, TestApp};

/// POSTs a binary body with the binary content type.
async fn post_binary(app: &TestApp, path: &str, body: Vec<u8>) -> Reply {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let mut res = client
        .post(format!("{}{path}", app.base))
        .insert_header(("content-type", CONTENT_TYPE))
        .send_body(body)
        .await
        .expect("request sent");
    let bytes = res.body().limit(64 * 1024 * 1024).await.expect("body read");
    Reply {
        status: res.status().as_u16(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers: res.headers().clone(),
    }
}

fn group(queue: &str, partition: &str, items: &[(&str, Value)]) -> Group {
    Group {
        queue: queue.into(),
        partition: partition.into(),
        items: items
            .iter()
            .map(|(t, p)| (t.to_string(), p.to_string()))
            .collect(),
    }
}

/// The answer without the fields that differ between two pushes of the same items.
fn shape(reply: &Reply) -> Vec<(u64, String, String, String)> {
    reply
        .body
        .as_array()
        .unwrap_or_else(|| panic!("an array: {:?}", reply.body))
        .iter()
        .map(|r| {
            (
                r["index"].as_u64().unwrap(),
                r["queueName"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
                r["transaction_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[actix_web::test]
async fn push_binary_answers_and_stores_as_the_json_push_does() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let items = [
        ("k1", json!({"n": 1})),
        ("", json!([1.5, "é"])),
        ("k1", json!(3)),
    ];
    let json_reply = app
        .push(json!(items
            .iter()
            .map(|(t, p)| json!({"queue": "j", "partition": "p", "payload": p, "transactionId": t}))
            .collect::<Vec<_>>()))
        .await;
    assert_eq!(json_reply.status, 201);
    for (flags, queue) in [(FLAG_TXN, "b"), (FLAG_TXN | FLAG_ZSTD, "z")] {
        let reply = post_binary(
            &app,
            "/api/v1/push",
            encode_push(&[group(queue, "p", &items)], flags),
        )
        .await;
        assert_eq!(reply.status, 201, "{:?}", reply.body);
        let mut want = shape(&json_reply);
        for w in &mut want {
            w.1 = queue.to_string();
        }
        // The minted transaction ids differ; everything else is the JSON answer.
        let got = shape(&reply);
        assert_eq!(got.len(), 3);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((g.0, &g.1, &g.2), (w.0, &w.1, &w.2), "{queue}");
        }
        assert_eq!(got[0].3, "k1");
        assert_eq!(reply.body[2]["message_id"], reply.body[0]["message_id"]);
        let stored = db.stored(queue, "p").await;
        let payloads: Vec<&str> = stored.iter().map(|s| s.payload.as_str()).collect();
        assert_eq!(payloads, vec![r#"{"n":1}"#, r#"[1.5,"é"]"#]);
        assert_eq!(
            stored[1].transaction_id,
            reply.body[1]["transaction_id"].as_str().unwrap()
        );
    }
}

#[actix_web::test]
async fn push_binary_dedup_is_the_json_dedup() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = app
        .push(json!([{ "queue": "d", "payload": 1, "transactionId": "order-1" }]))
        .await;
    // The same key through each binary form: a duplicate naming the JSON push's message.
    for body in [
        encode_push(&[group("d", "Default", &[("order-1", json!(1))])], 0),
        encode_push(
            &[group("d", "Default", &[("order-1", json!(1))])],
            FLAG_ZSTD,
        ),
        encode_push_frames(&[group("d", "Default", &[("order-1", json!(1))])], false),
    ] {
        let again = post_binary(&app, "/api/v1/push", body).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body[0]["status"], "duplicate", "{:?}", again.body);
        assert_eq!(again.body[0]["message_id"], first.body[0]["message_id"]);
    }
    // A key first pushed in binary form is a duplicate for the JSON push too.
    let framed = post_binary(
        &app,
        "/api/v1/push",
        encode_push_frames(&[group("d", "Default", &[("order-2", json!(2))])], false),
    )
    .await;
    assert_eq!(framed.body[0]["status"], "queued");
    let json_again = app
        .push(json!([{ "queue": "d", "payload": 2, "transactionId": "order-2" }]))
        .await;
    assert_eq!(json_again.body[0]["status"], "duplicate");
    assert_eq!(
        json_again.body[0]["message_id"],
        framed.body[0]["message_id"]
    );
    assert_eq!(db.stored("d", "Default").await.len(), 2);
}

#[actix_web::test]
async fn push_binary_frames_keep_the_client_message_ids_and_pop_back() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let body = encode_push_frames(
        &[group(
            "f",
            "p",
            &[("a", json!({"x": 1})), ("", json!("two"))],
        )],
        false,
    );
    let reply = post_binary(&app, "/api/v1/push", body).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    let stored = db.stored("f", "p").await;
    assert_eq!(stored.len(), 2);
    for (s, r) in stored.iter().zip(reply.body.as_array().unwrap()) {
        assert_eq!(s.id.to_string(), r["message_id"].as_str().unwrap());
        assert_eq!(s.transaction_id, r["transaction_id"].as_str().unwrap());
    }
    // The second carried no transaction id: its message id's text is its key.
    assert_eq!(stored[1].transaction_id, stored[1].id.to_string());
    let popped = pop_partition(&app, "f", "p", "batch=10").await;
    let m = messages(&popped);
    assert_eq!(m[0]["data"], json!({"x": 1}));
    assert_eq!(m[1]["data"], "two");
    assert_eq!(m[0]["id"], reply.body[0]["message_id"]);
}

#[actix_web::test]
async fn push_binary_counts_answer_with_flag_2() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let items = [("k", json!(1)), ("k", json!(2)), ("", json!(3))];
    let reply = post_binary(
        &app,
        "/api/v1/push",
        encode_push(&[group("c", "p", &items)], FLAG_COUNTS),
    )
    .await;
    assert_eq!(reply.status, 201);
    assert_eq!(
        reply.body,
        json!({"count": 3, "queued": 2, "duplicate": 1, "buffered": 0, "error": 0})
    );
    let reply = post_binary(&app, "/api/v1/push", encode_push_frames(&[], true)).await;
    assert_eq!(
        reply.body,
        json!({"count": 0, "queued": 0, "duplicate": 0, "buffered": 0, "error": 0})
    );
}

#[actix_web::test]
async fn push_binary_malformed_bodies_are_400_naming_the_offset() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let good = encode_push(&[group("m", "p", &[("t", json!(1))])], FLAG_TXN);
    let mut bad_payload = good.clone();
    let last = bad_payload.len() - 1;
    bad_payload[last] = b'{';
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"QPB".to_vec(), "byte 0, magic"),
        (b"{\"items\":[]}".to_vec(), "byte 0, magic"),
        (b"QPB1\x40".to_vec(), "byte 4, flags"),
        (
            good[..good.len() - 2].to_vec(),
            "byte 22, group 0 item 0 payload",
        ),
        (
            bad_payload,
            "byte 22, group 0 item 0 payload: is not one JSON document",
        ),
        ([good.clone(), vec![0]].concat(), "end of body"),
        (
            encode_push(&[group("m", "p", &[("t", json!(1))])], FLAG_ZSTD)[..20].to_vec(),
            "compressed body",
        ),
        (
            encode_push_frames(&[group("m", "", &[("t", json!(1))])], false),
            "group 0 partition: partition must not be empty",
        ),
    ];
    for (body, want) in cases {
        let reply = post_binary(&app, "/api/v1/push", body).await;
        assert_eq!(reply.status, 400, "{want}: {:?}", reply.body);
        let text = reply.body["error"].as_str().unwrap();
        assert!(text.contains(want), "want {want:?} in {text:?}");
    }
    assert!(db.stored("m", "p").await.is_empty(), "nothing was written");
}

#[actix_web::test]
async fn push_binary_zip_bomb_is_413_before_it_is_inflated() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_MAX_BODY_BYTES", "100000")])).await;
    let big = json!("a".repeat(300_000));
    for body in [
        encode_push(&[group("z", "p", &[("", big.clone())])], FLAG_ZSTD),
        encode_push_frames(&[group("z", "p", &[("", big.clone())])], false),
    ] {
        assert!(body.len() < 10_000);
        let reply = post_binary(&app, "/api/v1/push", body).await;
        assert_eq!(reply.status, 413, "{:?}", reply.body);
    }
}

#[actix_web::test]
async fn transaction_binary_commits_head_acks_and_framed_pushes_together() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "in", "p", 0, 1).await;
    let reply = pop(&app, "in", "").await;
    let m = &messages(&reply)[0];
    let head = json!({
        "operations": [
            { "type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"],
              "leaseId": m["leaseId"] },
        ],
        "requiredLeases": [m["leaseId"]],
        "kv": [{ "op": "put", "ns": "tx", "key": "k", "value": 7, "ttlSeconds": 60 }],
    });
    let body = encode_transaction(
        &serde_json::to_vec(&head).unwrap(),
        &[
            group("out", "a", &[("t1", json!({"n": 1}))]),
            group("out", "b", &[("", json!(2)), ("t3", json!(3))]),
        ],
        false,
    );
    let r = post_binary(&app, "/api/v1/transaction", body).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["success"], true, "{:?}", r.body);
    let results = r.body["results"].as_array().unwrap();
    let kinds: Vec<(&str, u64)> = results
        .iter()
        .map(|r| (r["type"].as_str().unwrap(), r["index"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![("ack", 0), ("push", 1), ("push", 2), ("push", 3), ("kv", 4)],
        "head operations, then the pushes in wire order, then the riders"
    );
    assert_eq!(results[1]["transactionId"], "t1");
    assert_eq!(results[3]["status"], "queued");
    assert_eq!(pop(&app, "in", "").await.status, 204, "the ack committed");
    assert_eq!(db.stored("out", "a").await.len(), 1);
    let b = db.stored("out", "b").await;
    assert_eq!(b.len(), 2);
    assert_eq!(
        b[0].id.to_string(),
        results[2]["messageId"].as_str().unwrap()
    );
    let kv = app
        .post(
            "/api/v1/kv",
            &json!({"operations": [{"op": "get", "ns": "tx", "key": "k"}]}),
        )
        .await;
    assert_eq!(kv.body["results"][0]["value"], 7, "{:?}", kv.body);

    // Flag 2: the pushes and acks counted; a second bundle of the same keys is duplicates.
    let body = encode_transaction(
        b"",
        &[group(
            "out",
            "a",
            &[("t1", json!({"n": 1})), ("t4", json!(4))],
        )],
        true,
    );
    let r = post_binary(&app, "/api/v1/transaction", body).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["success"], true);
    assert_eq!(
        (r.body["pushed"].as_u64(), r.body["duplicate"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(r.body["acked"], 0);
    assert_eq!(r.body["results"], json!([]));
}

#[actix_web::test]
async fn transaction_binary_malformed_is_400_and_applies_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let groups = [group("tb", "p", &[("t", json!(1))])];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            encode_transaction(b"{not json", &groups, false),
            "QTB1 body: head (bytes 9..18): Invalid JSON",
        ),
        (
            encode_transaction(br#"{"operations":[{"type":"nope"}]}"#, &groups, false),
            "operation 0: type must be",
        ),
        (encode_push(&groups, 0), "QTB1 body: byte 0, magic"),
        (
            encode_transaction(b"", &[], false),
            "operations array cannot be empty",
        ),
    ];
    for (body, want) in cases {
        let r = post_binary(&app, "/api/v1/transaction", body).await;
        assert_eq!(r.status, 400, "{want}: {:?}", r.body);
        let text = r.body["error"].as_str().unwrap();
        assert!(text.contains(want), "want {want:?} in {text:?}");
    }
    assert!(db.stored("tb", "p").await.is_empty());
}
