//! The streams runtime's routes over raw HTTP (reference 2.x §2.11, docs/streams.md):
//! registration, state reads, and the atomic cycle (state ops + sink pushes + source ack in one
//! transaction) with its refusals, and a cycle cut off from PostgreSQL (before COMMIT, and with
//! the COMMIT's answer lost). The SDK runtime itself runs in tests/compat/streams26.py.

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::support::consuming::{messages, pop, push_n};
use crate::support::proxy::Proxy;
use crate::support::{
    fresh_db, pg, spawn_app, spawn_app_with, test_settings, Reply, TestApp, TestDb,
};
use queen_broker::storage::streams::RIPE_SQL;

const GROUP: &str = "streams.q";

async fn register(app: &TestApp, name: &str, hash: &str, reset: bool) -> Reply {
    app.post(
        "/streams/v1/queries",
        &json!({ "name": name, "source_queue": "src", "sink_queue": "sink",
                 "config_hash": hash, "reset": reset }),
    )
    .await
}

/// Registers `name` and returns its server id.
async fn query_id(app: &TestApp, name: &str) -> String {
    let r = register(app, name, "h1", false).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["query_id"].as_str().expect("query_id").to_string()
}

async fn state(app: &TestApp, query: &str, partition: &str, filters: Value) -> Reply {
    let mut body = json!({ "query_id": query, "partition_id": partition, "keys": [] });
    for (k, v) in filters.as_object().expect("filters") {
        body[k] = v.clone();
    }
    app.post("/streams/v1/state/get", &body).await
}

fn keys(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_string())
        .collect()
}

async fn cycle(app: &TestApp, body: Value) -> Reply {
    app.post("/streams/v1/cycle", &body).await
}

fn upsert(key: &str, value: Value) -> Value {
    json!({ "type": "upsert", "key": key, "value": value })
}

fn sink_item(n: i64) -> Value {
    json!({ "queue": "sink", "partition": "out", "payload": { "n": n } })
}

/// The `n`s of the sink partition `out`, popped in one batch (queue mode).
async fn sink_ns(app: &TestApp) -> Vec<i64> {
    let reply = pop(app, "sink", "batch=10000").await;
    messages(&reply)
        .iter()
        .map(|m| m["data"]["n"].as_i64().expect("n"))
        .collect()
}

/// Pushes `n` messages to `src`/`p` and pops them all under the group: (partition id, messages).
async fn leased_batch(app: &TestApp, n: i64) -> (String, Vec<Value>) {
    push_n(app, "src", "p", 0, n).await;
    let reply = pop(app, "src", &format!("batch={n}&consumerGroup={GROUP}")).await;
    let got = messages(&reply);
    assert_eq!(got.len() as i64, n, "{}", reply.body);
    let pid = got[0]["partitionId"]
        .as_str()
        .expect("partitionId")
        .to_string();
    (pid, got)
}

fn ack_of(m: &Value, count: usize) -> Value {
    json!({ "transactionId": m["transactionId"], "leaseId": m["leaseId"],
            "status": "completed", "count": count })
}

async fn expire_leases(db: &TestDb) {
    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second' WHERE lease_expires_at IS NOT NULL")
        .await;
}

