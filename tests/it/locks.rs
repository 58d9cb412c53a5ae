//! `POST /api/v1/locks` (reference 2.x §2.2, docs/kv.md): locks and semaphores as KV rows,
//! tokens as versions, on one broker and on two brokers sharing the database.

use serde_json::{json, Value};

use crate::support::{fresh_db, spawn_app, TestApp};

async fn lock(app: &TestApp, op: Value) -> Value {
    let r = app
        .post("/api/v1/locks", &json!({ "operations": [op] }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let results = r.body["results"].as_array().expect("results");
    assert_eq!(results.len(), 1);
    results[0].clone()
}

fn acquire(name: &str, owner: &str, limit: i64) -> Value {
    json!({"op": "acquire", "name": name, "ttlSeconds": 30, "owner": owner, "limit": limit})
}

#[actix_web::test]
async fn a_lock_has_one_holder_its_permit_is_a_kv_row_and_a_later_holder_gets_a_higher_token() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let a = lock(&app, acquire("report", "a", 1)).await;
    assert_eq!(a["acquired"], true);
    assert_eq!(a["slot"], 0);
    assert_eq!(
        a["guard"],
        json!({"op": "check", "ns": "queen-locks", "key": "report#0", "expect": a["token"], "required": true})
    );
    let b = lock(&app, acquire("report", "b", 1)).await;
    assert_eq!(
        (b["acquired"].clone(), b["reason"].clone()),
        (json!(false), json!("held"))
    );
    assert_eq!(b["holders"][0]["owner"], "a");

    let row = app
        .post(
            "/api/v1/kv",
            &json!({"operations": [{"op": "get", "ns": "queen-locks", "key": "report#0"}]}),
        )
        .await;
    assert_eq!(row.body["results"][0]["version"], a["token"]);
    assert_eq!(row.body["results"][0]["value"]["owner"], "a");

    let who = lock(&app, json!({"op": "get", "name": "report"})).await;
    assert_eq!(who["held"], true);
    assert_eq!(who["holders"][0]["token"], a["token"]);
    assert!(who["holders"][0]["expiresAt"].is_string() && who["holders"][0]["since"].is_string());

    let stale_release = lock(
        &app,
        json!({"op": "release", "name": "report", "token": a["token"].as_i64().unwrap() + 1000}),
    )
    .await;
    assert_eq!(stale_release["released"], false);
    let released = lock(
        &app,
        json!({"op": "release", "name": "report", "token": a["token"]}),
    )
    .await;
    assert_eq!(released["released"], true);
    let b = lock(&app, acquire("report", "b", 1)).await;
    assert!(b["token"].as_i64() > a["token"].as_i64());
}

#[actix_web::test]
async fn an_owner_sending_again_gets_the_same_permit_and_a_renew_whose_answer_was_lost_succeeds() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = lock(&app, acquire("retry", "me", 1)).await;
    let again = lock(&app, acquire("retry", "me", 1)).await;
    assert_eq!(again["already"], true);
    assert_eq!(again["token"], first["token"]);

    let renew = |token: &Value, owner: Option<&str>| {
        let mut op = json!({"op": "renew", "name": "retry", "token": token, "ttlSeconds": 30});
        if let Some(o) = owner {
            op["owner"] = o.into();
        }
        op
    };
    let renewed = lock(&app, renew(&first["token"], Some("me"))).await;
    assert_eq!(renewed["renewed"], true);
    let resent = lock(&app, renew(&first["token"], Some("me"))).await;
    assert!(resent["token"].as_i64() > renewed["token"].as_i64());
    assert_eq!(resent["guard"]["expect"], resent["token"]);

    let stranger = lock(&app, renew(&first["token"], Some("someone-else"))).await;
    assert_eq!(
        (stranger["renewed"].clone(), stranger["reason"].clone()),
        (json!(false), json!("lost"))
    );
    assert_eq!(stranger["holders"][0]["owner"], "me");
    let stranger_current = lock(&app, renew(&resent["token"], Some("someone-else"))).await;
    assert_eq!(
        stranger_current["renewed"], false,
        "another owner never renews"
    );
    let anonymous_stale = lock(&app, renew(&first["token"], None)).await;
    assert_eq!(
        anonymous_stale["renewed"], false,
        "without an owner only the current token renews"
    );
    let anonymous = lock(&app, renew(&resent["token"], None)).await;
    assert_eq!(anonymous["renewed"], true);
}

