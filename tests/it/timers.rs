//! Timers (docs/timers.md, reference 2.x §2.3), over raw HTTP: a timer fires once as a message
//! with its data, `transactionId` = its `txn` and the id promised at schedule time; cancel,
//! peek, `absent` and `too_late`; reschedule and negative delays; keyset paging; the 400s; the
//! operations inside a caller's transaction; and exactly-once firing with several brokers on
//! one database, one of them killed with SIGKILL while timers are due.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use queen_broker::storage::timers::{self as store, Schedule, TimerOp, TimerResult};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::consuming::*;
use crate::support::{eventually, fresh_db, spawn_app, TestApp, TestDb};

const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");

fn b64(data: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(data.to_string())
}

fn schedule_op(queue: &str, key: &str, data: &Value, delay_ms: i64) -> Value {
    json!({ "op": "schedule", "queue": queue, "timerKey": key, "payload": b64(data),
            "delayMs": delay_ms, "txn": format!("txn-{key}") })
}

/// POSTs operations; asserts 200 and returns the results.
async fn batch(app: &TestApp, ops: Vec<Value>) -> Vec<Value> {
    let r = app
        .post("/api/v1/timers", &json!({ "operations": ops }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["results"].as_array().expect("results").clone()
}

async fn rows_left(db: &TestDb) -> i64 {
    let mut conn = db.conn().await;
    sqlx::query_scalar("SELECT count(*) FROM queen.timers")
        .fetch_one(&mut conn)
        .await
        .expect("count")
}

#[actix_web::test]
async fn a_timer_fires_once_as_a_message_with_its_data_txn_and_promised_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // The queue does not exist yet: the fire creates it, as a push would.
    let data = json!({ "orderId": "9f1", "n": 1.10 });
    let results = batch(
        &app,
        vec![
            json!({ "op": "schedule", "queue": "later", "timerKey": "order:9f1:expire",
                     "payload": b64(&data), "delayMs": 300, "txn": "t-9f1", "partition": "p1" }),
        ],
    )
    .await;
    let r = &results[0];
    assert_eq!(r["ok"], true);
    assert_eq!(r["status"], "scheduled");
    assert_eq!(r["txn"], "t-9f1");
    assert_eq!(r["timerKey"], "order:9f1:expire");
    let deliver_at = r["deliverAt"].as_str().expect("deliverAt");
    assert_eq!(
        deliver_at.len(),
        "2024-01-01T00:00:00.000000Z".len(),
        "{deliver_at}"
    );
    assert!(deliver_at.ends_with('Z'));
    let scheduled_at = Instant::now();

    // A long-poll waiting on the queue is woken by the fire.
    let reply = pop(&app, "later", "wait=true&timeout=10000").await;
    let waited = scheduled_at.elapsed();
    let m = &messages(&reply)[0];
    assert_eq!(m["data"], data);
    assert_eq!(m["transactionId"], "t-9f1");
    assert_eq!(
        m["id"], r["messageId"],
        "the promised id is the delivered one"
    );
    assert_eq!(m["partition"], "p1");
    assert!(
        waited >= Duration::from_millis(250),
        "not before deliverAt: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2300),
        "fired late: {waited:?}"
    );
    eprintln!("timer of 300 ms popped after {waited:?}");
    let stored = db.stored("later", "p1").await;
    assert_eq!(stored.len(), 1, "fired exactly once");
    assert_eq!(rows_left(&db).await, 0, "the fired row is gone");
    let peek = app.get("/api/v1/timers/later/order%3A9f1%3Aexpire").await;
    assert_eq!(peek.body, json!({ "found": false }));
}

#[actix_web::test]
async fn cancel_removes_a_pending_timer_and_a_second_cancel_is_absent() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let data = json!({ "v": 1 });
    let s = &batch(&app, vec![schedule_op("cq", "a/b:c", &data, 30_000)]).await[0];

    // The key holds `/`; the path keeps it literal and percent-encodes the rest.
    let peek = app.get("/api/v1/timers/cq/a/b%3Ac").await;
    assert_eq!(peek.status, 200);
    assert_eq!(peek.body["found"], true);
    assert_eq!(peek.body["timerKey"], "a/b:c");
    assert_eq!(peek.body["payload"], b64(&data));
    assert_eq!(peek.body["encrypted"], false);
    assert_eq!(peek.body["messageId"], s["messageId"]);
    assert_eq!(peek.body["deliverAt"], s["deliverAt"]);
    assert_eq!(peek.body["partition"], "Default");

    let c = app
        .delete("/api/v1/timers/cq/a/b%3Ac?txn=txn-a%2Fb%3Ac")
        .await;
    assert_eq!(c.status, 200, "{:?}", c.body);
    assert_eq!(c.body["status"], "cancelled");
    assert_eq!(c.body["ok"], true);
    assert_eq!(c.body["txn"], "txn-a/b:c");
    assert_eq!(
        app.get("/api/v1/timers/cq/a/b%3Ac").await.body["found"],
        false
    );

    let again = app.delete("/api/v1/timers/cq/a/b%3Ac?txn=mine").await;
    assert_eq!(again.body["status"], "absent");
    assert_eq!(again.body["ok"], false);
    assert_eq!(again.body["txn"], "mine", "absent echoes the caller's txn");
    let never = app.delete("/api/v1/timers/no-such-queue/never").await;
    assert_eq!(never.status, 200);
    assert_eq!(never.body["status"], "absent");
    assert_eq!(never.body["txn"], Value::Null);

    // A cancel in the batch route answers the same way.
    batch(&app, vec![schedule_op("cq", "k2", &data, 30_000)]).await;
    let r = batch(
        &app,
        vec![
            json!({ "op": "cancel", "queue": "cq", "timerKey": "k2" }),
            json!({ "op": "cancel", "queue": "cq", "timerKey": "k3", "txn": "x" }),
        ],
    )
    .await;
    assert_eq!(r[0]["status"], "cancelled");
    assert_eq!(r[0]["txn"], "txn-k2");
    assert_eq!(r[1]["status"], "absent");
    assert_eq!(r[1]["txn"], "x");
    assert_eq!(rows_left(&db).await, 0);
}

