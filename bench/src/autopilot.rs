//! The autopilot suite (`--suites autopilot`; docs/benchmarks.md, "Autopilot"): whether pops
//! that let the broker size them (`autopilot=true`, no `batch`, no `partitions`; reference
//! §2.8) reach the throughput of the best fixed batch, and whether honouring the advised
//! `waitMs` cuts empty polling. In one run, on one database server, each round measures:
//!
//! - **backlog**: the queue filled first (`--autopilot-prefill` messages over the partitions),
//!   then `--consumers` consumers pop + ack batch without a long poll (`wait=false`), once per
//!   fixed batch of `--autopilot-batches` and once with autopilot honouring `waitMs`:
//!   consumed msg/s, msg/pop, broker CPU per message ([`crate::consume::pop_ack`]).
//! - **live stream**, per rate of `--autopilot-rates`: paced producers push that many msg/s
//!   (pushes of `LIVE_PUSH_BATCH`) while the consumers pop: each fixed batch with a long
//!   poll (`wait=true&timeout=1000`), autopilot with a long poll (the 2.x client's default),
//!   autopilot without one honouring `waitMs`, and autopilot without one ignoring it (popping
//!   again at once): consumed ÷ produced, end-to-end latency, pops/s and empty pops/s
//!   ([`crate::consume::end_to_end`]).
//!
//! Each autopilot figure is set against the best fixed batch of the same round (highest
//! consumed msg/s among the fixed pops of the same backlog or rate); the table gives the median
//! of those per-round ratios, and what the broker chose (the echoed batch and partitions, the
//! partitions a delivering pop claimed, the advised waits).

use serde::Serialize;

use crate::measure::{median, CpuUse};
use crate::measurement::{AutopilotSeen, ConsumeDetail, Detail, Measurement};
use crate::report::{kilo, num, opt, Results};
use crate::scenario::{Kind, PopStyle, Scenario};

/// The suite's scenarios of one round, in order: the backlog (each fixed batch, then
/// autopilot), then per live rate each fixed batch with a long poll and the three autopilot
/// consumers.
pub fn plan(batches: &[usize], rates: &[u32], partitions: u64, dedup: bool) -> Vec<Scenario> {
    let at = |pop, live_rate| Scenario {
        kind: Kind::Autopilot { pop, live_rate },
        partitions,
        dedup,
    };
    let mut out: Vec<Scenario> = batches
        .iter()
        .map(|&batch| at(PopStyle::Fixed { batch, wait: false }, 0))
        .collect();
    out.push(at(
        PopStyle::Autopilot {
            wait: false,
            honour_wait: true,
        },
        0,
    ));
    for &rate in rates {
        out.extend(
            batches
                .iter()
                .map(|&batch| at(PopStyle::Fixed { batch, wait: true }, rate)),
        );
        for (wait, honour_wait) in [(true, true), (false, true), (false, false)] {
            out.push(at(PopStyle::Autopilot { wait, honour_wait }, rate));
        }
    }
    out
}

/// Medians of one scenario of the suite over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct AutopilotRow {
    /// The scenario.
    pub scenario: Scenario,
    /// How the consumers popped.
    pub pop: PopStyle,
    /// 0: backlog; else the live stream's offered msg/s.
    pub live_rate: u32,
    /// Rounds measured.
    pub rounds: usize,
    /// Rounds whose check passed.
    pub verified: usize,
    /// Median msg/s consumed (popped and acked) in the window.
    pub consumed_msgs_per_sec: f64,
    /// Lowest and highest round.
    pub min_max: (f64, f64),
    /// Median over rounds of consumed msg/s ÷ that of the best fixed batch of the same round
    /// and workload.
    pub vs_best_fixed: Option<f64>,
    /// The same per CPU-second (broker + PostgreSQL + load generator): what the ratio would be
    /// if both had been given the same CPU, the other tenants of the machine left out.
    pub vs_best_fixed_per_cpu: Option<f64>,
    /// The fixed pop that was best most often.
    pub best_fixed: Option<String>,
    /// Median msg/s pushed in the window (live).
    pub produced_msgs_per_sec: f64,
    /// Median of per-round consumed ÷ pushed msg/s (live; the paced producers fall behind
    /// what they offer when the broker is kept busy).
    pub consumed_vs_produced: f64,
    /// Messages per pop that delivered.
    pub msgs_per_pop: f64,
    /// Pop requests answered per second (delivering and empty).
    pub pops_per_sec: f64,
    /// Empty pop answers per second.
    pub empty_pops_per_sec: f64,
    /// Push answered → pop answered, p50 and p99 ms (live).
    pub end_to_end_ms: (f64, f64),
    /// Rounds in which the consumers kept up (live; see `ConsumeDetail::kept_up`).
    pub kept_up_rounds: usize,
    /// Cores used in the window.
    pub cpu: CpuUse,
    /// Broker CPU per consumed message, µs.
    pub broker_us_per_msg: f64,
    /// Broker + PostgreSQL CPU per consumed message, µs.
    pub broker_pg_us_per_msg: f64,
    /// What autopilot chose, each round.
    pub chose: Vec<AutopilotSeen>,
    /// Failed requests, all rounds.
    pub errors: u64,
}

