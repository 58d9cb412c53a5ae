//! The push suite's measurements: the broker pushing (`POST /api/v1/push` from N keep-alive
//! connections) and the SQL baselines, each on its own fresh database, with CPU and WAL read
//! at both ends of the window and the stored rows checked afterwards.

use std::sync::Arc;
use std::time::Instant;

use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::load;
use crate::measure::{CpuTargets, CpuUse, Window, WorkerStats};
use crate::measurement::Measurement;
use crate::profile::{self, Profile};
use crate::scenario::{trace, Kind, Params, Scenario};
use crate::BoxError;

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

/// Measures one push or baseline scenario on the (fresh) database at `url`; `profiled` names
/// it when a profile is wanted.
///
/// # Errors
///
/// When setup fails (a failing request inside the window is counted, not fatal), or for a
/// scenario of another suite.
pub async fn run(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    url: &str,
    profiled: Option<&str>,
) -> Result<Measurement, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    let tag = crate::data::fresh_seed();
    let m = match scenario.kind {
        Kind::Broker { batch } | Kind::EncryptedPush { batch } => {
            let t = Instant::now();
            db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
            if scenario.kind.encrypted() {
                db::encrypt_queue(&mut conn).await?;
            }
            trace(params, "setup", t);
            let t = Instant::now();
            let mut env = crate::scenario::broker_env(&params.broker_env, scenario.kind);
            if params.profile {
                env.push(("RUST_LOG".into(), "broker_actors::committer=trace".into()));
            }
            let broker = BrokerProcess::start(&params.broker_bin, url, &env).await?;
            trace(params, "broker start", t);
            let t = Instant::now();
            let primed = load::prime(broker.port, scenario.partitions, params.connections).await?;
            trace(params, "prime", t);
            if params.verbose {
                let mib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / 1_048_576.0);
                eprintln!(
                    "      broker after priming: RSS {:.1} MiB, peak {:.1} MiB",
                    mib(crate::measure::rss_bytes(broker.pid())),
                    mib(crate::measure::peak_rss_bytes(broker.pid()))
                );
            }
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
        Kind::Naive | Kind::SingleCommits => {
            // (3) commits one row at a time from as many connections as the broker's producers.
            let (connections, batch) = if scenario.kind == Kind::SingleCommits {
                (params.connections, 1)
            } else {
                (params.baseline_connections, params.baseline_batch)
            };
            load::create_naive_table(&mut conn, scenario.dedup).await?;
            let conns = load::connect_all(url, connections).await?;
            server.checkpoint().await?;
            let targets = CpuTargets {
                broker: None,
                postmaster: server.postmaster,
            };
            let window = Window::after(params.warmup, params.duration);
            let workers = load::naive_workers(
                conns,
                scenario.partitions,
                batch,
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
        Kind::Spool { .. }
        | Kind::PopAck { .. }
        | Kind::EncryptedPopAck { .. }
        | Kind::EndToEnd { .. }
        | Kind::Brokers { .. }
        | Kind::Wakeup
        | Kind::Autopilot { .. } => {
            conn.close().await?;
            return Err(format!("{} is not a push scenario", scenario.label()).into());
        }
    };
    conn.close().await?;
    Ok(m)
}