#[actix_web::test]
async fn registration_is_idempotent_refuses_a_changed_hash_and_reset_wipes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = register(&app, "q", "h1", false).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["fresh"], true);
    assert_eq!(first.body["reset"], false);
    assert_eq!(first.body["name"], "q");
    assert_eq!(first.body["config_hash"], "h1");
    let id = first.body["query_id"].clone();

    let again = register(&app, "q", "h1", false).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["query_id"], id);
    assert_eq!(
        (again.body["fresh"].clone(), again.body["reset"].clone()),
        (json!(false), json!(false))
    );

    // State to be wiped later.
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    let c = cycle(
        &app,
        json!({ "query_id": id, "partition_id": pid, "state_ops": [upsert("k", json!(1))],
                                "push_items": [], "ack": null }),
    )
    .await;
    assert_eq!(c.status, 200, "{}", c.body);

    let changed = register(&app, "q", "h2", false).await;
    assert_eq!(changed.status, 409, "{}", changed.body);
    assert_eq!(changed.body["success"], false);
    assert_eq!(changed.body["query_id"], id);
    assert!(
        changed.body["error"]
            .as_str()
            .unwrap()
            .starts_with("config_hash mismatch"),
        "{}",
        changed.body
    );
    // Nothing changed: the old hash still registers, the state is still there.
    assert_eq!(register(&app, "q", "h1", false).await.status, 200);
    assert_eq!(
        keys(&state(&app, id.as_str().unwrap(), pid, json!({})).await),
        vec!["k"]
    );

    // reset with an unchanged hash wipes nothing.
    let same = register(&app, "q", "h1", true).await;
    assert_eq!(
        (same.status, same.body["reset"].clone()),
        (200, json!(false))
    );
    assert_eq!(
        keys(&state(&app, id.as_str().unwrap(), pid, json!({})).await),
        vec!["k"]
    );

    let reset = register(&app, "q", "h2", true).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(
        (reset.body["fresh"].clone(), reset.body["reset"].clone()),
        (json!(false), json!(true))
    );
    assert_eq!(reset.body["query_id"], id);
    assert!(keys(&state(&app, id.as_str().unwrap(), pid, json!({})).await).is_empty());
    assert_eq!(register(&app, "q", "h2", false).await.status, 200);

    for (body, error) in [
        (
            json!({ "source_queue": "s", "config_hash": "h" }),
            "name is required",
        ),
        (
            json!({ "name": "q", "config_hash": "h" }),
            "source_queue is required",
        ),
        (
            json!({ "name": "q", "source_queue": "s" }),
            "config_hash is required",
        ),
    ] {
        let r = app.post("/streams/v1/queries", &body).await;
        assert_eq!((r.status, r.body["error"].clone()), (400, json!(error)));
    }
}

#[actix_web::test]
async fn state_is_read_by_keys_prefix_and_ripe_window_sorted_by_key() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    let other = "0190f3c8-0000-7000-8000-0000000000bb";
    let ops = json!([
        upsert(
            "t\u{1f}2000\u{1f}b",
            json!({ "acc": 2, "windowStart": 1000, "windowEnd": 2000 })
        ),
        upsert(
            "t\u{1f}1000\u{1f}a",
            json!({ "acc": 1, "windowStart": 0, "windowEnd": 1000 })
        ),
        upsert(
            "t\u{1f}x\u{1f}c",
            json!({ "acc": 3, "windowEnd": "not a number" })
        ),
        upsert("u\u{1f}1500\u{1f}d", json!({ "acc": 4, "windowEnd": 1500 })),
        upsert("__wm__", json!({ "eventTimeMs": 1234 })),
        upsert("gone", json!(0)),
        json!({ "type": "delete", "key": "gone" }),
    ]);
    let c = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
                                "state_ops": ops, "push_items": [], "ack": null }),
    )
    .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.body["success"], true);
    assert_eq!(c.body["state_ops_applied"], 7);
    assert_eq!(c.body["ack_result"], Value::Null);

    let all = state(&app, &q, pid, json!({})).await;
    assert_eq!(
        keys(&all),
        vec![
            "__wm__",
            "t\u{1f}1000\u{1f}a",
            "t\u{1f}2000\u{1f}b",
            "t\u{1f}x\u{1f}c",
            "u\u{1f}1500\u{1f}d"
        ]
    );
    assert_eq!(
        all.body["rows"][1]["value"],
        json!({ "acc": 1, "windowStart": 0, "windowEnd": 1000 })
    );
    assert!(all.body["rows"][1]["updated_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    let by_keys = state(
        &app,
        &q,
        pid,
        json!({ "keys": ["u\u{1f}1500\u{1f}d", "missing", "__wm__"] }),
    )
    .await;
    assert_eq!(keys(&by_keys), vec!["__wm__", "u\u{1f}1500\u{1f}d"]);
    let by_prefix = state(&app, &q, pid, json!({ "key_prefix": "t\u{1f}" })).await;
    assert_eq!(
        keys(&by_prefix),
        vec![
            "t\u{1f}1000\u{1f}a",
            "t\u{1f}2000\u{1f}b",
            "t\u{1f}x\u{1f}c"
        ]
    );
    let ripe = state(
        &app,
        &q,
        pid,
        json!({ "key_prefix": "t\u{1f}", "ripe_at_or_before": 1999 }),
    )
    .await;
    assert_eq!(keys(&ripe), vec!["t\u{1f}1000\u{1f}a"]);
    let ripe_all = state(&app, &q, pid, json!({ "ripe_at_or_before": 2000 })).await;
    assert_eq!(
        keys(&ripe_all),
        vec![
            "t\u{1f}1000\u{1f}a",
            "t\u{1f}2000\u{1f}b",
            "u\u{1f}1500\u{1f}d"
        ]
    );
    let ripe_keys = state(
        &app,
        &q,
        pid,
        json!({ "keys": ["t\u{1f}2000\u{1f}b", "u\u{1f}1500\u{1f}d"], "ripe_at_or_before": 1500 }),
    )
    .await;
    assert_eq!(keys(&ripe_keys), vec!["u\u{1f}1500\u{1f}d"]);

    // Scoped to (query, partition).
    assert!(keys(&state(&app, &q, other, json!({})).await).is_empty());
    let q2 = query_id(&app, "q2").await;
    assert!(keys(&state(&app, &q2, pid, json!({})).await).is_empty());

    let unknown = state(&app, "0190f3c8-0000-7000-8000-0000000000cc", pid, json!({})).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let bad = app
        .post("/streams/v1/state/get", &json!({ "partition_id": pid }))
        .await;
    assert_eq!(
        (bad.status, bad.body["error"].clone()),
        (400, json!("query_id is required"))
    );
}