#[actix_web::test]
async fn a_cancel_that_waits_for_a_fire_in_progress_is_too_late() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    batch(&app, vec![schedule_op("tl", "k", &json!(1), 60_000)]).await;
    // Stand in for a firing broker: hold the row as a fire does, then delete it and commit.
    let mut fire = db.conn().await;
    sqlx::query("BEGIN").execute(&mut fire).await.unwrap();
    sqlx::query("SELECT 1 FROM queen.timers WHERE queue = 'tl' AND timer_key = 'k' FOR UPDATE")
        .execute(&mut fire)
        .await
        .unwrap();
    let cancel = app.delete("/api/v1/timers/tl/k?txn=other");
    let commit_fire = async {
        eventually(
            Duration::from_secs(10),
            "the cancel waits for the row",
            || async {
                let mut watch = db.conn().await;
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM queen.timers%'",
                )
                .fetch_one(&mut watch)
                .await
                .unwrap();
                (waiting > 0).then_some(())
            },
        )
        .await;
        sqlx::query("DELETE FROM queen.timers WHERE queue = 'tl' AND timer_key = 'k'")
            .execute(&mut fire)
            .await
            .unwrap();
        sqlx::query("COMMIT").execute(&mut fire).await.unwrap();
    };
    let (c, ()) = futures_util::join!(cancel, commit_fire);
    assert_eq!(c.status, 200, "{:?}", c.body);
    assert_eq!(c.body["status"], "too_late");
    assert_eq!(c.body["ok"], false);
    assert_eq!(c.body["txn"], "txn-k", "the fired timer's txn");
}

