//! The Grafana board in `docs/grafana/queen-broker.json` names only metrics a broker exposes:
//! a broker that has pushed, popped and acked is scraped, and every metric name read from the
//! board's PromQL (`expr` of each target, the metric of each `label_values` variable) must be
//! a sample name of the exposition. A renamed or removed family fails here, not on an
//! operator's empty panel.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::consuming::{ack_one, messages, pop_partition};
use crate::support::{eventually, fresh_db, spawn_app_with, test_settings};

const BOARD: &str = include_str!("../../docs/grafana/queen-broker.json");

/// Words of PromQL that are not metric names: aggregation operators (they may be followed by
/// `by (…)` rather than `(`), binary operators and modifiers.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "atan2",
];

/// The metric names a PromQL expression selects. Skips label matchers (`{…}`), ranges
/// (`[…]`), strings, Grafana variables (`$…`), numbers, function calls (a name followed by
/// `(`), keywords, and the label lists of `by`/`without`/`on`/`ignoring`/`group_*`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let skip_past = |from: usize, close: char| -> usize {
        let mut j = from + 1;
        let mut quote = None;
        while j < chars.len() {
            match (quote, chars[j]) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), '\\') => j += 1,
                (None, '"' | '\'' | '`') => quote = Some(chars[j]),
                (None, c) if c == close => return j + 1,
                _ => {}
            }
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_past(i, '}');
        } else if c == '[' {
            i = skip_past(i, ']');
        } else if matches!(c, '"' | '\'' | '`') {
            // A string outside braces: skip to its closing quote.
            let mut j = i + 1;
            while j < chars.len() && chars[j] != c {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            i = j + 1;
        } else if c.is_ascii_digit() || c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "._".contains(chars[i])) {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            let label_list = matches!(
                word.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            );
            if label_list && call {
                i = skip_past(next, ')');
            } else if word == "label_values" && call {
                // label_values(metric, label): the first argument is a metric.
                let args: String = chars[next + 1..skip_past(next, ')') - 1].iter().collect();
                names.extend(metric_names(args.split(',').next().unwrap_or("")));
                i = skip_past(next, ')');
            } else if !call && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every string under an `expr` key, and every `definition` of a template variable.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| queries(v, out)),
        _ => {}
    }
}

#[test]
fn the_promql_reader_finds_metrics_and_nothing_else() {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (le, route) (rate(queen_http_request_duration_seconds_bucket{instance=~"$instance",route="/a{b}"}[$__rate_interval]))) / on (instance) group_left max(up) - 2e3 * sum without (x) (queen_a_total offset 5m) > bool 0"#,
    );
    let want: BTreeSet<String> = [
        "queen_http_request_duration_seconds_bucket",
        "up",
        "queen_a_total",
    ]
    .map(String::from)
    .into();
    assert_eq!(got, want);
    assert_eq!(
        metric_names("label_values(queen_uptime_seconds, instance)"),
        BTreeSet::from(["queen_uptime_seconds".to_string()])
    );
}

#[actix_web::test]
async fn every_metric_the_grafana_board_names_is_in_the_exposition() {
    let board: Value = serde_json::from_str(BOARD).expect("the board is JSON");
    let mut exprs = Vec::new();
    queries(&board, &mut exprs);
    let wanted: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    // The board covers rates, lag, latency histograms, spool and pools: a reader that found
    // next to nothing would pass vacuously.
    for family in [
        "queen_push_messages_total",
        "queen_pop_message_age_seconds_bucket",
        "queen_commit_duration_seconds_bucket",
        "queen_file_buffer_bytes",
        "queen_db_pool_active",
    ] {
        assert!(
            wanted.contains(family),
            "the board lost {family}: {wanted:?}"
        );
    }
    assert!(wanted.len() >= 25, "{wanted:?}");

    // A broker that has done a little of everything the board draws, sampling its history
    // (backlogs, 2.x state) every 100 ms.
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_HISTORY_INTERVAL_MS", "100")])).await;
    for (path, body) in [
        (
            "/api/v1/kv",
            json!({ "operations": [{ "op": "put", "ns": "board", "key": "k", "value": 1, "forever": true }] }),
        ),
        (
            "/api/v1/locks",
            json!({ "operations": [{ "op": "acquire", "name": "board", "ttlSeconds": 60, "owner": "o" }] }),
        ),
        (
            "/api/v1/timers",
            json!({ "operations": [{ "op": "schedule", "queue": "board-timers", "timerKey": "t", "payload": "eyJuIjoxfQ==", "delayMs": 3_600_000 }] }),
        ),
        (
            "/streams/v1/queries",
            json!({ "name": "board", "source_queue": "board", "config_hash": "h" }),
        ),
    ] {
        let r = app.post(path, &body).await;
        assert_eq!(r.status, 200, "{path}: {:?}", r.body);
    }
    let items: Vec<Value> = (0..4)
        .map(|n| json!({ "queue": "board", "partition": "p", "payload": { "n": n } }))
        .collect();
    assert_eq!(app.push(json!(items)).await.status, 201);
    let popped = pop_partition(&app, "board", "p", "batch=4").await;
    let list = messages(&popped);
    assert_eq!(list.len(), 4, "{:?}", popped.body);
    // Scraped with the lease live (queen_leases_held) once a sample saw the backlog and the
    // 2.x state, then acked.
    let first = eventually(
        Duration::from_secs(15),
        "a sample with backlog and state",
        || {
            let app = &app;
            async move {
                let (status, text) = app.get_text("/metrics/prometheus").await;
                assert_eq!(status, 200);
                let seen = [
                    "queen_queue_backlog_messages{",
                    "queen_kv_keys{",
                    "queen_stream_state_bytes{",
                ]
                .iter()
                .all(|family| text.contains(family));
                seen.then_some(text)
            }
        },
    )
    .await;
    assert_eq!(
        ack_one(&app, &list[3], "completed", None).await["success"],
        true
    );
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);

    let exposed: BTreeSet<&str> = first
        .lines()
        .chain(text.lines())
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|name| !exposed.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/grafana/queen-broker.json names metrics /metrics/prometheus does not expose: {missing:?}"
    );
}
