//! Several brokers on one database (docs/history/benchmarks.md, "Several brokers"): N broker processes
//! (each the release binary, its own process, port and spool) against the same fresh database,
//! the load spread over them: producer connection `c` talks to broker `c mod N`, consumer `k`
//! to broker `k mod N`.
//!
//! - push: the producers push batch 100 for the window (as the push suite's broker scenario);
//!   afterwards the database must hold exactly what was answered `queued`.
//! - end-to-end: producers and long-polling consumers (pop 100 + ack batch) together for the
//!   window, then the producers stop and the consumers drain. Every message answered `queued`
//!   must be consumed exactly once (0 lost, 0 twice), the committed offsets must add up to
//!   what was consumed, and within a partition each producer's messages must be consumed in
//!   the order that producer sent them.
//!
//! Beside msg/s it records what each commit carried (the brokers' own commit histograms, read
//! from `/metrics/prometheus` at both ends of the window), messages per segment row, and CPU by
//! party, the brokers summed, PostgreSQL's processes summed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::http::HttpConn;
use crate::measure::{process_ticks, CpuTargets, Window};
use crate::measurement::{self, BrokersDetail, Counters, Detail, Measurement};
use crate::scenario::{trace, Params, Scenario};
use crate::traffic::{self, ConsumerLog, ProducerLog};
use crate::BoxError;

/// Items per push request.
pub const PUSH_BATCH: usize = 100;

/// How long the end-to-end consumers may take to drain what was pushed.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// The commit counters of one broker's `/metrics/prometheus`: (commits, items, partitions).
async fn commit_counters(port: u16) -> (f64, f64, f64) {
    let mut conn = HttpConn::new(port);
    let Ok(r) = conn.request("GET", "/metrics/prometheus", b"").await else {
        return (f64::NAN, f64::NAN, f64::NAN);
    };
    let text = String::from_utf8_lossy(&r.body);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    (
        value("queen_commit_batch_items_count"),
        value("queen_commit_batch_items_sum"),
        value("queen_commit_batch_partitions_sum"),
    )
}

async fn all_commit_counters(ports: &[u16]) -> (f64, f64, f64) {
    let mut total = (0.0, 0.0, 0.0);
    for &p in ports {
        let (c, i, s) = commit_counters(p).await;
        total = (total.0 + c, total.1 + i, total.2 + s);
    }
    total
}

fn broker_ticks(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| process_ticks(*p)).sum()
}

/// Consumed messages whose producer had sent a later message of the same partition that was
/// consumed before them. The consumers' pops of one partition never overlap (one lease at a
/// time, the next pop only after the ack), so the order in which pops were answered, and the
/// order inside each pop, is the consumption order.
pub fn order_violations(producers: &[ProducerLog], consumers: &[ConsumerLog], batch: usize) -> u64 {
    let mut seen: Vec<(Instant, usize, usize, u32, u16, u64)> = Vec::new();
    for (k, log) in consumers.iter().enumerate() {
        for (at, &(c, seq, popped)) in log.consumed.iter().enumerate() {
            let Some(r) = producers
                .get(usize::from(c))
                .and_then(|p| p.requests.get((seq / batch as u64) as usize))
            else {
                continue;
            };
            seen.push((popped, k, at, r.partition, c, seq));
        }
    }
    seen.sort_unstable_by_key(|x| (x.0, x.1, x.2));
    let mut last: std::collections::HashMap<(u32, u16), u64> = std::collections::HashMap::new();
    let mut violations = 0;
    for (_, _, _, partition, c, seq) in seen {
        match last.insert((partition, c), seq) {
            Some(prev) if prev > seq => violations += 1,
            _ => {}
        }
    }
    violations
}

