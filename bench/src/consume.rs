//! The consuming scenarios (docs/history/benchmarks.md, "Consuming"):
//!
//! - [`pop_ack`]: the queue is filled first (push, batch 100), then K consumers loop
//!   `GET /api/v1/pop/queue/bench?batch=100&wait=false` + `POST /api/v1/ack/batch` (every
//!   message, status completed, with its lease) for the window: consumed msg/s.
//! - [`end_to_end`]: N producers (push, batch 100) and K consumers (the same loop with
//!   `wait=true&timeout=1000`) run together for the window: msg/s consumed, and the latency
//!   from the push being answered `queued` to the message's pop being answered. Then the
//!   producers stop and the consumers drain the queue. The paced variants offer a share (50 %,
//!   25 %) of the same round's push-only rate instead of pushing as fast as answered: whether
//!   the consumers keep up with that, and the latency when they do. Pops always ask for
//!   [`POP_BATCH`]; a paced push carries 100 items (10 below 10 %, see
//!   [`crate::scenario::paced_push_batch`]).
//!
//!   The autopilot suite (`crate::autopilot`) runs both with other pops
//!   ([`crate::scenario::PopStyle`]: a fixed batch, or `autopilot=true` honouring the advised
//!   `waitMs` or not) and records the broker's echoes ([`AutopilotSeen`]).
//! - [`wakeup`]: one consumer long-polls the empty queue, the bench pushes one message: the
//!   time from the push's answer to the pop's answer, sampled [`Params::wakeups`] times.
//!
//! Both check every message: consumed at most once (exactly once after the drain, for
//! end-to-end), nothing consumed that was not acknowledged, and the committed offsets in
//! PostgreSQL add up to what the consumers received.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use crate::broker::BrokerProcess;
use crate::db::{self, Server};
use crate::http::HttpConn;
use crate::measure::{CpuTargets, Window};
use crate::measurement::{
    self, AutopilotSeen, ConsumeDetail, Counters, Detail, Latency, Measurement, WakeupDetail,
    KEPT_UP_DRAIN_SECS,
};
use crate::profile;
use crate::scenario::{trace, Params, PopStyle, Scenario, POP_BATCH};
use crate::traffic::{self, ConsumerLog, ProducerLog};
use crate::BoxError;

/// How long the end-to-end consumers may take to drain what was pushed.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Starts a broker on a fresh queue and primes every partition; returns it and the primed count.
async fn start(
    params: &Params,
    scenario: Scenario,
    url: &str,
) -> Result<(BrokerProcess, u64), BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    db::setup_queue(&mut conn, scenario.partitions, scenario.dedup).await?;
    if scenario.kind.encrypted() {
        db::encrypt_queue(&mut conn).await?;
    }
    conn.close().await?;
    let t = Instant::now();
    let env = crate::scenario::broker_env(&params.broker_env, scenario.kind);
    let broker = BrokerProcess::start(&params.broker_bin, url, &env).await?;
    trace(params, "broker start", t);
    let primed = crate::load::prime(broker.port, scenario.partitions, params.connections).await?;
    Ok((broker, primed))
}

/// Window figures of the consumers: (msgs acked in the window, cycles, pop, ack and cycle
/// latencies p50/p99, empty pops in the window).
struct ConsumerFigures {
    msgs: u64,
    cycles: u64,
    pop_ms: (f64, f64),
    ack_ms: (f64, f64),
    cycle_ms: (f64, f64),
    empty: u64,
}