/// A firing round whose link to PostgreSQL went half-open mid-transaction: its backend sits
/// idle in the transaction holding the claimed rows, which every broker's round skips. The
/// server ends that transaction after `storage::begin::IDLE_IN_TRANSACTION` (its `begin`
/// sets the bound), and the timer fires. In the chaos run with half-open links 691 timers
/// stayed unfired for good before this bound.
#[actix_web::test]
async fn timers_claimed_by_a_round_cut_off_mid_transaction_are_freed_and_fired() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    batch(&app, vec![schedule_op("cut", "k", &json!(1), 300)]).await;
    // Stand in for the cut-off round: claim the row as a round does, then say nothing more.
    let mut frozen = db.conn().await;
    let mut tx = queen_broker::storage::begin::begin(&mut frozen)
        .await
        .expect("begin");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM queen.timers WHERE queue = 'cut' FOR UPDATE) AS r",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("claim");
    assert_eq!(held, 1, "claimed before the broker fired it");
    let limit = queen_broker::storage::begin::IDLE_IN_TRANSACTION + Duration::from_secs(10);
    eventually(limit, "the claimed timer fired", || async {
        (rows_left(&db).await == 0).then_some(())
    })
    .await;
    let popped = messages(&pop(&app, "cut", "batch=5&wait=false").await);
    assert_eq!(popped.len(), 1, "fired once");
    let after = sqlx::query("SELECT 1").execute(&mut *tx).await;
    assert!(
        after.is_err(),
        "the server ended the idle transaction's session: {after:?}"
    );
}

#[actix_web::test]
async fn reschedule_moves_the_delivery_and_delivers_the_new_payload_and_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = batch(
        &app,
        vec![schedule_op("rq", "r", &json!({ "v": 1 }), 60_000)],
    )
    .await;
    let mut op = schedule_op("rq", "r", &json!({ "v": 2 }), 200);
    op["op"] = json!("reschedule");
    op["txn"] = json!("second");
    let again = batch(&app, vec![op]).await;
    assert_eq!(again[0]["status"], "rescheduled");
    assert!(again[0]["deliverAt"].as_str() < first[0]["deliverAt"].as_str());
    assert_ne!(again[0]["messageId"], first[0]["messageId"]);

    let reply = pop(&app, "rq", "wait=true&timeout=10000").await;
    let m = &messages(&reply)[0];
    assert_eq!(m["data"], json!({ "v": 2 }));
    assert_eq!(m["transactionId"], "second");
    assert_eq!(m["id"], again[0]["messageId"]);
    assert_eq!(db.stored("rq", "Default").await.len(), 1);

    // A second schedule of a pending key is the same upsert; the list shows the key once.
    batch(&app, vec![schedule_op("rq", "u", &json!(1), 60_000)]).await;
    let up = batch(&app, vec![schedule_op("rq", "u", &json!(2), 60_000)]).await;
    assert_eq!(up[0]["status"], "rescheduled");
    let list = app.get("/api/v1/timers/rq").await;
    let keys: Vec<&str> = list.body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["timerKey"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["u"]);
}

#[actix_web::test]
async fn a_negative_delay_fires_on_the_first_round() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let r = batch(
        &app,
        vec![schedule_op("past", "p", &json!({ "late": true }), -10_000)],
    )
    .await;
    assert_eq!(r[0]["status"], "scheduled");
    eventually(Duration::from_secs(5), "the past timer fires", || async {
        (app.get("/api/v1/timers/past/p").await.body["found"] == false).then_some(())
    })
    .await;
    let stored = db.stored("past", "Default").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].payload, r#"{"late":true}"#);
    assert_eq!(stored[0].transaction_id, "txn-p");
}

