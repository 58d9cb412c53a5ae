//! The spool scenario (docs/history/benchmarks.md, "The spool"): the same broker process pushes with
//! PostgreSQL up (every item `queued`), then PostgreSQL is crashed under the running load
//! (`pg_ctl stop -m immediate`: connections break, new ones are refused) and the producers go
//! on (every item `buffered`); the two rates make the ratio. Then the producers stop,
//! PostgreSQL comes back, and the bench times the replay until the spool is empty. Finally
//! every segment is decoded: each item answered `queued` or `buffered` must be stored exactly
//! once, nothing else may be.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::http::HttpConn;
use crate::measure::{CpuTargets, Window};
use crate::measurement::{self, Counters, Detail, Measurement, SpoolDetail};
use crate::scenario::{trace, Params, Scenario};
use crate::traffic::{self, ProducerLog, Verdict};
use crate::BoxError;

/// How long the replay may take before the bench gives up waiting.
const DRAIN_LIMIT: Duration = Duration::from_secs(180);

/// `spool.records`, `spool.replayed` and `spool.bytes` from the broker's `/metrics`.
async fn spool_metrics(http: &mut HttpConn) -> Result<(u64, u64, u64), BoxError> {
    let r = http.request("GET", "/metrics", b"").await?;
    if r.status != 200 {
        return Err(format!("/metrics answered {}", r.status).into());
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    let get = |k: &str| v["spool"][k].as_u64().unwrap_or(0);
    Ok((get("records"), get("replayed"), get("bytes")))
}

/// Messages and latencies of the requests answered inside `w`, counting items with verdict
/// `want`; also the items in `w` that got another verdict.
fn window_figures(logs: &[ProducerLog], w: &Window, want: Verdict) -> (u64, f64, f64, u64, u64) {
    let mut msgs = 0;
    let mut other = 0;
    let mut ops = 0;
    let mut lat = Vec::new();
    for l in logs {
        for r in &l.requests {
            if w.contains(r.done) {
                ops += 1;
                let (hit, miss) = match want {
                    Verdict::Queued => (r.queued, r.buffered + r.other),
                    _ => (r.buffered, r.queued + r.other),
                };
                msgs += u64::from(hit);
                other += u64::from(miss);
                lat.push(r.done - r.sent);
            }
        }
    }
    let p50 = traffic::percentile_ms(&mut lat, 50.0);
    let p99 = traffic::percentile_ms(&mut lat, 99.0);
    (msgs, p50, p99, other, ops)
}

/// Runs the spool scenario once on the database at `url`.
///
/// # Errors
///
/// When setup fails, PostgreSQL does not come back, or the spool does not drain in time.
pub async fn run(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    url: &str,
    batch: usize,
) -> Result<Measurement, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
    conn.close().await?;
    let broker = BrokerProcess::start(&params.broker_bin, url, &params.broker_env).await?;
    let primed = crate::load::prime(broker.port, scenario.partitions, params.connections).await?;
    server.checkpoint().await?;
    let mut targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let tag = crate::data::fresh_seed();
    let stop = Arc::new(AtomicBool::new(false));
    let workers = traffic::producers(
        broker.port,
        params.connections,
        batch,
        scenario.partitions,
        tag,
        stop.clone(),
        None,
    );
    let tp = params.ticks_per_sec;

    // PostgreSQL up: every item queued.
    let queued_w = Window::after(params.warmup, params.duration);
    tokio::time::sleep_until(queued_w.start.into()).await;
    let q0 = Counters::read(server, &targets, false).await?;
    tokio::time::sleep_until(queued_w.end.into()).await;
    let q1 = Counters::read(server, &targets, false).await?;

    // PostgreSQL crashes under load; the producers go on.
    let t = Instant::now();
    server.stop_cluster().await?;
    let stop_secs = t.elapsed().as_secs_f64();
    trace(params, "PostgreSQL stopped (immediate)", t);
    let buffered_w = Window::after(params.warmup, params.duration);
    tokio::time::sleep_until(buffered_w.start.into()).await;
    let b0 = Counters::read(server, &targets, false).await?;
    tokio::time::sleep_until(buffered_w.end.into()).await;
    let b1 = Counters::read(server, &targets, false).await?;
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::with_capacity(workers.len());
    for w in workers {
        logs.push(w.await?);
    }

    // PostgreSQL back: time the replay until the spool is empty.
    let mut http = HttpConn::new(broker.port);
    let depth = spool_metrics(&mut http).await;
    let rss_before_replay =
        crate::measure::peak_rss_bytes(broker.pid()).map(|b| b as f64 / (1024.0 * 1024.0));
    let t = Instant::now();
    let started = server.start_cluster().await;
    let up = Instant::now();
    let restart_secs = (up - t).as_secs_f64();
    started?;
    let (records, replayed0, spool_bytes) = depth?;
    targets.postmaster = server.postmaster;
    let d0 = Counters::read(server, &targets, true).await?;
    let mut first: Option<(Instant, u64)> = None;
    let mut last_replayed = replayed0;
    let drained = loop {
        let (left, replayed, _) = spool_metrics(&mut http).await?;
        let now = Instant::now();
        if first.is_none() && replayed > replayed0 {
            first = Some((now, replayed));
        }
        last_replayed = last_replayed.max(replayed);
        if left == 0 {
            break Some(now);
        }
        if now - up > DRAIN_LIMIT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let d1 = Counters::read(server, &targets, true).await?;
    let peak = crate::measure::peak_rss_bytes(broker.pid());
    let errors_logged: Vec<String> = broker
        .log()
        .lines()
        .filter(|l| l.contains("ERROR"))
        .take(3)
        .map(str::to_string)
        .collect();
    broker.stop();

    // Every item against its verdict.
    let mut conn = PgConnection::connect(url).await?;
    let stored = db::stored_messages(&mut conn).await? as u64;
    let mut counts = traffic::Counts::new(&logs);
    let other = db::stored_transactions(&mut conn, tag, &mut counts).await?;
    conn.close().await?;
    let check = traffic::check(&logs, &counts, false);

    let (queued_msgs, queued_p50, queued_p99, queued_odd, _) =
        window_figures(&logs, &queued_w, Verdict::Queued);
    let (buffered_msgs, buffered_p50, buffered_p99, buffered_odd, buffered_ops) =
        window_figures(&logs, &buffered_w, Verdict::Buffered);
    let sum = |f: fn(&traffic::Request) -> u32| -> u64 {
        logs.iter()
            .flat_map(|l| &l.requests)
            .map(|r| u64::from(f(r)))
            .sum()
    };
    let (queued_total, buffered_total) = (sum(|r| r.queued), sum(|r| r.buffered));
    let queued_rate = queued_msgs as f64 / queued_w.secs();
    let buffered_rate = buffered_msgs as f64 / buffered_w.secs();
    let (drain_secs, drain_rate, replay_rate, replay_start) = match (drained, first) {
        (Some(end), Some((t1, r1))) => {
            let whole = (end - up).as_secs_f64();
            let after = (end - t1).as_secs_f64();
            (
                whole,
                records as f64 / whole,
                if after > 0.0 {
                    (last_replayed - r1) as f64 / after
                } else {
                    f64::NAN
                },
                (t1 - up).as_secs_f64(),
            )
        }
        (Some(end), None) => {
            let whole = (end - up).as_secs_f64();
            (whole, records as f64 / whole, f64::NAN, f64::NAN)
        }
        _ => (f64::NAN, f64::NAN, f64::NAN, f64::NAN),
    };
    let drain_wal = d0.wal_until(&d1, server).await? / records.max(1) as f64;

    let mut m = measurement::blank(scenario, round);
    m.msgs_per_sec = buffered_rate;
    m.ops_per_sec = buffered_ops as f64 / buffered_w.secs();
    m.p50_ms = buffered_p50;
    m.p99_ms = buffered_p99;
    m.peak_rss_mib = peak.map(|b| b as f64 / (1024.0 * 1024.0));
    m.cpu = b0.cpu_until(&b1, tp);
    m.errors = logs.iter().map(|l| l.errors).sum();
    m.not_queued = queued_odd + buffered_odd;
    if let Some(e) = logs.iter().find_map(|l| l.first_error.clone()) {
        m.problems.push(format!("{} errors, first: {e}", m.errors));
    }
    if queued_odd > 0 {
        m.problems.push(format!(
            "{queued_odd} items not queued while PostgreSQL was up"
        ));
    }
    if buffered_odd > 0 {
        m.problems.push(format!(
            "{buffered_odd} items not buffered while PostgreSQL was down"
        ));
    }
    if drained.is_none() {
        m.problems.push(format!(
            "the spool did not drain within {} s",
            DRAIN_LIMIT.as_secs()
        ));
    }
    if records != buffered_total {
        m.problems.push(format!(
            "spool held {records} records, producers were answered buffered {buffered_total} times"
        ));
    }
    m.verified = check.ok() && other == primed;
    if !m.verified {
        m.problems.push(format!(
            "stored {stored}: {} of {} acknowledged items exactly once, {} lost, {} duplicates, {} unexpected; {other} others (primed {primed})",
            check.exactly_once, check.acknowledged, check.lost, check.duplicates, check.unexpected
        ));
    }
    m.problems.extend(errors_logged);
    m.detail = Some(Detail::Spool(SpoolDetail {
        queued_msgs_per_sec: queued_rate,
        queued_p50_ms: queued_p50,
        queued_p99_ms: queued_p99,
        queued_cpu: q0.cpu_until(&q1, tp),
        buffered_msgs_per_sec: buffered_rate,
        ratio: buffered_rate / queued_rate,
        stop_secs,
        queued_total,
        buffered_total,
        spool_records: records,
        spool_bytes,
        peak_rss_before_replay_mib: rss_before_replay,
        restart_secs,
        replay_start_secs: replay_start,
        drain_secs,
        drain_msgs_per_sec: drain_rate,
        replay_msgs_per_sec: replay_rate,
        drain_cpu: d0.cpu_until(&d1, tp),
        drain_wal_bytes_per_msg: drain_wal,
        stored,
        check,
    }));
    Ok(m)
}
