//! Lag at scale (docs/operations.md, "Lag at scale"): past `QUEEN_LAG_LIVE_PAIRS` subscribed
//! (group, partition) pairs the lag views read the last background pass instead of measuring
//! on request. Two brokers on one database, one measuring on request (the default limit) and
//! one forced onto passes (a limit of 1), must answer the same figures once a pass has run
//! after the last change; the answers say where their figures come from. And a group's
//! partitions come a page at a time.

use std::time::Duration;

use crate::support::consuming::{ack_all, messages, pop, push_n};
use crate::support::{eventually, fresh_db, spawn_app, spawn_app_with, test_settings, TestApp};
use serde_json::Value;

/// What the lag views answer that must not depend on where they read from: the consumer
/// groups (with backlog, lagging partitions and members), the lagging partitions, the offset
/// spread of the overview and the analytics' queue lag.
async fn figures(app: &TestApp) -> (Value, Vec<String>) {
    let groups = app.get("/api/v1/consumer-groups").await;
    assert_eq!(groups.status, 200, "{}", groups.body);
    let list: Vec<Value> = groups
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            serde_json::json!([
                g["name"],
                g["queueName"],
                g["backlog"],
                g["partitionsWithLag"],
                g["members"],
                g["subscriptionMode"]
            ])
        })
        .collect();
    let lagging = app
        .get("/api/v1/consumer-groups/lagging?minLagSeconds=0")
        .await;
    assert_eq!(lagging.status, 200, "{}", lagging.body);
    let mut partitions: Vec<Value> = lagging
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::json!([
                r["consumer_group"],
                r["queue_name"],
                r["partition_name"],
                r["offset_lag"]
            ])
        })
        .collect();
    partitions.sort_by_key(|v| v.to_string());
    let overview = app.get("/api/v1/resources/overview").await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    let analytics = app.get("/api/v1/analytics/queue-lag").await;
    assert_eq!(analytics.status, 200, "{}", analytics.body);
    let queue_lag: Vec<Value> = analytics.body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| serde_json::json!([q["consumerGroup"], q["queue"], q["partitionsWithLag"]]))
        .collect();
    let sources = vec![
        header(&groups, "x-lag-measured-at"),
        header(&lagging, "x-lag-measured-at"),
        overview.body["lag"]["measuredAt"]
            .as_str()
            .unwrap()
            .to_string(),
        analytics.body["lagMeasuredAt"]
            .as_str()
            .unwrap()
            .to_string(),
    ];
    (
        serde_json::json!({
            "groups": list,
            "lagging": partitions,
            "offsetLag": overview.body["lag"]["offset"],
            "queueLag": queue_lag,
        }),
        sources,
    )
}

fn header(reply: &crate::support::Reply, name: &str) -> String {
    reply
        .headers
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .to_str()
        .unwrap()
        .to_string()
}

/// Waits until the broker on passes answers what the one measuring on request answers, and
/// returns the figures. Both are read again each time: a lease an ack claimed ahead for the
/// group's next pop is live for a moment (a member) and released when no pop takes it.
async fn converged(live: &TestApp, passes: &TestApp) -> Value {
    eventually(Duration::from_secs(20), "the pass's figures", || async {
        let (truth, sources) = figures(live).await;
        assert!(
            sources.iter().all(|s| s == "request"),
            "few pairs: measured on request, said so: {sources:?}"
        );
        let (seen, sources) = figures(passes).await;
        assert!(
            sources.iter().all(|s| s != "request"),
            "past the limit: never measured on request: {sources:?}"
        );
        (seen == truth && sources.iter().all(|s| s.ends_with('Z'))).then_some(seen)
    })
    .await
}

