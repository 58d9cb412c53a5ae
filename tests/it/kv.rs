//! `POST /api/v1/kv` (reference 2.x §2.1, docs/kv.md): ops applied in order in one transaction,
//! expiry as a predicate, versions from one sequence, named 400s, the sweeper.

use serde_json::{json, Value};

use crate::support::{fresh_db, spawn_app, TestApp, TestDb};

const NS: &str = "test-kv";

async fn kv(app: &TestApp, ops: Value) -> Vec<Value> {
    let r = app.post("/api/v1/kv", &json!({ "operations": ops })).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    r.body["results"].as_array().expect("results").clone()
}

async fn one(app: &TestApp, op: Value) -> Value {
    kv(app, json!([op])).await.remove(0)
}

fn put(key: &str, value: Value) -> Value {
    json!({ "op": "put", "ns": NS, "key": key, "value": value, "ttlSeconds": 60 })
}

fn get(key: &str) -> Value {
    json!({ "op": "get", "ns": NS, "key": key })
}

/// Makes every row of `key` expired, as if its TTL had run out (no waiting in tests).
async fn expire(db: &TestDb, key: &str) {
    db.exec(&format!(
        "UPDATE queen.kv SET expires_at = now() - interval '1 second' WHERE key = '{key}'"
    ))
    .await;
}

#[actix_web::test]
async fn put_get_round_trips_value_version_and_expiry_and_null_is_a_value() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let p = one(&app, put("round", json!({"state": "held", "n": 1}))).await;
    assert_eq!(p["applied"], true);
    assert!(p["version"].as_i64().unwrap() > 0);
    let g = one(&app, get("round")).await;
    assert_eq!(g["found"], true);
    assert_eq!(g["value"], json!({"state": "held", "n": 1}));
    assert_eq!(g["version"], p["version"]);
    assert!(g["expiresAt"].is_string());
    assert_eq!(
        one(&app, get("never")).await,
        json!({"found": false, "index": 0})
    );

    one(&app, put("null", Value::Null)).await;
    let n = one(&app, get("null")).await;
    assert_eq!(n["found"], true);
    assert!(n["value"].is_null() && n.get("value").is_some());

    let f = one(
        &app,
        json!({"op": "put", "ns": NS, "key": "immortal", "value": 1, "forever": true}),
    )
    .await;
    assert_eq!(f["applied"], true);
    assert!(one(&app, get("immortal")).await["expiresAt"].is_null());
}

#[actix_web::test]
async fn expect_fences_writers_and_an_expect_on_an_absent_key_creates_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let absent = one(
        &app,
        json!({"op": "put", "ns": NS, "key": "fence", "value": 1, "ttlSeconds": 60, "expect": 42}),
    )
    .await;
    assert_eq!(absent["applied"], false);
    assert_eq!(absent["reason"], "absent");
    assert_eq!(absent["version"], 0);
    assert_eq!(one(&app, get("fence")).await["found"], false);

    let first = one(&app, put("fence", json!({"v": 1}))).await;
    let mut second_op = put("fence", json!({"v": 2}));
    second_op["expect"] = first["version"].clone();
    let second = one(&app, second_op.clone()).await;
    assert_eq!(second["applied"], true);
    let stale = one(&app, second_op).await;
    assert_eq!(stale["applied"], false);
    assert_eq!(stale["reason"], "version");
    assert_eq!(stale["version"], second["version"]);
    assert_eq!(stale["value"], json!({"v": 2}));

    let d1 = one(&app, json!({"op": "delete", "ns": NS, "key": "fence"})).await;
    let d2 = one(&app, json!({"op": "delete", "ns": NS, "key": "fence"})).await;
    assert_eq!(d1["applied"], true);
    assert_eq!(
        (d2["applied"].clone(), d2["reason"].clone()),
        (json!(false), json!("absent"))
    );

    let check = one(
        &app,
        json!({"op": "check", "ns": NS, "key": "fence", "expect": 0}),
    )
    .await;
    assert_eq!(check["applied"], true);
}

