//! `streams`: cycles per second of a map → tumbling window → sink pipeline driven the way the
//! SDKs' Stream runtime drives the broker (docs/streams.md), beside the same work done with
//! plain pop / push / ack (no state, no atomicity), against a running broker, in the same run.
//!
//! Each of `WORKERS` (4) workers owns one source partition holding `MESSAGES` (20 000) messages
//! `{"v": n}`. Per round a worker pops a batch of `BATCH` (200) under its group, then:
//! - *streams*: `state/get` of its partition, folds the batch into 1-second tumbling windows
//!   (one state row per window, the window's sum), emits the windows the batch closed to the
//!   sink and commits ONE `cycle` (state upserts and deletes, sink pushes, the ack of the last
//!   message);
//! - *plain*: pushes one mapped message per popped message to the sink and acks the batch
//!   (`/ack/batch`), two requests with nothing tying them together;
//! - *map*: the same output as *plain* (one sink message per message) as ONE stateless
//!   `cycle` (sink pushes and the ack): what the atomicity costs against *plain*.
//!
//! Prints messages/s and rounds (cycles)/s of each and the ratios to *plain*; the machine is
//! noisy, so the ratios measured in one run are the numbers to read.
//!
//!   QUEEN_URL=http://127.0.0.1:6632 cargo run --release -p queen-bench --bin streams

#[path = "../http.rs"]
#[allow(dead_code, reason = "the shared client has more than this tool uses")]
mod http;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

async fn call(
    conn: &mut http::HttpConn,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<(u16, Value), BoxError> {
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(body)?
    };
    let res = conn.request(method, path, &bytes).await?;
    let value = if res.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&res.body)?
    };
    if res.status >= 300 {
        return Err(format!("{method} {path}: {} {value}", res.status).into());
    }
    Ok((res.status, value))
}

/// Fills `queue`/`partition` with `n` messages `{"v": i, "t": i}` (t: event time in ms).
async fn fill(port: u16, queue: &str, partition: &str, n: usize) -> Result<(), BoxError> {
    let mut conn = http::HttpConn::new(port);
    for start in (0..n).step_by(1000) {
        let items: Vec<Value> = (start..(start + 1000).min(n))
            .map(|i| json!({ "queue": queue, "partition": partition, "payload": { "v": i, "t": i * 5 } }))
            .collect();
        call(
            &mut conn,
            "POST",
            "/api/v1/push",
            &json!({ "items": items }),
        )
        .await?;
    }
    Ok(())
}

/// Pops up to `batch` messages of one partition under `group` (wait briefly when empty).
async fn pop(
    conn: &mut http::HttpConn,
    queue: &str,
    partition: &str,
    group: &str,
    batch: usize,
) -> Result<Vec<Value>, BoxError> {
    let path = format!(
        "/api/v1/pop/queue/{queue}/partition/{partition}?batch={batch}&consumerGroup={group}&wait=true&timeout=200"
    );
    let (status, body) = call(conn, "GET", &path, &Value::Null).await?;
    if status == 204 {
        return Ok(Vec::new());
    }
    Ok(body["messages"].as_array().cloned().unwrap_or_default())
}

/// One streams worker (`window`: the tumbling-window pipeline, else map → sink): returns
/// (messages, cycles).
#[allow(clippy::too_many_arguments)]
async fn streams_worker(
    window: bool,
    port: u16,
    query_id: String,
    queue: String,
    partition: String,
    sink: String,
    messages: usize,
    batch: usize,
) -> Result<(usize, usize), BoxError> {
    let mut conn = http::HttpConn::new(port);
    let group = if window {
        "streams.window"
    } else {
        "streams.map"
    };
    let (mut done, mut cycles) = (0, 0);
    while done < messages {
        let got = pop(&mut conn, &queue, &partition, group, batch).await?;
        let Some(last) = got.last() else { continue };
        let pid = last["partitionId"]
            .as_str()
            .ok_or("partitionId")?
            .to_string();
        let ack = json!({ "transactionId": last["transactionId"], "leaseId": last["leaseId"],
                          "status": "completed", "count": got.len() });
        if !window {
            let items: Vec<Value> = got
                .iter()
                .map(|m| {
                    json!({ "queue": sink, "partition": partition,
                                 "payload": { "v": m["data"]["v"].as_i64().unwrap_or(0) * 2 } })
                })
                .collect();
            let body = json!({ "query_id": query_id, "partition_id": pid, "consumer_group": group,
                               "state_ops": [], "push_items": items, "ack": ack });
            call(&mut conn, "POST", "/streams/v1/cycle", &body).await?;
            done += got.len();
            cycles += 1;
            continue;
        }
        let (_, state) = call(
            &mut conn,
            "POST",
            "/streams/v1/state/get",
            &json!({ "query_id": query_id, "partition_id": pid, "keys": [] }),
        )
        .await?;
        // Window start (ms) → sum, seeded from the state rows.
        let mut windows: BTreeMap<i64, i64> = BTreeMap::new();
        for row in state["rows"].as_array().into_iter().flatten() {
            let start = row["value"]["windowStart"].as_i64().unwrap_or(0);
            windows.insert(start, row["value"]["acc"].as_i64().unwrap_or(0));
        }
        let mut clock = 0;
        for m in &got {
            let t = m["data"]["t"].as_i64().unwrap_or(0);
            let v = m["data"]["v"].as_i64().unwrap_or(0) * 2; // the map stage
            *windows.entry(t / 1000 * 1000).or_default() += v;
            clock = clock.max(t);
        }
        let mut ops = Vec::new();
        let mut items = Vec::new();
        for (&start, &sum) in &windows {
            let key = format!("tumb:1\u{1f}{start}\u{1f}{pid}");
            if start + 1000 <= clock {
                ops.push(json!({ "type": "delete", "key": key }));
                items.push(json!({ "queue": sink, "partition": partition,
                                   "payload": { "windowStart": start, "sum": sum } }));
            } else {
                ops.push(json!({ "type": "upsert", "key": key, "value":
                                 { "acc": sum, "windowStart": start, "windowEnd": start + 1000 } }));
            }
        }
        let body = json!({
            "query_id": query_id, "partition_id": pid, "consumer_group": group,
            "state_ops": ops, "push_items": items,
            "ack": ack,
            "release_lease": true,
        });
        call(&mut conn, "POST", "/streams/v1/cycle", &body).await?;
        done += got.len();
        cycles += 1;
    }
    Ok((done, cycles))
}