#[actix_web::test]
async fn a_cycle_with_an_invalid_part_applies_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 3).await;
    let good_ack = ack_of(&batch[2], 3);

    // An unknown state op type: 400 before anything runs.
    let bad_op = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1)), { "type": "merge", "key": "k" }],
        "push_items": [sink_item(0)], "ack": good_ack }),
    )
    .await;
    assert_eq!(bad_op.status, 400, "{}", bad_op.body);
    assert!(
        bad_op.body["error"]
            .as_str()
            .unwrap()
            .contains("unknown type"),
        "{}",
        bad_op.body
    );

    // An ack of a message outside the lease: state and sink pushes roll back with it.
    let wrong = cycle(&app, json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1))], "push_items": [sink_item(0), sink_item(1)],
        "ack": { "transactionId": "no-such-message", "leaseId": batch[0]["leaseId"], "count": 3 } })).await;
    assert_eq!(wrong.status, 409, "{}", wrong.body);
    assert_eq!(wrong.body["success"], false);
    assert_eq!(wrong.body["code"], "ack_message_not_found");
    assert!(
        wrong.body["error"]
            .as_str()
            .unwrap()
            .starts_with("Message not found"),
        "{}",
        wrong.body
    );
    assert!(keys(&state(&app, &q, &pid, json!({})).await).is_empty());
    assert!(sink_ns(&app).await.is_empty(), "no sink message");
    // The source lease is untouched: the group still holds the partition.
    assert_eq!(
        pop(&app, "src", &format!("consumerGroup={GROUP}"))
            .await
            .status,
        204
    );

    // An unknown query: 404, nothing applied.
    let unknown = cycle(&app, json!({ "query_id": "0190f3c8-0000-7000-8000-0000000000cc", "partition_id": pid,
        "consumer_group": GROUP, "state_ops": [upsert("k", json!(1))], "push_items": [], "ack": good_ack })).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);

    // The whole cycle applies together.
    let ok = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1))], "push_items": [sink_item(0), sink_item(1)],
        "ack": good_ack, "release_lease": true }),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body["queueName"], "src");
    assert_eq!(ok.body["push_results"].as_array().unwrap().len(), 2);
    assert_eq!(ok.body["push_results"][0]["status"], "queued");
    assert_eq!(
        ok.body["ack_result"],
        json!({ "success": true, "count": 3, "lease_released": true, "dlq": false })
    );
    assert_eq!(keys(&state(&app, &q, &pid, json!({})).await), vec!["k"]);
    assert_eq!(sink_ns(&app).await, vec![0, 1]);
    // The cursor moved past the batch.
    assert_eq!(
        pop(&app, "src", &format!("consumerGroup={GROUP}"))
            .await
            .status,
        204
    );
    // Sent again (a client retry after a lost answer), the ack is refused and nothing repeats.
    let replay = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [], "push_items": [sink_item(9)], "ack": good_ack }),
    )
    .await;
    assert_eq!(replay.status, 409, "{}", replay.body);
    assert!(sink_ns(&app).await.is_empty());
}

