//! Framed pops (`frames=true`, `QPF1`, docs/binary-wire.md "Framed pop") over raw HTTP, read
//! by a decoder that follows the 2.6 client's `queen/http/pop_frames.py` rule by rule, and
//! partitions named by their 64-bit id (decimal text) on the ack and message routes.

use serde_json::{json, Value};

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, TestApp};

/// One decoded message, as the client's decoder renders it.
#[derive(Debug, Clone)]
struct Msg {
    id: String,
    transaction_id: String,
    trace_id: Option<String>,
    data: Value,
    producer_sub: Option<String>,
    partition_id: String,
    partition: String,
    lease_id: String,
    consumer_group: String,
    delivery_attempt: u32,
    offset: u64,
    created_at_us: i64,
}

/// A decoded answer: own keys, queue, leaseId, consumerGroup, claims, messages, codecs used.
#[derive(Debug)]
struct Framed {
    own: Value,
    queue: String,
    lease_id: String,
    consumer_group: String,
    claims: u32,
    messages: Vec<Msg>,
    codecs: Vec<u8>,
    /// Each record's (base offset, count, bytes as sent).
    records: Vec<(u64, u32, Vec<u8>)>,
}

struct In<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(self.at + n <= self.data.len(), "truncated at {}", self.at);
        let s = &self.data[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> usize {
        u16::from_le_bytes(self.take(2).try_into().unwrap()) as usize
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn text(&mut self) -> String {
        let n = self.u16();
        String::from_utf8(self.take(n).to_vec()).expect("utf-8")
    }
}

fn uuid_text(b: &[u8]) -> String {
    uuid::Uuid::from_slice(b).expect("16 bytes").to_string()
}

/// Decodes a `QPF1` answer as the client's `decode_pop_frames` does.
fn decode(data: &[u8]) -> Framed {
    let mut a = In { data, at: 0 };
    assert_eq!(a.take(4), b"QPF1");
    assert_eq!(a.u8(), 1, "version");
    let own_len = a.u32() as usize;
    let own = a.take(own_len);
    let own = if own.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(own).expect("own keys are JSON")
    };
    let queue = a.text();
    let lease_id = a.text();
    let consumer_group = a.text();
    let claims = a.u32();
    let mut messages = Vec::new();
    let mut codecs = Vec::new();
    let mut sent = Vec::new();
    for _ in 0..claims {
        let partition_id = a.u64().to_string();
        let partition = a.text();
        let start = a.u64();
        let end = a.u64();
        let delivery_attempt = a.u32();
        let records = a.u32();
        for _ in 0..records {
            let base = a.u64();
            let created_at_us = a.i64();
            let count = a.u32();
            let codec = a.u8();
            codecs.push(codec);
            let len = a.u32() as usize;
            let raw = a.take(len).to_vec();
            sent.push((base, count, raw.clone()));
            let raw = match codec {
                0 => raw,
                1 => zstd::decode_all(&raw[..]).expect("a zstd record"),
                c => panic!("unknown codec {c}"),
            };
            let mut frames = In { data: &raw, at: 0 };
            for i in 0..count {
                let body_len = frames.u32() as usize;
                let mut f = In {
                    data: frames.take(body_len),
                    at: 0,
                };
                let flags = f.u8();
                assert_eq!(flags & !3, 0, "no flags beyond trace and producer");
                let id = uuid_text(f.take(16));
                let trace_id = (flags & 1 != 0).then(|| uuid_text(f.take(16)));
                let transaction_id = f.text();
                let producer_sub = (flags & 2 != 0).then(|| f.text());
                let offset = base + u64::from(i);
                if offset < start || offset > end {
                    continue;
                }
                let payload = &f.data[f.at..];
                messages.push(Msg {
                    id,
                    transaction_id,
                    trace_id,
                    data: serde_json::from_slice(payload).expect("a JSON payload"),
                    producer_sub,
                    partition_id: partition_id.clone(),
                    partition: partition.clone(),
                    lease_id: lease_id.clone(),
                    consumer_group: consumer_group.clone(),
                    delivery_attempt,
                    offset,
                    created_at_us,
                });
            }
            assert_eq!(frames.at, raw.len(), "a record holds exactly its frames");
        }
    }
    assert_eq!(a.at, data.len(), "nothing after the last claim");
    Framed {
        own,
        queue,
        lease_id,
        consumer_group,
        claims,
        messages,
        codecs,
        records: sent,
    }
}

