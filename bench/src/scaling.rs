//! The report of the two scaling suites (docs/history/benchmarks.md, "Partitions at scale" and
//! "Several brokers"): per partition count, push msg/s against the 100-partition rate of the
//! same round and the broker's peak RSS; per broker count, push and end-to-end msg/s against one
//! broker in the same round, what each commit carried and PostgreSQL's CPU. Every ratio is the
//! median of per-round ratios (the machine is shared; absolute figures drift).

use serde::Serialize;

use crate::measure::median;
use crate::measurement::{BrokersDetail, Detail, Measurement};
use crate::report::{kilo, num, opt, Results};
use crate::scenario::{Kind, Scenario};

/// One partition count of the scale suite.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRow {
    /// The scenario (broker, batch 100, P partitions).
    pub scenario: Scenario,
    /// Median msg/s.
    pub msgs_per_sec: f64,
    /// Lowest and highest round.
    pub min_max: (f64, f64),
    /// Median over rounds of msg/s ÷ the 100-partition msg/s of the same round.
    pub vs_100: Option<f64>,
    /// The same per CPU-second (broker + PostgreSQL + load generator).
    pub vs_100_per_cpu: Option<f64>,
    /// Median p99 request latency, ms.
    pub p99_ms: f64,
    /// Highest peak RSS of the broker over the rounds, MiB (priming included: every partition
    /// written once).
    pub peak_rss_mib: Option<f64>,
    /// Median messages per segment row.
    pub msgs_per_segment: Option<f64>,
    /// Rounds, and rounds whose stored count matched what was acknowledged.
    pub rounds: (usize, usize),
}

/// The scale suite's rows: broker scenarios of `batch` at each of `partitions`.
pub fn scale_rows(r: &Results, partitions: &[u64], batch: usize, dedup: bool) -> Vec<ScaleRow> {
    let at = |p: u64| Scenario {
        kind: Kind::Broker { batch },
        partitions: p,
        dedup,
    };
    partitions
        .iter()
        .filter_map(|&p| {
            let ms: Vec<&Measurement> = r.all.iter().filter(|m| m.scenario == at(p)).collect();
            if ms.is_empty() {
                return None;
            }
            let rates: Vec<f64> = ms.iter().map(|m| m.msgs_per_sec).collect();
            let segs = median(
                &ms.iter()
                    .filter_map(|m| m.msgs_per_segment)
                    .collect::<Vec<_>>(),
            );
            Some(ScaleRow {
                scenario: at(p),
                msgs_per_sec: median(&rates),
                min_max: (
                    rates.iter().copied().fold(f64::INFINITY, f64::min),
                    rates.iter().copied().fold(0.0, f64::max),
                ),
                vs_100: r.ratio(at(p), at(100)),
                vs_100_per_cpu: r.cpu_ratio(at(p), at(100)),
                p99_ms: median(&ms.iter().map(|m| m.p99_ms).collect::<Vec<_>>()),
                peak_rss_mib: ms.iter().filter_map(|m| m.peak_rss_mib).reduce(f64::max),
                msgs_per_segment: segs.is_finite().then_some(segs),
                rounds: (ms.len(), ms.iter().filter(|m| m.verified).count()),
            })
        })
        .collect()
}

/// The scale suite as a Markdown table.
pub fn scale_table(rows: &[ScaleRow]) -> String {
    let mut out = String::from(
        "| partitions | msg/s (median) | min–max | **÷ 100 partitions** (per CPU-s) | p99 ms | msg/segment | broker peak RSS MB | verified |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {}–{} | {} ({}) | {} | {} | {} | {}/{} |\n",
            r.scenario.partitions,
            kilo(r.msgs_per_sec),
            kilo(r.min_max.0),
            kilo(r.min_max.1),
            opt(r.vs_100, 2),
            opt(r.vs_100_per_cpu, 2),
            num(r.p99_ms, 1),
            opt(r.msgs_per_segment, 1),
            opt(r.peak_rss_mib.map(|m| m * 1.048_576), 1),
            r.rounds.1,
            r.rounds.0
        ));
    }
    out
}

/// One broker count of the several-brokers suite.
#[derive(Clone, Debug, Serialize)]
pub struct BrokersRow {
    /// The scenario.
    pub scenario: Scenario,
    /// Median msg/s (pushed for push; consumed for end-to-end).
    pub msgs_per_sec: f64,
    /// Lowest and highest round.
    pub min_max: (f64, f64),
    /// Median over rounds of msg/s ÷ one broker's in the same round.
    pub vs_one: Option<f64>,
    /// The same per CPU-second.
    pub vs_one_per_cpu: Option<f64>,
    /// Median pushed msg/s (end-to-end: what the producers got through meanwhile).
    pub pushed_msgs_per_sec: f64,
    /// Median commits per second, items and segments per commit.
    pub commits: (f64, f64, f64),
    /// Median messages per segment row.
    pub msgs_per_segment: f64,
    /// Median cores: brokers (summed), PostgreSQL, load generator, others.
    pub cores: (f64, f64, f64, f64),
    /// Median PostgreSQL CPU-seconds per 100 k messages pushed.
    pub pg_cpu_per_100k_msgs: f64,
    /// Median push p50 / p99, ms.
    pub push_ms: (f64, f64),
    /// Highest broker peak RSS, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Median messages per non-empty pop and empty pops per second (end-to-end).
    pub pops: (f64, f64),
    /// Over all rounds: acknowledged messages, lost, twice, out of order.
    pub check: (u64, u64, u64, u64),
    /// Rounds, and rounds that passed every check.
    pub rounds: (usize, usize),
}