#[actix_web::test]
async fn a_cycle_on_a_lost_lease_is_refused_whole() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 2).await;
    expire_leases(&db).await;
    // Another runner takes the partition over with a lease of its own.
    let taken = messages(&pop(&app, "src", &format!("batch=2&consumerGroup={GROUP}")).await);
    assert_eq!(taken.len(), 2);
    assert_ne!(taken[0]["leaseId"], batch[0]["leaseId"]);

    let late = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1))], "push_items": [sink_item(0)],
        "ack": ack_of(&batch[1], 2) }),
    )
    .await;
    assert_eq!(late.status, 409, "{}", late.body);
    assert_eq!(late.body["code"], "lease_lost");
    assert!(
        late.body["error"]
            .as_str()
            .unwrap()
            .starts_with("Invalid or expired lease"),
        "{}",
        late.body
    );
    assert!(keys(&state(&app, &q, &pid, json!({})).await).is_empty());
    assert!(sink_ns(&app).await.is_empty());

    // The new holder's cycle goes through.
    let ok = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [], "push_items": [], "ack": ack_of(&taken[1], 2) }),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[actix_web::test]
async fn release_lease_false_keeps_the_lease_and_the_tail_redelivers_in_order() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 5).await;
    // A gate allowed two of five.
    let partial = cycle(&app, json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("bucket", json!({ "tokens": 0 }))], "push_items": [sink_item(0), sink_item(1)],
        "ack": ack_of(&batch[1], 2), "release_lease": false })).await;
    assert_eq!(partial.status, 200, "{}", partial.body);
    assert_eq!(partial.body["ack_result"]["lease_released"], false);
    // The lease is still held: nothing for the group until it runs out.
    assert_eq!(
        pop(&app, "src", &format!("batch=5&consumerGroup={GROUP}"))
            .await
            .status,
        204
    );
    expire_leases(&db).await;
    let tail = messages(&pop(&app, "src", &format!("batch=5&consumerGroup={GROUP}")).await);
    let ns: Vec<i64> = tail
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![2, 3, 4]);

    // The tail's cycle, releasing: the partition is free again and the cursor is at the end.
    let rest = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [], "push_items": [sink_item(2), sink_item(3), sink_item(4)],
        "ack": ack_of(&tail[2], 3) }),
    )
    .await;
    assert_eq!(rest.status, 200, "{}", rest.body);
    assert_eq!(rest.body["ack_result"]["lease_released"], true);
    assert_eq!(sink_ns(&app).await, vec![0, 1, 2, 3, 4]);

    // release_lease (the default) before the batch's end hands the tail out at once.
    push_n(&app, "src", "p", 5, 3).await;
    let next = messages(&pop(&app, "src", &format!("batch=5&consumerGroup={GROUP}")).await);
    assert_eq!(next.len(), 3);
    let first = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [], "push_items": [], "ack": ack_of(&next[0], 1) }),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["ack_result"]["lease_released"], true);
    let again = messages(&pop(&app, "src", &format!("batch=5&consumerGroup={GROUP}")).await);
    let ns: Vec<i64> = again
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![6, 7]);
}

#[actix_web::test]
async fn sink_order_is_emit_order_within_and_across_cycles() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    let mut emitted = Vec::new();
    for c in 0..4 {
        let items: Vec<Value> = (0..50).map(|i| sink_item(c * 50 + i)).collect();
        emitted.extend((0..50).map(|i| c * 50 + i));
        let r = cycle(
            &app,
            json!({ "query_id": q, "partition_id": pid, "state_ops": [],
                                    "push_items": items, "ack": null }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let reply = pop(&app, "sink", "batch=1000").await;
    let got = messages(&reply);
    let ns: Vec<i64> = got
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, emitted);
    // The runtime sorts a batch by (createdAt, id): the broker's ids rise in emit order.
    let ids: Vec<&str> = got.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "message ids rise in emit order"
    );
}

#[actix_web::test]
async fn a_failed_ack_routes_the_message_to_the_dlq() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 3).await;
    let mut ack = ack_of(&batch[2], 3);
    ack["status"] = json!("failed");
    ack["error"] = json!("operator blew up");
    let r = cycle(
        &app,
        json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [], "push_items": [], "ack": ack }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["ack_result"]["dlq"], true);
    assert_eq!(r.body["ack_result"]["lease_released"], true);
    let dlq = app.get("/api/v1/dlq?queue=src").await;
    assert_eq!(dlq.body["total"], 1, "{}", dlq.body);
    let letter = &dlq.body["messages"][0];
    assert_eq!(letter["errorMessage"], "operator blew up");
    assert_eq!(letter["consumerGroup"], GROUP);
    assert_eq!(letter["data"]["n"], 2);
    // The cursor is past the dead-lettered message.
    assert_eq!(
        pop(&app, "src", &format!("consumerGroup={GROUP}"))
            .await
            .status,
        204
    );
}

