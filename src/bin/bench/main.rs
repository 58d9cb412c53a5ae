//! `bench`: the push path's benchmark (docs/benchmarks.md).
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
//! together, with end-to-end latency).

mod broker;
mod consume;
mod data;
mod db;
mod http;
mod load;
mod measure;
mod profile;
mod report;
mod scenario;
mod spool;
mod traffic;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::report::Results;
use crate::scenario::{Kind, Params, Scenario};

/// Errors of this program: any error, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
bench: throughput and latency of POST /api/v1/push against same-run PostgreSQL baselines,
pushing while PostgreSQL is down (spool), and consuming (pop+ack, end-to-end)

USAGE: bench [OPTIONS]   (build first: cargo build --release --bins)

  --quick                 100 partitions, batch 1 and 100, dedup on/off, 2 rounds
                          (push suite ~2½ minutes, spool + consume ~3 minutes)
  --suites LIST           push,spool,consume (default all). spool and consume run at 100
                          partitions (else the first of --partitions) with dedup on (unless
                          --dedup off); consume adds the push-only scenario it is compared
                          with (batch 100) when the push suite does not measure it
  --rounds N              rounds of the whole matrix (default 3)
  --duration SECS         timed window per measurement (default 3)
  --warmup SECS           warm-up before the window (default 1)
  --connections N         concurrent HTTP connections (default 64)
  --baseline-connections N  SQL connections of the baselines (default: --connections)
  --baseline-batch N      messages per baseline transaction (default 100)
  --batches LIST          items per push request (default 1,10,100)
  --partitions LIST       partitions written (default 1,100,10000)
  --dedup LIST            on,off (default on,off)
  --no-baselines          measure the broker only
  --consumers N           concurrent consumers of the consume suite (default 16)
  --prefill N             messages pushed before the pop+ack window (default 300000)
  --database-url URL      use this server (its database is used for CREATE DATABASE) instead of
                          a private durable cluster started from the local PostgreSQL binaries
  --broker-bin PATH       the broker binary (default: queen-broker beside this program)
  --broker-env K=V        extra environment for the broker (repeatable), e.g. QUEEN_COMMITTERS=8
  --json PATH             write every measurement and the summary as JSON
  --svg PATH              write a bar chart of msg/s as SVG
  --profile               also record where the time goes (pg_stat_statements, sampled backend
                          states, the broker's commit log); costs a little throughput
  -v, --verbose           print how long each setup step takes
  -h, --help              this text
";

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
    quick: bool,
    verbose: bool,
    profile: bool,
    suites: Vec<Suite>,
    consumers: usize,
    prefill: u64,
}

/// The parts of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suite {
    Push,
    Spool,
    Consume,
}

