//! What an operator sees: the metrics registry counts exactly what happened, histograms fill,
//! every answer carries a request id, the JSON log is one object per line with the access
//! line, `--help` answers without any database, and the OpenAPI document lists every route.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::consuming::{ack_one, messages, pop, pop_partition};
use crate::support::{fresh_db, spawn_app, TestApp};

const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");

/// The value of the sample `name{labels}` in a Prometheus text exposition: the labels must be
/// exactly `labels` (any order); 0 when the sample is absent.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let got: BTreeMap<&str, &str> = label_text
            .split(',')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if got == want {
            return value.parse().expect("a number");
        }
    }
    0.0
}

async fn scrape(app: &TestApp) -> String {
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    text
}

#[actix_web::test]
async fn counters_move_by_exactly_what_a_known_sequence_produces() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let before = scrape(&app).await;
    assert_eq!(
        sample(
            &before,
            "queen_push_messages_total",
            &[("verdict", "queued")]
        ),
        0.0
    );

    // 5 new items over two partitions, then one repeated transactionId.
    let items: Vec<Value> = (0..5)
        .map(|i| json!({ "queue": "obs", "partition": if i < 3 { "a" } else { "b" }, "payload": i, "transactionId": format!("t{i}") }))
        .collect();
    let r = app.push(json!(items)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let r = app
        .push(json!([{ "queue": "obs", "partition": "a", "payload": 0, "transactionId": "t0" }]))
        .await;
    assert_eq!(r.body[0]["status"], "duplicate", "{:?}", r.body);

    // Pop the three messages of partition a; ack two completed, the third failed.
    let popped = pop_partition(&app, "obs", "a", "batch=3").await;
    let list = messages(&popped);
    assert_eq!(list.len(), 3, "{:?}", popped.body);
    for m in &list[..2] {
        assert_eq!(ack_one(&app, m, "completed", None).await["success"], true);
    }
    assert_eq!(
        ack_one(&app, &list[2], "failed", None).await["success"],
        true
    );
    // Partition b's two messages acked by one batch (counted as two), then a batch naming a
    // message that is not there (an error outcome).
    let popped = pop_partition(&app, "obs", "b", "batch=2").await;
    let b = messages(&popped);
    assert_eq!(b.len(), 2, "{:?}", popped.body);
    let each = |m: &Value, txn: &Value| {
        json!({ "transactionId": txn, "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                "status": "completed" })
    };
    let batch: Vec<Value> = b.iter().map(|m| each(m, &m["transactionId"])).collect();
    let r = app
        .post("/api/v1/ack/batch", &json!({ "acknowledgments": batch }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert!(
        r.body
            .as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|o| o["success"] == true)),
        "{:?}",
        r.body
    );
    let r = app
        .post(
            "/api/v1/ack/batch",
            &json!({ "acknowledgments": [each(&b[0], &json!("nope"))] }),
        )
        .await;
    assert_eq!(r.body[0]["success"], false, "{:?}", r.body);
    // An empty pop of another queue.
    assert_eq!(pop(&app, "obs-empty", "").await.status, 204);

    let text = scrape(&app).await;
    let s = |name: &str, labels: &[(&str, &str)]| sample(&text, name, labels);
    assert_eq!(
        s("queen_push_messages_total", &[("verdict", "queued")]),
        5.0
    );
    assert_eq!(
        s("queen_push_messages_total", &[("verdict", "duplicate")]),
        1.0
    );
    assert_eq!(
        s("queen_push_messages_total", &[("verdict", "failed")]),
        0.0
    );
    assert_eq!(s("queen_pop_messages_total", &[]), 5.0);
    assert_eq!(
        s(
            "queen_ack_total",
            &[("status", "completed"), ("result", "success")]
        ),
        4.0
    );
    assert_eq!(
        s(
            "queen_ack_total",
            &[("status", "completed"), ("result", "error")]
        ),
        1.0
    );
    assert_eq!(
        s(
            "queen_ack_total",
            &[("status", "failed"), ("result", "success")]
        ),
        1.0
    );
    let http = |route: &str, method: &str, class: &str| {
        s(
            "queen_http_requests_total",
            &[("route", route), ("method", method), ("status", class)],
        )
    };
    assert_eq!(http("/api/v1/push", "POST", "2xx"), 2.0);
    assert_eq!(http("/api/v1/ack", "POST", "2xx"), 3.0);
    // One 200 on the partition route, one 204 on the queue route.
    assert_eq!(
        http(
            "/api/v1/pop/queue/{queue}/partition/{partition}",
            "GET",
            "2xx"
        ),
        2.0
    );
    assert_eq!(http("/api/v1/pop/queue/{queue}", "GET", "2xx"), 1.0);
    // The first scrape is counted; this one is not yet.
    assert_eq!(http("/metrics/prometheus", "GET", "2xx"), 1.0);

    // Histograms: every item went through a committer once (the duplicate too).
    assert_eq!(s("queen_commit_batch_items_sum", &[]), 6.0);
    let commits = s("queen_commit_batch_items_count", &[]);
    // Three segments (a and b, then a again): one to three transactions.
    assert!((1.0..=3.0).contains(&commits), "{commits} commits");
    assert_eq!(
        s("queen_commit_duration_seconds_count", &[("result", "ok")]),
        commits
    );
    assert_eq!(s("queen_commit_batch_partitions_count", &[]), commits);
    assert_eq!(s("queen_commit_batch_partitions_sum", &[]), 3.0);
    assert_eq!(s("queen_pop_message_age_seconds_count", &[]), 5.0);
    assert!(s("queen_pop_message_age_seconds_sum", &[]) > 0.0);
    assert_eq!(
        s(
            "queen_pop_duration_seconds_count",
            &[("result", "messages")]
        ),
        2.0
    );
    assert_eq!(
        s("queen_pop_duration_seconds_count", &[("result", "empty")]),
        1.0
    );
    assert!(
        s(
            "queen_http_request_duration_seconds_count",
            &[("route", "/api/v1/push"), ("method", "POST")]
        ) == 2.0
    );
    // Gauges read at the scrape, and the process collector.
    assert_eq!(s("queen_partition_actors", &[]), 2.0);
    assert_eq!(s("queen_partition_actor_evictions_total", &[]), 0.0);
    let host = app.broker.primary.current_host();
    assert_eq!(s("queen_database_primary", &[("host", host.as_str())]), 1.0);
    assert_eq!(s("queen_database_primary_switches_total", &[]), 0.0);
    assert_eq!(s("queen_file_buffer_pending", &[]), 0.0);
    assert_eq!(s("queen_file_buffer_db_healthy", &[]), 1.0);
    assert!(s("queen_db_pool_size", &[("pool", "shared")]) >= 1.0);
    assert!(
        text.contains("queen_db_pool_size{pool=\"claims\"}"),
        "the grouped claims' pool is reported"
    );
    assert!(
        text.contains("queen_db_pool_size{pool=\"acks\"}"),
        "the grouped acks' pool is reported"
    );
    assert!(s("process_resident_memory_bytes", &[]) > 0.0);
    assert!(
        text.contains("# TYPE queen_file_buffer_replayed_total counter"),
        "{text}"
    );
    // The failed ack released the lease: no live lease is left.
    assert_eq!(s("queen_leases_held", &[("scope", "cluster")]), 0.0);

    // The JSON route reads the same registry.
    let j = app.get("/metrics").await;
    assert_eq!(j.status, 200);
    assert_eq!(j.body["messages"]["total"], 5, "{}", j.body);
    assert_eq!(j.body["messages"]["popped"], 5, "{}", j.body);
    // Every ack outcome, the one that was not applied too.
    assert_eq!(j.body["messages"]["acked"], 6, "{}", j.body);
    // 2 pushes, 3 acks, 2 ack batches, 3 pops, 2 scrapes answered before this request was
    // counted.
    assert_eq!(j.body["requests"]["total"], 12, "{}", j.body);
    assert!(j.body["memory"]["rss"].as_u64().unwrap() > 0, "{}", j.body);
}

#[actix_web::test]
async fn every_answer_carries_a_request_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let client = awc::Client::default();
    let res = client
        .get(format!("{}/health", app.base))
        .insert_header(("X-Request-Id", "trace-me-42"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers().get("x-request-id").unwrap(), "trace-me-42");
    // Generated when absent (and when unusable); different per request; also on errors.
    let a = app.get("/health").await.headers;
    let b = app.get("/no/such/route").await;
    assert_eq!(b.status, 404);
    let (a, b) = (
        a.get("x-request-id").unwrap(),
        b.headers.get("x-request-id").unwrap(),
    );
    assert!(!a.is_empty() && a != b, "{a:?} {b:?}");
    let res = client
        .get(format!("{}/health", app.base))
        .insert_header(("X-Request-Id", "has space"))
        .send()
        .await
        .unwrap();
    assert_ne!(res.headers().get("x-request-id").unwrap(), "has space");
}

#[test]
fn help_and_version_answer_without_touching_a_database() {
    let private = std::env::temp_dir().join(format!("queen-help-{}", std::process::id()));
    for flag in ["--help", "--version"] {
        let out = Command::new(BROKER)
            .arg(flag)
            .env_clear()
            // Nothing answers there; a private cluster would be created under `private`.
            .env("DATABASE_URL", "postgres://u:p@127.0.0.1:1/none")
            .env("QUEEN_PRIVATE_PG_DIR", &private)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if flag == "--help" {
            assert!(
                stdout.contains("--config <PATH>") && stdout.contains("[env: PG_HOST]"),
                "{stdout}"
            );
        } else {
            assert!(stdout.starts_with("queen-broker "), "{stdout}");
        }
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(!private.exists());
    let out = Command::new(BROKER).arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}

#[actix_web::test]
async fn json_logs_are_one_object_per_line_with_the_access_line() {
    let db = fresh_db().await;
    let port = queen_broker::pg::free_port().unwrap();
    let spool = std::env::temp_dir().join(format!("queen-test-spool-log-{port}"));
    let child = Command::new(BROKER)
        .args([
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--port",
            &port.to_string(),
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("DATABASE_URL", &db.url)
        .env("HOST", "127.0.0.1")
        .env("FILE_BUFFER_DIR", &spool)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = awc::Client::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        if let Ok(res) = client
            .get(format!("http://127.0.0.1:{port}/health"))
            .insert_header(("X-Request-Id", "log-me-7"))
            .send()
            .await
        {
            break res
                .headers()
                .get("x-request-id")
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
        }
        assert!(Instant::now() < deadline, "broker not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(id, "log-me-7");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&spool);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!("not one JSON object: {l:?}: {e}; the whole log:\n{stderr}")
            })
        })
        .collect();
    let start = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("queen-broker listening")
        })
        .unwrap_or_else(|| panic!("no start-up line in {stderr}"));
    let text = start["message"].as_str().unwrap();
    let database = db.url.rsplit('/').next().unwrap();
    assert!(
        text.contains("db_host=127.0.0.1 ")
            && text.contains(&format!("database={database} "))
            && text.contains("private_database=false"),
        "{text}"
    );
    assert!(
        !text.contains(&db.url),
        "the URL (with its password) is never logged: {text}"
    );
    let access = lines
        .iter()
        .find(|l| {
            l["target"] == "queen_broker::access"
                && l["message"].as_str().unwrap().contains("log-me-7")
        })
        .unwrap_or_else(|| panic!("no access line in {stderr}"));
    let text = access["message"].as_str().unwrap();
    assert!(
        text.contains("route=/health")
            && text.contains("status=200")
            && text.contains("latency_us="),
        "{text}"
    );
    assert_eq!(access["level"], "DEBUG");
}