#[actix_web::test]
async fn the_list_is_keyset_paged_in_byte_order_with_a_clamped_limit() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let keys = ["b", "a/2", "a/10", "B", "c:1"];
    let ops = keys
        .iter()
        .map(|k| schedule_op("lq", k, &json!(k), 120_000))
        .collect();
    batch(&app, ops).await;
    // Another queue's timers are not listed.
    batch(&app, vec![schedule_op("other", "a", &json!(0), 120_000)]).await;

    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => "/api/v1/timers/lq?limit=2".to_string(),
            Some(a) => format!("/api/v1/timers/lq?limit=2&after={}", urlencode(a)),
        };
        let page = app.get(&path).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let rows = page.body["rows"].as_array().unwrap();
        assert!(rows.len() <= 2);
        seen.extend(
            rows.iter()
                .map(|r| r["timerKey"].as_str().unwrap().to_string()),
        );
        if page.body["truncated"] == false {
            assert_eq!(page.body["nextAfter"], Value::Null);
            break;
        }
        after = Some(page.body["nextAfter"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, ["B", "a/10", "a/2", "b", "c:1"], "bytewise order");
    // limit=0 is clamped to 1, a huge one to the maximum, a non-number to the default.
    assert_eq!(
        app.get("/api/v1/timers/lq?limit=0").await.body["rows"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        app.get("/api/v1/timers/lq?limit=999999").await.body["rows"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        app.get("/api/v1/timers/lq?limit=x").await.body["truncated"],
        false
    );
    let empty = app.get("/api/v1/timers/nothing-here").await;
    assert_eq!(empty.body["rows"], json!([]));
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_string()
}

#[actix_web::test]
async fn malformed_calls_are_400_timers_bad_request_and_change_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let ok = schedule_op("bad", "k", &json!(1), 1000);
    let with = |field: &str, value: Value| {
        let mut op = ok.clone();
        op[field] = value;
        op
    };
    let without = |field: &str| {
        let mut op = ok.clone();
        op.as_object_mut().unwrap().remove(field);
        op
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "operations": [ok.clone(), with("delayMs", json!(2000))] }),
            "duplicate_key",
        ),
        (
            json!({ "operations": [with("producerSub", json!("forged"))] }),
            "server_owned_field",
        ),
        (
            json!({ "operations": [with("deliverAt", json!("2030-01-01T00:00:00Z"))] }),
            "server_owned_field",
        ),
        (
            json!({ "operations": [with("_meta", json!(1))] }),
            "server_owned_field",
        ),
        (
            json!({ "operations": [with("payload", json!("%%%"))] }),
            "invalid_payload",
        ),
        (
            json!({ "operations": [with("payload", json!(base64::engine::general_purpose::STANDARD.encode("not json")))] }),
            "invalid_payload",
        ),
        (
            json!({ "operations": [without("delayMs")] }),
            "invalid_delay",
        ),
        (
            json!({ "operations": [with("delayMs", json!(400 * 86_400_000_i64))] }),
            "invalid_delay",
        ),
        (
            json!({ "operations": [with("payloadZstd", json!(true))] }),
            "payload_zstd_unsupported",
        ),
        (
            json!({ "operations": [with("op", json!("fire"))] }),
            "invalid_op",
        ),
        (
            json!({ "operations": [with("queue", json!(""))] }),
            "invalid_queue",
        ),
        (
            json!({ "operations": [with("timerKey", json!(""))] }),
            "invalid_timer_key",
        ),
        (
            json!({ "operations": [with("partition", json!(7))] }),
            "invalid_partition",
        ),
        (
            json!({ "operations": [with("txn", json!("x".repeat(300)))] }),
            "invalid_txn",
        ),
        (json!({ "operations": "all" }), "operations_required"),
        (json!({}), "operations_required"),
    ];
    for (body, reason) in cases {
        let r = app.post("/api/v1/timers", &body).await;
        assert_eq!(r.status, 400, "{body} → {:?}", r.body);
        assert_eq!(r.body["error"], "timers_bad_request", "{:?}", r.body);
        assert_eq!(r.body["reason"], reason, "{body} → {:?}", r.body);
        assert!(r.body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let r = app.post_raw("/api/v1/timers", b"not json".to_vec()).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (400, Some("invalid_json"))
    );
    // The first operation of a refused call was not applied, and no queue was created.
    assert_eq!(rows_left(&db).await, 0);
    let mut conn = db.conn().await;
    let queues: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.queues")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(queues, 0);
    let nul = app.get("/api/v1/timers/q/a%00b").await;
    assert_eq!(nul.status, 400, "{:?}", nul.body);
}