fn consumer_figures(logs: &[ConsumerLog], w: &Window) -> ConsumerFigures {
    let (mut msgs, mut cycles, mut empty) = (0, 0, 0);
    let (mut pop, mut ack, mut cycle) = (Vec::new(), Vec::new(), Vec::new());
    for l in logs {
        for c in l.cycles.iter().filter(|c| w.contains(c.acked)) {
            msgs += u64::from(c.msgs);
            cycles += 1;
            pop.push(c.popped - c.started);
            ack.push(c.acked - c.popped);
            cycle.push(c.acked - c.started);
        }
        empty += l.empty.iter().filter(|&&t| w.contains(t)).count() as u64;
    }
    let p = |v: &mut Vec<Duration>| {
        (
            traffic::percentile_ms(v, 50.0),
            traffic::percentile_ms(v, 99.0),
        )
    };
    ConsumerFigures {
        msgs,
        cycles,
        pop_ms: p(&mut pop),
        ack_ms: p(&mut ack),
        cycle_ms: p(&mut cycle),
        empty,
    }
}

/// Counts every consumed message against the producers' logs.
fn consumed_counts(producers: &[ProducerLog], consumers: &[ConsumerLog]) -> traffic::Counts {
    let mut counts = traffic::Counts::new(producers);
    for l in consumers {
        for &(c, seq, _) in &l.consumed {
            counts.add(usize::from(c), seq);
        }
    }
    counts
}

fn queued(logs: &[ProducerLog]) -> u64 {
    logs.iter()
        .flat_map(|l| &l.requests)
        .map(|r| u64::from(r.queued))
        .sum()
}

fn first_error<'a>(
    producers: &'a [ProducerLog],
    consumers: &'a [ConsumerLog],
) -> Option<&'a String> {
    producers
        .iter()
        .filter_map(|l| l.first_error.as_ref())
        .chain(consumers.iter().filter_map(|l| l.first_error.as_ref()))
        .next()
}

/// Fills in what both scenarios share and checks the run. Without `drained` (pop+ack: the
/// queue is not emptied) messages not consumed yet are not lost.
async fn finish(
    m: &mut Measurement,
    url: &str,
    producers: &[ProducerLog],
    consumers: &[ConsumerLog],
    primed: u64,
    drained: bool,
) -> Result<(traffic::Check, u64, i64, i64), BoxError> {
    let counts = consumed_counts(producers, consumers);
    let check = traffic::check(producers, &counts, true);
    let other: u64 = consumers.iter().map(|l| l.other).sum();
    let consumed_total: u64 = consumers
        .iter()
        .map(|l| l.consumed.len() as u64)
        .sum::<u64>()
        + other;
    let mut conn = PgConnection::connect(url).await?;
    // A lease the broker claimed ahead for a consumer's next pop (QUEEN_POP_AHEAD_MS, 50 ms by
    // default) is released when no pop takes it: the check gives it a second to go.
    let mut waited = 0;
    let (committed, live) = loop {
        let (committed, live) = db::consumed_offsets(&mut conn).await?;
        if live == 0 || waited >= 20 {
            break (committed, live);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += 1;
    };
    conn.close().await?;
    m.errors = producers.iter().map(|l| l.errors).sum::<u64>()
        + consumers.iter().map(|l| l.errors).sum::<u64>();
    if let Some(e) = first_error(producers, consumers) {
        m.problems.push(format!("{} errors, first: {e}", m.errors));
    }
    let ack_failures: u64 = consumers.iter().map(|l| l.ack_failures).sum();
    if ack_failures > 0 {
        m.problems
            .push(format!("{ack_failures} acks not successful"));
    }
    let not_queued: u64 = producers
        .iter()
        .flat_map(|l| &l.requests)
        .map(|r| u64::from(r.buffered + r.other))
        .sum();
    m.not_queued = not_queued;
    let lost = if drained { check.lost } else { 0 };
    m.verified = lost == 0
        && check.duplicates == 0
        && check.unexpected == 0
        && committed as u64 == consumed_total
        && live == 0
        && (!drained || other == primed);
    if !m.verified {
        m.problems.push(format!(
            "consumed {consumed_total} ({other} primed of {primed}): {} duplicates, {} unexpected, {} lost{}; committed offsets add up to {committed}; {live} leases live",
            check.duplicates,
            check.unexpected,
            lost,
            if drained { "" } else { " (not drained)" }
        ));
    }
    Ok((check, consumed_total, committed, live))
}

/// Which measurement this is.
pub struct Run<'a> {
    /// The scenario.
    pub scenario: Scenario,
    /// The round (0-based).
    pub round: usize,
    /// Its database's URL.
    pub url: &'a str,
    /// Its database's name, when a profile is wanted.
    pub profiled: Option<&'a str>,
}

