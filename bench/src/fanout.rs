//! The fan-out suite (`--suites fanout`): one queue, producers pushing at a fixed rate, and 1, 5
//! or 10 consumer groups each reading everything (`consumerGroup=gK&subscriptionMode=all`,
//! long-poll pops of 100 + `/ack/batch`, the same number of consumers per group). Every round
//! first measures push-only (producers as fast as answered, no consumer); the fan-out runs of
//! that round offer a share of it (`--fanout-pace`, percent). Reported per run: the producers'
//! rate held, deliveries/s of all groups and of the median group, each group's lag at the end
//! of the window (messages pushed and not yet acked by it), the broker's and PostgreSQL's CPU
//! per delivered message, and the broker's segment cache reads (`queen_segment_cache_reads_total`,
//! hit or miss: a miss is a segment whose frames came from PostgreSQL), which tell whether a
//! segment read once serves every group.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use sqlx::{Connection, PgConnection};

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::http::HttpConn;
use crate::measure::{CpuTargets, CpuUse, Window};
use crate::scenario::{trace, Params, POP_BATCH};
use crate::traffic::{self, ProducerLog};
use crate::wire::{self, PopOptions, Spread, PARTITIONS, PUSH_BATCH};
use crate::{data, load, BoxError};

/// One fan-out (or push-only) run.
#[derive(Clone, Debug, Serialize)]
pub struct FanoutMeasurement {
    /// Round (from 0).
    pub round: usize,
    /// Consumer groups (0: push only, producers unpaced).
    pub groups: usize,
    /// Consumers per group.
    pub consumers_per_group: usize,
    /// The consumers popped with `autopilot=true`.
    pub autopilot: bool,
    /// msg/s the producers offered (None: as fast as answered).
    pub offered_msgs_per_sec: Option<f64>,
    /// msg/s the producers got queued in the window.
    pub produced_msgs_per_sec: f64,
    /// Deliveries (popped and acked) per second, all groups.
    pub delivered_msgs_per_sec: f64,
    /// Deliveries (all groups) in the window.
    pub delivered: u64,
    /// Deliveries per second of each group.
    pub group_msgs_per_sec: Vec<f64>,
    /// Each group's lag at the end of the window: messages queued by then (priming included)
    /// not yet acked by the group.
    pub group_lag_at_end: Vec<i64>,
    /// Cores used in the window.
    pub cpu: CpuUse,
    /// Broker CPU per delivery (push only: per message pushed), µs.
    pub broker_us_per_msg: f64,
    /// PostgreSQL CPU per delivery (push only: per message pushed), µs.
    pub postgres_us_per_msg: f64,
    /// Segments pops took from the broker's cache in the window.
    pub cache_hits: u64,
    /// Segments pops read from PostgreSQL in the window.
    pub cache_misses: u64,
    /// The broker's segment cache budget at the end of the window, bytes
    /// (`queen_segment_cache_budget_bytes`; 0 from a broker without that gauge).
    pub cache_budget_at_end: u64,
    /// The broker's peak resident set (VmHWM) at the end of the run, MiB: one broker serves one
    /// run, so this is the run's peak (priming included).
    pub peak_rss_mib: Option<f64>,
    /// Failed requests (producers and consumers).
    pub errors: u64,
    /// What went wrong.
    pub problems: Vec<String>,
}

/// The broker's segment cache so far: (hits, misses, budget bytes), from
/// `/metrics/prometheus`.
async fn cache_reads(port: u16) -> (u64, u64, u64) {
    let mut conn = HttpConn::new(port);
    let Ok(r) = conn.request("GET", "/metrics/prometheus", b"").await else {
        return (0, 0, 0);
    };
    reads_in(&String::from_utf8_lossy(&r.body))
}