fn detail(m: &Measurement) -> Option<&ConsumeDetail> {
    match &m.detail {
        Some(Detail::Consume(d)) => Some(d),
        _ => None,
    }
}

/// The suite's rows, in plan order; `window_secs` is the length of a window.
pub fn rows(r: &Results, window_secs: f64) -> Vec<AutopilotRow> {
    let mut seen: Vec<Scenario> = Vec::new();
    for m in &r.all {
        if matches!(m.scenario.kind, Kind::Autopilot { .. }) && !seen.contains(&m.scenario) {
            seen.push(m.scenario);
        }
    }
    seen.iter().map(|&s| row(r, s, window_secs)).collect()
}

/// The best fixed pop of `round` for the workload of `s` (same rate, partitions, dedup).
fn best_fixed(r: &Results, s: Scenario, round: usize) -> Option<&Measurement> {
    let Kind::Autopilot { live_rate, .. } = s.kind else {
        return None;
    };
    r.all
        .iter()
        .filter(|m| {
            m.round == round
                && m.scenario.partitions == s.partitions
                && m.scenario.dedup == s.dedup
                && matches!(m.scenario.kind, Kind::Autopilot { pop: PopStyle::Fixed { .. }, live_rate: l } if l == live_rate)
        })
        .max_by(|a, b| a.msgs_per_sec.total_cmp(&b.msgs_per_sec))
}

fn row(r: &Results, s: Scenario, window_secs: f64) -> AutopilotRow {
    let Kind::Autopilot { pop, live_rate } = s.kind else {
        unreachable!("rows() passes autopilot scenarios only");
    };
    let ms: Vec<&Measurement> = r.all.iter().filter(|m| m.scenario == s).collect();
    let pick =
        |f: &dyn Fn(&Measurement) -> f64| median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>());
    let pick_d = |f: &dyn Fn(&ConsumeDetail) -> f64| {
        median(
            &ms.iter()
                .filter_map(|m| detail(m))
                .map(f)
                .collect::<Vec<_>>(),
        )
    };
    let rates: Vec<f64> = ms.iter().map(|m| m.msgs_per_sec).collect();
    let mut ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    let mut bests: Vec<String> = Vec::new();
    let per_cpu = |m: &Measurement| m.msgs_per_sec / m.cpu.ours();
    for m in &ms {
        if let Some(b) = best_fixed(r, s, m.round) {
            if b.msgs_per_sec > 0.0 {
                ratios.push(m.msgs_per_sec / b.msgs_per_sec);
                cpu_ratios.push(per_cpu(m) / per_cpu(b));
            }
            if let Kind::Autopilot { pop, .. } = b.scenario.kind {
                bests.push(pop.label());
            }
        }
    }
    let best = bests
        .iter()
        .max_by_key(|b| bests.iter().filter(|x| x == b).count())
        .cloned();
    let vs = median(&ratios);
    let vs_cpu = median(&cpu_ratios);
    let empty_per_sec = |d: &ConsumeDetail| d.empty_pops as f64 / window_secs;
    let cpu = CpuUse {
        broker: pick(&|m| m.cpu.broker),
        postgres: pick(&|m| m.cpu.postgres),
        load: pick(&|m| m.cpu.load),
        other: pick(&|m| m.cpu.other),
        cores: pick(&|m| m.cpu.cores),
    };
    AutopilotRow {
        scenario: s,
        pop,
        live_rate,
        rounds: ms.len(),
        verified: ms.iter().filter(|m| m.verified).count(),
        consumed_msgs_per_sec: median(&rates),
        min_max: (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        ),
        vs_best_fixed: vs.is_finite().then_some(vs),
        vs_best_fixed_per_cpu: vs_cpu.is_finite().then_some(vs_cpu),
        best_fixed: best,
        produced_msgs_per_sec: pick_d(&|d| d.produced_msgs_per_sec),
        consumed_vs_produced: pick_d(&|d| d.consumed_msgs_per_sec / d.produced_msgs_per_sec),
        msgs_per_pop: pick_d(&|d| d.msgs_per_pop),
        pops_per_sec: pick(&|m| m.ops_per_sec + detail(m).map_or(f64::NAN, empty_per_sec)),
        empty_pops_per_sec: pick_d(&empty_per_sec),
        end_to_end_ms: (
            pick_d(&|d| d.end_to_end_ms.map_or(f64::NAN, |l| l.p50)),
            pick_d(&|d| d.end_to_end_ms.map_or(f64::NAN, |l| l.p99)),
        ),
        kept_up_rounds: ms
            .iter()
            .filter_map(|m| detail(m))
            .filter(|d| d.kept_up == Some(true))
            .count(),
        cpu,
        broker_us_per_msg: pick(&|m| m.cpu.broker / m.msgs_per_sec * 1e6),
        broker_pg_us_per_msg: pick(&|m| (m.cpu.broker + m.cpu.postgres) / m.msgs_per_sec * 1e6),
        chose: ms
            .iter()
            .filter_map(|m| detail(m).and_then(|d| d.autopilot))
            .collect(),
        errors: ms.iter().map(|m| m.errors).sum(),
    }
}