/// Pop + ack on a queue pre-filled with `prefill` messages, the consumers popping as `style`
/// says; see the module docs.
///
/// # Errors
///
/// When setup fails.
pub async fn pop_ack(
    server: &mut Server,
    params: &Params,
    run: Run<'_>,
    style: PopStyle,
    prefill: u64,
) -> Result<Measurement, BoxError> {
    let Run {
        scenario,
        round,
        url,
        profiled,
    } = run;
    let (broker, primed) = start(params, scenario, url).await?;
    let tag = crate::data::fresh_seed();
    let t = Instant::now();
    let producers = traffic::fill(
        broker.port,
        params.connections,
        100,
        scenario.partitions,
        tag,
        prefill,
    )
    .await;
    let fill_secs = t.elapsed().as_secs_f64();
    trace(params, "fill", t);
    let prefilled = queued(&producers);
    let t = Instant::now();
    server.checkpoint().await?;
    trace(params, "checkpoint", t);
    let targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let window = Window::after(params.warmup, params.duration);
    let workers = traffic::consumers_with(
        &[broker.port],
        params.consumers,
        style,
        tag,
        stop.clone(),
        counter.clone(),
    );
    tokio::time::sleep_until(window.start.into()).await;
    let c0 = Counters::read(server, &targets, true).await?;
    let collecting = match profiled {
        Some(db) => Some(profile::begin(server, db, window.end).await?),
        None => None,
    };
    profile::sleep_through(
        &window,
        params.perf_dir.as_deref(),
        &scenario.label(),
        round,
    )
    .await?;
    let c1 = Counters::read(server, &targets, true).await?;
    stop.store(true, Ordering::Relaxed);
    let profile = match collecting {
        Some(c) => Some(profile::finish(server, c).await?),
        None => None,
    };
    let mut logs = Vec::with_capacity(workers.len());
    for w in workers {
        logs.push(w.await?);
    }
    let peak = crate::measure::peak_rss_bytes(broker.pid());
    let broker_problems = broker.log_problems(3);
    broker.stop();

    let f = consumer_figures(&logs, &window);
    let mut m = measurement::blank(scenario, round);
    m.profile = profile;
    m.msgs_per_sec = f.msgs as f64 / window.secs();
    m.ops_per_sec = f.cycles as f64 / window.secs();
    (m.p50_ms, m.p99_ms) = f.cycle_ms;
    m.peak_rss_mib = peak.map(|b| b as f64 / (1024.0 * 1024.0));
    m.cpu = c0.cpu_until(&c1, params.ticks_per_sec);
    let secs = (c1.at - c0.at).as_secs_f64();
    m.wal_bytes_per_msg = c0.wal_until(&c1, server).await? / (m.msgs_per_sec * secs);
    let (check, consumed_total, committed, live) =
        finish(&mut m, url, &producers, &logs, primed, false).await?;
    if consumed_total + 1_000 >= prefilled + primed {
        m.problems.push(format!(
            "the queue ran dry: {consumed_total} of {} consumed, {} empty pops in the window (raise --prefill)",
            prefilled + primed,
            f.empty
        ));
    } else if f.empty > 0 {
        m.problems.push(format!(
            "{} empty pops in the window with {} messages left (every partition leased?)",
            f.empty,
            prefilled + primed - consumed_total
        ));
    }
    m.problems.extend(broker_problems);
    m.detail = Some(Detail::Consume(ConsumeDetail {
        consumers: params.consumers,
        consumed_msgs_per_sec: m.msgs_per_sec,
        produced_msgs_per_sec: prefilled as f64 / fill_secs,
        offered_msgs_per_sec: None,
        msgs_per_pop: f.msgs as f64 / f.cycles.max(1) as f64,
        pop_ms: f.pop_ms,
        ack_ms: f.ack_ms,
        cycle_ms: f.cycle_ms,
        push_ms: None,
        end_to_end_ms: None,
        popped_before_push_answer: 0,
        empty_pops: f.empty,
        prefilled,
        backlog_at_end: 0,
        drain_secs: f64::NAN,
        kept_up: None,
        consumed_total,
        committed_offsets: committed,
        live_leases: live,
        segment_msgs: None,
        check,
        autopilot: AutopilotSeen::of(&logs, &window),
    }));
    Ok(m)
}