/// (hits, misses) of `queen_segment_cache_reads_total` and `queen_segment_cache_budget_bytes`
/// in a Prometheus text exposition (0 for what it lacks).
fn reads_in(text: &str) -> (u64, u64, u64) {
    let read = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .filter(|v| v.starts_with(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    (
        read("queen_segment_cache_reads_total{result=\"hit\"}"),
        read("queen_segment_cache_reads_total{result=\"miss\"}"),
        read("queen_segment_cache_budget_bytes"),
    )
}

/// Messages queued by requests answered before `at`.
fn queued_before(logs: &[ProducerLog], at: Instant) -> u64 {
    logs.iter()
        .flat_map(|l| &l.requests)
        .filter(|r| r.done < at)
        .map(|r| u64::from(r.queued))
        .sum()
}

/// How each group's consumers pop.
#[derive(Clone, Copy, Debug)]
pub struct GroupPops {
    /// Consumers per group.
    pub consumers: usize,
    /// `autopilot=true` (the 2.6 client's default) instead of fixed pops of 100 from one
    /// partition.
    pub autopilot: bool,
}

/// Measures `groups` groups (0: push only) once, on a fresh database with its own broker; the
/// producers offer `pace` msg/s (None: as fast as answered).
///
/// # Errors
///
/// When setup fails.
pub async fn measure(
    server: &mut Server,
    params: &Params,
    round: usize,
    groups: usize,
    pops: GroupPops,
    pace: Option<f64>,
) -> Result<FanoutMeasurement, BoxError> {
    let name = server.create_database().await?;
    let url = server.url(&name);
    let result = measure_in(server, params, &url, round, groups, pops, pace).await;
    server.drop_database(&name).await?;
    result
}

async fn measure_in(
    server: &mut Server,
    params: &Params,
    url: &str,
    round: usize,
    groups: usize,
    pops: GroupPops,
    pace: Option<f64>,
) -> Result<FanoutMeasurement, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    db::setup_queue(&mut conn, PARTITIONS, true).await?;
    conn.close().await?;
    let t = Instant::now();
    let broker = BrokerProcess::start(&params.broker_bin, url, &params.broker_env).await?;
    trace(params, "broker start", t);
    let primed = load::prime(broker.port, PARTITIONS, params.connections).await?;
    server.checkpoint().await?;
    let targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let window = Window::after(params.warmup, params.duration);
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> = (0..groups).map(|_| Arc::default()).collect();
    let mut consumers = Vec::new();
    for (g, delivered) in counters.iter().enumerate() {
        let opts = PopOptions {
            framed: false,
            group: Some(format!("g{g}")),
            wait: true,
            batch: POP_BATCH,
            autopilot: pops.autopilot,
        };
        consumers.extend(wire::consumers(
            broker.port,
            pops.consumers,
            &opts,
            window,
            stop.clone(),
            delivered.clone(),
        ));
    }
    let tag = data::fresh_seed();
    let producers = traffic::producers(
        broker.port,
        params.connections,
        PUSH_BATCH,
        PARTITIONS,
        tag,
        stop.clone(),
        pace,
    );
    tokio::time::sleep_until(window.start.into()).await;
    let (c0, t0) = (targets.snapshot(), Instant::now());
    let d0: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let r0 = cache_reads(broker.port).await;
    tokio::time::sleep_until(window.end.into()).await;
    let c1 = targets.snapshot();
    let secs = t0.elapsed().as_secs_f64();
    let d1: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let r1 = cache_reads(broker.port).await;
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::new();
    for p in producers {
        logs.push(p.await?);
    }
    let mut errors: u64 = logs.iter().map(|l| l.errors).sum();
    let mut problems: Vec<String> = logs
        .iter()
        .filter_map(|l| l.first_error.clone())
        .take(1)
        .map(|e| format!("producer errors, first: {e}"))
        .collect();
    for c in consumers {
        let s = c.await?;
        errors += s.window.errors;
        if let (Some(e), true) = (s.window.first_error, problems.len() < 3) {
            problems.push(format!("consumer error: {e}"));
        }
        if s.ack_failures > 0 {
            problems.push(format!("{} acks not successful", s.ack_failures));
        }
    }
    problems.extend(broker.log_problems(3));
    let peak_rss_mib =
        crate::measure::peak_rss_bytes(broker.pid()).map(|b| b as f64 / f64::from(1 << 20));
    broker.stop();

    let cpu = CpuUse::between(&c0, &c1, secs, params.ticks_per_sec);
    let produced = queued_before(&logs, window.end) - queued_before(&logs, window.start);
    let produced_total = queued_before(&logs, window.end) + primed;
    let group_msgs_per_sec: Vec<f64> = d0
        .iter()
        .zip(&d1)
        .map(|(a, b)| (b - a) as f64 / secs)
        .collect();
    let delivered_msgs_per_sec: f64 = group_msgs_per_sec.iter().sum();
    let per = if groups == 0 {
        produced as f64 / window.secs()
    } else {
        delivered_msgs_per_sec
    };
    Ok(FanoutMeasurement {
        round,
        groups,
        consumers_per_group: pops.consumers,
        autopilot: pops.autopilot,
        offered_msgs_per_sec: pace,
        produced_msgs_per_sec: produced as f64 / window.secs(),
        delivered_msgs_per_sec,
        delivered: d0.iter().zip(&d1).map(|(a, b)| b - a).sum(),
        group_msgs_per_sec,
        group_lag_at_end: d1
            .iter()
            .map(|d| produced_total as i64 - *d as i64)
            .collect(),
        cpu,
        broker_us_per_msg: cpu.broker * 1e6 / per,
        postgres_us_per_msg: cpu.postgres * 1e6 / per,
        cache_hits: r1.0.saturating_sub(r0.0),
        cache_misses: r1.1.saturating_sub(r0.1),
        cache_budget_at_end: r1.2,
        peak_rss_mib,
        errors,
        problems,
    })
}

/// One group count over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct FanoutRow {
    /// Consumer groups (0: push only).
    pub groups: usize,
    /// Rounds measured.
    pub rounds: usize,
    /// Producers' msg/s.
    pub produced_msgs_per_sec: Spread,
    /// Producers' msg/s against push-only of the same round.
    pub produced_vs_push_only: Spread,
    /// Deliveries/s, all groups.
    pub delivered_msgs_per_sec: Spread,
    /// Deliveries/s of the median group.
    pub median_group_msgs_per_sec: Spread,
    /// All groups' deliveries against the median group's (per round).
    pub fanout_factor: Spread,
    /// The largest group lag at the end of the window.
    pub max_lag_at_end: Spread,
    /// Broker CPU per delivery, µs.
    pub broker_us_per_msg: Spread,
    /// PostgreSQL CPU per delivery, µs.
    pub postgres_us_per_msg: Spread,
    /// Segments read from PostgreSQL per 1 000 deliveries.
    pub misses_per_1k: Spread,
    /// Share of segment reads served by the cache.
    pub hit_share: Spread,
    /// The broker's segment cache budget at the end of the window, MiB.
    pub cache_budget_mib: Spread,
    /// The broker's peak RSS over the run, MiB (NaN when it could not be read).
    pub peak_rss_mib: Spread,
}

