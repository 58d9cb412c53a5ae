//! Turning rounds of measurements into the report: medians per scenario, ratios against the
//! baselines of the same round (then the median of those ratios), the issue's targets, a text
//! table, a JSON file and an SVG chart.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::measure::{median, CpuUse};
use crate::measurement::{ConsumeDetail, Detail, Latency, Measurement, SpoolDetail, WakeupDetail};
use crate::scenario::{Kind, Scenario};

/// Medians of one scenario over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The scenario.
    pub scenario: Scenario,
    /// Its label.
    pub label: String,
    /// Rounds measured.
    pub rounds: usize,
    /// Median msg/s.
    pub msgs_per_sec: f64,
    /// Lowest msg/s of a round.
    pub msgs_per_sec_min: f64,
    /// Highest msg/s of a round.
    pub msgs_per_sec_max: f64,
    /// Median of the rounds' p50 latency.
    pub p50_ms: f64,
    /// Median of the rounds' p99 latency.
    pub p99_ms: f64,
    /// Median messages per segment row.
    pub msgs_per_segment: Option<f64>,
    /// Highest peak RSS of the broker over the rounds, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Median cores used by party.
    pub cpu: CpuUse,
    /// Median WAL bytes per message.
    pub wal_bytes_per_msg: f64,
    /// CPU (broker + PostgreSQL + load generator) per message, microseconds.
    pub cpu_us_per_msg: f64,
    /// Against baseline (1) with the same partitions and dedup.
    pub vs_segments: Option<Versus>,
    /// ... against (1+), the broker's transaction shape by SQL.
    pub vs_segment_txn: Option<Versus>,
    /// ... against baseline (2), naive with the unique dedup index.
    pub vs_naive: Option<Versus>,
    /// ... against (2'), naive without a dedup index.
    pub vs_naive_plain: Option<Versus>,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// Items not `queued` over all rounds.
    pub not_queued: u64,
    /// Rounds whose stored count did not match.
    pub unverified: usize,
}

/// What encryption costs: an encrypted-queue scenario against the same scenario on a plain
/// queue, medians of per-round ratios of the same run.
#[derive(Clone, Debug, Serialize)]
pub struct EncryptionRow {
    /// The encrypted scenario's label.
    pub label: String,
    /// Median msg/s on the encrypted queue.
    pub encrypted_msgs_per_sec: f64,
    /// Median msg/s on the plain queue.
    pub plain_msgs_per_sec: f64,
    /// Encrypted over plain, msg/s and msg per CPU-second.
    pub versus_plain: Option<Versus>,
    /// CPU µs per message (broker + PostgreSQL + load generator) on the encrypted queue minus
    /// on the plain one: the added cost per message.
    pub added_cpu_us_per_msg: f64,
}

/// The encryption comparison as a Markdown table.
pub fn encryption_table(rows: &[EncryptionRow]) -> String {
    let mut out = String::from(
        "| scenario | encrypted msg/s | plain msg/s | encrypted/plain | per CPU-s | added CPU µs/msg |\n| --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.label,
            kilo(r.encrypted_msgs_per_sec),
            kilo(r.plain_msgs_per_sec),
            opt(r.versus_plain.map(|v| v.throughput), 2),
            opt(r.versus_plain.and_then(|v| v.per_cpu), 2),
            num(r.added_cpu_us_per_msg, 1),
        );
    }
    out
}

/// A comparison with a baseline: medians of per-round ratios.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Versus {
    /// msg/s over the baseline's msg/s.
    pub throughput: f64,
    /// msg per CPU-second over the baseline's.
    pub per_cpu: Option<f64>,
}

/// Medians of one spool scenario over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct SpoolRow {
    /// The scenario.
    pub scenario: Scenario,
    /// Its label.
    pub label: String,
    /// Rounds measured.
    pub rounds: usize,
    /// msg/s answered `queued` before the outage.
    pub queued_msgs_per_sec: f64,
    /// msg/s answered `buffered` during the outage.
    pub buffered_msgs_per_sec: f64,
    /// Median of per-round buffered ÷ queued.
    pub ratio: f64,
    /// Lowest per-round ratio.
    pub ratio_min: f64,
    /// Highest per-round ratio.
    pub ratio_max: f64,
    /// Request latency before the outage, p50 ms.
    pub queued_p50_ms: f64,
    /// ... p99 ms.
    pub queued_p99_ms: f64,
    /// Request latency during the outage, p50 ms.
    pub buffered_p50_ms: f64,
    /// ... p99 ms.
    pub buffered_p99_ms: f64,
    /// Cores used before the outage.
    pub queued_cpu: CpuUse,
    /// Cores used during the outage.
    pub buffered_cpu: CpuUse,
    /// Spool depth when PostgreSQL came back.
    pub spool_records: f64,
    /// Spool bytes per record.
    pub spool_bytes_per_record: f64,
    /// Seconds until the restarted PostgreSQL accepted connections.
    pub restart_secs: f64,
    /// Seconds from accepting to the first replayed batch.
    pub replay_start_secs: f64,
    /// Seconds from accepting to an empty spool.
    pub drain_secs: f64,
    /// Records per second from accepting to an empty spool.
    pub drain_msgs_per_sec: f64,
    /// Records per second once the replay was under way.
    pub replay_msgs_per_sec: f64,
    /// Cores used while draining.
    pub drain_cpu: CpuUse,
    /// WAL bytes per replayed record.
    pub drain_wal_bytes_per_msg: f64,
    /// Highest broker peak RSS before the replay started, MiB.
    pub rss_before_replay_mib: f64,
    /// Highest broker peak RSS over the whole run (replay included), MiB.
    pub peak_rss_mib: f64,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// Items with a verdict other than the window's (queued before, buffered during).
    pub unexpected_verdicts: u64,
    /// Rounds whose stored items did not match the verdicts.
    pub unverified: usize,
    /// Acknowledged items checked in the database, all rounds.
    pub items_checked: u64,
}

