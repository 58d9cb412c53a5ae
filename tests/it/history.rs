//! `GET /api/v1/system/history`: the broker samples its own rates, backlogs, spool and commit
//! latency (`crate::history`), so a page opened now sees the recent past. A broker sampling
//! every 100 ms is pushed to, popped from and partly acked; its history then shows the
//! pushes as a rate, the commits' latency, and the group's backlog on that queue alone.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::auth::{call, claims, hs256, AUDIENCE, ISSUER, SECRET};
use crate::support::consuming::{ack_all, pop};
use crate::support::{eventually, fresh_db, spawn_app_with, test_settings};

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("a column")
        .iter()
        .filter_map(Value::as_f64)
        .collect()
}

#[actix_web::test]
async fn the_history_shows_rates_latency_and_the_backlog_of_each_group() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_HISTORY_INTERVAL_MS", "100"),
            ("QUEEN_HISTORY_QUEUES", "5"),
        ],
    ))
    .await;
    let items: Vec<Value> = (0..30)
        .map(|n| json!({ "queue": "charted", "partition": format!("p{}", n % 3), "payload": { "n": n } }))
        .collect();
    assert_eq!(app.push(json!(items)).await.status, 201);
    let other: Vec<Value> = (0..4)
        .map(|n| json!({ "queue": "elsewhere", "payload": { "n": n } }))
        .collect();
    assert_eq!(app.push(json!(other)).await.status, 201);
    // Group g takes 10 and acks them: 20 left. The other queue's group takes nothing yet but
    // subscribes with a pop of 1, left unacked.
    let first = pop(&app, "charted", "consumerGroup=g&batch=10&partitions=3").await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let acked = ack_all(&app, &first, "completed", Some("g")).await;
    assert!(acked.as_array().is_some_and(|a| !a.is_empty()), "{acked}");
    let taken = first.body["messages"].as_array().unwrap().len() as i64;
    assert_eq!(
        pop(&app, "elsewhere", "consumerGroup=h&batch=1")
            .await
            .status,
        200
    );

    let history = eventually(
        Duration::from_secs(15),
        "a sample with g's backlog and rates",
        || {
            let app = &app;
            async move {
                let h = app.get("/api/v1/system/history").await;
                assert_eq!(h.status, 200, "{:?}", h.body);
                let pair = h.body["queues"]
                    .as_array()?
                    .iter()
                    .find(|q| q["queue"] == "charted" && q["consumerGroup"] == "g")?
                    .clone();
                let last = pair["backlog"].as_array()?.last()?.as_i64()?;
                // The pop and the ack show as rates in the sample after the one that counted them;
                // on a loaded machine that can come after the sample that shows the backlog.
                let shown = |column: &str| numbers(&h.body[column]).iter().any(|r| *r > 0.0);
                (last == 30 - taken && shown("poppedPerSecond") && shown("ackedPerSecond"))
                    .then_some(h.body)
            }
        },
    )
    .await;
    assert_eq!(history["enabled"], true);
    assert_eq!(history["recording"], true);
    assert_eq!(history["intervalSeconds"], 0.1);
    assert_eq!(history["capacity"], 360);
    assert_eq!(history["queuesError"], Value::Null);
    let at = history["at"].as_array().unwrap();
    assert!(at.len() >= 2, "{history}");
    for column in [
        "pushedPerSecond",
        "poppedPerSecond",
        "ackedPerSecond",
        "spoolBytes",
        "commitP50Seconds",
        "commitP99Seconds",
    ] {
        assert_eq!(
            history[column].as_array().unwrap().len(),
            at.len(),
            "{column}"
        );
    }
    // The 34 pushes show as rates whose sum over the intervals (their real lengths, from `at`)
    // is that many messages, less any pushed before the first sample (taken at start).
    let at_ms: Vec<f64> = numbers(&history["at"]);
    let rates = history["pushedPerSecond"].as_array().unwrap();
    let counted: f64 = (1..at_ms.len())
        .map(|i| rates[i].as_f64().unwrap_or(0.0) * (at_ms[i] - at_ms[i - 1]) / 1000.0)
        .sum();
    assert!(
        (1.0..=35.0).contains(&counted),
        "34 pushed over the samples, counted {counted}: {history}"
    );
    assert!(numbers(&history["poppedPerSecond"])
        .iter()
        .any(|r| *r > 0.0));
    assert!(numbers(&history["ackedPerSecond"]).iter().any(|r| *r > 0.0));
    // The push's commits were timed.
    let p99 = numbers(&history["commitP99Seconds"]);
    assert!(p99.iter().any(|s| *s > 0.0 && *s < 10.0), "{history}");
    let oldest = history["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "charted")
        .map(|q| numbers(&q["oldestSeconds"]))
        .unwrap();
    assert!(oldest.last().is_some_and(|s| *s >= 0.0));

    // One queue's page asks for its series only.
    let only = app.get("/api/v1/system/history?queue=elsewhere").await;
    assert_eq!(only.status, 200);
    let queues = only.body["queues"].as_array().unwrap();
    assert!(
        queues.iter().all(|q| q["queue"] == "elsewhere"),
        "{queues:?}"
    );
    let h = eventually(Duration::from_secs(15), "h's backlog on elsewhere", || {
        let app = &app;
        async move {
            let only = app.get("/api/v1/system/history?queue=elsewhere").await;
            let q = only.body["queues"].as_array()?.first()?.clone();
            (q["backlog"].as_array()?.last()?.as_i64()? == 4).then_some(q)
        }
    })
    .await;
    assert_eq!(h["consumerGroup"], "h");
}

#[actix_web::test]
async fn the_history_needs_read_rights_and_says_when_the_sampler_is_off() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_HISTORY_INTERVAL_MS", "0"),
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", SECRET),
            ("JWT_ISSUER", ISSUER),
            ("JWT_AUDIENCE", AUDIENCE),
        ],
    ))
    .await;
    let path = "/api/v1/system/history";
    assert_eq!(call(&app, "GET", path, None, None).await.status, 401);
    let writer = hs256(&claims("w", "write-only"));
    assert_eq!(
        call(&app, "GET", path, Some(&writer), None).await.status,
        403
    );
    let reader = hs256(&claims("r", "read-only"));
    let r = call(&app, "GET", path, Some(&reader), None).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["enabled"], false);
    assert_eq!(r.body["at"], json!([]));
    assert_eq!(r.body["queues"], json!([]));
}