/// Producers (push `batch`, as fast as answered or paced at `pace` msg/s) and consumers
/// (popping as `style` says) together; see the module docs.
///
/// # Errors
///
/// When setup fails.
pub async fn end_to_end(
    server: &mut Server,
    params: &Params,
    run: Run<'_>,
    batch: usize,
    pace: Option<f64>,
    style: PopStyle,
) -> Result<Measurement, BoxError> {
    let Run {
        scenario,
        round,
        url,
        profiled,
    } = run;
    let (broker, primed) = start(params, scenario, url).await?;
    let t = Instant::now();
    server.checkpoint().await?;
    trace(params, "checkpoint", t);
    let targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let tag = crate::data::fresh_seed();
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let window = Window::after(params.warmup, params.duration);
    let consumers = traffic::consumers_with(
        &[broker.port],
        params.consumers,
        style,
        tag,
        stop_consumers.clone(),
        counter.clone(),
    );
    let producers = traffic::producers(
        broker.port,
        params.connections,
        batch,
        scenario.partitions,
        tag,
        stop_producers.clone(),
        pace,
    );
    tokio::time::sleep_until(window.start.into()).await;
    let c0 = Counters::read(server, &targets, true).await?;
    let collecting = match profiled {
        Some(db) => Some(profile::begin(server, db, window.end).await?),
        None => None,
    };
    profile::sleep_through(
        &window,
        params.perf_dir.as_deref(),
        &scenario.label(),
        round,
    )
    .await?;
    let c1 = Counters::read(server, &targets, true).await?;
    stop_producers.store(true, Ordering::Relaxed);
    let profile = match collecting {
        Some(c) => Some(profile::finish(server, c).await?),
        None => None,
    };
    let mut plogs = Vec::with_capacity(producers.len());
    for w in producers {
        plogs.push(w.await?);
    }
    // Drain: the consumers go on until everything queued (and primed) is consumed.
    let expected = queued(&plogs) + primed;
    let t = Instant::now();
    while counter.load(Ordering::Relaxed) < expected && t.elapsed() < DRAIN_LIMIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drained = counter.load(Ordering::Relaxed) >= expected;
    let drain_secs = t.elapsed().as_secs_f64();
    stop_consumers.store(true, Ordering::Relaxed);
    let mut clogs = Vec::with_capacity(consumers.len());
    for w in consumers {
        clogs.push(w.await?);
    }
    let peak = crate::measure::peak_rss_bytes(broker.pid());
    let broker_problems = broker.log_problems(3);
    broker.stop();

    let f = consumer_figures(&clogs, &window);
    // Push answered → pop answered, for messages popped inside the window.
    let mut e2e = Vec::new();
    let mut early = 0u64;
    for l in &clogs {
        for &(c, seq, popped) in l.consumed.iter().filter(|x| window.contains(x.2)) {
            let Some(r) = plogs
                .get(usize::from(c))
                .and_then(|p| p.requests.get((seq / batch as u64) as usize))
            else {
                continue;
            };
            if popped < r.done {
                early += 1;
            }
            e2e.push(popped.saturating_duration_since(r.done));
        }
    }
    let e2e_ms = Latency::of(&mut e2e);
    let mut push_lat = Vec::new();
    let mut produced = 0u64;
    let mut produced_by_end = 0u64;
    for r in plogs.iter().flat_map(|l| &l.requests) {
        if window.contains(r.done) {
            produced += u64::from(r.queued);
            push_lat.push(r.done - r.sent);
        }
        if r.done < window.end {
            produced_by_end += u64::from(r.queued);
        }
    }
    let consumed_by_end: u64 = clogs
        .iter()
        .flat_map(|l| &l.cycles)
        .filter(|c| c.acked < window.end)
        .map(|c| u64::from(c.msgs))
        .sum();

    let mut m = measurement::blank(scenario, round);
    m.profile = profile;
    m.msgs_per_sec = f.msgs as f64 / window.secs();
    m.ops_per_sec = f.cycles as f64 / window.secs();
    m.p50_ms = e2e_ms.p50;
    m.p99_ms = e2e_ms.p99;
    m.peak_rss_mib = peak.map(|b| b as f64 / (1024.0 * 1024.0));
    m.cpu = c0.cpu_until(&c1, params.ticks_per_sec);
    let secs = (c1.at - c0.at).as_secs_f64();
    m.wal_bytes_per_msg = c0.wal_until(&c1, server).await? / (m.msgs_per_sec * secs);
    let (check, consumed_total, committed, live) =
        finish(&mut m, url, &plogs, &clogs, primed, true).await?;
    let segment_msgs = match (&c0.mark, &c1.mark) {
        (Some(a), Some(b)) => {
            let mut conn = PgConnection::connect(url).await?;
            let stats = db::segment_stats_between(&mut conn, a, b).await?;
            conn.close().await?;
            m.msgs_per_segment =
                (stats.segments > 0).then(|| stats.msgs as f64 / stats.segments as f64);
            stats.sizes
        }
        _ => None,
    };
    if !drained {
        m.problems.push(format!(
            "not drained within {} s: {} of {expected} consumed",
            DRAIN_LIMIT.as_secs(),
            counter.load(Ordering::Relaxed)
        ));
        m.verified = false;
        let mut conn = PgConnection::connect(url).await?;
        for line in db::behind(&mut conn).await? {
            m.problems.push(format!("not consumed: {line}"));
        }
        conn.close().await?;
    }
    m.problems.extend(broker_problems);
    m.detail = Some(Detail::Consume(ConsumeDetail {
        consumers: params.consumers,
        consumed_msgs_per_sec: m.msgs_per_sec,
        produced_msgs_per_sec: produced as f64 / window.secs(),
        offered_msgs_per_sec: pace,
        msgs_per_pop: f.msgs as f64 / f.cycles.max(1) as f64,
        pop_ms: f.pop_ms,
        ack_ms: f.ack_ms,
        cycle_ms: f.cycle_ms,
        push_ms: Some((
            traffic::percentile_ms(&mut push_lat, 50.0),
            traffic::percentile_ms(&mut push_lat, 99.0),
        )),
        end_to_end_ms: Some(e2e_ms),
        popped_before_push_answer: early,
        empty_pops: f.empty,
        prefilled: 0,
        backlog_at_end: (produced_by_end + primed) as i64 - consumed_by_end as i64,
        drain_secs,
        kept_up: Some(m.verified && drain_secs <= KEPT_UP_DRAIN_SECS),
        consumed_total,
        committed_offsets: committed,
        live_leases: live,
        segment_msgs,
        check,
        autopilot: AutopilotSeen::of(&clogs, &window),
    }));
    Ok(m)
}

