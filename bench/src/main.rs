//! `bench`: the push path's benchmark (docs/history/benchmarks.md).
//!
//! In one run, on one machine: starts a durable PostgreSQL (or uses `--database-url`), then for
//! every scenario starts the real `queen-broker` binary as a separate process against a fresh
//! database and drives `POST /api/v1/push` from N keep-alive connections; in the same run it
//! measures the baselines on the same server with the same data: (1) the broker's rows
//! (segments + dedup sidecar) written directly by SQL, (2) one row per message. Every scenario
//! runs in each of several rounds; the report gives medians and the median of per-round ratios,
//! because the machine is shared and absolute figures drift. Only 127.0.0.1 is ever contacted.
//!
//! Two more suites use the same machinery: `spool` (push while PostgreSQL is down, then the
//! replay's drain rate) and `consume` (pop+ack on a filled queue, and producers with consumers
//! together, with end-to-end latency). Two scaling suites run when asked: `scale` (push over up
//! to a million partitions against 100, with the broker's peak RSS) and `brokers` (1, 2, 3
//! broker processes on one database, push and end-to-end). The autopilot suite (when asked)
//! sets pops the broker sizes (`autopilot=true`) against fixed batches, on a backlog and on a
//! live stream, with and without honouring the advised `waitMs`. The wire suite (when asked)
//! pushes the same rows as JSON, `QPB1` and `QPB1` with zstd, and pops them as JSON and framed
//! `QPF1`, with the broker's CPU per message (`wire`); the fan-out suite (when asked) has 1, 5,
//! 10 consumer groups read one queue while producers push at a fixed rate (`fanout`); the kafka
//! suite (when asked) produces and consumes with librdkafka through the broker's Kafka listener
//! beside HTTP and beside Tansu on the same PostgreSQL (`kafka`).
//!
//! Modules, imports pointing down only: `main` (options, plan, rounds) → `scaling` and
//! `autopilot` (those suites' plans and tables), `kafka` and `fanout` → `wire` → `report` → `runner` (one measurement: fresh database, dispatch) → the
//! suites `push`, `spool`, `consume`, `brokers` →
//! `measurement` (what a measurement produced) and `scenario` (what is measured) → `profile`,
//! `db`, `traffic`, `load`, `broker` → `measure`, `http`, `data`.

mod autopilot;
mod broker;
mod brokers;
mod consume;
mod data;
mod db;
mod fanout;
mod http;
mod kafka;
mod load;
mod measure;
mod measurement;
mod profile;
mod push;
mod report;
mod runner;
mod scaling;
mod scenario;
mod spool;
mod traffic;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[cfg(test)]
use clap::CommandFactory;
use clap::{Parser, ValueEnum};

use crate::report::Results;
use crate::scenario::{Kind, Params, Scenario, POP_BATCH};