#[actix_web::test]
async fn the_served_openapi_document_lists_every_route_of_the_table() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let doc = app.get("/api/v1/openapi.json").await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.body["openapi"], "3.1.0");
    for route in queen_broker::http::routes() {
        // A tail parameter's pattern (`{timerKey:.+}`) is not part of the document's path.
        let (path, _) = queen_broker::http::openapi::openapi_path(route.path);
        let path = path.as_str();
        let method = route.method.as_str().to_ascii_lowercase();
        assert!(
            doc.body["paths"][path][&method].is_object(),
            "{} {path} is served but missing from /api/v1/openapi.json",
            route.method
        );
    }
    let operations: usize = doc.body["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|m| m.as_object().unwrap().len())
        .sum();
    assert_eq!(
        operations,
        queen_broker::http::routes().len(),
        "operations the table has not"
    );
    // The main routes have request and response schemas.
    for (method, path, status) in [
        ("post", "/api/v1/push", "201"),
        ("post", "/api/v1/ack", "200"),
        ("post", "/api/v1/ack/batch", "200"),
        ("post", "/api/v1/transaction", "200"),
        ("post", "/api/v1/configure", "200"),
    ] {
        let op = &doc.body["paths"][path][method];
        assert!(
            op["requestBody"]["content"]["application/json"]["schema"]["$ref"].is_string(),
            "{path}"
        );
        assert!(
            op["responses"][status]["content"]["application/json"]["schema"]["$ref"].is_string(),
            "{path}"
        );
    }
    for path in [
        "/api/v1/pop/queue/{queue}",
        "/api/v1/pop/queue/{queue}/partition/{partition}",
        "/api/v1/pop",
    ] {
        assert_eq!(
            doc.body["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/PopResponse",
            "{path}"
        );
    }
}
