//! The dashboard's lists a page at a time (docs/operations.md, "Views at scale"): the queue
//! list, a queue's partitions and the consumer groups with `limit`, `offset` and `search`; the
//! bounded defaults; the overview's exactness flags; the lagging list's limit.

use crate::support::consuming::{pop, push_n};
use crate::support::{fresh_db, spawn_app, TestApp};
use serde_json::Value;

fn names(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("an array: {list}"))
        .iter()
        .map(|q| q[key].as_str().unwrap().to_string())
        .collect()
}

async fn ok(app: &TestApp, path: &str) -> Value {
    let reply = app.get(path).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    reply.body
}

#[actix_web::test]
async fn the_queue_list_pages_and_searches_by_name_with_the_counts_of_each_queue() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for (i, name) in ["alpha", "beta", "gamma", "alpine", "delta_x", "deltaxx"]
        .iter()
        .enumerate()
    {
        push_n(&app, name, "p0", 0, i as i64 + 1).await;
        push_n(&app, name, "p1", 0, 1).await;
    }

    let all = ok(&app, "/api/v1/resources/queues").await;
    assert_eq!(all["total"], 6);
    assert_eq!(all["limit"], 100, "the default page");
    assert_eq!(all["offset"], 0);
    assert_eq!(
        names(&all["queues"], "name"),
        ["alpha", "alpine", "beta", "delta_x", "deltaxx", "gamma"]
    );

    let first = ok(&app, "/api/v1/resources/queues?limit=2").await;
    assert_eq!(names(&first["queues"], "name"), ["alpha", "alpine"]);
    assert_eq!(first["total"], 6);
    let third = ok(&app, "/api/v1/resources/queues?limit=2&offset=4").await;
    assert_eq!(names(&third["queues"], "name"), ["deltaxx", "gamma"]);
    let past = ok(&app, "/api/v1/resources/queues?limit=2&offset=10").await;
    assert_eq!(past["queues"], Value::Array(vec![]));
    assert_eq!(past["total"], 6);

    let found = ok(&app, "/api/v1/resources/queues?search=ALP").await;
    assert_eq!(names(&found["queues"], "name"), ["alpha", "alpine"]);
    assert_eq!(found["total"], 2);
    let alpha = &found["queues"][0];
    assert_eq!(alpha["partitions"], 2);
    assert_eq!(alpha["messages"]["total"], 2, "1 in p0 + 1 in p1");
    assert_eq!(alpha["messages"]["pending"], 2);

    // `_` and `%` are the characters searched for, not patterns.
    let literal = ok(&app, "/api/v1/resources/queues?search=delta_").await;
    assert_eq!(names(&literal["queues"], "name"), ["delta_x"]);
    let none = ok(&app, "/api/v1/resources/queues?search=%25").await;
    assert_eq!(none["total"], 0);

    let capped = ok(&app, "/api/v1/resources/queues?limit=5000").await;
    assert_eq!(capped["limit"], 1000, "cut to the largest page");
    for bad in ["limit=0", "limit=x", "offset=-1"] {
        let reply = app.get(&format!("/api/v1/resources/queues?{bad}")).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.body);
    }
}

#[actix_web::test]
async fn a_queues_partitions_come_a_page_at_a_time_with_totals_over_all_of_them() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    for p in 0..5 {
        push_n(&app, "wide", &format!("p{p}"), 0, 2).await;
    }
    let page = ok(&app, "/api/v1/resources/queues/wide?limit=2&offset=2").await;
    assert_eq!(names(&page["partitions"], "name"), ["p2", "p3"]);
    assert_eq!(page["partitionCount"], 5);
    assert_eq!(page["totals"]["total"], 10, "over every partition");
    let whole = ok(&app, "/api/v1/resources/queues/wide").await;
    assert_eq!(whole["partitions"].as_array().unwrap().len(), 5);
    assert_eq!(whole["limit"], 1000);
}

#[actix_web::test]
async fn consumer_groups_page_and_search_with_their_backlog_and_a_total_header() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "orders", "p", 0, 4).await;
    push_n(&app, "audit", "p", 0, 2).await;
    for (queue, group) in [
        ("orders", "billing"),
        ("orders", "shipping"),
        ("audit", "billing"),
    ] {
        let got = pop(&app, queue, &format!("batch=1&consumerGroup={group}")).await;
        assert_eq!(got.status, 200);
    }

    let all = app.get("/api/v1/consumer-groups").await;
    assert_eq!(all.status, 200);
    assert_eq!(all.headers.get("x-total-count").unwrap(), "3");
    let pairs: Vec<(String, String, i64)> = all
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap().into(),
                g["queueName"].as_str().unwrap().into(),
                g["backlog"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            ("billing".into(), "audit".into(), 2),
            ("billing".into(), "orders".into(), 4),
            ("shipping".into(), "orders".into(), 4),
        ],
        "a popped but unacknowledged message is still behind the cursor"
    );
    let second = app.get("/api/v1/consumer-groups?limit=1&offset=1").await;
    assert_eq!(names(&second.body, "queueName"), ["orders"]);
    assert_eq!(second.body[0]["name"], "billing");
    assert_eq!(second.headers.get("x-total-count").unwrap(), "3");

    let by_group = app.get("/api/v1/consumer-groups?search=SHIP").await;
    assert_eq!(names(&by_group.body, "name"), ["shipping"]);
    let by_queue = app.get("/api/v1/consumer-groups?search=aud").await;
    assert_eq!(names(&by_queue.body, "name"), ["billing"]);
    assert_eq!(by_queue.headers.get("x-total-count").unwrap(), "1");

    let lagging = ok(
        &app,
        "/api/v1/consumer-groups/lagging?minLagSeconds=0&limit=2",
    )
    .await;
    assert_eq!(lagging.as_array().unwrap().len(), 2, "cut to the limit");
}

#[actix_web::test]
async fn the_overview_says_its_counts_are_exact_when_they_are() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    push_n(&app, "one", "a", 0, 3).await;
    push_n(&app, "one", "b", 0, 1).await;
    push_n(&app, "two", "a", 0, 2).await;
    let o = ok(&app, "/api/v1/resources/overview").await;
    assert_eq!(o["queues"], 2);
    assert_eq!(o["partitions"], 3);
    assert_eq!(o["partitionsExact"], true);
    assert_eq!(o["messages"]["total"], 6);
    assert_eq!(o["messagesExact"], true);
    assert_eq!(o["messagesPartitions"], 3);
}
