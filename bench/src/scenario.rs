//! One measurement, start to finish: a fresh database, the setup its workload needs, a
//! checkpoint, warm-up, the timed window (with CPU and WAL read at both ends), verification,
//! and clean-up. The broker runs as a separate process started for this measurement alone, so
//! its peak RSS (VmHWM) is this scenario's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::load;
use crate::measure::{CpuTargets, CpuUse, Window, WorkerStats};
use crate::profile::{self, Profile};
use crate::BoxError;

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Baseline (1): the broker's rows (segments + dedup sidecar) inserted by SQL.
    SegmentRows,
    /// Baseline (1+): the same rows through the broker's commit transaction, one segment each.
    SegmentTxn,
    /// Baseline (2): one row per message; `dedup` means the unique (partition, txn) index.
    Naive,
    /// The broker, `batch` items per push request.
    Broker {
        /// Items per request.
        batch: usize,
    },
    /// The broker with PostgreSQL taken away: pushes answered `buffered` (spool) against
    /// `queued` with the same broker just before, then the replay's drain rate.
    Spool {
        /// Items per request.
        batch: usize,
    },
    /// Consumers only, on a pre-filled queue: pop `batch` (no long-poll) + ack batch.
    PopAck {
        /// Messages per pop.
        batch: usize,
    },
    /// Producers (push `batch`) and consumers (long-poll pop `batch` + ack batch) together.
    EndToEnd {
        /// Items per push and messages per pop.
        batch: usize,
        /// 0: producers push as fast as they are answered; else they offer this percentage of
        /// the same round's push-only rate (batch `batch`), on a fixed schedule.
        pace_pct: u32,
    },
}

/// A workload: what, on how many partitions, dedup on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Scenario {
    /// What is measured.
    pub kind: Kind,
    /// Partitions written (each request/transaction picks one at random).
    pub partitions: u64,
    /// Dedup on (broker, baseline 1: window 3600 s; baseline 2: the unique index).
    pub dedup: bool,
}

impl Scenario {
    /// A one-line label.
    pub fn label(&self) -> String {
        let d = if self.dedup { "on" } else { "off" };
        let p = self.partitions;
        match self.kind {
            Kind::Broker { batch } => format!("broker, batch {batch}, P={p}, dedup {d}"),
            Kind::Spool { batch } => {
                format!("spool: PostgreSQL down, batch {batch}, P={p}, dedup {d}")
            }
            Kind::PopAck { batch } => format!("pop+ack, batch {batch}, P={p}, dedup {d}"),
            Kind::EndToEnd { batch, pace_pct: 0 } => {
                format!("end-to-end push+pop+ack, batch {batch}, P={p}, dedup {d}")
            }
            Kind::EndToEnd { batch, pace_pct } => format!(
                "end-to-end, producers paced at {pace_pct}% of push-only, batch {batch}, P={p}, dedup {d}"
            ),
            Kind::SegmentRows => format!("(1) segment rows by SQL, P={p}, dedup {d}"),
            Kind::SegmentTxn => format!("(1+) broker's txn by SQL, P={p}, dedup {d}"),
            Kind::Naive if self.dedup => format!("(2) naive + unique index, P={p}"),
            Kind::Naive => format!("(2') naive, no index, P={p}"),
        }
    }
}

/// Parameters shared by every measurement of a run.
pub struct Params {
    /// Concurrent connections of the load generator.
    pub connections: usize,
    /// Connections of the SQL baselines.
    pub baseline_connections: usize,
    /// Messages per baseline transaction.
    pub baseline_batch: usize,
    /// Warm-up before the window.
    pub warmup: Duration,
    /// The window.
    pub duration: Duration,
    /// The broker binary.
    pub broker_bin: PathBuf,
    /// Extra environment for the broker.
    pub broker_env: Vec<(String, String)>,
    /// Clock ticks per second (/proc units).
    pub ticks_per_sec: f64,
    /// Print the time each setup step takes.
    pub verbose: bool,
    /// Collect a profile (pg_stat_statements, backend states, broker commits).
    pub profile: bool,
    /// Concurrent consumers of the consuming scenarios.
    pub consumers: usize,
    /// Messages pushed before the pop+ack window.
    pub prefill: u64,
}

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
    /// [`Kind::Spool`].
    Spool(crate::spool::SpoolDetail),
    /// [`Kind::PopAck`] and [`Kind::EndToEnd`].
    Consume(crate::consume::ConsumeDetail),
}

struct Observed {
    profile: Option<Profile>,
    stats: WorkerStats,
    cpu: CpuUse,
    wal_bytes: f64,
    marks: (db::Mark, db::Mark),
    secs: f64,
}