/// The rows, per group count, with ratios against the same round's push-only run.
pub fn rows(all: &[FanoutMeasurement]) -> Vec<FanoutRow> {
    let mut counts: Vec<usize> = all.iter().map(|m| m.groups).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
        .into_iter()
        .map(|groups| {
            let mine: Vec<&FanoutMeasurement> = all.iter().filter(|m| m.groups == groups).collect();
            let of = |f: &dyn Fn(&FanoutMeasurement) -> f64| {
                Spread::of(&mine.iter().map(|m| f(m)).collect::<Vec<_>>())
            };
            let median_group =
                |m: &FanoutMeasurement| crate::measure::median(&m.group_msgs_per_sec);
            FanoutRow {
                groups,
                rounds: mine.len(),
                produced_msgs_per_sec: of(&|m| m.produced_msgs_per_sec),
                produced_vs_push_only: of(&|m| {
                    all.iter()
                        .find(|p| p.groups == 0 && p.round == m.round)
                        .map_or(f64::NAN, |p| {
                            m.produced_msgs_per_sec / p.produced_msgs_per_sec
                        })
                }),
                delivered_msgs_per_sec: of(&|m| m.delivered_msgs_per_sec),
                median_group_msgs_per_sec: of(&median_group),
                fanout_factor: of(&|m| m.delivered_msgs_per_sec / median_group(m)),
                max_lag_at_end: of(&|m| {
                    m.group_lag_at_end
                        .iter()
                        .copied()
                        .max()
                        .map_or(f64::NAN, |l| l as f64)
                }),
                broker_us_per_msg: of(&|m| m.broker_us_per_msg),
                postgres_us_per_msg: of(&|m| m.postgres_us_per_msg),
                misses_per_1k: of(&|m| {
                    if m.delivered > 0 {
                        m.cache_misses as f64 * 1000.0 / m.delivered as f64
                    } else {
                        f64::NAN
                    }
                }),
                hit_share: of(&|m| {
                    let n = m.cache_hits + m.cache_misses;
                    if n > 0 {
                        m.cache_hits as f64 / n as f64
                    } else {
                        f64::NAN
                    }
                }),
                cache_budget_mib: of(&|m| m.cache_budget_at_end as f64 / f64::from(1 << 20)),
                peak_rss_mib: of(&|m| m.peak_rss_mib.unwrap_or(f64::NAN)),
            }
        })
        .collect()
}