fn list<T: std::str::FromStr>(v: &str, name: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("{name}: cannot read {x:?}"))
        })
        .collect()
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut o = Options {
        rounds: 3,
        duration: 3.0,
        warmup: 1.0,
        connections: 64,
        baseline_connections: None,
        baseline_batch: 100,
        batches: vec![1, 10, 100],
        partitions: vec![1, 100, 10_000],
        dedup: vec![true, false],
        baselines: true,
        database_url: None,
        broker_bin: None,
        broker_env: Vec::new(),
        json: None,
        svg: None,
        quick: false,
        verbose: false,
        profile: false,
        suites: vec![Suite::Push, Suite::Spool, Suite::Consume],
        consumers: 16,
        prefill: 300_000,
    };
    let mut explicit = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let num_err = |name: &str| format!("{name}: expected a number");
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quick" => o.quick = true,
            "-v" | "--verbose" => o.verbose = true,
            "--profile" => o.profile = true,
            "--no-baselines" => o.baselines = false,
            "--rounds" => o.rounds = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--duration" => o.duration = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--warmup" => o.warmup = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--connections" => o.connections = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--baseline-connections" => {
                o.baseline_connections = Some(value(arg)?.parse().map_err(|_| num_err(arg))?)
            }
            "--baseline-batch" => {
                o.baseline_batch = value(arg)?.parse().map_err(|_| num_err(arg))?
            }
            "--batches" => o.batches = list(&value(arg)?, arg)?,
            "--partitions" => o.partitions = list(&value(arg)?, arg)?,
            "--dedup" => {
                o.dedup = value(arg)?
                    .split(',')
                    .map(|d| match d.trim() {
                        "on" => Ok(true),
                        "off" => Ok(false),
                        other => Err(format!("--dedup: expected on or off, not {other:?}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--database-url" => o.database_url = Some(value(arg)?),
            "--broker-bin" => o.broker_bin = Some(PathBuf::from(value(arg)?)),
            "--broker-env" => {
                let kv = value(arg)?;
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| format!("--broker-env: expected KEY=VALUE, not {kv:?}"))?;
                o.broker_env.push((k.to_string(), v.to_string()));
            }
            "--suites" => {
                o.suites = value(arg)?
                    .split(',')
                    .map(|d| match d.trim() {
                        "push" => Ok(Suite::Push),
                        "spool" => Ok(Suite::Spool),
                        "consume" => Ok(Suite::Consume),
                        other => Err(format!(
                            "--suites: expected push, spool or consume, not {other:?}"
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--consumers" => o.consumers = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--prefill" => o.prefill = value(arg)?.parse().map_err(|_| num_err(arg))?,
            "--json" => o.json = Some(PathBuf::from(value(arg)?)),
            "--svg" => o.svg = Some(PathBuf::from(value(arg)?)),
            other => return Err(format!("unknown option {other:?} (see --help)")),
        }
        explicit.push(arg.clone());
    }
    if o.quick {
        let given = |name: &str| explicit.iter().any(|a| a == name);
        if !given("--rounds") {
            o.rounds = 2;
        }
        if !given("--duration") {
            o.duration = 3.0;
        }
        if !given("--batches") {
            o.batches = vec![1, 100];
        }
        if !given("--partitions") {
            o.partitions = vec![100];
        }
    }
    if o.rounds == 0
        || o.connections == 0
        || o.baseline_batch == 0
        || o.duration <= 0.0
        || o.consumers == 0
    {
        return Err(
            "rounds, connections, consumers, baseline batch and duration must be positive".into(),
        );
    }
    if o.suites.is_empty() || o.partitions.is_empty() || o.batches.is_empty() || o.dedup.is_empty()
    {
        return Err("suites, partitions, batches and dedup must not be empty".into());
    }
    if o.batches.contains(&0) || o.partitions.contains(&0) {
        return Err("batches and partitions must be positive".into());
    }
    Ok(Some(o))
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
    if o.suites.contains(&Suite::Consume) {
        let push_only = Scenario {
            kind: Kind::Broker { batch: 100 },
            partitions,
            dedup,
        };
        if !out.contains(&push_only) {
            out.push(push_only);
        }
        for kind in [
            Kind::PopAck { batch: 100 },
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 0,
            },
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 50,
            },
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 25,
            },
        ] {
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
            "bench: warning: a debug build is being measured; use cargo build --release --bins"
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
            let m = scenario::run(server, &params, s, round, push_only).await?;
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
                if m.problems.is_empty() {
                    String::new()
                } else {
                    format!("\n      ! {}", m.problems.join("\n      ! "))
                }
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

    let rows = results.rows();
    let target_p = target_partitions(o);
    let targets = results.targets(target_p);
    let spool_rows = results.spool_rows();
    let consume_rows = results.consume_rows();
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
            },
            "summary": rows,
            "spool": spool_rows,
            "consuming": consume_rows,
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::from(2);
        }
    };
    let argv = std::iter::once("bench".to_string())
        .chain(args)
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

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn quick_mode_shrinks_the_matrix_but_keeps_explicit_choices() {
        let o = parse_args(&args(&["--quick", "--rounds", "5"]))
            .expect("parses")
            .expect("options");
        assert_eq!((o.rounds, o.partitions.clone()), (5, vec![100]));
        let p = plan(&o, true);
        // push: 2 naive + 2 × (2 baselines + 2 batches); spool: 2 batches; consume: 4.
        assert_eq!(p.len(), 2 + 2 * (2 + 2) + 2 + 4);
        assert!(matches!(p[0].kind, Kind::Naive));
        assert!(matches!(p[2].kind, Kind::SegmentRows));
        assert!(matches!(p[4].kind, Kind::Broker { batch: 100 }));
        assert!(matches!(p[10].kind, Kind::Spool { batch: 100 }));
        assert!(matches!(p[11].kind, Kind::Spool { batch: 1 }));
        assert!(matches!(
            p[13].kind,
            Kind::EndToEnd {
                batch: 100,
                pace_pct: 0
            }
        ));
        let only = parse_args(&args(&["--quick", "--suites", "consume"]))
            .expect("parses")
            .expect("options");
        let p = plan(&only, false);
        assert_eq!(p.len(), 5, "the push-only scenario is added for the ratio");
        assert!(matches!(p[0].kind, Kind::Broker { batch: 100 }));
        assert!(!plan(&o, false)
            .iter()
            .any(|s| matches!(s.kind, Kind::Spool { .. })));
    }

    #[test]
    fn bad_options_are_named() {
        let err = parse_args(&args(&["--dedup", "maybe"]))
            .err()
            .expect("error");
        assert!(err.contains("--dedup"), "{err}");
        assert!(parse_args(&args(&["--nope"])).is_err());
    }
}