/// GET with the body kept as bytes, and the content type.
async fn get_bytes(app: &TestApp, path: &str) -> (u16, String, Vec<u8>) {
    let client = awc::Client::default();
    let mut res = client
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("request sent");
    let body = res.body().limit(64 << 20).await.expect("body read");
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (res.status().as_u16(), ct, body.to_vec())
}

/// Acks messages naming partitions as given; returns the answer.
async fn ack_batch(app: &TestApp, msgs: &[Msg], group: Option<&str>) -> Value {
    let acks: Vec<Value> = msgs
        .iter()
        .map(|m| {
            json!({"transactionId": m.transaction_id, "partitionId": m.partition_id,
                   "leaseId": m.lease_id, "status": "completed"})
        })
        .collect();
    let r = app
        .post(
            "/api/v1/ack/batch",
            &json!({"acknowledgments": acks, "consumerGroup": group}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

#[actix_web::test]
async fn a_framed_pop_carries_what_the_json_pop_carries_and_acks_by_the_64_bit_id() {
    let db = fresh_db().await;
    // Records are compressed from 4 KiB of payloads on (by default never).
    let app = spawn_app_with(test_settings(
        &db,
        &[("QUEEN_POP_FRAMES_COMPRESS_FROM", "4096")],
    ))
    .await;
    push_n(&app, "fq", "a", 0, 3).await;
    // Large enough together to go as a zstd record.
    let big: Vec<Value> = (0..40)
        .map(|i| json!({"queue": "fq", "partition": "b", "payload": {"n": 100 + i, "pad": "x".repeat(200)}}))
        .collect();
    assert_eq!(app.push(json!(big)).await.status, 201);
    let (status, ct, body) = get_bytes(
        &app,
        "/api/v1/pop/queue/fq?batch=100&partitions=2&frames=true",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/x-queen-pop");
    let f = decode(&body);
    assert_eq!(f.queue, "fq");
    assert_eq!(f.consumer_group, "__QUEUE_MODE__");
    assert!(uuid::Uuid::parse_str(&f.lease_id).is_ok(), "{}", f.lease_id);
    assert_eq!(f.claims, 2);
    assert_eq!(f.own, Value::Null, "no echo asked for");
    assert!(
        f.codecs.contains(&1),
        "the large claim is compressed: {:?}",
        f.codecs
    );
    assert_eq!(f.messages.len(), 43);
    let a_id = partition_id(&db, "a").await.to_string();
    let b_id = partition_id(&db, "b").await.to_string();
    let mut ns: Vec<i64> = f
        .messages
        .iter()
        .map(|m| m.data["n"].as_i64().unwrap())
        .collect();
    ns.sort_unstable();
    assert_eq!(
        ns,
        [0, 1, 2].into_iter().chain(100..140).collect::<Vec<_>>()
    );
    for m in &f.messages {
        let expected = if m.partition == "a" { &a_id } else { &b_id };
        assert_eq!(&m.partition_id, expected);
        assert_eq!(m.delivery_attempt, 1);
        assert_eq!(m.consumer_group, "__QUEUE_MODE__");
        assert_eq!(
            (m.trace_id.as_deref(), m.producer_sub.as_deref()),
            (None, None)
        );
        assert!(m.created_at_us > 1_600_000_000_000_000);
        // The stored message under the same id and transaction id, at the same offset.
        let stored = db.stored("fq", &m.partition).await;
        let s = stored
            .iter()
            .find(|s| s.id.to_string() == m.id)
            .expect("a stored message with the framed id");
        assert_eq!(s.transaction_id, m.transaction_id);
        assert_eq!(s.offset as u64, m.offset);
    }
    // Acked by the 64-bit id, as the client acks what it decoded.
    let answer = ack_batch(&app, &f.messages, None).await;
    assert!(all_succeeded(&answer), "{answer}");
    let again = pop(&app, "fq", "batch=100&partitions=2").await;
    assert_eq!(again.status, 204, "everything was acked: {:?}", again.body);
}

#[actix_web::test]
async fn a_framed_pop_matches_the_json_pop_of_the_same_messages() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "jq", "p", 0, 5).await;
    let json_pop = pop(&app, "jq", "batch=5&consumerGroup=g1").await;
    let (_, _, body) = get_bytes(
        &app,
        "/api/v1/pop/queue/jq?batch=5&consumerGroup=g2&frames=true",
    )
    .await;
    let f = decode(&body);
    let j = messages(&json_pop);
    assert_eq!(j.len(), f.messages.len());
    for (j, m) in j.iter().zip(&f.messages) {
        assert_eq!(j["id"], m.id);
        assert_eq!(j["transactionId"], m.transaction_id);
        assert_eq!(j["data"], m.data);
        assert_eq!(j["partition"], m.partition);
        assert_eq!(j["consumerGroup"], "g1");
        assert_eq!(m.consumer_group, "g2");
        // createdAt as the client renders it from the record's microseconds.
        let at = chrono::DateTime::from_timestamp_micros(m.created_at_us).unwrap();
        assert_eq!(
            j["createdAt"].as_str().unwrap()[..23],
            at.format("%Y-%m-%dT%H:%M:%S%.3f").to_string()
        );
        assert_eq!(
            j["retryCount"].as_i64().unwrap() + 1,
            i64::from(m.delivery_attempt)
        );
    }
    // The JSON pop's UUID and the framed pop's 64-bit id name the same partition.
    let uuid = j[0]["partitionId"].as_str().unwrap();
    let id = &f.messages[0].partition_id;
    let by_uuid = app
        .get(&format!(
            "/api/v1/messages/{uuid}/{}",
            j[0]["transactionId"].as_str().unwrap()
        ))
        .await;
    let by_id = app
        .get(&format!(
            "/api/v1/messages/{id}/{}",
            j[0]["transactionId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(by_uuid.status, 200);
    assert_eq!(by_id.status, 200, "{:?}", by_id.body);
    assert_eq!(by_uuid.body, by_id.body);
    // g2 acks one message singly by the id, in a transaction another.
    let one = app
        .post(
            "/api/v1/ack",
            &json!({"transactionId": f.messages[0].transaction_id, "partitionId": id,
                    "leaseId": f.lease_id, "consumerGroup": "g2"}),
        )
        .await;
    assert_eq!(one.status, 200, "{:?}", one.body);
    assert_eq!(one.body[0]["success"], true, "{:?}", one.body);
    let tx = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [{"type": "ack", "transactionId": f.messages[1].transaction_id,
                    "partitionId": id, "consumerGroup": "g2", "status": "completed"}]}),
        )
        .await;
    assert_eq!(tx.status, 200, "{:?}", tx.body);
    assert_eq!(tx.body["success"], true, "{:?}", tx.body);
}

#[actix_web::test]
async fn framed_pops_carry_the_autopilot_echo_and_empty_ones_answer_as_json() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "aq", "p", 0, 2).await;
    let (status, ct, body) =
        get_bytes(&app, "/api/v1/pop/queue/aq?autopilot=true&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/x-queen-pop"));
    let f = decode(&body);
    assert_eq!(f.messages.len(), 2);
    assert!(
        f.own["autopilot"]["batch"].as_u64().unwrap() >= 1,
        "{}",
        f.own
    );
    assert!(f.own["autopilot"]["waitMs"].is_u64(), "{}", f.own);
    // Nothing left: the echo still goes out, as the JSON answer the client reads as well.
    let (status, ct, body) =
        get_bytes(&app, "/api/v1/pop/queue/aq?autopilot=true&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["messages"], json!([]));
    assert!(v["autopilot"].is_object());
    // Without an echo: 204, as for JSON.
    let (status, _, _) = get_bytes(&app, "/api/v1/pop/queue/aq?frames=true").await;
    assert_eq!(status, 204);
}