/// The suite's table, medians with (min–max) over the rounds.
pub fn table(rows: &[FanoutRow]) -> String {
    let mut s = format!(
        "{:<12} {:>22} {:>18} {:>22} {:>22} {:>16} {:>20} {:>18} {:>18} {:>16} {:>16} {:>16} {:>16}\n",
        "groups",
        "produced msg/s",
        "× push-only",
        "deliveries/s",
        "median group/s",
        "total/group",
        "max lag at end",
        "broker µs/deliv",
        "PG µs/deliv",
        "misses/1k deliv",
        "cache hit share",
        "cache MiB at end",
        "peak RSS MiB"
    );
    for r in rows {
        let (name, delivered) = if r.groups == 0 {
            ("push only".to_string(), "—".to_string())
        } else {
            (
                format!("{} group(s)", r.groups),
                r.delivered_msgs_per_sec.text(0),
            )
        };
        s.push_str(&format!(
            "{:<12} {:>22} {:>18} {:>22} {:>22} {:>16} {:>20} {:>18} {:>18} {:>16} {:>16} {:>16} {:>16}\n",
            name,
            r.produced_msgs_per_sec.text(0),
            r.produced_vs_push_only.text(2),
            delivered,
            r.median_group_msgs_per_sec.text(0),
            r.fanout_factor.text(1),
            r.max_lag_at_end.text(0),
            r.broker_us_per_msg.text(1),
            r.postgres_us_per_msg.text(1),
            r.misses_per_1k.text(2),
            r.hit_share.text(3),
            r.cache_budget_mib.text(0),
            r.peak_rss_mib.text(1)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(round: usize, groups: usize, produced: f64, per_group: &[f64]) -> FanoutMeasurement {
        FanoutMeasurement {
            round,
            groups,
            consumers_per_group: 4,
            autopilot: false,
            offered_msgs_per_sec: None,
            produced_msgs_per_sec: produced,
            delivered_msgs_per_sec: per_group.iter().sum(),
            delivered: 1000,
            group_msgs_per_sec: per_group.to_vec(),
            group_lag_at_end: per_group.iter().map(|r| *r as i64).collect(),
            cpu: CpuUse::default(),
            broker_us_per_msg: 1.0,
            postgres_us_per_msg: 1.0,
            cache_hits: 30,
            cache_misses: 10,
            cache_budget_at_end: 8 << 20,
            peak_rss_mib: Some(40.0 + groups as f64),
            errors: 0,
            problems: Vec::new(),
        }
    }

    #[test]
    fn rows_compare_each_round_with_its_push_only_run() {
        let all = vec![
            run(0, 0, 100.0, &[]),
            run(0, 2, 50.0, &[10.0, 30.0]),
            run(1, 0, 200.0, &[]),
            run(1, 2, 60.0, &[20.0, 20.0]),
        ];
        let r = rows(&all);
        assert_eq!(r.iter().map(|r| r.groups).collect::<Vec<_>>(), vec![0, 2]);
        let two = &r[1];
        assert!((two.produced_vs_push_only.median - 0.4).abs() < 1e-9); // 0.5 and 0.3
        assert_eq!(two.delivered_msgs_per_sec.median, 40.0);
        assert_eq!(two.fanout_factor.median, 2.0);
        assert_eq!(two.max_lag_at_end.median, 25.0); // 30 and 20
        assert_eq!(two.misses_per_1k.median, 10.0);
        assert_eq!(two.hit_share.median, 0.75);
        assert_eq!(two.cache_budget_mib.median, 8.0);
        assert_eq!(two.peak_rss_mib.median, 42.0);
        assert!(table(&r).contains("push only"));
    }

    #[test]
    fn cache_reads_are_read_from_the_metrics_text() {
        let text = "# HELP x\nqueen_segment_cache_reads_total{result=\"hit\"} 30\nqueen_segment_cache_reads_total{result=\"miss\"} 4\nqueen_segment_cache_budget_bytes 8388608\n";
        assert_eq!(reads_in(text), (30, 4, 8 << 20));
        assert_eq!(reads_in(""), (0, 0, 0));
    }
}