#[actix_web::test]
async fn an_expired_lock_goes_to_the_next_holder_with_a_higher_token() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let old = lock(&app, acquire("expiry", "old", 1)).await;
    db.exec("UPDATE queen.kv SET expires_at = now() - interval '1 second'")
        .await;
    let next = lock(&app, acquire("expiry", "next", 1)).await;
    assert_eq!(next["acquired"], true);
    assert!(next["token"].as_i64() > old["token"].as_i64());
    let renew = lock(
        &app,
        json!({"op": "renew", "name": "expiry", "token": old["token"], "ttlSeconds": 30, "owner": "old"}),
    )
    .await;
    assert_eq!(renew["reason"], "lost");
}

async fn crowd(apps: &[&TestApp], name: &str, limit: i64, n: usize) -> Vec<Value> {
    let calls = (0..n).map(|i| lock(apps[i % apps.len()], acquire(name, &format!("w{i}"), limit)));
    futures_util::future::join_all(calls).await
}

fn granted(results: &[Value]) -> Vec<i64> {
    let mut slots: Vec<i64> = results
        .iter()
        .filter(|r| r["acquired"] == true)
        .map(|r| r["slot"].as_i64().unwrap())
        .collect();
    slots.sort_unstable();
    slots
}

#[actix_web::test]
async fn a_semaphore_of_three_grants_exactly_three_of_twelve_concurrent_acquires() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let results = crowd(&[&app], "crowd", 3, 12).await;
    assert_eq!(granted(&results), [0, 1, 2], "{results:?}");
    let who = lock(&app, json!({"op": "get", "name": "crowd"})).await;
    assert_eq!(who["holders"].as_array().unwrap().len(), 3);

    // One leaves; the next acquire gets exactly that slot.
    let leaving = results.iter().find(|r| r["slot"] == 1).unwrap();
    let r = lock(
        &app,
        json!({"op": "release", "name": "crowd", "token": leaving["token"]}),
    )
    .await;
    assert_eq!(r["released"], true);
    let extra = lock(&app, acquire("crowd", "late", 3)).await;
    assert_eq!(
        (extra["acquired"].clone(), extra["slot"].clone()),
        (json!(true), json!(1))
    );
}

#[actix_web::test]
async fn two_brokers_on_one_database_keep_the_semaphore_bound_and_tokens_rising() {
    let db = fresh_db().await;
    let here = spawn_app(&db).await;
    let there = spawn_app(&db).await;
    for round in 0..3 {
        let name = format!("shared-{round}");
        let results = crowd(&[&here, &there], &name, 3, 12).await;
        assert_eq!(granted(&results), [0, 1, 2], "round {round}: {results:?}");
    }
    // A lock handed back and forth between the brokers: every token above the last.
    let mut last = 0;
    for i in 0..10 {
        let (taker, other) = if i % 2 == 0 {
            (&here, &there)
        } else {
            (&there, &here)
        };
        let got = lock(taker, acquire("pingpong", &format!("o{i}"), 1)).await;
        let token = got["token"].as_i64().unwrap();
        assert!(token > last, "token {token} after {last}");
        last = token;
        let r = lock(
            other,
            json!({"op": "release", "name": "pingpong", "token": token}),
        )
        .await;
        assert_eq!(r["released"], true);
    }
}

#[actix_web::test]
async fn malformed_lock_calls_are_named_400s() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let cases = [
        (
            json!({"op": "acquire", "name": "a#b", "ttlSeconds": 1}),
            "bad_name",
        ),
        (
            json!({"op": "acquire", "name": "a", "ttlSeconds": 0}),
            "bad_expiry",
        ),
        (
            json!({"op": "acquire", "name": "a", "ttlSeconds": 1, "limit": 2000}),
            "bad_limit",
        ),
        (
            json!({"op": "renew", "name": "a", "ttlSeconds": 1}),
            "bad_token",
        ),
        (json!({"op": "steal", "name": "a"}), "bad_op"),
    ];
    for (op, reason) in cases {
        let r = app
            .post("/api/v1/locks", &json!({"operations": [op]}))
            .await;
        assert_eq!(r.status, 400);
        assert_eq!(r.body["error"], "lock_bad_request");
        assert_eq!(r.body["reason"], reason, "{:?}", r.body);
    }
}