#[actix_web::test]
async fn a_trace_id_that_is_not_a_uuid_is_answered_as_json() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let tx = app
        .post(
            "/api/v1/transaction",
            &json!({"operations": [{"type": "push", "items": [
                {"queue": "tq", "partition": "p", "payload": {"n": 1}, "traceId": "not-a-uuid"}]}]}),
        )
        .await;
    assert_eq!(tx.status, 200, "{:?}", tx.body);
    let (status, ct, body) = get_bytes(&app, "/api/v1/pop/queue/tq?frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["messages"][0]["traceId"], "not-a-uuid");
}

#[actix_web::test]
async fn partition_ids_that_are_neither_form_are_400s_and_unknown_ones_not_found() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "mq", "p", 0, 1).await;
    for bad in [
        "-1",
        "0",
        "+5",
        "1.5",
        " 7",
        "99999999999999999999",
        "9223372036854775808",
        "x",
    ] {
        let r = app
            .post(
                "/api/v1/ack",
                &json!({"transactionId": "t", "partitionId": bad}),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
        assert!(
            r.body["error"].as_str().unwrap().contains("partitionId"),
            "{bad}: {:?}",
            r.body
        );
        let r = app
            .post(
                "/api/v1/transaction",
                &json!({"operations": [{"type": "ack", "transactionId": "t", "partitionId": bad}]}),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
    }
    // A well-formed id no partition has: the ack's own failure, as for an unknown UUID.
    let unknown = app
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "t", "partitionId": "9223372036854775807"}),
        )
        .await;
    let by_uuid = app
        .post(
            "/api/v1/ack",
            &json!({"transactionId": "t", "partitionId": uuid::Uuid::now_v7().to_string()}),
        )
        .await;
    assert_eq!(unknown.status, by_uuid.status, "{:?}", unknown.body);
    assert_eq!(unknown.body[0]["success"], false);
    assert_eq!(unknown.body[0]["error"], by_uuid.body[0]["error"]);
    let r = app.get("/api/v1/messages/9223372036854775807/t").await;
    assert_eq!(r.status, 404);
}