#[actix_web::test]
async fn state_past_the_bound_is_413_and_applies_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    db.exec("UPDATE queen.stream_queries SET max_state_keys = 3, max_state_bytes = 200")
        .await;
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    let run = |ops: Value, items: Value| {
        let body = json!({ "query_id": q, "partition_id": pid, "state_ops": ops, "push_items": items, "ack": null });
        let app = &app;
        async move { cycle(app, body).await }
    };
    let three = json!([
        upsert("a", json!(1)),
        upsert("b", json!(2)),
        upsert("c", json!(3))
    ]);
    assert_eq!(run(three, json!([])).await.status, 200);

    let over = run(json!([upsert("d", json!(4))]), json!([sink_item(0)])).await;
    assert_eq!(over.status, 413, "{}", over.body);
    assert_eq!(over.body["code"], "state_limit_exceeded");
    assert!(
        over.body["error"].as_str().unwrap().contains("4 keys"),
        "{}",
        over.body
    );
    assert!(sink_ns(&app).await.is_empty());
    assert_eq!(
        keys(&state(&app, &q, pid, json!({})).await),
        vec!["a", "b", "c"]
    );

    // Replacing and swapping keys keeps the count: allowed.
    assert_eq!(
        run(json!([upsert("a", json!(10))]), json!([])).await.status,
        200
    );
    let swap = run(
        json!([{ "type": "delete", "key": "c" }, upsert("d", json!(4))]),
        json!([]),
    )
    .await;
    assert_eq!(swap.status, 200, "{}", swap.body);
    assert_eq!(
        keys(&state(&app, &q, pid, json!({})).await),
        vec!["a", "b", "d"]
    );

    // The byte bound: one big value.
    let big = run(json!([upsert("a", json!("x".repeat(300)))]), json!([])).await;
    assert_eq!(big.status, 413, "{}", big.body);
    // The running size is exact: what the rows hold.
    let mut conn = db.conn().await;
    let (keys_n, bytes): (i64, i64) =
        sqlx::query_as("SELECT state_keys, state_bytes FROM queen.stream_shards")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let (rows, row_bytes): (i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(octet_length(key) + octet_length(value))::bigint FROM queen.stream_state")
        .fetch_one(&mut conn).await.unwrap();
    assert_eq!((keys_n, bytes), (rows, row_bytes));
}

#[actix_web::test]
async fn concurrent_cycles_on_one_shard_are_serialised() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    let replies = join_all((0..16).map(|c| {
        let ops: Vec<Value> = (0..5)
            .map(|k| upsert(&format!("k{c}-{k}"), json!(k)))
            .collect();
        let body = json!({ "query_id": q, "partition_id": pid, "state_ops": ops,
                           "push_items": [sink_item(c)], "ack": null });
        let app = &app;
        async move { cycle(app, body).await }
    }))
    .await;
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    let mut conn = db.conn().await;
    let (keys_n, cycles): (i64, i64) =
        sqlx::query_as("SELECT state_keys, cycles FROM queen.stream_shards")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!((keys_n, cycles), (80, 16));
    assert_eq!(keys(&state(&app, &q, pid, json!({})).await).len(), 80);
    let mut ns = sink_ns(&app).await;
    ns.sort_unstable();
    assert_eq!(ns, (0..16).collect::<Vec<_>>());
}

#[actix_web::test]
async fn the_ripe_window_read_uses_its_index_at_100k_keys() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let pid = "0190f3c8-0000-7000-8000-0000000000aa";
    // 100 000 open windows of one partition (and a second partition as big), a few ripe ones.
    db.exec(&format!(
        "INSERT INTO queen.stream_state (query_id, partition_id, key, value, window_end)
         SELECT '{q}', p, 't' || chr(31) || lpad(n::text, 6, '0'),
                '{{\"acc\":1,\"windowEnd\":' || (1000000 + n) || '}}', 1000000 + n
           FROM generate_series(1, 100000) AS n,
                unnest(ARRAY['{pid}'::uuid, '0190f3c8-0000-7000-8000-0000000000bb'::uuid]) AS p"
    ))
    .await;
    db.exec("ANALYZE queen.stream_state").await;
    let mut conn = db.conn().await;
    for mode in ["auto", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {RIPE_SQL}"))
            .bind(uuid::Uuid::parse_str(&q).unwrap())
            .bind(uuid::Uuid::parse_str(pid).unwrap())
            .bind(1_000_010.0_f64)
            .bind(Some("t\u{1f}"))
            .bind(Some("t\u{20}"))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("stream_state_ripe"), "{mode}: {plan}");
        assert!(!plan.contains("Seq Scan"), "{mode}: {plan}");
    }
    let ripe = state(
        &app,
        &q,
        pid,
        json!({ "key_prefix": "t\u{1f}", "ripe_at_or_before": 1_000_010 }),
    )
    .await;
    assert_eq!(keys(&ripe).len(), 10);
}

