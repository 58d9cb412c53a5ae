//! Helpers shared by the consuming tests (pop, ack, lease, groups, transaction, long-poll).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{Reply, TestApp, TestDb};

/// A raw HTTP answer: status and body bytes.
pub struct Raw {
    /// Status.
    pub status: u16,
    /// Body.
    pub body: Vec<u8>,
}

/// GETs a path and keeps the body bytes as sent.
pub async fn get_raw(app: &TestApp, path: &str) -> Raw {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let mut res = client
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("request sent");
    let body = res
        .body()
        .limit(256 * 1024 * 1024)
        .await
        .expect("body read");
    Raw {
        status: res.status().as_u16(),
        body: body.to_vec(),
    }
}

/// POSTs raw bytes and keeps the body bytes as sent.
pub async fn post_raw(app: &TestApp, path: &str, body: &str) -> Raw {
    let client = awc::Client::default();
    let mut res = client
        .post(format!("{}{path}", app.base))
        .insert_header(("content-type", "application/json"))
        .send_body(body.to_string())
        .await
        .expect("request sent");
    let body = res.body().limit(256 * 1024 * 1024).await.expect("body");
    Raw {
        status: res.status().as_u16(),
        body: body.to_vec(),
    }
}

/// Pushes `n` messages `{"n": i}` (i from `first`) to one partition; asserts all queued.
pub async fn push_n(app: &TestApp, queue: &str, partition: &str, first: i64, n: i64) {
    let items: Vec<Value> = (first..first + n)
        .map(|i| json!({ "queue": queue, "partition": partition, "payload": { "n": i } }))
        .collect();
    let reply = app.push(json!(items)).await;
    assert_eq!(reply.status, 201, "{:?}", reply.body);
    for r in reply.body.as_array().expect("array") {
        assert_eq!(r["status"], "queued", "{r}");
    }
}

/// GET `/api/v1/pop/queue/{queue}?{query}`.
pub async fn pop(app: &TestApp, queue: &str, query: &str) -> Reply {
    app.get(&format!("/api/v1/pop/queue/{queue}?{query}")).await
}

/// GET `/api/v1/pop/queue/{queue}/partition/{partition}?{query}`.
pub async fn pop_partition(app: &TestApp, queue: &str, partition: &str, query: &str) -> Reply {
    app.get(&format!(
        "/api/v1/pop/queue/{queue}/partition/{partition}?{query}"
    ))
    .await
}

/// The messages of a pop reply (empty for 204).
pub fn messages(reply: &Reply) -> Vec<Value> {
    if reply.status == 204 {
        return Vec::new();
    }
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body["messages"].as_array().expect("messages").clone()
}

/// The `n` of each message's `{"n": i}` payload.
pub fn ns(reply: &Reply) -> Vec<i64> {
    messages(reply)
        .iter()
        .map(|m| m["data"]["n"].as_i64().expect("n"))
        .collect()
}

/// Acks every message of a pop reply with one status (batch route); returns the results.
pub async fn ack_all(app: &TestApp, reply: &Reply, status: &str, group: Option<&str>) -> Value {
    let acks: Vec<Value> = messages(reply)
        .iter()
        .map(|m| {
            json!({
                "transactionId": m["transactionId"],
                "partitionId": m["partitionId"],
                "leaseId": m["leaseId"],
                "status": status,
            })
        })
        .collect();
    let r = app
        .post(
            "/api/v1/ack/batch",
            &json!({ "acknowledgments": acks, "consumerGroup": group }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body
}

/// Whether every item of an ack answer succeeded.
pub fn all_succeeded(answer: &Value) -> bool {
    answer
        .as_array()
        .is_some_and(|items| items.iter().all(|a| a["success"] == true))
}

/// Acks one message (single route).
pub async fn ack_one(app: &TestApp, message: &Value, status: &str, group: Option<&str>) -> Value {
    let r = app
        .post(
            "/api/v1/ack",
            &json!({
                "transactionId": message["transactionId"],
                "partitionId": message["partitionId"],
                "leaseId": message["leaseId"],
                "status": status,
                "consumerGroup": group,
            }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body[0].clone()
}

/// DELETEs a path.
pub async fn delete(app: &TestApp, path: &str) -> Reply {
    let client = awc::Client::default();
    let mut res = client
        .delete(format!("{}{path}", app.base))
        .send()
        .await
        .expect("request sent");
    let bytes = res.body().await.expect("body read");
    Reply {
        status: res.status().as_u16(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers: res.headers().clone(),
    }
}

/// The database id of the partition named `name` (names are unique within these tests).
pub async fn partition_id(db: &TestDb, name: &str) -> i64 {
    let mut conn = db.conn().await;
    sqlx::query_scalar("SELECT id FROM queen.partitions WHERE name = $1")
        .bind(name)
        .fetch_one(&mut conn)
        .await
        .expect("partition row")
}

/// Checks what consumers got from partitions `0..partitions` holding messages
/// `p * 1000 .. p * 1000 + each` (`push_n` numbering): within each consumer's pops a
/// partition's messages come in order, and every message came exactly once.
pub fn assert_each_once_in_order(all: &[Vec<i64>], partitions: i64, each: i64) {
    let mut by_partition: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for got in all {
        let mut last: std::collections::BTreeMap<i64, i64> = Default::default();
        for n in got {
            let p = n / 1000;
            if let Some(prev) = last.insert(p, *n) {
                assert!(*n > prev, "partition {p} out of order: {prev} then {n}");
            }
            by_partition.entry(p).or_default().push(*n);
        }
    }
    for p in 0..partitions {
        let mut got = by_partition.remove(&p).unwrap_or_default();
        got.sort_unstable();
        let want: Vec<i64> = (p * 1000..p * 1000 + each).collect();
        assert_eq!(got, want, "partition {p}: every message once");
    }
    assert!(
        by_partition.is_empty(),
        "messages of no such partition: {by_partition:?}"
    );
}