/// One plain worker: pop, push one mapped message per message, ack the batch.
async fn plain_worker(
    port: u16,
    queue: String,
    partition: String,
    sink: String,
    messages: usize,
    batch: usize,
) -> Result<(usize, usize), BoxError> {
    let mut conn = http::HttpConn::new(port);
    let group = format!("plain.bench.{}", Uuid::new_v4().simple());
    let group = group.as_str();
    let (mut done, mut rounds) = (0, 0);
    while done < messages {
        let got = pop(&mut conn, &queue, &partition, group, batch).await?;
        if got.is_empty() {
            continue;
        }
        let items: Vec<Value> = got
            .iter()
            .map(|m| {
                json!({ "queue": sink, "partition": partition,
                             "payload": { "v": m["data"]["v"].as_i64().unwrap_or(0) * 2 } })
            })
            .collect();
        call(
            &mut conn,
            "POST",
            "/api/v1/push",
            &json!({ "items": items }),
        )
        .await?;
        let acks: Vec<Value> = got
            .iter()
            .map(|m| {
                json!({ "transactionId": m["transactionId"], "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "status": "completed" })
            })
            .collect();
        call(
            &mut conn,
            "POST",
            "/api/v1/ack/batch",
            &json!({ "acknowledgments": acks, "consumerGroup": group }),
        )
        .await?;
        done += got.len();
        rounds += 1;
    }
    Ok((done, rounds))
}

async fn run() -> Result<(), BoxError> {
    let url = env_or("QUEEN_URL", "http://127.0.0.1:6632");
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or("QUEEN_URL must be http://127.0.0.1:PORT")?;
    let workers: usize = env_or("WORKERS", "4").parse()?;
    let messages: usize = env_or("MESSAGES", "20000").parse()?;
    let batch: usize = env_or("BATCH", "200").parse()?;
    let run = &Uuid::new_v4().simple().to_string()[..8];
    let source = format!("bench-streams-{run}");
    for w in 0..workers {
        fill(port, &source, &format!("p{w}"), messages).await?;
    }

    let mut conn = http::HttpConn::new(port);
    let (_, reg) = call(
        &mut conn,
        "POST",
        "/streams/v1/queries",
        &json!({ "name": format!("bench-{run}"), "source_queue": source,
                 "config_hash": "bench", "reset": false }),
    )
    .await?;
    let query_id = reg["query_id"].as_str().ok_or("query_id")?.to_string();

    let mut results = Vec::new();
    for mode in ["plain", "map", "window", "plain"] {
        let sink = format!("{source}-{mode}-{}-sink", results.len());
        let started = Instant::now();
        let tasks: Vec<_> = (0..workers)
            .map(|w| {
                let (queue, partition, sink) = (source.clone(), format!("p{w}"), sink.clone());
                let query_id = query_id.clone();
                tokio::task::spawn_local(async move {
                    if mode == "plain" {
                        plain_worker(port, queue, partition, sink, messages, batch).await
                    } else {
                        let window = mode == "window";
                        streams_worker(
                            window, port, query_id, queue, partition, sink, messages, batch,
                        )
                        .await
                    }
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        let (mut total, mut rounds) = (0, 0);
        for t in tasks {
            let (m, r) = t.await??;
            total += m;
            rounds += r;
        }
        let secs = started
            .elapsed()
            .max(Duration::from_millis(1))
            .as_secs_f64();
        println!(
            "{mode:>7}: {total} messages in {rounds} rounds over {secs:.2} s = {:.0} msg/s, {:.1} rounds/s",
            total as f64 / secs,
            rounds as f64 / secs
        );
        results.push((total as f64 / secs, rounds as f64 / secs));
    }
    // Plain runs first and last (its own group each time): the mean is the baseline.
    let base = (
        (results[0].0 + results[3].0) / 2.0,
        (results[0].1 + results[3].1) / 2.0,
    );
    for (mode, (msgs, rounds)) in ["map", "window"].iter().zip(&results[1..3]) {
        println!(
            "{mode}/plain: {:.2}x messages/s, {:.2}x rounds/s ({workers} workers, batch {batch})",
            msgs / base.0,
            rounds / base.1
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    match local.block_on(&runtime, run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("streams bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