/// Runs the timed part: waits for the window, reads counters at both ends, joins the workers.
/// With `profile` (the scenario's database name), also collects a [`Profile`].
async fn observe(
    server: &mut Server,
    targets: CpuTargets,
    window: Window,
    workers: Vec<JoinHandle<WorkerStats>>,
    ticks_per_sec: f64,
    profile: Option<&str>,
) -> Result<Observed, BoxError> {
    tokio::time::sleep_until(window.start.into()).await;
    let c0 = targets.snapshot();
    let t0 = Instant::now();
    let m0 = server.mark().await?;
    let sampler = match profile {
        Some(db) => {
            profile::reset_statements(&mut server.admin).await?;
            Some(profile::sample_backends(
                server.admin_url().to_string(),
                db.to_string(),
                window.end,
            ))
        }
        None => None,
    };
    tokio::time::sleep_until(window.end.into()).await;
    let c1 = targets.snapshot();
    let secs = t0.elapsed().as_secs_f64();
    let m1 = server.mark().await?;
    let profile = match (profile, sampler) {
        (Some(db), Some(sampler)) => {
            let statements = profile::top_statements(&mut server.admin, db).await?;
            let (counts, samples) = sampler.await??;
            let (backend_states, backends) = profile::shares(counts, samples);
            Some(Profile {
                statements,
                backend_states,
                backends,
                commits: None,
            })
        }
        _ => None,
    };
    let mut all = Vec::with_capacity(workers.len());
    for w in workers {
        all.push(w.await?);
    }
    let wal_bytes = server.wal_bytes(&m0, &m1).await?;
    Ok(Observed {
        profile,
        stats: WorkerStats::merge(all),
        cpu: CpuUse::between(&c0, &c1, secs, ticks_per_sec),
        wal_bytes,
        marks: (m0, m1),
        secs,
    })
}

fn measurement(
    scenario: Scenario,
    round: usize,
    window: &Window,
    o: &Observed,
    msgs_per_segment: Option<f64>,
) -> Measurement {
    let secs = window.secs();
    let msgs_per_sec = o.stats.msgs as f64 / secs;
    let mut problems = Vec::new();
    if let Some(e) = &o.stats.first_error {
        problems.push(format!("{} errors, first: {e}", o.stats.errors));
    }
    if o.stats.not_queued > 0 {
        problems.push(format!("{} items not queued", o.stats.not_queued));
    }
    Measurement {
        scenario,
        round,
        msgs_per_sec,
        ops_per_sec: o.stats.ops as f64 / secs,
        p50_ms: o.stats.percentile_ms(50.0),
        p99_ms: o.stats.percentile_ms(99.0),
        msgs_per_segment,
        peak_rss_mib: None,
        cpu: o.cpu,
        wal_bytes_per_msg: if o.stats.msgs > 0 {
            // The WAL window is the marks' (a few ms off the counting window): scale by time.
            o.wal_bytes / (msgs_per_sec * o.secs)
        } else {
            f64::NAN
        },
        errors: o.stats.errors,
        not_queued: o.stats.not_queued,
        problems,
        verified: false,
        profile: o.profile.clone(),
        detail: None,
    }
}

pub fn trace(params: &Params, what: &str, since: Instant) {
    if params.verbose {
        eprintln!(
            "      {what}: {:.0} ms",
            since.elapsed().as_secs_f64() * 1000.0
        );
    }
}

/// Measures one scenario once.
///
/// # Errors
///
/// When setup fails (a failing request inside the window is counted, not fatal).
pub async fn run(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    push_only: Option<f64>,
) -> Result<Measurement, BoxError> {
    let t = Instant::now();
    let name = server.create_database().await?;
    trace(params, "create database", t);
    let url = server.url(&name);
    let result = run_in(server, params, scenario, round, &url, &name, push_only).await;
    let t = Instant::now();
    server.drop_database(&name).await?;
    trace(params, "drop database", t);
    result
}