/// Gives up on a wake-up sample after this long (the pop's own timeout is a bit longer).
const WAKEUP_TIMEOUT_MS: u64 = 5_000;

/// How long the consumer's pop is given to reach the broker and park before the push.
const WAKEUP_SETTLE: Duration = Duration::from_millis(100);

/// Long-poll wake-up; see the module docs. The priming messages are consumed first, so the
/// queue is empty; then, [`Params::wakeups`] times: a consumer's `wait=true` pop is sent,
/// [`WAKEUP_SETTLE`] later one message is pushed to the next partition, and the time from the
/// push's answer to the pop's answer is recorded; the message is acked before the next sample.
///
/// # Errors
///
/// When setup fails or the priming messages cannot be consumed.
pub async fn wakeup(
    server: &mut Server,
    params: &Params,
    run: Run<'_>,
) -> Result<Measurement, BoxError> {
    let Run {
        scenario,
        round,
        url,
        ..
    } = run;
    let (broker, primed) = start(params, scenario, url).await?;
    let tag = crate::data::fresh_seed();
    // Empty the queue: consume the priming messages.
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let drainers = traffic::consumers(
        broker.port,
        1,
        POP_BATCH,
        false,
        tag,
        stop.clone(),
        counter.clone(),
    );
    let t = Instant::now();
    while counter.load(Ordering::Relaxed) < primed && t.elapsed() < DRAIN_LIMIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for d in drainers {
        d.await?;
    }
    if counter.load(Ordering::Relaxed) < primed {
        broker.stop();
        return Err(format!(
            "wake-up: only {} of {primed} priming messages consumed",
            counter.load(Ordering::Relaxed)
        )
        .into());
    }
    trace(params, "empty the queue", t);
    let targets = CpuTargets {
        broker: Some(broker.pid()),
        postmaster: server.postmaster,
    };
    let c0 = Counters::read(server, &targets, true).await?;
    let started = Instant::now();
    let s = wakeup_samples(broker.port, params.wakeups, scenario.partitions, tag).await;
    let secs = started.elapsed().as_secs_f64();
    let c1 = Counters::read(server, &targets, true).await?;
    let peak = crate::measure::peak_rss_bytes(broker.pid());
    let broker_problems = broker.log_problems(3);
    broker.stop();

    let mut m = measurement::blank(scenario, round);
    let (mut wake, mut sent, mut push) = (s.wake, s.from_sent, s.push);
    let wake_ms = Latency::of(&mut wake);
    m.msgs_per_sec = s.woken as f64 / secs;
    m.ops_per_sec = m.msgs_per_sec;
    m.p50_ms = wake_ms.p50;
    m.p99_ms = wake_ms.p99;
    m.peak_rss_mib = peak.map(|b| b as f64 / (1024.0 * 1024.0));
    m.cpu = c0.cpu_until(&c1, params.ticks_per_sec);
    m.errors = s.errors;
    if let Some(e) = s.first_error {
        m.problems.push(format!("{} errors, first: {e}", s.errors));
    }
    m.verified = s.woken == params.wakeups && s.errors == 0;
    if s.woken < params.wakeups {
        m.problems.push(format!(
            "{} of {} waiting pops did not bring the pushed message",
            params.wakeups - s.woken,
            params.wakeups
        ));
    }
    m.problems.extend(broker_problems);
    m.detail = Some(Detail::Wakeup(WakeupDetail {
        samples: params.wakeups,
        woken: s.woken,
        before_push_answer: s.early,
        wake_ms,
        from_push_sent_ms: Latency::of(&mut sent),
        push_ms: Latency::of(&mut push),
    }));
    Ok(m)
}