#[actix_web::test]
async fn batch_results_are_index_aligned_whatever_the_key_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    batch(&app, vec![schedule_op("ia", "m", &json!(0), 60_000)]).await;
    let r = batch(
        &app,
        vec![
            schedule_op("ia", "z", &json!(1), 60_000),
            json!({ "op": "cancel", "queue": "ia", "timerKey": "m" }),
            schedule_op("ia", "a", &json!(2), 60_000),
            schedule_op("ib", "a", &json!(3), 60_000),
        ],
    )
    .await;
    let summary: Vec<(&str, &str, &str)> = r
        .iter()
        .map(|x| {
            (
                x["queue"].as_str().unwrap(),
                x["timerKey"].as_str().unwrap(),
                x["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("ia", "z", "scheduled"),
            ("ia", "m", "cancelled"),
            ("ia", "a", "scheduled"),
            ("ib", "a", "scheduled"),
        ]
    );
    assert_eq!(rows_left(&db).await, 3);
}

#[actix_web::test]
async fn operations_applied_in_a_callers_transaction_roll_back_with_it() {
    let db = fresh_db().await;
    let _app = spawn_app(&db).await;
    let op = |key: &str| {
        TimerOp::Schedule(Schedule {
            queue: "txq".into(),
            timer_key: key.into(),
            partition: "Default".into(),
            payload: "{\"k\":1}".into(),
            delay_ms: 60_000,
            txn: "t".into(),
            producer_sub: None,
            message_id: Uuid::now_v7(),
        })
    };
    let mut conn = db.conn().await;
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    let results = store::apply(&mut tx, &[op("b"), op("a")]).await.unwrap();
    assert!(
        matches!(&results[0], TimerResult::Scheduled { timer_key, rescheduled: false, .. } if timer_key == "b")
    );
    tx.rollback().await.unwrap();
    assert_eq!(rows_left(&db).await, 0, "rolled back with the caller");
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    store::apply(&mut tx, &[op("a")]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(rows_left(&db).await, 1);
}

#[actix_web::test]
async fn a_timer_whose_queue_refuses_it_stays_pending_with_the_reason() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let c = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "full", "options": { "maxSize": 1 } }),
        )
        .await;
    assert_eq!(c.status, 200, "{:?}", c.body);
    push_n(&app, "full", "Default", 0, 1).await;
    batch(&app, vec![schedule_op("full", "f", &json!(1), -1)]).await;
    let peek = eventually(Duration::from_secs(10), "the fire is refused", || async {
        let p = app.get("/api/v1/timers/full/f").await;
        (p.body["attempts"].as_i64() >= Some(1)).then_some(p)
    })
    .await;
    assert!(
        peek.body["lastError"].as_str().unwrap().contains("maxSize"),
        "{:?}",
        peek.body
    );
    assert!(peek.body["deliverAt"].as_str() > peek.body["createdAt"].as_str());
    assert_eq!(
        db.stored("full", "Default").await.len(),
        1,
        "nothing written"
    );
}

/// Fires `n` timers scheduled through `schedule_on` (alternating brokers) and checks that
/// each timer's message is stored exactly once with its promised id.
async fn assert_each_fired_once(db: &TestDb, promised: &HashMap<String, String>, queue: &str) {
    let stored = db.stored(queue, "Default").await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for m in &stored {
        *seen.entry(m.transaction_id.as_str()).or_default() += 1;
        assert_eq!(
            promised.get(&m.transaction_id).map(String::as_str),
            Some(m.id.to_string().as_str()),
            "{} carries its promised id",
            m.transaction_id
        );
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "fired more than once: {twice:?}");
    assert_eq!(stored.len(), promised.len(), "every timer fired");
}

#[actix_web::test]
async fn two_brokers_on_one_database_fire_each_timer_once() {
    let db = fresh_db().await;
    let apps = [spawn_app(&db).await, spawn_app(&db).await];
    let mut promised = HashMap::new();
    for chunk in 0..6 {
        let ops: Vec<Value> = (0..100)
            .map(|i| {
                schedule_op(
                    "both",
                    &format!("k{chunk}-{i}"),
                    &json!(i),
                    (i % 5) * 50 - 100,
                )
            })
            .collect();
        for r in batch(&apps[chunk % 2], ops).await {
            promised.insert(
                r["txn"].as_str().unwrap().to_string(),
                r["messageId"].as_str().unwrap().to_string(),
            );
        }
    }
    eventually(Duration::from_secs(30), "every timer fired", || async {
        (rows_left(&db).await == 0).then_some(())
    })
    .await;
    assert_each_fired_once(&db, &promised, "both").await;
}

