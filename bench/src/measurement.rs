//! What one measurement produced: [`Measurement`] (the fields every scenario fills) and its
//! scenario-specific [`Detail`] (spool, consuming), plus the counters read at both ends of a
//! window. Below the suites and the report, which all build or read these.

use std::time::Instant;

use serde::Serialize;

use crate::db::{self, Server};
use crate::measure::{CpuTargets, CpuUse};
use crate::profile::Profile;
use crate::scenario::Scenario;
use crate::traffic;
use crate::BoxError;

/// The result of one measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// What ran.
    pub scenario: Scenario,
    /// Which round (0-based).
    pub round: usize,
    /// Messages stored per second inside the window.
    pub msgs_per_sec: f64,
    /// Requests (broker) or transactions (baselines) per second.
    pub ops_per_sec: f64,
    /// Median latency of a request or transaction.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// Average messages per segment row committed in the window (segments layouts).
    pub msgs_per_segment: Option<f64>,
    /// The broker's peak RSS in MiB.
    pub peak_rss_mib: Option<f64>,
    /// Cores used in the window, by party.
    pub cpu: CpuUse,
    /// WAL bytes per stored message in the window.
    pub wal_bytes_per_msg: f64,
    /// Failed requests or transactions.
    pub errors: u64,
    /// Items answered with another verdict than `queued`.
    pub not_queued: u64,
    /// What went wrong first, if anything did, and broker warnings.
    pub problems: Vec<String>,
    /// Whether the database holds exactly the messages reported stored.
    pub verified: bool,
    /// Where the time went (with `--profile`).
    pub profile: Option<Profile>,
    /// What the spool and consuming scenarios measure beyond the common fields.
    pub detail: Option<Detail>,
}

/// Scenario-specific results.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detail {
    /// [`crate::scenario::Kind::Spool`].
    Spool(SpoolDetail),
    /// [`crate::scenario::Kind::PopAck`] and [`crate::scenario::Kind::EndToEnd`].
    Consume(ConsumeDetail),
    /// [`crate::scenario::Kind::Wakeup`].
    Wakeup(WakeupDetail),
    /// [`crate::scenario::Kind::Brokers`].
    Brokers(BrokersDetail),
}

/// After the producers stop, the longest drain that still counts as "kept up".
pub const KEPT_UP_DRAIN_SECS: f64 = 1.0;

/// Percentiles of a latency, ms.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Highest.
    pub max: f64,
}

impl Latency {
    /// The percentiles of `samples` (NaN when empty).
    pub fn of(samples: &mut [std::time::Duration]) -> Self {
        Self {
            p50: traffic::percentile_ms(samples, 50.0),
            p90: traffic::percentile_ms(samples, 90.0),
            p99: traffic::percentile_ms(samples, 99.0),
            max: traffic::percentile_ms(samples, 100.0),
        }
    }
}

/// What the long-poll wake-up measurement found.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupDetail {
    /// Samples taken (push, then the waiting pop's answer).
    pub samples: usize,
    /// Pops that brought the pushed message.
    pub woken: usize,
    /// Pops answered before the push's answer reached the bench (counted as 0 ms).
    pub before_push_answer: usize,
    /// Push answered → pop answered.
    pub wake_ms: Latency,
    /// Push sent → pop answered.
    pub from_push_sent_ms: Latency,
    /// Push request latency.
    pub push_ms: Latency,
}

/// What the spool scenario measured besides the buffered window (the main figures).
#[derive(Clone, Debug, Serialize)]
pub struct SpoolDetail {
    /// msg/s answered `queued` in the window before the outage (same broker process).
    pub queued_msgs_per_sec: f64,
    /// p50 request latency in that window, ms.
    pub queued_p50_ms: f64,
    /// p99 request latency in that window, ms.
    pub queued_p99_ms: f64,
    /// Cores used in that window.
    pub queued_cpu: CpuUse,
    /// msg/s answered `buffered` in the window during the outage.
    pub buffered_msgs_per_sec: f64,
    /// buffered ÷ queued.
    pub ratio: f64,
    /// Seconds `pg_ctl stop -m immediate` took.
    pub stop_secs: f64,
    /// Items answered `queued` over the whole run (outside the windows too).
    pub queued_total: u64,
    /// Items answered `buffered` over the whole run.
    pub buffered_total: u64,
    /// Spool depth (records) when PostgreSQL came back.
    pub spool_records: u64,
    /// Spool bytes on disk at that moment.
    pub spool_bytes: u64,
    /// The broker's peak RSS (MiB) when PostgreSQL came back, i.e. before any replay.
    pub peak_rss_before_replay_mib: Option<f64>,
    /// Seconds `pg_ctl start` took (crash recovery included) until it accepted connections.
    pub restart_secs: f64,
    /// Seconds from PostgreSQL accepting connections to the first replayed batch seen.
    pub replay_start_secs: f64,
    /// Seconds from PostgreSQL accepting connections to an empty spool.
    pub drain_secs: f64,
    /// Records replayed per second, from PostgreSQL accepting to an empty spool.
    pub drain_msgs_per_sec: f64,
    /// Records replayed per second once replay was under way (first batch seen to empty).
    pub replay_msgs_per_sec: f64,
    /// Cores used while draining.
    pub drain_cpu: CpuUse,
    /// WAL bytes per replayed record.
    pub drain_wal_bytes_per_msg: f64,
    /// Messages stored at the end (priming included).
    pub stored: u64,
    /// Every item checked against its verdict.
    pub check: traffic::Check,
}