/// Measures `brokers` brokers on the (fresh) database at `url`; see the module docs.
///
/// # Errors
///
/// When setup fails (a failing request inside the window is counted, not fatal).
pub async fn run(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    url: &str,
    brokers: usize,
    end_to_end: bool,
) -> Result<Measurement, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
    let t = Instant::now();
    let mut procs = Vec::with_capacity(brokers);
    for _ in 0..brokers {
        procs.push(BrokerProcess::start(&params.broker_bin, url, &params.broker_env).await?);
    }
    trace(params, "brokers start", t);
    let ports: Vec<u16> = procs.iter().map(|b| b.port).collect();
    let pids: Vec<u32> = procs.iter().map(BrokerProcess::pid).collect();
    // Every broker has its partition actors before the window, as in brokers that have run.
    let t = Instant::now();
    let mut primed = 0;
    for &port in &ports {
        primed += crate::load::prime(port, scenario.partitions, params.connections).await?;
    }
    trace(params, "prime", t);
    let t = Instant::now();
    server.checkpoint().await?;
    trace(params, "checkpoint", t);

    let targets = CpuTargets {
        broker: None,
        postmaster: server.postmaster,
    };
    let tag = crate::data::fresh_seed();
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let window = Window::after(params.warmup, params.duration);
    let consumers = if end_to_end {
        traffic::consumers_spread(
            &ports,
            params.consumers,
            crate::scenario::POP_BATCH,
            true,
            tag,
            stop_consumers.clone(),
            counter.clone(),
        )
    } else {
        Vec::new()
    };
    let producers = traffic::producers_spread(
        &ports,
        params.connections,
        PUSH_BATCH,
        scenario.partitions,
        tag,
        stop_producers.clone(),
    );
    tokio::time::sleep_until(window.start.into()).await;
    let commits0 = all_commit_counters(&ports).await;
    let b0 = broker_ticks(&pids);
    let c0 = Counters::read(server, &targets, true).await?;
    tokio::time::sleep_until(window.end.into()).await;
    let c1 = Counters::read(server, &targets, true).await?;
    let b1 = broker_ticks(&pids);
    let commits1 = all_commit_counters(&ports).await;
    stop_producers.store(true, Ordering::Relaxed);
    let mut plogs = Vec::with_capacity(producers.len());
    for w in producers {
        plogs.push(w.await?);
    }
    let queued_total: u64 = plogs
        .iter()
        .flat_map(|l| &l.requests)
        .map(|r| u64::from(r.queued))
        .sum();
    let mut drain_secs = f64::NAN;
    let mut clogs = Vec::new();
    if end_to_end {
        let expected = queued_total + primed;
        let t = Instant::now();
        while counter.load(Ordering::Relaxed) < expected && t.elapsed() < DRAIN_LIMIT {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drain_secs = t.elapsed().as_secs_f64();
        stop_consumers.store(true, Ordering::Relaxed);
        for w in consumers {
            clogs.push(w.await?);
        }
    }
    let rss: Vec<f64> = pids
        .iter()
        .filter_map(|p| crate::measure::peak_rss_bytes(*p))
        .map(|b| b as f64 / (1024.0 * 1024.0))
        .collect();
    let mut problems: Vec<String> = Vec::new();
    for b in &procs {
        problems.extend(b.log_problems(2));
    }
    for b in procs {
        b.stop();
    }

    let secs = window.secs();
    let mut m = measurement::blank(scenario, round);
    let mut per_broker = vec![0u64; brokers];
    let mut push_lat = Vec::new();
    for (c, l) in plogs.iter().enumerate() {
        for r in l.requests.iter().filter(|r| window.contains(r.done)) {
            per_broker[c % brokers] += u64::from(r.queued);
            push_lat.push(r.done - r.sent);
        }
    }
    let pushed: u64 = per_broker.iter().sum();
    let cpu_secs = (c1.at - c0.at).as_secs_f64();
    m.cpu = c0.cpu_until(&c1, params.ticks_per_sec);
    m.cpu.broker = (b1.saturating_sub(b0)) as f64 / params.ticks_per_sec / cpu_secs;
    m.cpu.other = (m.cpu.other - m.cpu.broker).max(0.0);
    m.errors =
        plogs.iter().map(|l| l.errors).sum::<u64>() + clogs.iter().map(|l| l.errors).sum::<u64>();
    if let Some(e) = plogs
        .iter()
        .filter_map(|l| l.first_error.as_ref())
        .chain(clogs.iter().filter_map(|l| l.first_error.as_ref()))
        .next()
    {
        problems.insert(0, format!("{} errors, first: {e}", m.errors));
    }
    m.not_queued = plogs
        .iter()
        .flat_map(|l| &l.requests)
        .map(|r| u64::from(r.buffered + r.other))
        .sum();
    m.peak_rss_mib = rss.iter().copied().reduce(f64::max);
    let (msgs, segs) = db::segments_between(
        &mut conn,
        c0.mark.as_ref().expect("read with wal"),
        c1.mark.as_ref().expect("read with wal"),
    )
    .await?;
    m.msgs_per_segment = (segs > 0).then(|| msgs as f64 / segs as f64);
    let wal = c0.wal_until(&c1, server).await?;

    let mut pops = (f64::NAN, f64::NAN);
    let (check, order, consumed_rate) = if end_to_end {
        let mut counts = traffic::Counts::new(&plogs);
        for l in &clogs {
            for &(c, seq, _) in &l.consumed {
                counts.add(usize::from(c), seq);
            }
        }
        let check = traffic::check(&plogs, &counts, true);
        let other: u64 = clogs.iter().map(|l| l.other).sum();
        let consumed_total = clogs.iter().map(|l| l.consumed.len() as u64).sum::<u64>() + other;
        let (committed, live) = db::consumed_offsets(&mut conn).await?;
        let order = order_violations(&plogs, &clogs, PUSH_BATCH);
        let ack_failures: u64 = clogs.iter().map(|l| l.ack_failures).sum();
        m.verified = check.ok()
            && order == 0
            && committed as u64 == consumed_total
            && live == 0
            && other == primed
            && ack_failures == 0;
        if !m.verified {
            problems.push(format!(
                "consumed {consumed_total} ({other} primed of {primed}): {} lost, {} twice, {} unexpected, {order} out of order, {ack_failures} acks failed; committed offsets add up to {committed}; {live} leases live",
                check.lost, check.duplicates, check.unexpected
            ));
        }
        let cycles: Vec<&traffic::Cycle> = clogs
            .iter()
            .flat_map(|l| &l.cycles)
            .filter(|c| window.contains(c.acked))
            .collect();
        let consumed_in_window: u64 = cycles.iter().map(|c| u64::from(c.msgs)).sum();
        pops = (
            consumed_in_window as f64 / cycles.len().max(1) as f64,
            clogs
                .iter()
                .flat_map(|l| &l.empty)
                .filter(|t| window.contains(**t))
                .count() as f64
                / secs,
        );
        (check, order, Some(consumed_in_window as f64 / secs))
    } else {
        // Every item answered `queued` is stored once: the stored transaction ids of this run
        // against the producers' logs.
        let mut counts = traffic::Counts::new(&plogs);
        let other = db::stored_transactions(&mut conn, tag, &mut counts).await?;
        let check = traffic::check(&plogs, &counts, true);
        let stored = db::stored_messages(&mut conn).await? as u64;
        m.verified = check.ok() && other == primed && stored == queued_total + primed;
        if !m.verified {
            problems.push(format!(
                "database holds {stored} messages, pushes reported {queued_total} queued (+{primed} priming): {} lost, {} twice, {} unexpected",
                check.lost, check.duplicates, check.unexpected
            ));
        }
        (check, 0, None)
    };
    conn.close().await?;

    m.msgs_per_sec = consumed_rate.unwrap_or(pushed as f64 / secs);
    m.ops_per_sec = push_lat.len() as f64 / secs;
    m.p50_ms = traffic::percentile_ms(&mut push_lat, 50.0);
    m.p99_ms = traffic::percentile_ms(&mut push_lat, 99.0);
    m.wal_bytes_per_msg = wal / (pushed as f64 / secs * cpu_secs);
    m.problems = problems;
    let commits = commits1.0 - commits0.0;
    m.detail = Some(Detail::Brokers(BrokersDetail {
        brokers,
        end_to_end,
        pushed_per_broker: per_broker.iter().map(|n| *n as f64 / secs).collect(),
        pushed_msgs_per_sec: pushed as f64 / secs,
        consumed_msgs_per_sec: consumed_rate,
        commits_per_sec: commits / cpu_secs,
        items_per_commit: (commits1.1 - commits0.1) / commits,
        segments_per_commit: (commits1.2 - commits0.2) / commits,
        pg_cpu_per_100k_msgs: m.cpu.postgres / (pushed as f64 / secs) * 100_000.0,
        max_broker_rss_mib: m.peak_rss_mib,
        check,
        order_violations: order,
        drain_secs,
        msgs_per_pop: pops.0,
        empty_pops_per_sec: pops.1,
    }));
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::{Request, Verdict};

    fn request(partition: u32) -> Request {
        let now = Instant::now();
        Request {
            sent: now,
            done: now,
            queued: 2,
            buffered: 0,
            other: 0,
            partition,
        }
    }

    #[test]
    fn consumption_against_the_send_order_is_counted_per_partition_and_producer() {
        // Producer 0 sent items 0,1 to partition 5 and items 2,3 to partition 6 (batch 2).
        let producers = vec![ProducerLog {
            requests: vec![request(5), request(6)],
            verdicts: vec![Verdict::Queued; 4],
            ..ProducerLog::default()
        }];
        let t = Instant::now();
        let later = t + Duration::from_millis(1);
        let in_order = ConsumerLog {
            consumed: vec![(0, 2, t), (0, 0, t), (0, 1, later), (0, 3, later)],
            ..ConsumerLog::default()
        };
        assert_eq!(order_violations(&producers, &[in_order], 2), 0);
        // Item 1 popped (by another consumer) before item 0 of the same partition.
        let a = ConsumerLog {
            consumed: vec![(0, 0, later)],
            ..ConsumerLog::default()
        };
        let b = ConsumerLog {
            consumed: vec![(0, 1, t), (0, 2, t), (0, 3, t)],
            ..ConsumerLog::default()
        };
        assert_eq!(order_violations(&producers, &[a, b], 2), 1);
    }
}