#[actix_web::test]
async fn past_the_live_limit_the_views_answer_from_a_pass_what_a_request_would_measure() {
    let db = fresh_db().await;
    let live = spawn_app(&db).await;
    let passes = spawn_app_with(test_settings(
        &db,
        &[("QUEEN_LAG_LIVE_PAIRS", "1"), ("QUEEN_LAG_PASS_MS", "200")],
    ))
    .await;
    for (p, n) in [("p0", 5), ("p1", 3), ("p2", 1), ("p3", 4)] {
        push_n(&live, "orders", p, 0, n).await;
    }
    push_n(&live, "audit", "a", 0, 6).await;
    // billing: consumes and acknowledges part of orders; shipping: holds a lease on one
    // partition without acknowledging; billing on audit: reads a little.
    for _ in 0..2 {
        let got = pop(&live, "orders", "batch=2&consumerGroup=billing").await;
        assert_eq!(got.status, 200, "{}", got.body);
        ack_all(&live, &got, "completed", Some("billing")).await;
    }
    let held = pop(&live, "orders", "batch=3&consumerGroup=shipping").await;
    assert_eq!(held.status, 200);
    let got = pop(&live, "audit", "batch=2&consumerGroup=billing").await;
    assert_eq!(got.status, 200);
    ack_all(&live, &got, "completed", Some("billing")).await;

    let first = converged(&live, &passes).await;
    let billing_orders = &first["groups"][1];
    assert_eq!(billing_orders[1], "orders");
    assert_eq!(billing_orders[2], 9, "13 stored, 4 acknowledged: {first}");
    assert_eq!(first["groups"][2][4], 1, "shipping's live lease: {first}");
    assert!(
        !first["lagging"].as_array().unwrap().is_empty(),
        "lagging partitions listed: {first}"
    );

    // Changes after the pass reach the next one: more messages, more consumed, a queue gone.
    push_n(&live, "orders", "p4", 0, 7).await;
    ack_all(&live, &held, "completed", Some("shipping")).await;
    let deleted = live.delete("/api/v1/resources/queues/audit").await;
    assert!(deleted.status < 300, "{}", deleted.body);
    let second = converged(&live, &passes).await;
    assert_ne!(first, second);
    assert!(
        !second.to_string().contains("audit"),
        "a deleted queue leaves no figures behind: {second}"
    );
}

#[actix_web::test]
async fn a_groups_partitions_come_a_page_at_a_time() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..5 {
        push_n(&app, "wide", &format!("p{p}"), 0, p + 1).await;
    }
    let got = pop(&app, "wide", "batch=1&consumerGroup=g").await;
    assert_eq!(messages(&got).len(), 1);

    let page = |query: &'static str| {
        let app = &app;
        async move {
            let reply = app.get(&format!("/api/v1/consumer-groups/g{query}")).await;
            assert_eq!(reply.status, 200, "{query}: {}", reply.body);
            let names: Vec<(String, i64)> = reply.body["wide"]["partitions"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .map(|p| {
                            (
                                p["partition"].as_str().unwrap().to_string(),
                                p["offsetLag"].as_i64().unwrap(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let next = reply
                .headers
                .get("x-next-offset")
                .map(|v| v.to_str().unwrap().to_string());
            (names, next)
        }
    };
    let (all, next) = page("").await;
    assert_eq!(
        all,
        [
            ("p0".into(), 1),
            ("p1".into(), 2),
            ("p2".into(), 3),
            ("p3".into(), 4),
            ("p4".into(), 5)
        ],
        "a popped message is behind the cursor until acknowledged"
    );
    assert_eq!(next, None, "one page holds them all");
    let (first, next) = page("?queue=wide&limit=2").await;
    assert_eq!(
        first.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
        ["p0", "p1"]
    );
    assert_eq!(next.as_deref(), Some("2"));
    let (last, next) = page("?queue=wide&limit=2&offset=4").await;
    assert_eq!(last, [("p4".into(), 5)]);
    assert_eq!(next, None);
    let (none, _) = page("?queue=other").await;
    assert!(none.is_empty());
    let bad = app.get("/api/v1/consumer-groups/g?limit=0").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}