/// What the consuming scenarios measured besides the common fields.
#[derive(Clone, Debug, Serialize)]
pub struct ConsumeDetail {
    /// Concurrent consumers.
    pub consumers: usize,
    /// Messages acked per second in the window (the main figure).
    pub consumed_msgs_per_sec: f64,
    /// Messages answered `queued` per second in the window (end-to-end), or while filling
    /// the queue (pop+ack).
    pub produced_msgs_per_sec: f64,
    /// msg/s the paced producers offered (end-to-end, paced).
    pub offered_msgs_per_sec: Option<f64>,
    /// Messages per pop that returned messages.
    pub msgs_per_pop: f64,
    /// Pop request latency, ms (p50, p99).
    pub pop_ms: (f64, f64),
    /// Ack batch request latency, ms (p50, p99).
    pub ack_ms: (f64, f64),
    /// Pop + ack, ms (p50, p99).
    pub cycle_ms: (f64, f64),
    /// Push request latency, ms (p50, p99), end-to-end only.
    pub push_ms: Option<(f64, f64)>,
    /// Push answered `queued` → pop answered, end-to-end only.
    pub end_to_end_ms: Option<Latency>,
    /// Messages whose pop was answered before their push's answer reached the producer
    /// (counted as 0 ms).
    pub popped_before_push_answer: u64,
    /// Pops answered 204 inside the window.
    pub empty_pops: u64,
    /// Messages in the queue before the window (pop+ack).
    pub prefilled: u64,
    /// Pushed but not yet consumed when the window closed (end-to-end).
    pub backlog_at_end: i64,
    /// Seconds the consumers took to drain after the producers stopped (end-to-end).
    pub drain_secs: f64,
    /// End-to-end: every message answered `queued` was consumed exactly once, and what was
    /// left when the producers stopped at the window's end was consumed within
    /// [`KEPT_UP_DRAIN_SECS`] (the consumers kept up with the producers).
    pub kept_up: Option<bool>,
    /// Messages consumed over the whole run (priming included).
    pub consumed_total: u64,
    /// Sum of queue mode's committed offsets (PostgreSQL's view of the same).
    pub committed_offsets: i64,
    /// Leases still live at the end.
    pub live_leases: i64,
    /// Messages per segment written in the window, 10th/50th/90th percentile (end-to-end): what
    /// a consumer reads per row.
    pub segment_msgs: Option<(f64, f64, f64)>,
    /// Every consumed message checked against its push's verdict.
    pub check: traffic::Check,
    /// What the broker's autopilot chose, when the consumers let it (the autopilot suite).
    pub autopilot: Option<AutopilotSeen>,
}

/// What the `autopilot` echoes of one measurement said (answers inside the window).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AutopilotSeen {
    /// Answers with an echo.
    pub answers: u64,
    /// Echoed `batch`: lowest, most frequent, highest.
    pub batch: (u32, u32, u32),
    /// Echoed `partitions`: lowest, most frequent, highest.
    pub partitions: (u32, u32, u32),
    /// Mean `partitionsClaimed` of the answers that delivered.
    pub claimed_per_pop: f64,
    /// Share of the answers that delivered which filled the echoed batch.
    pub full_share: f64,
    /// `waitMs` advised with the empty answers: median and highest (0: none advised).
    pub wait_ms: (u32, u32),
    /// Share of the consumers' time (consumers × window) spent pausing after empty answers as
    /// advised.
    pub paused_share: f64,
    /// The echo of the run's first answer (what the controller started from).
    pub first: Option<traffic::Echo>,
}