fn start_broker(db: &TestDb, port: u16) -> Child {
    let spool = std::env::temp_dir().join(format!("queen-timers-{}", Uuid::new_v4().simple()));
    Command::new(BROKER)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("DATABASE_URL", &db.url)
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("FILE_BUFFER_DIR", spool)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("broker starts")
}

#[actix_web::test]
async fn a_broker_killed_while_timers_are_due_leaves_each_fired_exactly_once() {
    let db = fresh_db().await;
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish();
    let ports = [
        queen_broker::pg::free_port().unwrap(),
        queen_broker::pg::free_port().unwrap(),
    ];
    let mut victim = start_broker(&db, ports[0]);
    let mut survivor = start_broker(&db, ports[1]);
    for port in ports {
        let url = format!("http://127.0.0.1:{port}/health");
        eventually(Duration::from_secs(30), "the broker is healthy", || {
            let request = client.get(&url).send();
            async move {
                request
                    .await
                    .is_ok_and(|r| r.status().is_success())
                    .then_some(())
            }
        })
        .await;
    }
    // Schedule through the victim only, due in the future; kill it once firing has begun.
    let mut promised = HashMap::new();
    let total = 3000;
    for chunk in 0..(total / 500) {
        let ops: Vec<Value> = (0..500)
            .map(|i| schedule_op("crash", &format!("c{chunk}-{i}"), &json!(i), 1500))
            .collect();
        let mut res = client
            .post(format!("http://127.0.0.1:{}/api/v1/timers", ports[0]))
            .send_json(&json!({ "operations": ops }))
            .await
            .expect("scheduled");
        assert_eq!(res.status().as_u16(), 200);
        let body: Value = res.json().limit(16 << 20).await.unwrap();
        for r in body["results"].as_array().unwrap() {
            promised.insert(
                r["txn"].as_str().unwrap().to_string(),
                r["messageId"].as_str().unwrap().to_string(),
            );
        }
    }
    let left = eventually(Duration::from_secs(30), "firing has begun", || async {
        let n = rows_left(&db).await;
        (n < total as i64).then_some(n)
    })
    .await;
    victim.kill().expect("SIGKILL");
    victim.wait().expect("reaped");
    eprintln!("killed one broker with {left} of {total} timers pending");
    eventually(
        Duration::from_secs(60),
        "the survivor fires the rest",
        || async { (rows_left(&db).await == 0).then_some(()) },
    )
    .await;
    survivor.kill().expect("SIGKILL");
    survivor.wait().expect("reaped");
    assert_each_fired_once(&db, &promised, "crash").await;
}

#[actix_web::test]
async fn a_batch_of_schedules_answers_in_call_order_and_names_the_replaced_ones() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = batch(&app, vec![schedule_op("sb", "m", &json!(0), 60_000)]).await;
    let r = batch(
        &app,
        vec![
            schedule_op("sb", "z", &json!(1), 60_000),
            schedule_op("sb", "m", &json!(2), 30_000),
            schedule_op("sa", "m", &json!(3), 60_000),
        ],
    )
    .await;
    let summary: Vec<(&str, &str, &str)> = r
        .iter()
        .map(|x| {
            (
                x["queue"].as_str().unwrap(),
                x["timerKey"].as_str().unwrap(),
                x["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("sb", "z", "scheduled"),
            ("sb", "m", "rescheduled"),
            ("sa", "m", "scheduled"),
        ]
    );
    assert!(r[1]["deliverAt"].as_str() < first[0]["deliverAt"].as_str());
    let peek = app.get("/api/v1/timers/sb/m").await;
    assert_eq!(peek.body["messageId"], r[1]["messageId"]);
    assert_eq!(peek.body["payload"], b64(&json!(2)));
    assert_eq!(rows_left(&db).await, 3);
}