#[actix_web::test]
async fn every_pop_route_answers_frames() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.post(
        "/api/v1/configure",
        &json!({ "queue": "rq", "namespace": "ns", "task": "t" }),
    )
    .await;
    push_n(&app, "rq", "p", 0, 2).await;
    let (status, ct, body) =
        get_bytes(&app, "/api/v1/pop/queue/rq/partition/p?batch=1&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/x-queen-pop"));
    let first = decode(&body).messages;
    assert_eq!(first.len(), 1);
    assert!(all_succeeded(&ack_batch(&app, &first, None).await));
    let (status, ct, body) =
        get_bytes(&app, "/api/v1/pop?namespace=ns&task=t&batch=1&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/x-queen-pop"));
    let second = decode(&body).messages;
    assert_eq!(second[0].data["n"], 1);
    assert!(all_succeeded(&ack_batch(&app, &second, None).await));
}

#[actix_web::test]
async fn the_streams_routes_take_the_64_bit_partition_id_beside_the_uuid() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "src", "p", 0, 1).await;
    let reg = app
        .post(
            "/streams/v1/queries",
            &json!({"name": "s", "source_queue": "src", "sink_queue": "sink", "config_hash": "h"}),
        )
        .await;
    assert_eq!(reg.status, 200, "{}", reg.body);
    let q = reg.body["query_id"].as_str().unwrap().to_string();
    let id = partition_id(&db, "p").await.to_string();
    let uuid = messages(&pop(&app, "src", "consumerGroup=peek").await)[0]["partitionId"]
        .as_str()
        .unwrap()
        .to_string();
    let c = app
        .post(
            "/streams/v1/cycle",
            &json!({"query_id": q, "partition_id": id, "push_items": [], "ack": null,
                    "state_ops": [{"type": "upsert", "key": "k", "value": 1}]}),
        )
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    for named in [&id, &uuid] {
        let s = app
            .post(
                "/streams/v1/state/get",
                &json!({"query_id": q, "partition_id": named, "keys": []}),
            )
            .await;
        assert_eq!(s.status, 200, "{}", s.body);
        assert_eq!(s.body["rows"][0]["key"], "k", "{named}: {}", s.body);
    }
    let bad = app
        .post(
            "/streams/v1/state/get",
            &json!({"query_id": q, "partition_id": "-3", "keys": []}),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.body["error"].as_str().unwrap().contains("partition_id"),
        "{}",
        bad.body
    );
}