impl AutopilotSeen {
    /// The echoes of `logs` inside `w`; `None` when there are none.
    pub fn of(logs: &[traffic::ConsumerLog], w: &crate::measure::Window) -> Option<Self> {
        let seen: Vec<&traffic::EchoSeen> = logs
            .iter()
            .flat_map(|l| &l.echoes)
            .filter(|e| w.contains(e.at))
            .collect();
        if seen.is_empty() {
            return None;
        }
        let spread = |f: fn(&traffic::EchoSeen) -> u32| {
            let mut counts: std::collections::BTreeMap<u32, u64> = Default::default();
            for e in &seen {
                *counts.entry(f(e)).or_default() += 1;
            }
            let most = counts
                .iter()
                .max_by_key(|(v, n)| (**n, std::cmp::Reverse(**v)))
                .map_or(0, |(v, _)| *v);
            let lo = counts.keys().next().copied().unwrap_or(0);
            let hi = counts.keys().next_back().copied().unwrap_or(0);
            (lo, most, hi)
        };
        let delivered: Vec<&&traffic::EchoSeen> = seen.iter().filter(|e| e.msgs > 0).collect();
        let mut waits: Vec<u32> = seen
            .iter()
            .filter(|e| e.msgs == 0)
            .map(|e| e.echo.wait_ms)
            .collect();
        waits.sort_unstable();
        let paused: f64 = logs
            .iter()
            .flat_map(|l| &l.paused)
            .map(|(at, d)| {
                // The part of each pause inside the window.
                let end = (*at + *d).min(w.end);
                let start = (*at).max(w.start);
                end.saturating_duration_since(start).as_secs_f64()
            })
            .sum::<f64>()
            + 0.0; // an empty sum is -0.0
        let first = logs
            .iter()
            .filter_map(|l| l.echoes.first())
            .min_by_key(|e| e.at)
            .map(|e| e.echo);
        Some(Self {
            answers: seen.len() as u64,
            batch: spread(|e| e.echo.batch),
            partitions: spread(|e| e.echo.partitions),
            claimed_per_pop: delivered.iter().map(|e| f64::from(e.claimed)).sum::<f64>()
                / delivered.len().max(1) as f64,
            full_share: delivered.iter().filter(|e| e.msgs >= e.echo.batch).count() as f64
                / delivered.len().max(1) as f64,
            wait_ms: (
                waits.get(waits.len() / 2).copied().unwrap_or(0),
                waits.last().copied().unwrap_or(0),
            ),
            paused_share: paused / (w.secs() * logs.len().max(1) as f64),
            first,
        })
    }
}

/// What a several-brokers measurement found besides the common fields.
#[derive(Clone, Debug, Serialize)]
pub struct BrokersDetail {
    /// Broker processes.
    pub brokers: usize,
    /// Producers and consumers together (else push only).
    pub end_to_end: bool,
    /// Messages answered `queued` per second in the window, per broker.
    pub pushed_per_broker: Vec<f64>,
    /// Messages answered `queued` per second in the window, all brokers.
    pub pushed_msgs_per_sec: f64,
    /// Messages acked per second in the window (end-to-end).
    pub consumed_msgs_per_sec: Option<f64>,
    /// Push commits (transactions of the brokers' committers) per second in the window.
    pub commits_per_sec: f64,
    /// Items per push commit.
    pub items_per_commit: f64,
    /// Segments (partitions) per push commit.
    pub segments_per_commit: f64,
    /// Cores used by PostgreSQL per 100 k messages pushed (its CPU-seconds per 100 k).
    pub pg_cpu_per_100k_msgs: f64,
    /// Highest peak RSS of the brokers, MiB.
    pub max_broker_rss_mib: Option<f64>,
    /// Every message checked against its push's verdict (stored for push; consumed for
    /// end-to-end).
    pub check: traffic::Check,
    /// Messages consumed out of their producer's order within a partition (end-to-end).
    pub order_violations: u64,
    /// Seconds the consumers took to drain after the producers stopped (end-to-end).
    pub drain_secs: f64,
    /// Messages per pop that returned messages, in the window (end-to-end).
    pub msgs_per_pop: f64,
    /// Pops answered 204 (nothing to hand out) per second in the window (end-to-end).
    pub empty_pops_per_sec: f64,
}

/// CPU counters (and, when PostgreSQL is up, the WAL position) at one instant.
pub struct Counters {
    /// CPU ticks by party.
    pub cpu: crate::measure::CpuSnapshot,
    /// When read.
    pub at: Instant,
    /// WAL position and server clock; `None` while PostgreSQL is away.
    pub mark: Option<db::Mark>,
}

impl Counters {
    /// Reads the counters now; the WAL position only with `wal`.
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn read(
        server: &mut Server,
        targets: &CpuTargets,
        wal: bool,
    ) -> Result<Self, BoxError> {
        let cpu = targets.snapshot();
        let at = Instant::now();
        let mark = if wal {
            Some(server.mark().await?)
        } else {
            None
        };
        Ok(Self { cpu, at, mark })
    }

    /// Cores used by party from `self` to `later`.
    pub fn cpu_until(&self, later: &Counters, ticks_per_sec: f64) -> CpuUse {
        let secs = (later.at - self.at).as_secs_f64();
        CpuUse::between(&self.cpu, &later.cpu, secs, ticks_per_sec)
    }

    /// WAL bytes written from `self` to `later` (NaN without both marks).
    ///
    /// # Errors
    ///
    /// Any database error.
    pub async fn wal_until(&self, later: &Counters, server: &mut Server) -> Result<f64, BoxError> {
        match (&self.mark, &later.mark) {
            (Some(a), Some(b)) => server.wal_bytes(a, b).await,
            _ => Ok(f64::NAN),
        }
    }
}

/// A [`Measurement`] with the common fields set and nothing else.
pub fn blank(scenario: Scenario, round: usize) -> Measurement {
    Measurement {
        scenario,
        round,
        msgs_per_sec: 0.0,
        ops_per_sec: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        msgs_per_segment: None,
        peak_rss_mib: None,
        cpu: CpuUse::default(),
        wal_bytes_per_msg: f64::NAN,
        errors: 0,
        not_queued: 0,
        problems: Vec::new(),
        verified: false,
        profile: None,
        detail: None,
    }
}