/// The several-brokers suite's rows, push first, then end-to-end, by broker count.
pub fn brokers_rows(r: &Results) -> Vec<BrokersRow> {
    let mut scenarios: Vec<Scenario> = Vec::new();
    for m in &r.all {
        if matches!(m.scenario.kind, Kind::Brokers { .. }) && !scenarios.contains(&m.scenario) {
            scenarios.push(m.scenario);
        }
    }
    scenarios.sort_by_key(|s| match s.kind {
        Kind::Brokers {
            brokers,
            end_to_end,
        } => (end_to_end, brokers),
        _ => (true, usize::MAX),
    });
    scenarios
        .into_iter()
        .map(|s| {
            let ms: Vec<(&Measurement, &BrokersDetail)> = r
                .all
                .iter()
                .filter(|m| m.scenario == s)
                .filter_map(|m| match &m.detail {
                    Some(Detail::Brokers(d)) => Some((m, d)),
                    _ => None,
                })
                .collect();
            let pick = |f: &dyn Fn(&Measurement, &BrokersDetail) -> f64| {
                median(&ms.iter().map(|(m, d)| f(m, d)).collect::<Vec<_>>())
            };
            let rates: Vec<f64> = ms.iter().map(|(m, _)| m.msgs_per_sec).collect();
            let one = Scenario {
                kind: match s.kind {
                    Kind::Brokers { end_to_end, .. } => Kind::Brokers {
                        brokers: 1,
                        end_to_end,
                    },
                    k => k,
                },
                ..s
            };
            let sum = |f: &dyn Fn(&BrokersDetail) -> u64| ms.iter().map(|(_, d)| f(d)).sum();
            BrokersRow {
                scenario: s,
                msgs_per_sec: median(&rates),
                min_max: (
                    rates.iter().copied().fold(f64::INFINITY, f64::min),
                    rates.iter().copied().fold(0.0, f64::max),
                ),
                vs_one: r.ratio(s, one),
                vs_one_per_cpu: r.cpu_ratio(s, one),
                pushed_msgs_per_sec: pick(&|_, d| d.pushed_msgs_per_sec),
                commits: (
                    pick(&|_, d| d.commits_per_sec),
                    pick(&|_, d| d.items_per_commit),
                    pick(&|_, d| d.segments_per_commit),
                ),
                msgs_per_segment: pick(&|m, _| m.msgs_per_segment.unwrap_or(f64::NAN)),
                cores: (
                    pick(&|m, _| m.cpu.broker),
                    pick(&|m, _| m.cpu.postgres),
                    pick(&|m, _| m.cpu.load),
                    pick(&|m, _| m.cpu.other),
                ),
                pg_cpu_per_100k_msgs: pick(&|_, d| d.pg_cpu_per_100k_msgs),
                push_ms: (pick(&|m, _| m.p50_ms), pick(&|m, _| m.p99_ms)),
                peak_rss_mib: ms
                    .iter()
                    .filter_map(|(m, _)| m.peak_rss_mib)
                    .reduce(f64::max),
                pops: (
                    pick(&|_, d| d.msgs_per_pop),
                    pick(&|_, d| d.empty_pops_per_sec),
                ),
                check: (
                    sum(&|d| d.check.acknowledged),
                    sum(&|d| d.check.lost),
                    sum(&|d| d.check.duplicates),
                    sum(&|d| d.order_violations),
                ),
                rounds: (ms.len(), ms.iter().filter(|(m, _)| m.verified).count()),
            }
        })
        .collect()
}

/// The several-brokers suite as a Markdown table.
pub fn brokers_table(rows: &[BrokersRow]) -> String {
    let mut out = String::from(
        "| scenario | msg/s (median) | min–max | **÷ 1 broker** (per CPU-s) | pushed msg/s | commits/s | items/commit | segments/commit | msg/segment | cores brokers/pg/load/other | PG core-s per 100k msgs | push p50/p99 ms | msg/pop, empty pops/s | max broker RSS MB | acknowledged / lost / twice / out of order | verified |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| `{}` | {} | {}–{} | {} ({}) | {} | {:.0} | {:.0} | {:.1} | {} | {:.2}/{:.2}/{:.2}/{:.2} | {:.2} | {}/{} | {} | {} | {} / {} / {} / {} | {}/{} |\n",
            r.scenario.label(),
            kilo(r.msgs_per_sec),
            kilo(r.min_max.0),
            kilo(r.min_max.1),
            opt(r.vs_one, 2),
            opt(r.vs_one_per_cpu, 2),
            kilo(r.pushed_msgs_per_sec),
            r.commits.0,
            r.commits.1,
            r.commits.2,
            num(r.msgs_per_segment, 1),
            r.cores.0,
            r.cores.1,
            r.cores.2,
            r.cores.3,
            r.pg_cpu_per_100k_msgs,
            num(r.push_ms.0, 1),
            num(r.push_ms.1, 1),
            if r.pops.0.is_finite() {
                format!("{:.1}, {:.0}", r.pops.0, r.pops.1)
            } else {
                "-".to_string()
            },
            opt(r.peak_rss_mib.map(|m| m * 1.048_576), 1),
            r.check.0,
            r.check.1,
            r.check.2,
            r.check.3,
            r.rounds.1,
            r.rounds.0
        ));
    }
    out
}