#[actix_web::test]
async fn a_reset_between_concurrent_cycles_leaves_consistent_state() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let q = query_id(&app, "q").await;
    let partitions: Vec<String> = (0..4)
        .map(|p| format!("0190f3c8-0000-7000-8000-0000000000a{p}"))
        .collect();
    let cycles = (0..24).map(|c| {
        let ops: Vec<Value> = (0..10)
            .map(|k| upsert(&format!("k{c}-{k}"), json!(k)))
            .collect();
        let body = json!({ "query_id": q, "partition_id": partitions[c % 4], "state_ops": ops,
                           "push_items": [], "ack": null });
        let app = &app;
        async move { cycle(app, body).await }
    });
    let reset = async { register(&app, "q", "h2", true).await };
    let (replies, reset) = futures_util::join!(join_all(cycles), reset);
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(reset.body["reset"], true);
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    // Whatever survived the reset, each shard's running size is what its rows hold.
    let mut conn = db.conn().await;
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*)
           FROM queen.stream_shards s
           FULL JOIN (SELECT query_id, partition_id, count(*) AS n,
                             sum(octet_length(key) + octet_length(value))::bigint AS b
                        FROM queen.stream_state
                       GROUP BY 1, 2) r USING (query_id, partition_id)
          WHERE s.state_keys IS DISTINCT FROM r.n AND NOT (s.state_keys = 0 AND r.n IS NULL)
             OR s.state_bytes IS DISTINCT FROM r.b AND NOT (s.state_bytes = 0 AND r.b IS NULL)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(mismatched, 0);
}

/// A broker whose database connections go through a proxy the test can cut.
async fn behind_proxy(db: &TestDb) -> (Proxy, TestApp) {
    let proxy = Proxy::start(pg().port()).await;
    let app = spawn_app_with(test_settings(db, &[("DATABASE_URL", &proxy.url(db))])).await;
    (proxy, app)
}

#[actix_web::test]
async fn a_cycle_without_postgresql_applies_nothing_and_its_retry_applies_once() {
    let db = fresh_db().await;
    let (proxy, app) = behind_proxy(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 3).await;
    let body = json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1))], "push_items": [sink_item(0), sink_item(1)],
        "ack": ack_of(&batch[2], 3) });

    proxy.cut();
    let away = cycle(&app, body.clone()).await;
    assert_eq!(away.status, 503, "{}", away.body);
    proxy.restore();
    assert!(keys(&state(&app, &q, &pid, json!({})).await).is_empty());
    assert!(sink_ns(&app).await.is_empty());

    // The client's retry, once PostgreSQL answers: applied whole, once.
    let retry = cycle(&app, body).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(keys(&state(&app, &q, &pid, json!({})).await), vec!["k"]);
    assert_eq!(sink_ns(&app).await, vec![0, 1]);
}

#[actix_web::test]
async fn a_cycle_whose_commit_answer_is_lost_is_not_applied_twice_by_its_retry() {
    let db = fresh_db().await;
    let (proxy, app) = behind_proxy(&db).await;
    let q = query_id(&app, "q").await;
    let (pid, batch) = leased_batch(&app, 3).await;
    let body = json!({ "query_id": q, "partition_id": pid, "consumer_group": GROUP,
        "state_ops": [upsert("k", json!(1))], "push_items": [sink_item(0), sink_item(1)],
        "ack": ack_of(&batch[2], 3) });

    // The COMMIT reaches PostgreSQL; its answer never reaches the broker.
    proxy.drop_next_commit();
    let unknown = cycle(&app, body.clone()).await;
    assert_eq!(proxy.commits_dropped(), 1);
    assert_eq!(unknown.status, 503, "{}", unknown.body);
    // It did commit, whole.
    assert_eq!(keys(&state(&app, &q, &pid, json!({})).await), vec!["k"]);
    assert_eq!(sink_ns(&app).await, vec![0, 1]);

    // The client sends it again: its ack is settled, so the cycle is refused whole.
    let retry = cycle(&app, body).await;
    assert_eq!(retry.status, 409, "{}", retry.body);
    assert!(sink_ns(&app).await.is_empty(), "no sink record twice");
}