/// What autopilot chose over the rounds, in a few words: the echoed batch and partitions (the
/// most frequent; lowest–highest over all rounds), partitions claimed per delivering pop,
/// share of full batches, and the advised waits.
pub fn chose_text(chose: &[AutopilotSeen]) -> String {
    if chose.is_empty() {
        return "-".into();
    }
    let most = |f: fn(&AutopilotSeen) -> u32| {
        let v: Vec<u32> = chose.iter().map(f).collect();
        *v.iter()
            .max_by_key(|x| v.iter().filter(|y| y == x).count())
            .expect("not empty")
    };
    let lo = |f: fn(&AutopilotSeen) -> u32| chose.iter().map(f).min().unwrap_or(0);
    let hi = |f: fn(&AutopilotSeen) -> u32| chose.iter().map(f).max().unwrap_or(0);
    let med = |f: fn(&AutopilotSeen) -> f64| median(&chose.iter().map(f).collect::<Vec<_>>());
    let waits = if hi(|c| c.wait_ms.1) > 0 {
        format!(
            "; waitMs p50 {} (max {}), paused {:.0} %",
            most(|c| c.wait_ms.0),
            hi(|c| c.wait_ms.1),
            med(|c| c.paused_share) * 100.0
        )
    } else {
        String::new()
    };
    format!(
        "batch {} ({}–{}), partitions {} ({}–{}); claimed {:.1}/pop, {:.0} % full{}",
        most(|c| c.batch.1),
        lo(|c| c.batch.0),
        hi(|c| c.batch.2),
        most(|c| c.partitions.1),
        lo(|c| c.partitions.0),
        hi(|c| c.partitions.2),
        med(|c| c.claimed_per_pop),
        med(|c| c.full_share) * 100.0,
        waits
    )
}

fn check(r: &AutopilotRow) -> String {
    if r.verified == r.rounds && r.errors == 0 {
        format!("{}/{}", r.verified, r.rounds)
    } else {
        format!("⚠ {}/{}, {} errors", r.verified, r.rounds, r.errors)
    }
}

/// The backlog rows as a Markdown table.
pub fn backlog_table(rows: &[AutopilotRow]) -> String {
    let mut out = String::from(
        "| pop | consumed msg/s (median) | min–max | **÷ best fixed** (per CPU-s) | msg/pop | pops/s | empty pops/s | CPU cores b/pg | broker µs/msg | b+pg µs/msg | autopilot chose | verified |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    for r in rows.iter().filter(|r| r.live_rate == 0) {
        out.push_str(&format!(
            "| {} | {} | {}–{} | {} ({}) | {} | {} | {} | {:.2}/{:.2} | {} | {} | {} | {} |\n",
            r.pop.label(),
            kilo(r.consumed_msgs_per_sec),
            kilo(r.min_max.0),
            kilo(r.min_max.1),
            opt(r.vs_best_fixed, 2),
            opt(r.vs_best_fixed_per_cpu, 2),
            num(r.msgs_per_pop, 1),
            kilo(r.pops_per_sec),
            num(r.empty_pops_per_sec, 0),
            r.cpu.broker,
            r.cpu.postgres,
            num(r.broker_us_per_msg, 1),
            num(r.broker_pg_us_per_msg, 1),
            chose_text(&r.chose),
            check(r)
        ));
    }
    out
}