/// Errors of this program: any error, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// bench: throughput and latency of POST /api/v1/push against same-run PostgreSQL baselines,
/// pushing while PostgreSQL is down (spool), and consuming (pop+ack, end-to-end, paced
/// end-to-end, long-poll wake-up).
///
/// Build the broker first (`cargo build --release --bins`, then `cargo run --release -p
/// queen-bench -- OPTIONS`); the bench runs the `queen-broker`
/// binary found beside its own executable (same target directory) unless --broker-bin says
/// otherwise. Only 127.0.0.1 is ever contacted.
#[derive(Parser, Debug)]
#[command(name = "bench", version)]
struct Args {
    /// 100 partitions, batch 1 and 100, dedup on/off, 2 rounds (push suite ~2½ minutes, spool
    /// + consume ~3 minutes); options given explicitly win.
    #[arg(long)]
    quick: bool,
    /// Suites to run. spool and consume run at 100 partitions (else the first of --partitions)
    /// with dedup on (unless --dedup off); consume adds the push-only scenario (batch 100) it is
    /// compared with when the push suite does not measure it. encryption (not run by default)
    /// measures push and pop+ack on a queue with `encryptionEnabled` next to the same on a
    /// plain queue (batch 100 each). scale (not run by default): push batch 100 over each of
    /// --scale-partitions, msg/s against 100 partitions and the broker's peak RSS. brokers (not
    /// run by default): 1, 2, 3 (--brokers) broker processes on one database, push batch 100
    /// and end-to-end, with commit sizes and PostgreSQL CPU. autopilot (not run by default):
    /// pops sized by the broker (`autopilot=true`) against each of --autopilot-batches, on a
    /// backlog of --autopilot-prefill messages and on live streams of --autopilot-rates msg/s,
    /// with empty pops/s (~7 minutes with 2 rounds). wire (not run by default): push batch 100
    /// as JSON, QPB1 and QPB1 with zstd, pop+ack as JSON and framed QPF1, with broker CPU per
    /// message (~2 minutes a round). fanout (not run by default): push-only, then
    /// --fanout-groups consumer groups reading one queue while producers offer --fanout-pace %
    /// of push-only. kafka (not run by default): librdkafka producing and consuming through the
    /// broker's Kafka listener, beside the HTTP push and pop+ack of the same rows and beside
    /// Tansu on the same PostgreSQL (when built, see --tansu-dir).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "push,spool,consume"
    )]
    suites: Vec<Suite>,
    /// Rounds of the whole matrix [default: 3, 2 with --quick].
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Timed window per measurement, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    duration: f64,
    /// Warm-up before the window, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    warmup: f64,
    /// Concurrent HTTP connections of the load generator (producers).
    #[arg(long, value_name = "N", default_value_t = 64)]
    connections: usize,
    /// SQL connections of the baselines [default: --connections].
    #[arg(long, value_name = "N")]
    baseline_connections: Option<usize>,
    /// Messages per baseline transaction.
    #[arg(long, value_name = "N", default_value_t = 100)]
    baseline_batch: usize,
    /// Items per push request [default: 1,10,100; 1,100 with --quick].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    batches: Option<Vec<usize>>,
    /// Partitions written [default: 1,100,10000; 100 with --quick].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    partitions: Option<Vec<u64>>,
    /// Dedup settings to measure.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "on,off"
    )]
    dedup: Vec<OnOff>,
    /// Measure the broker only (no SQL baselines).
    #[arg(long)]
    no_baselines: bool,
    /// Concurrent consumers of the consume suite.
    #[arg(long, value_name = "N", default_value_t = 16)]
    consumers: usize,
    /// Messages pushed before the pop+ack window (consume suite).
    #[arg(long, value_name = "N", default_value_t = 300_000)]
    prefill: u64,
    /// Offered rates of the paced end-to-end runs (consume suite), in percent of the same
    /// round's push-only msg/s; each producer pushes on a fixed schedule. Below 10 % a push
    /// carries 10 items instead of 100, so each producer still pushes several times a second.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "PERCENTS",
        default_value = "5,50"
    )]
    paced: Vec<u32>,
    /// Long-poll wake-up samples per round (consume suite; 0: not measured): a consumer waits
    /// on the empty queue, one message is pushed; push answered → pop answered.
    #[arg(long, value_name = "N", default_value_t = 50)]
    wakeups: usize,
    /// Use this PostgreSQL server (its database is used for CREATE DATABASE) instead of a
    /// private durable cluster started from the local PostgreSQL binaries; the spool suite is
    /// then skipped (it stops PostgreSQL).
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// The broker binary [default: queen-broker beside this program].
    #[arg(long, value_name = "PATH")]
    broker_bin: Option<PathBuf>,
    /// Extra environment for the broker, e.g. QUEEN_COMMITTERS=8 (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value)]
    broker_env: Vec<(String, String)>,
    /// Write every measurement and the summary as JSON.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Write a bar chart of the push suite's msg/s as SVG.
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
    /// Also record where the time goes (pg_stat_statements, sampled backend states, the
    /// broker's commit log); costs a little throughput.
    #[arg(long)]
    profile: bool,
    /// Record a CPU profile of the whole machine (`perf record -a -g`, Debian's linux-perf)
    /// during each consuming window, one file per scenario and round in DIR
    /// (`perf report -i FILE --sort comm,dso`).
    #[arg(long, value_name = "DIR")]
    perf: Option<PathBuf>,
    /// Partition counts of the scale suite (100 is always added: the others are compared
    /// with it). Each partition is written once before the window (priming), so the broker's
    /// peak RSS covers that many partitions; its actors are bounded by
    /// QUEEN_PARTITION_ACTORS_MAX (pass --broker-env to change it).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "100,10000,1000000"
    )]
    scale_partitions: Vec<u64>,
    /// Broker counts of the brokers suite.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "1,2,3"
    )]
    brokers: Vec<usize>,
    /// Fixed pop batches the autopilot suite compares autopilot with.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "10,100,1000"
    )]
    autopilot_batches: Vec<usize>,
    /// Messages pushed before the autopilot suite's backlog window (enough that the fastest
    /// consumers do not drain it in warm-up + window).
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    autopilot_prefill: u64,
    /// Live-stream rates of the autopilot suite, msg/s offered by the paced producers (pushes
    /// of 10 items from --connections producers).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "2000,20000"
    )]
    autopilot_rates: Vec<u32>,
    /// Consumer group counts of the fan-out suite.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "1,5,10"
    )]
    fanout_groups: Vec<usize>,
    /// Consumers per group in the fan-out suite.
    #[arg(long, value_name = "N", default_value_t = 4)]
    fanout_consumers: usize,
    /// The fan-out suite's consumers pop with `autopilot=true` (the 2.6 client's default: the
    /// broker sizes batch and partitions per pop) instead of pops of 100 from one partition.
    #[arg(long)]
    fanout_autopilot: bool,
    /// Rate the fan-out suite's producers offer, percent of the same round's push-only msg/s.
    #[arg(long, value_name = "PERCENT", default_value_t = 50)]
    fanout_pace: u32,
    /// Where `bench/tansu/setup.sh` built Tansu (its `bin/tansu` and `schema.sql`), for the
    /// kafka suite's Tansu rows [default: ~/.cache/queen-bench/tansu-0.6.0]; without it those
    /// rows are left out, saying so.
    #[arg(long, value_name = "DIR")]
    tansu_dir: Option<PathBuf>,
    /// Print how long each setup step takes.
    #[arg(short, long)]
    verbose: bool,
}

/// `on` or `off` (for --dedup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, not {s:?}"))
}