/// Medians of one consuming scenario over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct ConsumeRow {
    /// The scenario.
    pub scenario: Scenario,
    /// Its label.
    pub label: String,
    /// Rounds measured.
    pub rounds: usize,
    /// Concurrent consumers.
    pub consumers: usize,
    /// Median msg/s consumed (popped and acked) in the window.
    pub consumed_msgs_per_sec: f64,
    /// Lowest round.
    pub consumed_min: f64,
    /// Highest round.
    pub consumed_max: f64,
    /// msg/s pushed (end-to-end: in the window; pop+ack: while filling).
    pub produced_msgs_per_sec: f64,
    /// msg/s the paced producers offered.
    pub offered_msgs_per_sec: f64,
    /// Median of per-round consumed ÷ offered msg/s (paced end-to-end).
    pub consumed_vs_offered: f64,
    /// Against push-only (batch 100, same partitions and dedup) of the same round.
    pub vs_push_only: Option<Versus>,
    /// Push-only msg/s (median).
    pub push_only_msgs_per_sec: f64,
    /// Messages per pop that returned messages.
    pub msgs_per_pop: f64,
    /// Pop latency p50 ms.
    pub pop_p50_ms: f64,
    /// Pop latency p99 ms.
    pub pop_p99_ms: f64,
    /// Ack batch latency p50 ms.
    pub ack_p50_ms: f64,
    /// Ack batch latency p99 ms.
    pub ack_p99_ms: f64,
    /// Pop + ack p50 ms.
    pub cycle_p50_ms: f64,
    /// Pop + ack p99 ms.
    pub cycle_p99_ms: f64,
    /// Push latency p50 ms (end-to-end).
    pub push_p50_ms: f64,
    /// Push latency p99 ms (end-to-end).
    pub push_p99_ms: f64,
    /// Push answered → popped, p50 ms (end-to-end).
    pub end_to_end_p50_ms: f64,
    /// ... p90 ms.
    pub end_to_end_p90_ms: f64,
    /// ... p99 ms.
    pub end_to_end_p99_ms: f64,
    /// ... max ms.
    pub end_to_end_max_ms: f64,
    /// Pushed but not consumed when the window closed (end-to-end).
    pub backlog_at_end: f64,
    /// Seconds to drain after the producers stopped (end-to-end).
    pub drain_secs: f64,
    /// Rounds in which the consumers kept up (see `ConsumeDetail::kept_up`), end-to-end.
    pub kept_up_rounds: usize,
    /// Cores used in the window.
    pub cpu: CpuUse,
    /// CPU (broker + PostgreSQL + load generator) per consumed message, µs.
    pub cpu_us_per_msg: f64,
    /// CPU of the broker and PostgreSQL per consumed message, µs (median of rounds).
    pub broker_pg_us_per_msg: f64,
    /// The same per pushed message in the push-only scenario of the same rounds.
    pub push_only_broker_pg_us_per_msg: f64,
    /// Median of per-round (µs per consumed message ÷ µs per pushed message), broker +
    /// PostgreSQL.
    pub broker_pg_cpu_vs_push_only: Option<f64>,
    /// WAL bytes per consumed message.
    pub wal_bytes_per_msg: f64,
    /// Highest broker peak RSS, MiB.
    pub peak_rss_mib: f64,
    /// Failed requests over all rounds.
    pub errors: u64,
    /// Messages consumed more than once, all rounds.
    pub duplicates: u64,
    /// Messages acknowledged `queued` never consumed (end-to-end, after the drain).
    pub lost: u64,
    /// Rounds whose check failed.
    pub unverified: usize,
    /// Messages consumed, all rounds.
    pub consumed_total: u64,
}

/// Medians of the long-poll wake-up measurement over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupRow {
    /// The scenario.
    pub scenario: Scenario,
    /// Its label.
    pub label: String,
    /// Rounds measured.
    pub rounds: usize,
    /// Samples per round.
    pub samples: usize,
    /// Pops that brought their message, all rounds.
    pub woken: usize,
    /// Pops answered before the push's answer arrived (0 ms), all rounds.
    pub before_push_answer: usize,
    /// Push answered → pop answered, medians of the rounds' percentiles, ms.
    pub wake_ms: Latency,
    /// Push sent → pop answered, the same.
    pub from_push_sent_ms: Latency,
    /// Push request latency, the same.
    pub push_ms: Latency,
    /// Rounds whose check failed (a pop not woken, an error).
    pub unverified: usize,
}

/// Broker + PostgreSQL CPU per message, µs.
fn broker_pg_us(m: &Measurement) -> f64 {
    (m.cpu.broker + m.cpu.postgres) / m.msgs_per_sec * 1e6
}

fn latency_median(all: &[Latency]) -> Latency {
    let pick = |f: fn(&Latency) -> f64| median(&all.iter().map(f).collect::<Vec<_>>());
    Latency {
        p50: pick(|l| l.p50),
        p90: pick(|l| l.p90),
        p99: pick(|l| l.p99),
        max: pick(|l| l.max),
    }
}

/// The long-poll wake-up table, as Markdown.
pub fn wakeup_table(rows: &[WakeupRow]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | samples (woken) | push answered → pop answered p50/p90/p99/max ms | push sent → pop answered p50/p99 ms | push p50/p99 ms | check |\n");
    out.push_str("|---|---:|---:|---:|---:|---|\n");
    for r in rows {
        let check = if r.unverified == 0 {
            format!(
                "every pop woken{}",
                if r.before_push_answer > 0 {
                    format!(
                        " ({} before the push's answer arrived)",
                        r.before_push_answer
                    )
                } else {
                    String::new()
                }
            )
        } else {
            format!("⚠ {} unverified rounds", r.unverified)
        };
        let _ = writeln!(
            out,
            "| `{}` | {} × {} ({}) | **{}/{}/{}**/{} | {}/{} | {}/{} | {} |",
            r.label,
            r.rounds,
            r.samples,
            r.woken,
            num(r.wake_ms.p50, 1),
            num(r.wake_ms.p90, 1),
            num(r.wake_ms.p99, 1),
            num(r.wake_ms.max, 1),
            num(r.from_push_sent_ms.p50, 1),
            num(r.from_push_sent_ms.p99, 1),
            num(r.push_ms.p50, 1),
            num(r.push_ms.p99, 1),
            check
        );
    }
    out
}

fn cpu_median(all: impl Iterator<Item = CpuUse>) -> CpuUse {
    let v: Vec<CpuUse> = all.collect();
    let pick = |f: fn(&CpuUse) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    CpuUse {
        broker: pick(|c| c.broker),
        postgres: pick(|c| c.postgres),
        load: pick(|c| c.load),
        other: pick(|c| c.other),
        cores: pick(|c| c.cores),
    }
}

fn cores(c: &CpuUse) -> String {
    format!(
        "{:.2}/{:.2}/{:.2}/{:.2}",
        c.broker, c.postgres, c.load, c.other
    )
}

pub(crate) fn num(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "-".into()
    }
}

/// The spool table, as Markdown.
pub fn spool_table(rows: &[SpoolRow]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | queued msg/s (PG up) | buffered msg/s (PG down) | buffered ÷ queued (min–max) | p50/p99 ms up | p50/p99 ms down | CPU cores up b/pg/load/other | CPU cores down b/pg/load/other | spool records | spool B/record | restart s | replay start s | drain s | drain records/s (replay rate) | drain CPU b/pg | WAL B/record | broker RSS MB before replay/peak | check |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in rows {
        let check = if r.unverified == 0 && r.errors == 0 && r.unexpected_verdicts == 0 {
            format!("{} items exactly once", kilo(r.items_checked as f64))
        } else {
            format!(
                "⚠ {} unverified rounds, {} errors, {} unexpected verdicts",
                r.unverified, r.errors, r.unexpected_verdicts
            )
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | **{:.2}** ({:.2}–{:.2}) | {}/{} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.2}/{:.2} | {} | {}/{} | {} |",
            r.label,
            kilo(r.queued_msgs_per_sec),
            kilo(r.buffered_msgs_per_sec),
            r.ratio,
            r.ratio_min,
            r.ratio_max,
            num(r.queued_p50_ms, 1),
            num(r.queued_p99_ms, 1),
            num(r.buffered_p50_ms, 1),
            num(r.buffered_p99_ms, 1),
            cores(&r.queued_cpu),
            cores(&r.buffered_cpu),
            kilo(r.spool_records),
            num(r.spool_bytes_per_record, 0),
            num(r.restart_secs, 2),
            num(r.replay_start_secs, 2),
            num(r.drain_secs, 2),
            kilo(r.drain_msgs_per_sec),
            kilo(r.replay_msgs_per_sec),
            r.drain_cpu.broker,
            r.drain_cpu.postgres,
            num(r.drain_wal_bytes_per_msg, 0),
            num(r.rss_before_replay_mib * 1.048_576, 0),
            num(r.peak_rss_mib * 1.048_576, 0),
            check
        );
    }
    out
}