/// The live-stream rows as a Markdown table.
pub fn live_table(rows: &[AutopilotRow]) -> String {
    let mut out = String::from(
        "| offered msg/s | pop | consumed msg/s (median) | **÷ best fixed** (per CPU-s) | pushed msg/s | consumed ÷ pushed | end-to-end p50/p99 ms | kept up | msg/pop | pops/s | **empty pops/s** | CPU cores b/pg | b+pg µs/msg | autopilot chose | verified |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    for r in rows.iter().filter(|r| r.live_rate > 0) {
        out.push_str(&format!(
            "| {} | {} | {} | {} ({}) | {} | {} | {}/{} | {}/{} | {} | {} | {} | {:.2}/{:.2} | {} | {} | {} |\n",
            kilo(f64::from(r.live_rate)),
            r.pop.label(),
            kilo(r.consumed_msgs_per_sec),
            opt(r.vs_best_fixed, 2),
            opt(r.vs_best_fixed_per_cpu, 2),
            kilo(r.produced_msgs_per_sec),
            num(r.consumed_vs_produced, 2),
            num(r.end_to_end_ms.0, 1),
            num(r.end_to_end_ms.1, 1),
            r.kept_up_rounds,
            r.rounds,
            num(r.msgs_per_pop, 1),
            kilo(r.pops_per_sec),
            num(r.empty_pops_per_sec, 0),
            r.cpu.broker,
            r.cpu.postgres,
            num(r.broker_pg_us_per_msg, 1),
            chose_text(&r.chose),
            check(r)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_puts_autopilot_beside_the_fixed_batches_of_each_workload() {
        let p = plan(&[10, 1000], &[500], 100, true);
        let kinds: Vec<(PopStyle, u32)> = p
            .iter()
            .map(|s| match s.kind {
                Kind::Autopilot { pop, live_rate } => (pop, live_rate),
                _ => panic!("only autopilot scenarios"),
            })
            .collect();
        let fixed = |batch, wait| PopStyle::Fixed { batch, wait };
        let auto = |wait, honour_wait| PopStyle::Autopilot { wait, honour_wait };
        assert_eq!(
            kinds,
            vec![
                (fixed(10, false), 0),
                (fixed(1000, false), 0),
                (auto(false, true), 0),
                (fixed(10, true), 500),
                (fixed(1000, true), 500),
                (auto(true, true), 500),
                (auto(false, true), 500),
                (auto(false, false), 500),
            ]
        );
    }

    #[test]
    fn autopilot_is_set_against_the_best_fixed_batch_of_its_round() {
        let at = |pop, live_rate| Scenario {
            kind: Kind::Autopilot { pop, live_rate },
            partitions: 100,
            dedup: true,
        };
        let m = |s: Scenario, round, rate| {
            let mut m = crate::measurement::blank(s, round);
            m.msgs_per_sec = rate;
            m.verified = true;
            m
        };
        let small = at(
            PopStyle::Fixed {
                batch: 10,
                wait: false,
            },
            0,
        );
        let large = at(
            PopStyle::Fixed {
                batch: 1000,
                wait: false,
            },
            0,
        );
        let auto = at(
            PopStyle::Autopilot {
                wait: false,
                honour_wait: true,
            },
            0,
        );
        let r = Results {
            all: vec![
                m(small, 0, 50.0),
                m(large, 0, 200.0),
                m(auto, 0, 180.0),
                m(small, 1, 300.0),
                m(large, 1, 100.0),
                m(auto, 1, 330.0),
            ],
        };
        let rows = rows(&r, 3.0);
        assert_eq!(rows.len(), 3);
        let a = &rows[2];
        // Round 0: 180 ÷ 200; round 1: 330 ÷ 300.
        assert!((a.vs_best_fixed.expect("ratio") - 1.0).abs() < 1e-9);
        assert_eq!(a.verified, 2);
        assert!(backlog_table(&rows).contains("autopilot, wait=false, honours waitMs"));
        assert!(live_table(&rows).lines().count() == 2, "no live rows");
    }
}