/// The run's settings, defaults resolved.
struct Options {
    rounds: usize,
    duration: f64,
    warmup: f64,
    connections: usize,
    baseline_connections: Option<usize>,
    baseline_batch: usize,
    batches: Vec<usize>,
    partitions: Vec<u64>,
    dedup: Vec<bool>,
    baselines: bool,
    database_url: Option<String>,
    broker_bin: Option<PathBuf>,
    broker_env: Vec<(String, String)>,
    json: Option<PathBuf>,
    svg: Option<PathBuf>,
    verbose: bool,
    profile: bool,
    suites: Vec<Suite>,
    consumers: usize,
    prefill: u64,
    paced: Vec<u32>,
    wakeups: usize,
    perf: Option<PathBuf>,
    scale_partitions: Vec<u64>,
    brokers: Vec<usize>,
    autopilot_batches: Vec<usize>,
    autopilot_prefill: u64,
    autopilot_rates: Vec<u32>,
    fanout_groups: Vec<usize>,
    fanout_consumers: usize,
    fanout_autopilot: bool,
    fanout_pace: u32,
    tansu_dir: Option<PathBuf>,
}

/// The parts of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Suite {
    Push,
    Spool,
    Consume,
    /// Push and pop+ack on an encrypted queue against a plain one.
    Encryption,
    /// Push over many partitions against 100, with the broker's peak RSS.
    Scale,
    /// 1, 2, 3 brokers on one database.
    Brokers,
    /// Autopilot pops against fixed batches (backlog, live stream).
    Autopilot,
    /// JSON against binary bodies: push QPB1 (plain, zstd), framed QPF1 pops.
    Wire,
    /// Consumer groups each reading one queue while producers push at a fixed rate.
    Fanout,
    /// librdkafka through the broker's Kafka listener, beside HTTP and Tansu.
    Kafka,
}

impl Options {
    /// Resolves `--quick` and checks what clap cannot.
    fn from_args(a: Args) -> Result<Self, String> {
        let o = Options {
            rounds: a.rounds.unwrap_or(if a.quick { 2 } else { 3 }),
            duration: a.duration,
            warmup: a.warmup,
            connections: a.connections,
            baseline_connections: a.baseline_connections,
            baseline_batch: a.baseline_batch,
            batches: a.batches.unwrap_or_else(|| {
                if a.quick {
                    vec![1, 100]
                } else {
                    vec![1, 10, 100]
                }
            }),
            partitions: a.partitions.unwrap_or_else(|| {
                if a.quick {
                    vec![100]
                } else {
                    vec![1, 100, 10_000]
                }
            }),
            dedup: a.dedup.iter().map(|d| *d == OnOff::On).collect(),
            baselines: !a.no_baselines,
            database_url: a.database_url,
            broker_bin: a.broker_bin,
            broker_env: a.broker_env,
            json: a.json,
            svg: a.svg,
            verbose: a.verbose,
            profile: a.profile,
            suites: a.suites,
            consumers: a.consumers,
            prefill: a.prefill,
            paced: a.paced,
            wakeups: a.wakeups,
            perf: a.perf.clone(),
            scale_partitions: {
                let mut p = a.scale_partitions.clone();
                p.push(100);
                p.sort_unstable();
                p.dedup();
                p
            },
            brokers: {
                let mut b = a.brokers.clone();
                b.sort_unstable();
                b.dedup();
                b
            },
            autopilot_batches: {
                let mut b = a.autopilot_batches.clone();
                b.sort_unstable();
                b.dedup();
                b
            },
            autopilot_prefill: a.autopilot_prefill,
            autopilot_rates: {
                let mut r = a.autopilot_rates.clone();
                r.sort_unstable();
                r.dedup();
                r
            },
            fanout_groups: {
                let mut g = a.fanout_groups.clone();
                g.sort_unstable();
                g.dedup();
                g
            },
            fanout_consumers: a.fanout_consumers,
            fanout_autopilot: a.fanout_autopilot,
            fanout_pace: a.fanout_pace,
            tansu_dir: a.tansu_dir.or_else(kafka::default_tansu_dir),
        };
        if o.rounds == 0
            || o.connections == 0
            || o.baseline_batch == 0
            || o.duration <= 0.0
            || o.consumers == 0
        {
            return Err(
                "rounds, connections, consumers, baseline batch and duration must be positive"
                    .into(),
            );
        }
        if o.suites.is_empty()
            || o.partitions.is_empty()
            || o.batches.is_empty()
            || o.dedup.is_empty()
        {
            return Err("suites, partitions, batches and dedup must not be empty".into());
        }
        if o.paced.iter().any(|p| *p == 0 || *p > 1000) {
            return Err("--paced: percentages from 1 to 1000".into());
        }
        if o.batches.contains(&0) || o.partitions.contains(&0) || o.scale_partitions.contains(&0) {
            return Err("batches and partitions must be positive".into());
        }
        if o.brokers.is_empty() || o.brokers.contains(&0) {
            return Err("--brokers: broker counts from 1".into());
        }
        if o.autopilot_batches.is_empty() || o.autopilot_batches.contains(&0) {
            return Err("--autopilot-batches: batches from 1".into());
        }
        if o.fanout_groups.is_empty()
            || o.fanout_groups.contains(&0)
            || o.fanout_consumers == 0
            || o.fanout_pace == 0
        {
            return Err("--fanout-groups, --fanout-consumers, --fanout-pace: from 1".into());
        }
        if o.autopilot_rates.contains(&0) {
            return Err("--autopilot-rates: rates from 1 msg/s".into());
        }
        Ok(o)
    }
}