#[actix_web::test]
async fn eight_concurrent_put_if_absent_have_one_winner_and_the_losers_see_its_value() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let calls = (0..8).map(|i| {
        one(
            &app,
            json!({"op": "putIfAbsent", "ns": NS, "key": "claim", "value": {"by": i}, "ttlSeconds": 60}),
        )
    });
    let results = futures_util::future::join_all(calls).await;
    let winners: Vec<&Value> = results.iter().filter(|r| r["applied"] == true).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for loser in results.iter().filter(|r| r["applied"] == false) {
        assert_eq!(loser["reason"], "exists");
        assert_eq!(loser["value"], winners[0]["value"]);
        assert_eq!(loser["version"], winners[0]["version"]);
    }
}

#[actix_web::test]
async fn versions_rise_strictly_across_delete_and_expiry_and_expired_rows_are_absent() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let v1 = one(&app, put("life", json!(1))).await["version"]
        .as_i64()
        .unwrap();
    one(&app, json!({"op": "delete", "ns": NS, "key": "life"})).await;
    let v2 = one(&app, put("life", json!(2))).await["version"]
        .as_i64()
        .unwrap();
    assert!(v2 > v1);

    expire(&db, "life").await;
    assert_eq!(
        one(&app, get("life")).await["found"],
        false,
        "expired before any sweep"
    );
    let again = one(
        &app,
        json!({"op": "putIfAbsent", "ns": NS, "key": "life", "value": 3, "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(again["applied"], true, "an expired row counts as absent");
    assert!(again["version"].as_i64().unwrap() > v2);

    // An incr on an expired non-numeric value starts over at the delta.
    one(&app, put("typed", json!({"count": 0}))).await;
    let wedged = one(
        &app,
        json!({"op": "incr", "ns": NS, "key": "typed", "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(wedged["reason"], "type");
    expire(&db, "typed").await;
    let fresh = one(
        &app,
        json!({"op": "incr", "ns": NS, "key": "typed", "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(
        (fresh["applied"].clone(), fresh["value"].clone()),
        (json!(true), json!(1))
    );
}

#[actix_web::test]
async fn incr_admits_within_its_bounds_spends_nothing_when_refused_and_keeps_its_ttl() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let incr = |max: i64, delta: i64, ttl: i64| json!({"op": "incr", "ns": NS, "key": "quota", "delta": delta, "max": max, "ttlSeconds": ttl});
    for expected in 1..=3 {
        let r = one(&app, incr(3, 1, 60)).await;
        assert_eq!(
            (r["applied"].clone(), r["value"].clone()),
            (json!(true), json!(expected))
        );
    }
    let refused = one(&app, incr(3, 1, 60)).await;
    assert_eq!(refused["reason"], "limit");
    assert_eq!(refused["value"], 3);

    let first_shot = one(
        &app,
        json!({"op": "incr", "ns": NS, "key": "shot", "delta": 10, "max": 5, "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(first_shot["reason"], "limit");
    assert_eq!(one(&app, get("shot")).await["found"], false);

    let before = one(&app, get("quota")).await["expiresAt"].clone();
    one(&app, incr(100, 1, 3600)).await;
    assert_eq!(
        one(&app, get("quota")).await["expiresAt"],
        before,
        "incr's TTL is create-only"
    );
    let floor = one(
        &app,
        json!({"op": "incr", "ns": NS, "key": "quota", "delta": -10, "min": 0, "ttlSeconds": 60}),
    )
    .await;
    assert_eq!(floor["reason"], "limit");
}

#[actix_web::test]
async fn get_many_names_the_missing_and_get_prefix_pages_a_literal_prefix() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let mut ops: Vec<Value> = (0..5)
        .map(|i| put(&format!("walk:{i}"), json!(i)))
        .collect();
    ops.push(put("walk%_:x", json!("weird")));
    ops.push(put("walkXX", json!("like would match")));
    ops.push(put("many:a", json!(1)));
    ops.push(put("many:b", json!(2)));
    kv(&app, Value::Array(ops)).await;

    let many = one(
        &app,
        json!({"op": "getMany", "ns": NS, "keys": ["many:a", "many:b", "many:nope"]}),
    )
    .await;
    let keys: Vec<&str> = many["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["many:a", "many:b"]);
    assert_eq!(many["missing"], json!(["many:nope"]));

    let mut seen = Vec::new();
    let mut after = Value::Null;
    loop {
        let page = one(
            &app,
            json!({"op": "getPrefix", "ns": NS, "prefix": "walk:", "limit": 2, "after": after}),
        )
        .await;
        let rows = page["rows"].as_array().unwrap();
        seen.extend(rows.iter().map(|r| r["key"].as_str().unwrap().to_string()));
        if page["truncated"] == false {
            assert!(page["nextAfter"].is_null());
            break;
        }
        assert_eq!(rows.len(), 2);
        assert_eq!(page["nextAfter"], rows[1]["key"]);
        after = page["nextAfter"].clone();
    }
    assert_eq!(
        seen,
        (0..5).map(|i| format!("walk:{i}")).collect::<Vec<_>>()
    );

    let weird = one(
        &app,
        json!({"op": "getPrefix", "ns": NS, "prefix": "walk%_:", "keysOnly": true}),
    )
    .await;
    assert_eq!(
        weird["rows"],
        json!([{
            "key": "walk%_:x",
            "version": weird["rows"][0]["version"],
            "expiresAt": weird["rows"][0]["expiresAt"],
            "updatedAt": weird["rows"][0]["updatedAt"],
        }]),
        "a literal prefix, and keysOnly rows carry no value"
    );
}

#[actix_web::test]
async fn a_batch_is_index_aligned_and_a_lost_required_op_applies_nothing() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let results = kv(
        &app,
        json!([
            put("batch:1", json!("one")),
            get("batch:absent"),
            {"op": "incr", "ns": NS, "key": "batch:counter", "delta": 2, "ttlSeconds": 60},
            get("batch:1"),
        ]),
    )
    .await;
    let indexes: Vec<i64> = results
        .iter()
        .map(|r| r["index"].as_i64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2, 3]);
    assert_eq!(results[2]["value"], 2);
    assert_eq!(
        results[3]["value"], "one",
        "ops see the earlier ops of their batch"
    );

    let r = app
        .post(
            "/api/v1/kv",
            &json!({"operations": [
                put("gate:written", json!(1)),
                {"op": "putIfAbsent", "ns": NS, "key": "batch:1", "value": 2, "ttlSeconds": 60, "required": true},
                put("gate:after", json!(1)),
            ]}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["success"], false);
    assert_eq!(r.body["reason"], "kv_precondition");
    assert_eq!(r.body["failedIndex"], 1);
    let results = r.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "full-length");
    assert_eq!(results[1]["reason"], "exists");
    assert_eq!(results[1]["value"], "one");
    assert_eq!(results[0]["rolledBack"], true);
    assert_eq!(results[2]["rolledBack"], true);
    assert_eq!(
        one(&app, get("gate:written")).await["found"],
        false,
        "rolled back"
    );
    assert_eq!(one(&app, get("gate:after")).await["found"], false);
}

#[actix_web::test]
async fn malformed_calls_are_named_400s() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let long_key = "k".repeat(1025);
    let big = "x".repeat(300 * 1024);
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"operations": [{"op": "put", "ns": "NOT A NAMESPACE", "key": "k", "value": 1, "ttlSeconds": 60}]}),
            "bad_namespace",
        ),
        (
            json!({"operations": [{"op": "put", "ns": NS, "key": "k", "value": 1}]}),
            "kv_expiry_not_specified",
        ),
        (
            json!({"operations": [{"op": "put", "ns": NS, "key": "k", "value": 1, "ttlSeconds": 1, "forever": true}]}),
            "kv_expiry_not_specified",
        ),
        (
            json!({"operations": [{"op": "put", "ns": NS, "key": long_key, "value": 1, "ttlSeconds": 1}]}),
            "bad_key",
        ),
        (
            json!({"operations": [{"op": "put", "ns": NS, "key": "k", "value": big, "ttlSeconds": 1}]}),
            "value_too_large",
        ),
        (
            json!({"operations": [{"op": "get", "ns": NS, "key": ""}]}),
            "bad_key",
        ),
        (
            json!({"operations": [{"op": "frobnicate", "ns": NS, "key": "k"}]}),
            "bad_op",
        ),
        (json!({"operations": []}), "bad_operations"),
        (json!({"operations": "nope"}), "bad_operations"),
        (json!({}), "bad_operations"),
        (
            json!({"operations": [{"op": "incr", "ns": NS, "key": "k", "expect": 1, "ttlSeconds": 1}]}),
            "bad_expect",
        ),
        (
            json!({"operations": [{"op": "check", "ns": NS, "key": "k"}]}),
            "missing_field",
        ),
        (
            json!({"operations": [{"op": "put", "ns": "queen-locks", "key": "x#0", "value": 1, "ttlSeconds": 1}]}),
            "reserved_namespace",
        ),
    ];
    for (body, reason) in cases {
        let r = app.post("/api/v1/kv", &body).await;
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.body["error"], "kv_bad_request", "{:?}", r.body);
        assert_eq!(r.body["reason"], reason, "{:?}", r.body);
        assert!(r.body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
    let raw = app.post_raw("/api/v1/kv", b"{not json".to_vec()).await;
    assert_eq!(
        (raw.status, raw.body["error"].clone()),
        (400, json!("kv_bad_request"))
    );
}

/// Consumer supervision (reference 2.x §2.12) is a plain KV client: two puts of its status,
/// the chunk about 60 KB, both applied.
#[actix_web::test]
async fn a_supervision_report_of_sixty_kilobytes_is_two_applied_puts() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let data = "QUJD".repeat(15_000); // 60,000 bytes of base64
    let ops = json!([
        {"op": "put", "ns": "queen-supervisor", "key": "billing/host-1:42/head", "ttlSeconds": 60,
         "value": {"format": "queen.supervisor.remote-status/v1", "write": 7, "chunks": 1, "bytes": 45_000}},
        {"op": "put", "ns": "queen-supervisor", "key": "billing/host-1:42/chunk/0000", "ttlSeconds": 60,
         "value": {"write": 7, "index": 0, "data": data}},
    ]);
    let results = kv(&app, ops).await;
    assert!(results.iter().all(|r| r["applied"] == true), "{results:?}");
    let chunk = one(
        &app,
        json!({"op": "get", "ns": "queen-supervisor", "key": "billing/host-1:42/chunk/0000"}),
    )
    .await;
    assert_eq!(chunk["value"]["data"].as_str().unwrap().len(), 60_000);
}

#[actix_web::test]
async fn the_sweeper_prunes_expired_rows_and_leaves_live_ones() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    kv(
        &app,
        json!([
            put("dead:1", json!(1)),
            put("dead:2", json!(2)),
            put("alive", json!(3))
        ]),
    )
    .await;
    expire(&db, "dead:1").await;
    expire(&db, "dead:2").await;
    let mut conn = db.conn().await;
    let swept = queen_broker::storage::kv::sweep::sweep_expired(&mut conn, 1)
        .await
        .unwrap();
    assert_eq!(swept, 1, "one batch of one");
    let swept = queen_broker::storage::kv::sweep::sweep_expired(&mut conn, 100)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT key FROM queen.kv ORDER BY key")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, ["alive"]);
}