/// The consuming table, as Markdown.
pub fn consume_table(rows: &[ConsumeRow]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | consumed msg/s (median) | min–max | pushed msg/s | ÷ push-only (per CPU) | consumed ÷ offered | msg/pop | pop p50/p99 ms | ack p50/p99 ms | end-to-end p50/p90/p99/max ms | backlog at end | drain s | kept up (rounds) | CPU cores b/pg/load/other | CPU µs/msg b+pg (push-only; ratio) | CPU µs/msg b+pg+load | WAL B/msg | broker RSS MB | check |\n");
    out.push_str(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let e2e_kind = matches!(r.scenario.kind, Kind::EndToEnd { .. });
        let check = if r.unverified == 0 && r.errors == 0 {
            format!(
                "{} consumed, 0 duplicates{}",
                kilo(r.consumed_total as f64),
                if e2e_kind { ", 0 lost" } else { "" }
            )
        } else {
            format!(
                "⚠ {} unverified rounds, {} errors, {} duplicates, {} lost",
                r.unverified, r.errors, r.duplicates, r.lost
            )
        };
        let e2e = if r.end_to_end_p50_ms.is_finite() {
            format!(
                "{:.1}/{:.1}/{:.1}/{:.0}",
                r.end_to_end_p50_ms, r.end_to_end_p90_ms, r.end_to_end_p99_ms, r.end_to_end_max_ms
            )
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {}–{} | {} | {} | {} | {} | {}/{} | {}/{} | {} | {} | {} | {} | {} | {} ({}; {}) | {} | {} | {} | {} |",
            r.label,
            kilo(r.consumed_msgs_per_sec),
            kilo(r.consumed_min),
            kilo(r.consumed_max),
            if r.offered_msgs_per_sec.is_finite() {
                format!(
                    "{} (offered {})",
                    kilo(r.produced_msgs_per_sec),
                    kilo(r.offered_msgs_per_sec)
                )
            } else {
                kilo(r.produced_msgs_per_sec)
            },
            vs(r.vs_push_only),
            num(r.consumed_vs_offered, 2),
            num(r.msgs_per_pop, 1),
            num(r.pop_p50_ms, 1),
            num(r.pop_p99_ms, 1),
            num(r.ack_p50_ms, 1),
            num(r.ack_p99_ms, 1),
            e2e,
            if e2e_kind { kilo(r.backlog_at_end) } else { "-".into() },
            num(r.drain_secs, 2),
            if e2e_kind {
                format!("{}/{}", r.kept_up_rounds, r.rounds)
            } else {
                "-".into()
            },
            cores(&r.cpu),
            num(r.broker_pg_us_per_msg, 1),
            num(r.push_only_broker_pg_us_per_msg, 1),
            opt(r.broker_pg_cpu_vs_push_only, 2),
            num(r.cpu_us_per_msg, 0),
            num(r.wal_bytes_per_msg, 0),
            num(r.peak_rss_mib * 1.048_576, 1),
            check
        );
    }
    out
}

/// Everything measured, by scenario and round.
pub struct Results {
    /// Every measurement in the order taken.
    pub all: Vec<Measurement>,
}

impl Results {
    fn of(&self, s: Scenario) -> Vec<&Measurement> {
        self.all.iter().filter(|m| m.scenario == s).collect()
    }

    /// The median over rounds of `a`'s msg/s divided by `b`'s in the same round.
    pub fn ratio(&self, a: Scenario, b: Scenario) -> Option<f64> {
        self.ratio_of(a, b, |m| m.msgs_per_sec)
    }

    /// The same for messages per CPU-second (broker + PostgreSQL + load generator): what the
    /// ratio would be if both had been given the same CPU.
    pub fn cpu_ratio(&self, a: Scenario, b: Scenario) -> Option<f64> {
        self.ratio_of(a, b, |m| m.msgs_per_sec / m.cpu.ours())
    }

    fn ratio_of(&self, a: Scenario, b: Scenario, f: fn(&Measurement) -> f64) -> Option<f64> {
        let by_round: HashMap<usize, f64> = self.of(b).iter().map(|m| (m.round, f(m))).collect();
        let ratios: Vec<f64> = self
            .of(a)
            .iter()
            .filter_map(|m| {
                let base = by_round.get(&m.round)?;
                (*base > 0.0 && base.is_finite()).then(|| f(m) / base)
            })
            .collect();
        let r = median(&ratios);
        r.is_finite().then_some(r)
    }

    fn versus(&self, a: Scenario, b: Scenario) -> Option<Versus> {
        Some(Versus {
            throughput: self.ratio(a, b)?,
            per_cpu: self.cpu_ratio(a, b),
        })
    }

    /// One row per scenario, in first-measured order.
    pub fn rows(&self) -> Vec<Row> {
        let mut seen = Vec::new();
        for m in &self.all {
            if !seen.contains(&m.scenario) {
                seen.push(m.scenario);
            }
        }
        seen.into_iter().map(|s| self.row(s)).collect()
    }