/// The measurements of one round, in order: per partition count, the naive baselines, then per
/// dedup setting baselines (1) and (1+) followed by the broker from the largest batch down, so
/// each broker run sits next to the baselines it is compared with.
fn plan(o: &Options, can_stop_postgres: bool) -> Vec<Scenario> {
    let mut out = if o.suites.contains(&Suite::Push) {
        push_plan(o)
    } else {
        Vec::new()
    };
    let partitions = target_partitions(o);
    let dedup = o.dedup.contains(&true);
    if o.suites.contains(&Suite::Spool) && can_stop_postgres {
        // The batch sizes (100 and 1) among those asked for; else all asked for.
        let mut batches: Vec<usize> = o
            .batches
            .iter()
            .copied()
            .filter(|b| *b == 1 || *b == 100)
            .collect();
        if batches.is_empty() {
            batches = o.batches.clone();
        }
        batches.sort_unstable_by(|a, b| b.cmp(a));
        for batch in batches {
            out.push(Scenario {
                kind: Kind::Spool { batch },
                partitions,
                dedup,
            });
        }
    }
    if o.suites.contains(&Suite::Encryption) {
        for kind in [
            Kind::Broker { batch: 100 },
            Kind::EncryptedPush { batch: 100 },
            Kind::PopAck { batch: POP_BATCH },
            Kind::EncryptedPopAck { batch: POP_BATCH },
        ] {
            let s = Scenario {
                kind,
                partitions,
                dedup,
            };
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    if o.suites.contains(&Suite::Scale) {
        let dedup = o.dedup[0];
        for &p in &o.scale_partitions {
            let s = Scenario {
                kind: Kind::Broker { batch: 100 },
                partitions: p,
                dedup,
            };
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    if o.suites.contains(&Suite::Brokers) {
        for end_to_end in [false, true] {
            for &brokers in &o.brokers {
                out.push(Scenario {
                    kind: Kind::Brokers {
                        brokers,
                        end_to_end,
                    },
                    partitions,
                    dedup,
                });
            }
        }
    }
    if o.suites.contains(&Suite::Autopilot) {
        out.extend(autopilot::plan(
            &o.autopilot_batches,
            &o.autopilot_rates,
            partitions,
            dedup,
        ));
    }
    if o.suites.contains(&Suite::Consume) {
        let push_only = Scenario {
            kind: Kind::Broker { batch: 100 },
            partitions,
            dedup,
        };
        if !out.contains(&push_only) {
            out.push(push_only);
        }
        let mut kinds = vec![
            Kind::PopAck { batch: POP_BATCH },
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 0,
            },
        ];
        let mut paced = o.paced.clone();
        paced.sort_unstable();
        paced.dedup();
        kinds.extend(paced.into_iter().map(|pace_pct| Kind::EndToEnd {
            batch: scenario::paced_push_batch(pace_pct),
            pace_pct,
        }));
        if o.wakeups > 0 {
            kinds.push(Kind::Wakeup);
        }
        for kind in kinds {
            out.push(Scenario {
                kind,
                partitions,
                dedup,
            });
        }
    }
    out
}

/// The partition count the targets (and the spool and consume suites) use: 100 when measured.
fn target_partitions(o: &Options) -> u64 {
    if o.partitions.contains(&100) {
        100
    } else {
        o.partitions[0]
    }
}

fn push_plan(o: &Options) -> Vec<Scenario> {
    let mut batches = o.batches.clone();
    batches.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    for &partitions in &o.partitions {
        if o.baselines {
            for &dedup in &o.dedup {
                out.push(Scenario {
                    kind: Kind::Naive,
                    partitions,
                    dedup,
                });
            }
            if batches.contains(&1) {
                out.push(Scenario {
                    kind: Kind::SingleCommits,
                    partitions,
                    dedup: true,
                });
            }
        }
        for &dedup in &o.dedup {
            if o.baselines {
                for kind in [Kind::SegmentRows, Kind::SegmentTxn] {
                    out.push(Scenario {
                        kind,
                        partitions,
                        dedup,
                    });
                }
            }
            for &batch in &batches {
                out.push(Scenario {
                    kind: Kind::Broker { batch },
                    partitions,
                    dedup,
                });
            }
        }
    }
    out
}

fn machine_notes() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?".into(), |(_, v)| v.trim().to_string());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    vec![
        ("cpu".into(), cpu),
        (
            "cores".into(),
            std::thread::available_parallelism()
                .map_or(0, |n| n.get())
                .to_string(),
        ),
        (
            "memory".into(),
            mem.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        ),
        ("load average at start".into(), load.trim().to_string()),
    ]
}

async fn run(o: Options, argv: String) -> Result<bool, BoxError> {
    let started = Instant::now();
    let broker_bin = broker::locate(o.broker_bin.as_deref())?;
    if cfg!(debug_assertions) || broker_bin.to_string_lossy().contains("/debug/") {
        eprintln!(
            "bench: warning: a debug build is being measured; use cargo build --release --bins && cargo run --release -p queen-bench"
        );
    }
    let mut server = match &o.database_url {
        Some(url) => db::Server::connect(url).await?,
        None => {
            eprintln!(
                "bench: starting a private durable PostgreSQL (fsync on, synchronous_commit on)"
            );
            db::Server::private().await?
        }
    };
    let outcome = run_on(&mut server, &o, broker_bin, argv, started).await;
    if o.database_url.is_some() {
        server.drop_template().await;
    }
    server.shutdown();
    outcome
}

async fn run_on(
    server: &mut db::Server,
    o: &Options,
    broker_bin: PathBuf,
    argv: String,
    started: Instant,
) -> Result<bool, BoxError> {
    if !server.durable() {
        eprintln!(
            "bench: warning: the server is not durable (fsync={}, synchronous_commit={}): figures are not comparable",
            server.setting("fsync"),
            server.setting("synchronous_commit")
        );
    }
    if server.postmaster.is_none() {
        eprintln!(
            "bench: note: PostgreSQL's processes are not visible here; its CPU is not reported"
        );
    }
    if o.profile {
        server.enable_profiling().await?;
    }
    server.prepare_template().await?;
    let params = Params {
        connections: o.connections,
        baseline_connections: o.baseline_connections.unwrap_or(o.connections),
        baseline_batch: o.baseline_batch,
        warmup: Duration::from_secs_f64(o.warmup),
        duration: Duration::from_secs_f64(o.duration),
        broker_bin,
        broker_env: o.broker_env.clone(),
        ticks_per_sec: measure::clock_ticks_per_sec(),
        verbose: o.verbose,
        profile: o.profile,
        consumers: o.consumers,
        prefill: o.prefill,
        autopilot_prefill: o.autopilot_prefill,
        wakeups: o.wakeups,
        perf_dir: o.perf.clone(),
    };
    if o.suites.contains(&Suite::Spool) && !server.can_stop() {
        eprintln!(
            "bench: note: the spool suite needs the private cluster (it stops PostgreSQL); skipped with --database-url"
        );
    }
    let scenarios = plan(o, server.can_stop());
    let total = scenarios.len() * o.rounds;
    let mut results = Results { all: Vec::new() };
    let mut n = 0;
    for round in 0..o.rounds {
        for &s in &scenarios {
            n += 1;
            // A paced end-to-end run offers a share of this round's push-only rate.
            let push_only = results
                .all
                .iter()
                .find(|m| {
                    m.round == round
                        && m.scenario
                            == Scenario {
                                kind: Kind::Broker { batch: 100 },
                                ..s
                            }
                })
                .map(|m| m.msgs_per_sec);
            let m = runner::run(server, &params, s, round, push_only).await?;
            eprintln!(
                "[{:>3}/{total} {:>4.0}s] round {} {:<44} {:>9.0} msg/s  p50 {:>6.1} ms  p99 {:>6.1} ms{}  cpu b{:.2} pg{:.2} load{:.2} other{:.2}{}",
                n,
                started.elapsed().as_secs_f64(),
                round + 1,
                s.label(),
                m.msgs_per_sec,
                m.p50_ms,
                m.p99_ms,
                m.peak_rss_mib
                    .map_or(String::new(), |r| format!("  rss {:.1} MB", r * 1.048_576)),
                m.cpu.broker,
                m.cpu.postgres,
                m.cpu.load,
                m.cpu.other,
                report::problems_suffix(&m.problems)
            );
            if let Some(line) = report::detail_line(&m) {
                eprintln!("      {line}");
            }
            if let Some(p) = &m.profile {
                eprint!("{}", profile::text(p));
            }
            results.all.push(m);
        }
    }

    let wire_all = run_wire(server, o, &params, started).await?;
    let fanout_all = run_fanout(server, o, &params, started).await?;
    let kafka_all = run_kafka(server, o, &params, started).await?;

    let rows = results.rows();
    let target_p = target_partitions(o);
    let targets = results.targets(target_p);
    let spool_rows = results.spool_rows();
    let consume_rows = results.consume_rows();
    let wakeup_rows = results.wakeup_rows();
    let encryption_rows = results.encryption_rows();
    let mut header = String::new();
    header.push_str(&format!("command: {argv}\n"));
    header.push_str(&format!(
        "rounds {} × ({} s warm-up + {} s window); {} HTTP connections; baselines: {} SQL connections, {} messages per transaction; payload {} random base64 chars in a JSON string; wall time {:.0} s\n",
        o.rounds,
        o.warmup,
        o.duration,
        params.connections,
        params.baseline_connections,
        params.baseline_batch,
        data::PAYLOAD_CHARS,
        started.elapsed().as_secs_f64()
    ));
    let machine = machine_notes();
    header.push_str(&format!(
        "machine: {}\n",
        machine
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    header.push_str(&format!(
        "postgresql: {}\n",
        server
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    println!("\n{header}");
    println!("{}", report::table(&rows));
    if !spool_rows.is_empty() {
        println!("Spool (PostgreSQL crashed under load, then restarted):");
        println!("{}", report::spool_table(&spool_rows));
    }
    if !consume_rows.is_empty() {
        println!("Consuming ({} consumers):", o.consumers);
        println!("{}", report::consume_table(&consume_rows));
    }
    if !wakeup_rows.is_empty() {
        println!(
            "Long-poll wake-up (one consumer waiting on the empty queue, one message pushed):"
        );
        println!("{}", report::wakeup_table(&wakeup_rows));
    }
    if !encryption_rows.is_empty() {
        println!("Encryption (encrypted queue against a plain one, same run):");
        println!("{}", report::encryption_table(&encryption_rows));
    }
    let scale_rows = if o.suites.contains(&Suite::Scale) {
        scaling::scale_rows(&results, &o.scale_partitions, 100, o.dedup[0])
    } else {
        Vec::new()
    };
    if !scale_rows.is_empty() {
        println!("Partitions at scale (push batch 100, every partition primed once; ratios against 100 partitions in the same round):");
        println!("{}", scaling::scale_table(&scale_rows));
    }
    let brokers_rows = scaling::brokers_rows(&results);
    if !brokers_rows.is_empty() {
        println!("Several brokers on one database (ratios against 1 broker in the same round):");
        println!("{}", scaling::brokers_table(&brokers_rows));
    }
    let autopilot_rows = autopilot::rows(&results, o.duration);
    if autopilot_rows.iter().any(|r| r.live_rate == 0) {
        println!(
            "Autopilot, backlog ({} consumers, {} messages filled first, wait=false; ratios against the best fixed batch of the same round):",
            o.consumers, o.autopilot_prefill
        );
        println!("{}", autopilot::backlog_table(&autopilot_rows));
    }
    if autopilot_rows.iter().any(|r| r.live_rate > 0) {
        println!(
            "Autopilot, live stream ({} consumers, {} paced producers pushing {} items; ratios against the best fixed batch of the same round and rate):",
            o.consumers,
            o.connections,
            scenario::LIVE_PUSH_BATCH
        );
        println!("{}", autopilot::live_table(&autopilot_rows));
    }
    let wire_rows = wire::rows(&wire_all);
    if !wire_rows.is_empty() {
        println!(
            "Wire formats (push batch {}, {} partitions, dedup on, {} producers; pop batch {}, {} consumers; medians (min–max) of {} rounds, ratios per round against JSON):",
            wire::PUSH_BATCH,
            wire::PARTITIONS,
            params.connections,
            POP_BATCH,
            params.consumers,
            o.rounds
        );
        println!("{}", wire::table(&wire_rows));
    }
    let fanout_rows = fanout::rows(&fanout_all);
    if !fanout_rows.is_empty() {
        println!(
            "Fan-out (one queue, {} partitions; producers offer {} % of the same round's push-only; {} long-poll consumers per group, pop {} + ack; medians (min–max) of {} rounds):",
            wire::PARTITIONS,
            o.fanout_pace,
            o.fanout_consumers,
            POP_BATCH,
            o.rounds
        );
        println!("{}", fanout::table(&fanout_rows));
    }
    let kafka_rows = kafka::rows(&kafka_all);
    if !kafka_rows.is_empty() {
        println!(
            "Kafka (librdkafka through the broker and through Tansu on the same PostgreSQL, beside HTTP; {} partitions; produce: one librdkafka producer, HTTP: {} connections pushing {}; consume: {} group members / HTTP consumers popping {}; medians (min–max) of {} rounds, ratios per round against HTTP):",
            wire::PARTITIONS,
            params.connections,
            wire::PUSH_BATCH,
            kafka::CONSUMERS,
            POP_BATCH,
            o.rounds
        );
        println!("{}", kafka::table(&kafka_rows));
        for (what, x, met) in kafka::goals(&kafka_rows) {
            println!("{what}: {x:.2} ({})", if met { "met" } else { "missed" });
        }
    }
    println!("Targets (medians of per-round ratios, same run):");
    println!("{}", report::targets_text(&targets));
    if let Some(path) = &o.json {
        let doc = serde_json::json!({
            "command": argv,
            "machine": machine.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            "postgresql": server.settings.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "params": {
                "rounds": o.rounds, "warmup_secs": o.warmup, "duration_secs": o.duration,
                "connections": params.connections,
                "baseline_connections": params.baseline_connections,
                "baseline_batch": params.baseline_batch,
                "payload_chars": data::PAYLOAD_CHARS,
                "broker_env": o.broker_env,
                "consumers": o.consumers,
                "prefill": o.prefill,
                "paced_pct": o.paced,
                "wakeups": o.wakeups,
                "autopilot_batches": o.autopilot_batches,
                "autopilot_prefill": o.autopilot_prefill,
                "autopilot_rates": o.autopilot_rates,
            },
            "summary": rows,
            "spool": spool_rows,
            "consuming": consume_rows,
            "wakeup": wakeup_rows,
            "encryption": encryption_rows,
            "scale": scale_rows,
            "brokers": brokers_rows,
            "autopilot": autopilot_rows,
            "wire": { "rows": wire_rows, "goals": wire::goals(&wire_rows), "measurements": wire_all },
            "fanout": {
                "groups": o.fanout_groups, "consumers_per_group": o.fanout_consumers, "autopilot": o.fanout_autopilot,
                "pace_pct": o.fanout_pace, "rows": fanout_rows, "measurements": fanout_all,
            },
            "kafka": { "rows": kafka_rows, "goals": kafka::goals(&kafka_rows), "measurements": kafka_all },
            "targets": targets,
            "measurements": results.all,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        eprintln!("bench: wrote {}", path.display());
    }
    if let Some(path) = &o.svg {
        let title = format!(
            "POST /api/v1/push vs same-run PostgreSQL baselines ({} connections, {} rounds)",
            params.connections, o.rounds
        );
        std::fs::write(path, report::svg(&rows, &title))?;
        eprintln!("bench: wrote {}", path.display());
    }
    Ok(targets.iter().all(|t| t.met))
}

/// The wire suite's rounds, when asked: every variant each round, the order rotated.
async fn run_wire(
    server: &mut db::Server,
    o: &Options,
    params: &Params,
    started: Instant,
) -> Result<Vec<wire::WireMeasurement>, BoxError> {
    let mut all = Vec::new();
    if !o.suites.contains(&Suite::Wire) {
        return Ok(all);
    }
    for round in 0..o.rounds {
        for variant in wire::round_order(round) {
            let m = wire::measure(server, params, variant, round).await?;
            eprintln!(
                "[wire {:>4.0}s] round {} {:<26} {:>9.0} msg/s  broker {:>6.1} µs/msg  pg {:>6.1} µs/msg  {:>6.0} B/msg  cpu b{:.2} pg{:.2} load{:.2} other{:.2}{}",
                started.elapsed().as_secs_f64(),
                round + 1,
                variant.label(),
                m.msgs_per_sec,
                m.broker_us_per_msg,
                m.postgres_us_per_msg,
                m.bytes_per_msg,
                m.cpu.broker,
                m.cpu.postgres,
                m.cpu.load,
                m.cpu.other,
                report::problems_suffix(&m.problems)
            );
            all.push(m);
        }
    }
    Ok(all)
}

/// The kafka suite's rounds, when asked (Tansu's rows only when it is built).
async fn run_kafka(
    server: &mut db::Server,
    o: &Options,
    params: &Params,
    started: Instant,
) -> Result<Vec<kafka::KafkaMeasurement>, BoxError> {
    if !o.suites.contains(&Suite::Kafka) {
        return Ok(Vec::new());
    }
    let tansu = o.tansu_dir.as_deref().and_then(kafka::Tansu::find);
    if tansu.is_none() {
        eprintln!(
            "bench: Tansu is not built in {}: its rows are left out (bash bench/tansu/setup.sh builds it)",
            o.tansu_dir
                .as_deref()
                .map_or("(no home folder)".into(), |d| d.display().to_string())
        );
    }
    kafka::run(server, params, o.rounds, tansu.as_ref(), started).await
}

/// The fan-out suite's rounds, when asked: push-only, then each group count (order rotated)
/// with producers paced at --fanout-pace % of that push-only rate.
async fn run_fanout(
    server: &mut db::Server,
    o: &Options,
    params: &Params,
    started: Instant,
) -> Result<Vec<fanout::FanoutMeasurement>, BoxError> {
    let mut all = Vec::new();
    if !o.suites.contains(&Suite::Fanout) {
        return Ok(all);
    }
    for round in 0..o.rounds {
        let none = fanout::GroupPops {
            consumers: 0,
            autopilot: false,
        };
        let pops = fanout::GroupPops {
            consumers: o.fanout_consumers,
            autopilot: o.fanout_autopilot,
        };
        let push_only = fanout::measure(server, params, round, 0, none, None).await?;
        let pace = push_only.produced_msgs_per_sec * f64::from(o.fanout_pace) / 100.0;
        eprintln!(
            "[fanout {:>4.0}s] round {} push only {:>9.0} msg/s; offering {pace:.0} msg/s",
            started.elapsed().as_secs_f64(),
            round + 1,
            push_only.produced_msgs_per_sec
        );
        all.push(push_only);
        let mut groups = o.fanout_groups.clone();
        let n = groups.len();
        groups.rotate_left(round % n);
        for g in groups {
            let m = fanout::measure(server, params, round, g, pops, Some(pace)).await?;
            eprintln!(
                "[fanout {:>4.0}s] round {} {g:>2} group(s): produced {:>8.0} msg/s, delivered {:>8.0}/s (groups {:?}), lag at end {:?}, broker {:.1} µs/deliv, pg {:.1} µs/deliv, cache hits {} misses {}{}",
                started.elapsed().as_secs_f64(),
                round + 1,
                m.produced_msgs_per_sec,
                m.delivered_msgs_per_sec,
                m.group_msgs_per_sec.iter().map(|r| r.round() as i64).collect::<Vec<_>>(),
                m.group_lag_at_end,
                m.broker_us_per_msg,
                m.postgres_us_per_msg,
                m.cache_hits,
                m.cache_misses,
                report::problems_suffix(&m.problems)
            );
            all.push(m);
        }
    }
    Ok(all)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = match Options::from_args(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let argv = std::iter::once("bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(options, argv)) {
        // Missed targets are reported, not an error: the run itself worked.
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Options, String> {
        let args = Args::try_parse_from(std::iter::once("bench").chain(v.iter().copied()))
            .map_err(|e| e.to_string())?;
        Options::from_args(args)
    }

    #[test]
    fn the_options_parse_as_documented() {
        Args::command().debug_assert();
        let o = parse(&[]).expect("defaults");
        assert_eq!(
            (o.rounds, o.duration, o.warmup, o.connections),
            (3, 3.0, 1.0, 64)
        );
        assert_eq!(o.batches, vec![1, 10, 100]);
        assert_eq!(o.partitions, vec![1, 100, 10_000]);
        assert_eq!(o.dedup, vec![true, false]);
        assert_eq!(o.suites, vec![Suite::Push, Suite::Spool, Suite::Consume]);
        assert_eq!((o.consumers, o.prefill, o.baselines), (16, 300_000, true));
        assert_eq!((o.paced.clone(), o.wakeups), (vec![5, 50], 50));
        let o = parse(&[
            "--suites",
            "spool,consume",
            "--dedup",
            "off",
            "--batches",
            "1,100",
            "--broker-env",
            "QUEEN_COMMITTERS=1",
            "--broker-env",
            "A=b=c",
            "--no-baselines",
            "-v",
        ])
        .expect("parses");
        assert_eq!(o.suites, vec![Suite::Spool, Suite::Consume]);
        assert_eq!((o.dedup, o.batches), (vec![false], vec![1, 100]));
        assert_eq!(
            o.broker_env,
            vec![
                ("QUEEN_COMMITTERS".into(), "1".into()),
                ("A".into(), "b=c".into())
            ]
        );
        assert!(!o.baselines && o.verbose);
    }

    #[test]
    fn quick_mode_shrinks_the_matrix_but_keeps_explicit_choices() {
        let o = parse(&["--quick", "--rounds", "5"]).expect("parses");
        assert_eq!((o.rounds, o.partitions.clone()), (5, vec![100]));
        let p = plan(&o, true);
        // push: 2 naive + one row per commit (batch 1 is planned) + 2 × (2 baselines + 2 batches); spool: 2 batches; consume: pop+ack,
        // end-to-end, paced at 5 % and 50 %, wake-up.
        assert_eq!(p.len(), 2 + 1 + 2 * (2 + 2) + 2 + 5);
        assert!(matches!(p[0].kind, Kind::Naive));
        assert!(matches!(p[2].kind, Kind::SingleCommits));
        assert!(matches!(p[3].kind, Kind::SegmentRows));
        assert!(matches!(p[5].kind, Kind::Broker { batch: 100 }));
        assert!(matches!(p[11].kind, Kind::Spool { batch: 100 }));
        assert!(matches!(p[12].kind, Kind::Spool { batch: 1 }));
        assert!(matches!(
            p[14].kind,
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 0
            }
        ));
        assert!(matches!(
            p[15].kind,
            Kind::EndToEnd {
                batch: 10,
                pace_pct: 5
            }
        ));
        assert!(matches!(
            p[16].kind,
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 50
            }
        ));
        assert!(matches!(p[17].kind, Kind::Wakeup));
        let only = parse(&["--quick", "--suites", "consume"]).expect("parses");
        assert_eq!(only.rounds, 2);
        let p = plan(&only, false);
        assert_eq!(p.len(), 6, "the push-only scenario is added for the ratio");
        assert!(matches!(p[0].kind, Kind::Broker { batch: 100 }));
        let rates = parse(&[
            "--suites",
            "consume",
            "--paced",
            "50,25,5,25",
            "--wakeups",
            "0",
        ])
        .expect("parses");
        let paced: Vec<u32> = plan(&rates, true)
            .iter()
            .filter_map(|s| match s.kind {
                Kind::EndToEnd { pace_pct, .. } if pace_pct > 0 => Some(pace_pct),
                _ => None,
            })
            .collect();
        assert_eq!(paced, vec![5, 25, 50]);
        assert!(!plan(&rates, true).iter().any(|s| s.kind == Kind::Wakeup));
        assert!(parse(&["--paced", "0"]).is_err());
        assert!(!plan(&o, false)
            .iter()
            .any(|s| matches!(s.kind, Kind::Spool { .. })));
        let explicit =
            parse(&["--quick", "--partitions", "1,100", "--batches", "10"]).expect("parses");
        assert_eq!(
            (explicit.partitions, explicit.batches),
            (vec![1, 100], vec![10])
        );
    }

    #[test]
    fn the_scaling_suites_plan_partition_counts_against_100_and_broker_counts() {
        let o = parse(&[
            "--suites",
            "scale,brokers",
            "--scale-partitions",
            "1000000,10000",
        ])
        .expect("parses");
        let p = plan(&o, true);
        let scale: Vec<u64> = p
            .iter()
            .filter(|s| s.kind == Kind::Broker { batch: 100 })
            .map(|s| s.partitions)
            .collect();
        assert_eq!(
            scale,
            vec![100, 10_000, 1_000_000],
            "100 is added, in order"
        );
        let brokers: Vec<(usize, bool)> = p
            .iter()
            .filter_map(|s| match s.kind {
                Kind::Brokers {
                    brokers,
                    end_to_end,
                } => Some((brokers, end_to_end)),
                _ => None,
            })
            .collect();
        assert_eq!(
            brokers,
            vec![
                (1, false),
                (2, false),
                (3, false),
                (1, true),
                (2, true),
                (3, true)
            ]
        );
        assert!(parse(&["--brokers", "0"]).is_err());
        assert!(!plan(&parse(&[]).expect("defaults"), true)
            .iter()
            .any(|s| matches!(s.kind, Kind::Brokers { .. })));
    }

    #[test]
    fn the_autopilot_suite_plans_its_workloads_when_asked() {
        let o = parse(&[
            "--suites",
            "autopilot",
            "--autopilot-batches",
            "1000,10",
            "--autopilot-rates",
            "500",
        ])
        .expect("parses");
        assert_eq!(o.autopilot_batches, vec![10, 1000]);
        assert_eq!(o.autopilot_prefill, 2_000_000);
        let p = plan(&o, true);
        // Backlog: 2 fixed + autopilot; live at 500 msg/s: 2 fixed + 3 autopilot.
        assert_eq!(p.len(), 3 + 5);
        assert!(p.iter().all(|s| matches!(s.kind, Kind::Autopilot { .. })));
        assert!(p.iter().all(|s| s.partitions == 100 && s.dedup));
        let d = parse(&[]).expect("defaults");
        assert_eq!(d.autopilot_rates, vec![2000, 20_000]);
        assert!(!plan(&d, true)
            .iter()
            .any(|s| matches!(s.kind, Kind::Autopilot { .. })));
        assert!(parse(&["--autopilot-batches", "0"]).is_err());
        assert!(parse(&["--autopilot-rates", "0"]).is_err());
    }

    #[test]
    fn bad_options_are_named() {
        let err = parse(&["--dedup", "maybe"]).err().expect("error");
        assert!(err.contains("--dedup"), "{err}");
        assert!(parse(&["--nope"]).is_err());
        assert!(parse(&["--broker-env", "NOEQUALS"]).is_err());
        assert!(parse(&["--rounds", "0"]).is_err());
        assert!(parse(&["--batches", "1,x"]).is_err());
    }
}