async fn run_in(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    url: &str,
    name: &str,
    push_only: Option<f64>,
) -> Result<Measurement, BoxError> {
    let profiled = params.profile.then_some(name);
    match scenario.kind {
        Kind::Spool { batch } => {
            return crate::spool::run(server, params, scenario, round, url, batch).await
        }
        Kind::PopAck { batch } => {
            let run = crate::consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            return crate::consume::pop_ack(server, params, run, batch).await;
        }
        Kind::EndToEnd { batch, pace_pct } => {
            let run = crate::consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            let pace = match (pace_pct, push_only) {
                (0, _) => None,
                (pct, Some(rate)) => Some(rate * f64::from(pct) / 100.0),
                (_, None) => {
                    return Err(
                        "a paced end-to-end run needs the same round's push-only rate".into(),
                    )
                }
            };
            return crate::consume::end_to_end(server, params, run, batch, pace).await;
        }
        _ => {}
    }
    let mut conn = PgConnection::connect(url).await?;
    let tag = crate::data::fresh_seed();
    let m = match scenario.kind {
        Kind::Broker { batch } => {
            let t = Instant::now();
            db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
            trace(params, "setup", t);
            let t = Instant::now();
            let mut env = params.broker_env.clone();
            if params.profile {
                env.push(("RUST_LOG".into(), "broker_actors::committer=trace".into()));
            }
            let broker = BrokerProcess::start(&params.broker_bin, url, &env).await?;
            trace(params, "broker start", t);
            let t = Instant::now();
            let primed = load::prime(broker.port, scenario.partitions, params.connections).await?;
            trace(params, "prime", t);
            let t = Instant::now();
            server.checkpoint().await?;
            trace(params, "checkpoint", t);
            let targets = CpuTargets {
                broker: Some(broker.pid()),
                postmaster: server.postmaster,
            };
            let window = Window::after(params.warmup, params.duration);
            let workers = load::push_workers(
                broker.port,
                params.connections,
                batch,
                scenario.partitions,
                window,
                tag,
            );
            let o = observe(
                server,
                targets,
                window,
                workers,
                params.ticks_per_sec,
                profiled,
            )
            .await?;
            let peak = crate::measure::peak_rss_bytes(broker.pid());
            let broker_problems = broker.log_problems(3);
            let commits = profile::commits_from_log(&broker.log());
            let t = Instant::now();
            broker.stop();
            trace(params, "broker stop", t);
            let (msgs, segs) = db::segments_between(&mut conn, &o.marks.0, &o.marks.1).await?;
            let stored = db::stored_messages(&mut conn).await?;
            let mut m = measurement(
                scenario,
                round,
                &window,
                &o,
                (segs > 0).then(|| msgs as f64 / segs as f64),
            );
            m.peak_rss_mib = peak.map(|b| b as f64 / (1024.0 * 1024.0));
            m.verified = stored as u64 == o.stats.total_msgs + primed;
            if !m.verified {
                m.problems.push(format!(
                    "database holds {stored} messages, pushes reported {} queued (+{primed} priming)",
                    o.stats.total_msgs
                ));
            }
            m.problems.extend(broker_problems);
            if let Some(p) = &mut m.profile {
                p.commits = commits;
            }
            m
        }
        Kind::SegmentRows | Kind::SegmentTxn => {
            let shape = if scenario.kind == Kind::SegmentRows {
                load::Shape::Rows
            } else {
                load::Shape::Transaction
            };
            let ids = db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
            let conns = load::connect_all(url, params.baseline_connections).await?;
            server.checkpoint().await?;
            let targets = CpuTargets {
                broker: None,
                postmaster: server.postmaster,
            };
            let window = Window::after(params.warmup, params.duration);
            let workers = load::segment_workers(
                conns,
                Arc::new(ids),
                params.baseline_batch,
                scenario.dedup,
                shape,
                window,
                tag,
            );
            let o = observe(
                server,
                targets,
                window,
                workers,
                params.ticks_per_sec,
                profiled,
            )
            .await?;
            let (msgs, segs) = db::segments_between(&mut conn, &o.marks.0, &o.marks.1).await?;
            let stored = db::stored_messages(&mut conn).await?;
            let mut m = measurement(
                scenario,
                round,
                &window,
                &o,
                (segs > 0).then(|| msgs as f64 / segs as f64),
            );
            m.verified = stored as u64 == o.stats.total_msgs;
            m
        }
        Kind::Naive => {
            load::create_naive_table(&mut conn, scenario.dedup).await?;
            let conns = load::connect_all(url, params.baseline_connections).await?;
            server.checkpoint().await?;
            let targets = CpuTargets {
                broker: None,
                postmaster: server.postmaster,
            };
            let window = Window::after(params.warmup, params.duration);
            let workers = load::naive_workers(
                conns,
                scenario.partitions,
                params.baseline_batch,
                scenario.dedup,
                window,
                tag,
            );
            let o = observe(
                server,
                targets,
                window,
                workers,
                params.ticks_per_sec,
                profiled,
            )
            .await?;
            let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_messages")
                .fetch_one(&mut conn)
                .await?;
            let mut m = measurement(scenario, round, &window, &o, None);
            m.verified = stored as u64 == o.stats.total_msgs;
            m
        }
        Kind::Spool { .. } | Kind::PopAck { .. } | Kind::EndToEnd { .. } => {
            unreachable!("handled above")
        }
    };
    conn.close().await?;
    Ok(m)
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