/// What the wake-up samples recorded.
#[derive(Default)]
struct WakeupSamples {
    /// Push answered → pop answered, per woken pop.
    wake: Vec<Duration>,
    /// Push sent → pop answered.
    from_sent: Vec<Duration>,
    /// Push request latency.
    push: Vec<Duration>,
    woken: usize,
    early: usize,
    errors: u64,
    first_error: Option<String>,
}

impl WakeupSamples {
    fn fail(&mut self, what: String) {
        self.errors += 1;
        self.first_error.get_or_insert(what);
    }
}

async fn wakeup_samples(port: u16, n: usize, partitions: u64, tag: u64) -> WakeupSamples {
    let mut out = WakeupSamples::default();
    let mut producer = HttpConn::new(port);
    let mut consumer = HttpConn::new(port);
    let mut rng = crate::data::Rng::new(tag);
    let mut body = String::new();
    let mut seq = 0u64;
    let path = format!(
        "/api/v1/pop/queue/{}?batch={POP_BATCH}&wait=true&timeout={}",
        crate::data::QUEUE,
        WAKEUP_TIMEOUT_MS
    );
    for k in 0..n {
        let txn = crate::data::transaction_id(tag, 0, seq);
        let pop_path = path.clone();
        let waiting = tokio::spawn(async move {
            let r = consumer.request("GET", &pop_path, b"").await;
            (consumer, r, Instant::now())
        });
        tokio::time::sleep(WAKEUP_SETTLE).await;
        let partition = crate::data::partition_name(k as u64 % partitions.max(1));
        crate::data::push_body(&mut body, &partition, 1, (tag, 0), &mut seq, &mut rng);
        let sent = Instant::now();
        let pushed = producer
            .request("POST", "/api/v1/push", body.as_bytes())
            .await;
        let pushed_at = Instant::now();
        match &pushed {
            Ok(r)
                if r.status == 201 && traffic::verdicts(&r.body) == [traffic::Verdict::Queued] => {}
            Ok(r) => out.fail(format!(
                "push answered {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
            )),
            Err(e) => out.fail(format!("push: {e}")),
        }
        let (conn, popped, popped_at) = match waiting.await {
            Ok(x) => x,
            Err(e) => {
                out.fail(format!("pop task: {e}"));
                consumer = HttpConn::new(port);
                continue;
            }
        };
        consumer = conn;
        let r = match popped {
            Ok(r) => r,
            Err(e) => {
                out.fail(format!("pop: {e}"));
                continue;
            }
        };
        if r.status == 204 {
            continue; // timed out without the message: not woken
        }
        let mut ack = String::new();
        let txns = match (r.status, traffic::ack_for(&r.body, &mut ack)) {
            (200, Ok(t)) => t,
            (status, _) => {
                out.fail(format!(
                    "pop answered {status}: {}",
                    String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
                ));
                continue;
            }
        };
        if txns.contains(&txn.as_str()) {
            out.woken += 1;
            if popped_at < pushed_at {
                out.early += 1;
            }
            out.wake
                .push(popped_at.saturating_duration_since(pushed_at));
            out.from_sent
                .push(popped_at.saturating_duration_since(sent));
            out.push.push(pushed_at - sent);
        }
        match consumer
            .request("POST", "/api/v1/ack/batch", ack.as_bytes())
            .await
        {
            Ok(a) if a.status == 200 && traffic::acked_ok(&a.body) == txns.len() => {}
            Ok(a) => out.fail(format!(
                "ack answered {}: {}",
                a.status,
                String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
            )),
            Err(e) => out.fail(format!("ack: {e}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::Cycle;

    #[test]
    fn only_cycles_acked_inside_the_window_count() {
        let t0 = Instant::now();
        let w = Window {
            start: t0 + Duration::from_secs(1),
            end: t0 + Duration::from_secs(2),
        };
        let cycle = |at: u64, msgs| Cycle {
            started: t0 + Duration::from_millis(at - 10),
            popped: t0 + Duration::from_millis(at - 4),
            acked: t0 + Duration::from_millis(at),
            msgs,
        };
        let log = ConsumerLog {
            cycles: vec![
                cycle(500, 100),
                cycle(1500, 100),
                cycle(1900, 40),
                cycle(2500, 7),
            ],
            empty: vec![t0 + Duration::from_millis(1200), t0],
            ..ConsumerLog::default()
        };
        let f = consumer_figures(&[log], &w);
        assert_eq!((f.msgs, f.cycles, f.empty), (140, 2, 1));
        assert_eq!(f.cycle_ms.0, 10.0);
        assert_eq!(f.ack_ms.1, 4.0);
    }
}