    fn row(&self, s: Scenario) -> Row {
        let ms = self.of(s);
        let pick =
            |f: &dyn Fn(&Measurement) -> f64| median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>());
        let rates: Vec<f64> = ms.iter().map(|m| m.msgs_per_sec).collect();
        let segs = pick(&|m| m.msgs_per_segment.unwrap_or(f64::NAN));
        let rss = ms
            .iter()
            .filter_map(|m| m.peak_rss_mib)
            .fold(f64::NAN, f64::max);
        let base = |kind: Kind, dedup: bool| Scenario {
            kind,
            partitions: s.partitions,
            dedup,
        };
        let (vs_segments, vs_segment_txn, vs_naive, vs_naive_plain) = match s.kind {
            Kind::Broker { .. } => (
                self.versus(s, base(Kind::SegmentRows, s.dedup)),
                self.versus(s, base(Kind::SegmentTxn, s.dedup)),
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::SegmentTxn => (
                self.versus(s, base(Kind::SegmentRows, s.dedup)),
                None,
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::SegmentRows => (
                None,
                None,
                self.versus(s, base(Kind::Naive, true)),
                self.versus(s, base(Kind::Naive, false)),
            ),
            Kind::Naive
            | Kind::SingleCommits
            | Kind::Spool { .. }
            | Kind::PopAck { .. }
            | Kind::EncryptedPush { .. }
            | Kind::EncryptedPopAck { .. }
            | Kind::EndToEnd { .. }
            | Kind::Brokers { .. }
            | Kind::Wakeup
            | Kind::Autopilot { .. } => (None, None, None, None),
        };
        Row {
            scenario: s,
            label: s.label(),
            rounds: ms.len(),
            msgs_per_sec: median(&rates),
            msgs_per_sec_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            msgs_per_sec_max: rates.iter().copied().fold(0.0, f64::max),
            p50_ms: pick(&|m| m.p50_ms),
            p99_ms: pick(&|m| m.p99_ms),
            msgs_per_segment: segs.is_finite().then_some(segs),
            peak_rss_mib: rss.is_finite().then_some(rss),
            cpu: CpuUse {
                broker: pick(&|m| m.cpu.broker),
                postgres: pick(&|m| m.cpu.postgres),
                load: pick(&|m| m.cpu.load),
                other: pick(&|m| m.cpu.other),
                cores: pick(&|m| m.cpu.cores),
            },
            wal_bytes_per_msg: pick(&|m| m.wal_bytes_per_msg),
            cpu_us_per_msg: pick(&|m| m.cpu.ours() / m.msgs_per_sec * 1e6),
            vs_segments,
            vs_segment_txn,
            vs_naive,
            vs_naive_plain,
            errors: ms.iter().map(|m| m.errors).sum(),
            not_queued: ms.iter().map(|m| m.not_queued).sum(),
            unverified: ms.iter().filter(|m| !m.verified).count(),
        }
    }

    fn spool_of(&self, s: Scenario) -> Vec<(&Measurement, &SpoolDetail)> {
        self.of(s)
            .into_iter()
            .filter_map(|m| match &m.detail {
                Some(Detail::Spool(d)) => Some((m, d)),
                _ => None,
            })
            .collect()
    }

    fn consume_of(&self, s: Scenario) -> Vec<(&Measurement, &ConsumeDetail)> {
        self.of(s)
            .into_iter()
            .filter_map(|m| match &m.detail {
                Some(Detail::Consume(d)) => Some((m, d)),
                _ => None,
            })
            .collect()
    }

    /// One row per encrypted-queue scenario, against its plain counterpart of the same run.
    pub fn encryption_rows(&self) -> Vec<EncryptionRow> {
        self.scenarios_where(Kind::encrypted)
            .into_iter()
            .filter_map(|s| {
                let plain_kind = match s.kind {
                    Kind::EncryptedPush { batch } => Kind::Broker { batch },
                    Kind::EncryptedPopAck { batch } => Kind::PopAck { batch },
                    _ => return None,
                };
                let plain = Scenario {
                    kind: plain_kind,
                    ..s
                };
                let rate = |x: Scenario| {
                    median(
                        &self
                            .of(x)
                            .iter()
                            .map(|m| m.msgs_per_sec)
                            .collect::<Vec<_>>(),
                    )
                };
                let us = |x: Scenario| {
                    median(
                        &self
                            .of(x)
                            .iter()
                            .map(|m| m.cpu.ours() / m.msgs_per_sec * 1e6)
                            .collect::<Vec<_>>(),
                    )
                };
                Some(EncryptionRow {
                    label: s.label(),
                    encrypted_msgs_per_sec: rate(s),
                    plain_msgs_per_sec: rate(plain),
                    versus_plain: self.versus(s, plain),
                    added_cpu_us_per_msg: us(s) - us(plain),
                })
            })
            .collect()
    }

    fn scenarios_where(&self, f: fn(&Kind) -> bool) -> Vec<Scenario> {
        let mut seen = Vec::new();
        for m in &self.all {
            if f(&m.scenario.kind) && !seen.contains(&m.scenario) {
                seen.push(m.scenario);
            }
        }
        seen
    }

    /// One row per spool scenario: medians over rounds.
    pub fn spool_rows(&self) -> Vec<SpoolRow> {
        self.scenarios_where(|k| matches!(k, Kind::Spool { .. }))
            .into_iter()
            .map(|s| {
                let ms = self.spool_of(s);
                let pick = |f: &dyn Fn(&Measurement, &SpoolDetail) -> f64| {
                    median(&ms.iter().map(|(m, d)| f(m, d)).collect::<Vec<_>>())
                };
                let ratios: Vec<f64> = ms.iter().map(|(_, d)| d.ratio).collect();
                SpoolRow {
                    scenario: s,
                    label: s.label(),
                    rounds: ms.len(),
                    queued_msgs_per_sec: pick(&|_, d| d.queued_msgs_per_sec),
                    buffered_msgs_per_sec: pick(&|_, d| d.buffered_msgs_per_sec),
                    ratio: median(&ratios),
                    ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
                    ratio_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    queued_p50_ms: pick(&|_, d| d.queued_p50_ms),
                    queued_p99_ms: pick(&|_, d| d.queued_p99_ms),
                    buffered_p50_ms: pick(&|m, _| m.p50_ms),
                    buffered_p99_ms: pick(&|m, _| m.p99_ms),
                    queued_cpu: cpu_median(ms.iter().map(|(_, d)| d.queued_cpu)),
                    buffered_cpu: cpu_median(ms.iter().map(|(m, _)| m.cpu)),
                    spool_records: pick(&|_, d| d.spool_records as f64),
                    spool_bytes_per_record: pick(&|_, d| {
                        d.spool_bytes as f64 / d.spool_records.max(1) as f64
                    }),
                    restart_secs: pick(&|_, d| d.restart_secs),
                    replay_start_secs: pick(&|_, d| d.replay_start_secs),
                    drain_secs: pick(&|_, d| d.drain_secs),
                    drain_msgs_per_sec: pick(&|_, d| d.drain_msgs_per_sec),
                    replay_msgs_per_sec: pick(&|_, d| d.replay_msgs_per_sec),
                    drain_cpu: cpu_median(ms.iter().map(|(_, d)| d.drain_cpu)),
                    drain_wal_bytes_per_msg: pick(&|_, d| d.drain_wal_bytes_per_msg),
                    rss_before_replay_mib: ms
                        .iter()
                        .filter_map(|(_, d)| d.peak_rss_before_replay_mib)
                        .fold(f64::NAN, f64::max),
                    peak_rss_mib: ms
                        .iter()
                        .filter_map(|(m, _)| m.peak_rss_mib)
                        .fold(f64::NAN, f64::max),
                    errors: ms.iter().map(|(m, _)| m.errors).sum(),
                    unexpected_verdicts: ms.iter().map(|(m, _)| m.not_queued).sum(),
                    unverified: ms.iter().filter(|(m, _)| !m.verified).count(),
                    items_checked: ms.iter().map(|(_, d)| d.check.acknowledged).sum(),
                }
            })
            .collect()
    }

    /// One row per consuming scenario: medians over rounds, and the ratio to push-only.
    pub fn consume_rows(&self) -> Vec<ConsumeRow> {
        self.scenarios_where(Kind::is_consuming)
            .into_iter()
            .map(|s| {
                let ms = self.consume_of(s);
                let pick = |f: &dyn Fn(&Measurement, &ConsumeDetail) -> f64| {
                    median(&ms.iter().map(|(m, d)| f(m, d)).collect::<Vec<_>>())
                };
                let rates: Vec<f64> = ms.iter().map(|(m, _)| m.msgs_per_sec).collect();
                let push_only = Scenario {
                    kind: Kind::Broker { batch: 100 },
                    ..s
                };
                let e2e = |f: fn(&Latency) -> f64| {
                    pick(&move |_, d| d.end_to_end_ms.as_ref().map_or(f64::NAN, f))
                };
                let push_only_cpu: HashMap<usize, f64> = self
                    .of(push_only)
                    .iter()
                    .map(|m| (m.round, broker_pg_us(m)))
                    .collect();
                let cpu_ratios: Vec<f64> = ms
                    .iter()
                    .filter_map(|(m, _)| {
                        let base = push_only_cpu.get(&m.round)?;
                        (*base > 0.0 && base.is_finite()).then(|| broker_pg_us(m) / base)
                    })
                    .collect();
                let cpu_ratio = median(&cpu_ratios);
                let push =
                    |i: usize| pick(&move |_, d| d.push_ms.map_or(f64::NAN, |t| [t.0, t.1][i]));
                ConsumeRow {
                    scenario: s,
                    label: s.label(),
                    rounds: ms.len(),
                    consumers: ms.first().map_or(0, |(_, d)| d.consumers),
                    consumed_msgs_per_sec: median(&rates),
                    consumed_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
                    consumed_max: rates.iter().copied().fold(0.0, f64::max),
                    produced_msgs_per_sec: pick(&|_, d| d.produced_msgs_per_sec),
                    offered_msgs_per_sec: pick(&|_, d| d.offered_msgs_per_sec.unwrap_or(f64::NAN)),
                    consumed_vs_offered: pick(&|m, d| {
                        m.msgs_per_sec / d.offered_msgs_per_sec.unwrap_or(f64::NAN)
                    }),
                    vs_push_only: self.versus(s, push_only),
                    push_only_msgs_per_sec: median(
                        &self
                            .of(push_only)
                            .iter()
                            .map(|m| m.msgs_per_sec)
                            .collect::<Vec<_>>(),
                    ),
                    msgs_per_pop: pick(&|_, d| d.msgs_per_pop),
                    pop_p50_ms: pick(&|_, d| d.pop_ms.0),
                    pop_p99_ms: pick(&|_, d| d.pop_ms.1),
                    ack_p50_ms: pick(&|_, d| d.ack_ms.0),
                    ack_p99_ms: pick(&|_, d| d.ack_ms.1),
                    cycle_p50_ms: pick(&|_, d| d.cycle_ms.0),
                    cycle_p99_ms: pick(&|_, d| d.cycle_ms.1),
                    push_p50_ms: push(0),
                    push_p99_ms: push(1),
                    end_to_end_p50_ms: e2e(|l| l.p50),
                    end_to_end_p90_ms: e2e(|l| l.p90),
                    end_to_end_p99_ms: e2e(|l| l.p99),
                    end_to_end_max_ms: e2e(|l| l.max),
                    backlog_at_end: pick(&|_, d| d.backlog_at_end as f64),
                    drain_secs: pick(&|_, d| d.drain_secs),
                    kept_up_rounds: ms.iter().filter(|(_, d)| d.kept_up == Some(true)).count(),
                    cpu: cpu_median(ms.iter().map(|(m, _)| m.cpu)),
                    cpu_us_per_msg: pick(&|m, _| m.cpu.ours() / m.msgs_per_sec * 1e6),
                    broker_pg_us_per_msg: pick(&|m, _| broker_pg_us(m)),
                    push_only_broker_pg_us_per_msg: median(
                        &self
                            .of(push_only)
                            .iter()
                            .map(|m| broker_pg_us(m))
                            .collect::<Vec<_>>(),
                    ),
                    broker_pg_cpu_vs_push_only: cpu_ratio.is_finite().then_some(cpu_ratio),
                    wal_bytes_per_msg: pick(&|m, _| m.wal_bytes_per_msg),
                    peak_rss_mib: ms
                        .iter()
                        .filter_map(|(m, _)| m.peak_rss_mib)
                        .fold(f64::NAN, f64::max),
                    errors: ms.iter().map(|(m, _)| m.errors).sum(),
                    duplicates: ms.iter().map(|(_, d)| d.check.duplicates).sum(),
                    lost: ms.iter().map(|(_, d)| d.check.lost).sum(),
                    unverified: ms.iter().filter(|(m, _)| !m.verified).count(),
                    consumed_total: ms.iter().map(|(_, d)| d.consumed_total).sum(),
                }
            })
            .collect()
    }

    /// The consuming targets ("Consuming as fast as producing"), at `partitions`, dedup on:
    /// pop+ack and end-to-end against push-only, the paced runs at 5 % and 50 %, the long-poll
    /// wake-up, and the CPU per consumed message against the CPU per pushed one.
    fn consume_targets(&self, partitions: u64) -> Vec<Target> {
        let at = |kind| Scenario {
            kind,
            partitions,
            dedup: true,
        };
        let rows = self.consume_rows();
        let row = |s: Scenario| rows.iter().find(|r| r.scenario == s);
        let mut out = Vec::new();
        let pop_ack = at(Kind::PopAck { batch: 100 });
        if let Some(r) = row(pop_ack).and_then(|r| r.vs_push_only.map(|v| (r, v))) {
            let (r, v) = r;
            out.push(Target {
                name: format!("pop+ack msg/s vs push-only, batch 100, {partitions} partitions"),
                value: v.throughput,
                goal: "≥ 1.00×".into(),
                met: v.throughput >= 1.0,
                note: format!(
                    "{} vs {} msg/s",
                    kilo(r.consumed_msgs_per_sec),
                    kilo(r.push_only_msgs_per_sec)
                ),
            });
        }
        if let Some(r) = row(pop_ack) {
            if let Some(c) = r.broker_pg_cpu_vs_push_only {
                out.push(Target {
                    name: "broker + PostgreSQL CPU per consumed message (pop+ack) vs per pushed message".into(),
                    value: c,
                    goal: "≤ 1.00×".into(),
                    met: c <= 1.0,
                    note: format!(
                        "{:.1} µs vs {:.1} µs",
                        r.broker_pg_us_per_msg, r.push_only_broker_pg_us_per_msg
                    ),
                });
            }
        }
        let e2e = at(Kind::EndToEnd {
            batch: 100,
            pace_pct: 0,
        });
        if let Some(r) = row(e2e).and_then(|r| r.vs_push_only.map(|v| (r, v))) {
            let (r, v) = r;
            out.push(Target {
                name: format!(
                    "end-to-end consumed msg/s vs push-only, batch 100, {partitions} partitions"
                ),
                value: v.throughput,
                goal: "≥ 0.60×".into(),
                met: v.throughput >= 0.6,
                note: format!(
                    "end-to-end latency p50 {:.1} ms, p99 {:.1} ms",
                    r.end_to_end_p50_ms, r.end_to_end_p99_ms
                ),
            });
        }
        let paced = |pct: u32| {
            row(at(Kind::EndToEnd {
                batch: crate::scenario::paced_push_batch(pct),
                pace_pct: pct,
            }))
        };
        if let Some(r) = paced(5) {
            out.push(Target {
                name: "paced at 5 % of push-only: end-to-end p99 ms (and p50 < 20 ms)".into(),
                value: r.end_to_end_p99_ms,
                goal: "p50 < 20 ms, p99 < 100 ms".into(),
                met: r.end_to_end_p50_ms < 20.0 && r.end_to_end_p99_ms < 100.0,
                note: format!(
                    "p50 {:.1} ms; consumed ÷ offered {:.2}",
                    r.end_to_end_p50_ms, r.consumed_vs_offered
                ),
            });
        }
        if let Some(r) = paced(50) {
            out.push(Target {
                name: "paced at 50 % of push-only: end-to-end p99 ms, every message consumed".into(),
                value: r.end_to_end_p99_ms,
                goal: "kept up in every round, p99 < 250 ms".into(),
                met: r.kept_up_rounds == r.rounds && r.end_to_end_p99_ms < 250.0,
                note: format!(
                    "kept up in {}/{} rounds (drain ≤ {} s after the window); consumed ÷ offered {:.2}; backlog at the window's end {}",
                    r.kept_up_rounds,
                    r.rounds,
                    crate::measurement::KEPT_UP_DRAIN_SECS,
                    r.consumed_vs_offered,
                    kilo(r.backlog_at_end)
                ),
            });
        }
        if let Some(w) = self
            .wakeup_rows()
            .into_iter()
            .find(|w| w.scenario == at(Kind::Wakeup))
        {
            out.push(Target {
                name: "long-poll wake-up, push answered → pop answered, p99 ms".into(),
                value: w.wake_ms.p99,
                goal: "< 50 ms".into(),
                met: w.wake_ms.p99 < 50.0 && w.unverified == 0,
                note: format!("p50 {:.1} ms, {} samples", w.wake_ms.p50, w.woken),
            });
        }
        out
    }

    /// One row per long-poll wake-up scenario: medians of the rounds' percentiles.
    pub fn wakeup_rows(&self) -> Vec<WakeupRow> {
        self.scenarios_where(|k| matches!(k, Kind::Wakeup))
            .into_iter()
            .map(|s| {
                let ms: Vec<(&Measurement, &WakeupDetail)> = self
                    .of(s)
                    .into_iter()
                    .filter_map(|m| match &m.detail {
                        Some(Detail::Wakeup(d)) => Some((m, d)),
                        _ => None,
                    })
                    .collect();
                let lat = |f: fn(&WakeupDetail) -> Latency| {
                    latency_median(&ms.iter().map(|(_, d)| f(d)).collect::<Vec<_>>())
                };
                WakeupRow {
                    scenario: s,
                    label: s.label(),
                    rounds: ms.len(),
                    samples: ms.first().map_or(0, |(_, d)| d.samples),
                    woken: ms.iter().map(|(_, d)| d.woken).sum(),
                    before_push_answer: ms.iter().map(|(_, d)| d.before_push_answer).sum(),
                    wake_ms: lat(|d| d.wake_ms),
                    from_push_sent_ms: lat(|d| d.from_push_sent_ms),
                    push_ms: lat(|d| d.push_ms),
                    unverified: ms.iter().filter(|(m, _)| !m.verified).count(),
                }
            })
            .collect()
    }

    /// The issue's targets, evaluated at `partitions` (100 when measured).
    pub fn targets(&self, partitions: u64) -> Vec<Target> {
        let broker = |batch, dedup| Scenario {
            kind: Kind::Broker { batch },
            partitions,
            dedup,
        };
        let base = |kind, dedup| Scenario {
            kind,
            partitions,
            dedup,
        };
        let mut out = Vec::new();
        if let Some(r) = self.ratio(broker(100, true), base(Kind::SegmentRows, true)) {
            let mut notes = Vec::new();
            if let Some(c) = self.cpu_ratio(broker(100, true), base(Kind::SegmentRows, true)) {
                notes.push(format!("per CPU-second vs (1): {c:.2}×"));
            }
            if let Some(p) = self.ratio(broker(100, true), base(Kind::SegmentTxn, true)) {
                notes.push(format!("vs (1+) the broker's transaction by SQL: {p:.2}×"));
            }
            let txn = notes.join("; ");
            out.push(Target {
                name: format!("batch 100, {partitions} partitions, dedup on vs baseline (1)"),
                value: r,
                goal: "≥ 0.70×".into(),
                met: r >= 0.70,
                note: txn,
            });
        }
        if let Some(r) = self.ratio(broker(100, false), base(Kind::Naive, true)) {
            let mut notes = Vec::new();
            if let Some(c) = self.cpu_ratio(broker(100, false), base(Kind::Naive, true)) {
                notes.push(format!("per CPU-second vs (2): {c:.2}×"));
            }
            if let Some(p) = self.ratio(broker(100, false), base(Kind::Naive, false)) {
                notes.push(format!("vs (2') naive without the unique index: {p:.2}×"));
            }
            let plain = notes.join("; ");
            out.push(Target {
                name: format!("batch 100, {partitions} partitions, dedup off vs naive (2)"),
                value: r,
                goal: "≥ 1.00×".into(),
                met: r >= 1.0,
                note: plain,
            });
        }
        if let Some(r) = self.ratio(broker(1, true), broker(100, true)) {
            let note = self
                .ratio(broker(1, false), broker(100, false))
                .map_or(String::new(), |off| format!("with dedup off: {off:.2}×"));
            out.push(Target {
                name: format!("batch 1 vs batch 100 ({partitions} partitions, dedup on)"),
                value: r,
                goal: "≥ 0.20×".into(),
                met: r >= 0.20,
                note,
            });
        }
        if let Some(r) = self.ratio(broker(1, true), base(Kind::SingleCommits, true)) {
            // Queen 0.15 commits each push request on its own and does more per push than (3)'s
            // one INSERT, so it stays below (3): the issue's Queen figures on these machines
            // (≈ 5–8k msg/s at batch 1, 64 connections) are 0.3–0.5× of (3) measured here
            // (13.6–16.9k), so the issue's "≥ 5× Queen" is about ≥ 2× (3). The p99 is part of
            // the goal.
            let p99 = median(
                &self
                    .of(broker(1, true))
                    .iter()
                    .map(|m| m.p99_ms)
                    .collect::<Vec<_>>(),
            );
            out.push(Target {
                name: format!(
                    "batch 1 vs one row per commit (3), same connections ({partitions} partitions, dedup on)"
                ),
                value: r,
                goal: "≥ 2.00×, p99 < 10 ms".into(),
                met: r >= 2.0 && p99 < 10.0,
                note: format!("batch 1 p99 {p99:.1} ms"),
            });
        }
        for batch in [100, 1] {
            let sp = self.spool_of(Scenario {
                kind: Kind::Spool { batch },
                partitions,
                dedup: true,
            });
            if sp.is_empty() {
                continue;
            }
            let ratios: Vec<f64> = sp.iter().map(|(_, d)| d.ratio).collect();
            let r = median(&ratios);
            let drain = median(
                &sp.iter()
                    .map(|(_, d)| d.drain_msgs_per_sec)
                    .collect::<Vec<_>>(),
            );
            out.push(Target {
                name: format!(
                    "spool: buffered vs queued msg/s, batch {batch}, {partitions} partitions (same broker)"
                ),
                value: r,
                goal: "≥ 0.50×".into(),
                met: r >= 0.50,
                note: format!(
                    "per round {}; drain after restart {} records/s",
                    ratios
                        .iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    kilo(drain)
                ),
            });
        }
        out.extend(self.consume_targets(partitions));
        let b1 = self.of(broker(1, true));
        if !b1.is_empty() {
            let p99 = median(&b1.iter().map(|m| m.p99_ms).collect::<Vec<_>>());
            out.push(Target {
                name: format!("batch 1 p99 latency ({partitions} partitions, dedup on)"),
                value: p99,
                goal: "< 20 ms".into(),
                met: p99 < 20.0,
                note: "milliseconds".into(),
            });
        }
        let rss = self
            .all
            .iter()
            .filter(|m| matches!(m.scenario.kind, Kind::Broker { .. }))
            .filter_map(|m| m.peak_rss_mib.map(|r| (r, m.scenario)))
            .fold(None, |acc: Option<(f64, Scenario)>, (r, s)| match acc {
                Some((best, _)) if best >= r => acc,
                _ => Some((r, s)),
            });
        if let Some((mib, s)) = rss {
            out.push(Target {
                name: "broker peak RSS (highest of all push runs)".into(),
                value: mib * 1.048_576,
                goal: "≤ 50 MB".into(),
                met: mib * 1.048_576 <= 50.0,
                note: {
                    let small = self
                        .all
                        .iter()
                        .filter(|m| matches!(m.scenario.kind, Kind::Broker { .. }))
                        .filter(|m| m.scenario.partitions <= 100)
                        .filter_map(|m| m.peak_rss_mib)
                        .fold(f64::NAN, f64::max);
                    if small.is_finite() && s.partitions > 100 {
                        format!(
                            "MB, in {}; highest with ≤ 100 partitions: {:.1} MB",
                            s.label(),
                            small * 1.048_576
                        )
                    } else {
                        format!("MB, in {}", s.label())
                    }
                },
            });
        }
        out
    }
}

/// One of the issue's targets.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value (ratio, ms or MB).
    pub value: f64,
    /// The goal as text.
    pub goal: String,
    /// Whether it is met.
    pub met: bool,
    /// Extra context.
    pub note: String,
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// "throughput ratio (per-CPU ratio)".
fn vs(v: Option<Versus>) -> String {
    match v {
        None => "-".into(),
        Some(Versus {
            throughput,
            per_cpu: Some(c),
        }) => format!("{throughput:.2} ({c:.2})"),
        Some(v) => format!("{:.2}", v.throughput),
    }
}

pub(crate) fn kilo(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// The results table, as Markdown (readable as plain text too).
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push_str("| scenario | msg/s (median) | min–max | p50 ms | p99 ms | msg/segment | broker RSS MB | CPU cores broker/pg/load/other | CPU µs/msg | WAL B/msg | vs (1) | vs (1+) | vs (2) | vs (2') |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let mut flags = String::new();
        if r.errors > 0 || r.not_queued > 0 {
            let _ = write!(flags, " ⚠{} err/{} not queued", r.errors, r.not_queued);
        }
        if r.unverified > 0 {
            let _ = write!(flags, " ⚠unverified×{}", r.unverified);
        }
        let _ = writeln!(
            out,
            "| `{}`{} | {} | {}–{} | {:.1} | {:.1} | {} | {} | {:.2}/{:.2}/{:.2}/{:.2} | {} | {} | {} | {} | {} | {} |",
            r.label,
            flags,
            kilo(r.msgs_per_sec),
            kilo(r.msgs_per_sec_min),
            kilo(r.msgs_per_sec_max),
            r.p50_ms,
            r.p99_ms,
            opt(r.msgs_per_segment, 1),
            opt(r.peak_rss_mib.map(|m| m * 1.048_576), 1),
            r.cpu.broker,
            r.cpu.postgres,
            r.cpu.load,
            r.cpu.other,
            num(r.cpu_us_per_msg, 0),
            num(r.wal_bytes_per_msg, 0),
            vs(r.vs_segments),
            vs(r.vs_segment_txn),
            vs(r.vs_naive),
            vs(r.vs_naive_plain),
        );
    }
    out
}

/// The targets, one line each.
pub fn targets_text(targets: &[Target]) -> String {
    let mut out = String::new();
    for t in targets {
        let _ = writeln!(
            out,
            "- [{}] {}: {:.2} (goal {}){}",
            if t.met { "met" } else { "MISSED" },
            t.name,
            t.value,
            t.goal,
            if t.note.is_empty() {
                String::new()
            } else {
                format!(" — {}", t.note)
            }
        );
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart of msg/s (median, with the rounds' min–max as a whisker), grouped by
/// partitions and dedup; baselines in grey, the broker in blue.
pub fn svg(rows: &[Row], title: &str) -> String {
    let mut groups: Vec<(u64, bool)> = Vec::new();
    for r in rows {
        if matches!(r.scenario.kind, Kind::Broker { .. } | Kind::SegmentRows)
            && !groups.contains(&(r.scenario.partitions, r.scenario.dedup))
        {
            groups.push((r.scenario.partitions, r.scenario.dedup));
        }
    }
    let find = |kind: Kind, p: u64, d: bool| {
        rows.iter().find(|r| {
            r.scenario.kind == kind && r.scenario.partitions == p && r.scenario.dedup == d
        })
    };
    let mut batches: Vec<usize> = rows
        .iter()
        .filter_map(|r| match r.scenario.kind {
            Kind::Broker { batch } => Some(batch),
            _ => None,
        })
        .collect();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    batches.dedup();

    struct Bar<'a> {
        label: String,
        row: &'a Row,
        color: &'static str,
    }
    let mut layout: Vec<(String, Vec<Bar>)> = Vec::new();
    for &(p, d) in &groups {
        let mut bars = Vec::new();
        if let Some(r) = find(Kind::SegmentRows, p, d) {
            bars.push(Bar {
                label: "(1) segment rows, SQL".into(),
                row: r,
                color: "#8d8d8d",
            });
        }
        if let Some(r) = find(Kind::SegmentTxn, p, d) {
            bars.push(Bar {
                label: "(1+) broker's txn, SQL".into(),
                row: r,
                color: "#b0b0b0",
            });
        }
        // (2) is the naive baseline for both dedup settings; (2') only applies without dedup.
        let naive: &[bool] = if d { &[true] } else { &[true, false] };
        for &unique in naive {
            if let Some(r) = find(Kind::Naive, p, unique) {
                let label = if unique {
                    "(2) naive + unique index"
                } else {
                    "(2') naive, no index"
                };
                bars.push(Bar {
                    label: label.into(),
                    row: r,
                    color: if unique { "#d6d6d6" } else { "#e8e8e8" },
                });
            }
        }
        for (n, b) in batches.iter().enumerate() {
            if let Some(r) = find(Kind::Broker { batch: *b }, p, d) {
                let color = ["#0d47a1", "#1976d2", "#64b5f6", "#90caf9"][n.min(3)];
                bars.push(Bar {
                    label: format!("broker, batch {b}"),
                    row: r,
                    color,
                });
            }
        }
        let name = format!(
            "{p} partition{}, dedup {}",
            if p == 1 { "" } else { "s" },
            if d { "on" } else { "off" }
        );
        layout.push((name, bars));
    }
    let max = rows.iter().map(|r| r.msgs_per_sec_max).fold(1.0, f64::max);
    let step = nice_step(max / 6.0);
    let top = (max / step).ceil() * step;

    let (width, left, right, bar_h, gap, group_gap, head) =
        (980.0, 230.0, 90.0, 15.0, 3.0, 30.0, 70.0);
    let plot_w = width - left - right;
    let n_bars: usize = layout.iter().map(|(_, b)| b.len()).sum();
    let height = head + layout.len() as f64 * group_gap + n_bars as f64 * (bar_h + gap) + 40.0;
    let x = |v: f64| left + v / top * plot_w;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/><text x="{left}" y="24" font-size="15" font-weight="bold">{}</text><text x="{left}" y="42" fill="#555">messages stored per second (median of rounds; whisker: lowest–highest round)</text>"##,
        esc(title)
    );
    let axis_bottom = height - 30.0;
    let mut t = 0.0;
    while t <= top + step / 2.0 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{head}" x2="{xx:.1}" y2="{axis_bottom:.1}" stroke="#e6e6e6"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            axis_bottom + 16.0,
            if t >= 1000.0 {
                format!("{}k", t / 1000.0)
            } else {
                format!("{t}")
            }
        );
        t += step;
    }
    let mut y = head;
    for (name, bars) in &layout {
        y += group_gap;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{:.1}" font-weight="bold">{}</text>"#,
            y - 8.0,
            esc(name)
        );
        for bar in bars {
            let r = bar.row;
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{left}" y="{y:.1}" width="{:.1}" height="{bar_h}" fill="{}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" fill="#222">{}</text>"##,
                left - 8.0,
                y + bar_h - 3.0,
                esc(&bar.label),
                (x(r.msgs_per_sec) - left).max(0.5),
                bar.color,
                x(r.msgs_per_sec_min),
                y + bar_h / 2.0,
                x(r.msgs_per_sec_max),
                y + bar_h / 2.0,
                x(r.msgs_per_sec_max) + 5.0,
                y + bar_h - 3.0,
                kilo(r.msgs_per_sec)
            );
            y += bar_h + gap;
        }
    }
    s.push_str("</svg>\n");
    s
}

fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if raw <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

/// What went wrong in a measurement, as the indented lines after its progress line ("" when
/// nothing did).
pub fn problems_suffix(problems: &[String]) -> String {
    if problems.is_empty() {
        String::new()
    } else {
        format!("\n      ! {}", problems.join("\n      ! "))
    }
}

/// One line about a measurement's scenario-specific results (for the progress output).
pub fn detail_line(m: &Measurement) -> Option<String> {
    match &m.detail {
        Some(Detail::Spool(d)) => Some(format!(
            "queued {} msg/s (p99 {} ms) → buffered {} msg/s: {:.2}×; spool {} records, PostgreSQL back after {:.1} s, drained in {:.1} s: {} records/s (replay {} /s after {:.1} s); {} acknowledged items stored exactly once: {}",
            kilo(d.queued_msgs_per_sec),
            num(d.queued_p99_ms, 1),
            kilo(d.buffered_msgs_per_sec),
            d.ratio,
            d.spool_records,
            d.restart_secs,
            d.drain_secs,
            kilo(d.drain_msgs_per_sec),
            kilo(d.replay_msgs_per_sec),
            d.replay_start_secs,
            d.check.acknowledged,
            d.check.ok()
        )),
        Some(Detail::Consume(d)) => Some(format!(
            "consumed {} msg/s, pushed {} msg/s, {:.1} msg/pop, pop p50/p99 {}/{} ms, ack {}/{} ms{}{}; consumed {} (committed offsets {}), duplicates {}, {}",
            kilo(d.consumed_msgs_per_sec),
            kilo(d.produced_msgs_per_sec),
            d.msgs_per_pop,
            num(d.pop_ms.0, 1),
            num(d.pop_ms.1, 1),
            num(d.ack_ms.0, 1),
            num(d.ack_ms.1, 1),
            d.end_to_end_ms.map_or(String::new(), |t| format!(
                ", end-to-end p50/p90/p99/max {:.1}/{:.1}/{:.1}/{:.0} ms{}",
                t.p50,
                t.p90,
                t.p99,
                t.max,
                d.segment_msgs.map_or(String::new(), |(p10, p50, p90)| format!(
                    ", segments written p10/p50/p90 {p10:.0}/{p50:.0}/{p90:.0} msgs"
                ))
            )),
            if d.drain_secs.is_finite() {
                format!(
                    ", backlog {} drained in {:.1} s{}",
                    d.backlog_at_end,
                    d.drain_secs,
                    match d.kept_up {
                        Some(true) => ", kept up",
                        Some(false) => ", did not keep up",
                        None => "",
                    }
                )
            } else {
                String::new()
            },
            d.consumed_total,
            d.committed_offsets,
            d.check.duplicates,
            if d.prefilled > 0 {
                format!("{} left in the queue", d.check.lost)
            } else {
                format!("lost {}", d.check.lost)
            }
        )),
        Some(Detail::Wakeup(d)) => Some(format!(
            "{} of {} waiting pops woken; push answered → pop answered p50/p90/p99/max {}/{}/{}/{} ms (push p50 {} ms)",
            d.woken,
            d.samples,
            num(d.wake_ms.p50, 1),
            num(d.wake_ms.p90, 1),
            num(d.wake_ms.p99, 1),
            num(d.wake_ms.max, 1),
            num(d.push_ms.p50, 1)
        )),
        Some(Detail::Brokers(d)) => Some(format!(
            "{} broker(s): pushed {} msg/s (per broker {}){}; {:.0} commits/s of {:.0} items in {:.1} segments; PostgreSQL {:.2} core-s per 100k msgs; {} acknowledged: {} lost, {} twice, {} out of order",
            d.brokers,
            kilo(d.pushed_msgs_per_sec),
            d.pushed_per_broker.iter().map(|r| kilo(*r)).collect::<Vec<_>>().join("/"),
            d.consumed_msgs_per_sec.map_or(String::new(), |c| format!(
                ", consumed {} msg/s ({:.1} msg/pop, {:.0} empty pops/s), drained in {:.1} s",
                kilo(c),
                d.msgs_per_pop,
                d.empty_pops_per_sec,
                d.drain_secs
            )),
            d.commits_per_sec,
            d.items_per_commit,
            d.segments_per_commit,
            d.pg_cpu_per_100k_msgs,
            d.check.acknowledged,
            d.check.lost,
            d.check.duplicates,
            d.order_violations
        )),
        None => None,
    }
}