#[actix_web::test]
async fn sealed_payloads_go_out_opened_in_frames() {
    let db = fresh_db().await;
    let key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_ENCRYPTION_KEY", key)])).await;
    let r = app
        .post(
            "/api/v1/configure",
            &json!({"queue": "sq", "options": {"encryptionEnabled": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    push_n(&app, "sq", "p", 0, 3).await;
    let stored = db.stored("sq", "p").await;
    assert!(
        !stored[0].payload.contains("\"n\""),
        "stored sealed: {}",
        stored[0].payload
    );
    let (status, ct, body) = get_bytes(&app, "/api/v1/pop/queue/sq?batch=10&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/x-queen-pop"));
    let f = decode(&body);
    let ns: Vec<i64> = f
        .messages
        .iter()
        .map(|m| m.data["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, [0, 1, 2]);
}

/// The stored `frames` of a queue's segments, oldest first, with their base offsets.
async fn segment_bytes(db: &crate::support::TestDb, queue: &str) -> Vec<(i64, Vec<u8>)> {
    sqlx::query_as(
        "SELECT s.base_offset, s.frames
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1
          ORDER BY s.base_offset",
    )
    .bind(queue)
    .fetch_all(&mut db.conn().await)
    .await
    .unwrap()
}

#[actix_web::test]
async fn a_framed_pop_sends_the_stored_record_frames_as_they_are() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Two pushes: two segments of one arrival time each.
    push_n(&app, "vq", "p", 0, 6).await;
    push_n(&app, "vq", "p", 6, 4).await;
    let segments = segment_bytes(&db, "vq").await;
    assert_eq!(segments.len(), 2);
    for (_, bytes) in &segments {
        assert_eq!(bytes[0], 3, "segments are written in the framed layout");
    }
    // A run's frames follow its 16-byte header (arrival time, count, length) after the
    // version byte; each segment here is one run.
    let run = |bytes: &[u8]| bytes[17..].to_vec();
    let (status, ct, body) = get_bytes(&app, "/api/v1/pop/queue/vq?batch=10&frames=true").await;
    assert_eq!((status, ct.as_str()), (200, "application/x-queen-pop"));
    let f = decode(&body);
    assert_eq!(f.codecs, [0, 0], "stored frames go uncompressed by default");
    assert_eq!(
        f.records,
        vec![(0, 6, run(&segments[0].1)), (6, 4, run(&segments[1].1))],
        "each record is a stored run, byte for byte"
    );
    let ns: Vec<i64> = f
        .messages
        .iter()
        .map(|m| m.data["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, (0..10).collect::<Vec<_>>());
    // The same messages as the JSON pop of another group, field by field.
    let json_pop = pop(&app, "vq", "batch=10&consumerGroup=other").await;
    let j = messages(&json_pop);
    assert_eq!(j.len(), 10);
    for (j, m) in j.iter().zip(&f.messages) {
        assert_eq!(j["id"], m.id);
        assert_eq!(j["transactionId"], m.transaction_id);
        assert_eq!(j["data"], m.data);
    }
    // A pop that starts inside a run sends the run's frames from there on: a group pops and
    // acks the first 3, and its next pop's first record is the rest of the first run.
    let (_, _, body) = get_bytes(
        &app,
        "/api/v1/pop/queue/vq?batch=3&consumerGroup=g2&frames=true",
    )
    .await;
    let first = decode(&body);
    assert_eq!(
        first.records,
        vec![(
            0,
            3,
            run(&segments[0].1)[..frames_len(&run(&segments[0].1), 3)].to_vec()
        )]
    );
    ack_batch(&app, &first.messages, Some("g2")).await;
    let (_, _, body) = get_bytes(
        &app,
        "/api/v1/pop/queue/vq?batch=10&consumerGroup=g2&frames=true",
    )
    .await;
    let rest = decode(&body);
    let run0 = run(&segments[0].1);
    assert_eq!(
        rest.records,
        vec![
            (3, 3, run0[frames_len(&run0, 3)..].to_vec()),
            (6, 4, run(&segments[1].1))
        ]
    );
    let ns: Vec<i64> = rest
        .messages
        .iter()
        .map(|m| m.data["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, (3..10).collect::<Vec<_>>());
}

/// Bytes of the first `n` frames of a run (each a `u32` body length and the body).
fn frames_len(run: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        at += 4 + u32::from_le_bytes(run[at..at + 4].try_into().unwrap()) as usize;
    }
    at
}

#[actix_web::test]
async fn segments_of_the_items_layout_pop_as_they_did() {
    let db = fresh_db().await;
    // No cache, so pops read the rewritten rows from PostgreSQL.
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_SEGMENT_CACHE_BYTES", "0")])).await;
    push_n(&app, "oq", "p", 0, 5).await;
    // Stored as a broker before the framed layout stored it.
    let mut conn = db.conn().await;
    for (base, bytes) in segment_bytes(&db, "oq").await {
        let frames = queen_broker::storage::segments::frames::decode(&bytes).unwrap();
        let items: Vec<broker_actors::Item> = frames
            .iter()
            .map(|f| broker_actors::Item {
                message_id: f.id,
                transaction_id: f.transaction_id.to_string(),
                payload: f.payload.into(),
                producer_sub: f.producer_sub.map(str::to_string),
                trace_id: None,
                arrived_at_micros: f.created_at_micros,
            })
            .collect();
        let old = queen_broker::storage::segments::frames::encode_items(items.iter());
        assert_eq!(old[0], 1);
        sqlx::query("UPDATE queen.segments SET frames = $1 WHERE base_offset = $2")
            .bind(old)
            .bind(base)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let json_pop = pop(&app, "oq", "batch=10&consumerGroup=j").await;
    let j = messages(&json_pop);
    let (_, _, body) = get_bytes(
        &app,
        "/api/v1/pop/queue/oq?batch=10&consumerGroup=f&frames=true",
    )
    .await;
    let f = decode(&body);
    assert_eq!(f.messages.len(), 5);
    assert_eq!(j.len(), 5);
    for (i, (j, m)) in j.iter().zip(&f.messages).enumerate() {
        assert_eq!(j["data"]["n"], i);
        assert_eq!(m.data["n"], i);
        assert_eq!(j["id"], m.id);
        assert_eq!(j["transactionId"], m.transaction_id);
    }
    // Framed again from the decoded messages: one record of one arrival time.
    assert_eq!(f.records.len(), 1);
    assert_ne!(
        f.records[0].2,
        segment_bytes(&db, "oq").await[0].1[17..].to_vec()
    );
}
