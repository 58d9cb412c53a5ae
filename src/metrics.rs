//! The broker's metrics: ONE Prometheus registry per broker, built at start-up, updated on the
//! hot path (atomic counters and histogram buckets, no locks held across I/O), read by both
//! `GET /metrics/prometheus` (text exposition) and `GET /metrics` (Queen's JSON shape, filled
//! from the same families). docs/operations.md lists every family.
//!
//! Who reports what:
//! - the HTTP middleware (`http::observe`): requests by route, method and status class, their
//!   latency, and the latency of pops;
//! - the push, pop and ack handlers: one call each ([`Metrics::pushed`], [`Metrics::popped`],
//!   [`Metrics::acked`]);
//! - the committers, through the actors crate's `CommitObserver` trait (the actors know
//!   nothing of Prometheus): commit latency and batch sizes;
//! - gauges (partition actors, backlog, spool, pools, leases) are read when scraped
//!   ([`Gauges`]), so they cost nothing between scrapes.
//!
//! `QUEEN_METRICS=false` stops the recording (counters and histograms stay at zero), which is
//! how the bench measures what recording costs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use broker_actors::observe::{CommitObserver, CommitReport};
use prometheus::core::Collector;
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::storage::consume::acks::{Ack, AckOutcome, AckStatus};

/// Latency buckets in seconds: 0.5 ms .. 10 s.
const LATENCY: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Pop latency: as [`LATENCY`], plus the long-poll range.
const POP_LATENCY: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Message age in seconds: 1 ms .. 1 day.
const AGE: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0, 86400.0,
];

/// The verdicts a push item can get, in the order of [`Metrics::push_by_verdict`].
const VERDICTS: [&str; 4] = ["queued", "duplicate", "buffered", "failed"];

/// What the scrape reads from the broker's state (see `http::metrics`).
#[derive(Debug, Default, Clone)]
pub struct Gauges {
    /// Connections of the shared pool / idle among them.
    pub pool_size: u32,
    /// Idle connections of the shared pool.
    pub pool_idle: usize,
    /// Connections of the leasing pops' pool.
    pub lease_pool_size: u32,
    /// Idle connections of the leasing pops' pool.
    pub lease_pool_idle: usize,
    /// Connections of the grouped hand-off claims' pool.
    pub claim_pool_size: u32,
    /// Idle connections of the grouped hand-off claims' pool.
    pub claim_pool_idle: usize,
    /// Connections of the grouped acks' pool.
    pub ack_pool_size: u32,
    /// Idle connections of the grouped acks' pool.
    pub ack_pool_idle: usize,
    /// Items in the spool not yet replayed.
    pub spool_records: u64,
    /// Bytes of spool files.
    pub spool_bytes: u64,
    /// Age of the oldest spool file holding items not yet replayed, seconds (0 when empty).
    pub spool_oldest_secs: f64,
    /// Items replayed from the spool since start.
    pub replayed: u64,
    /// Spooled records PostgreSQL refused, kept in the quarantine file.
    pub quarantined: u64,
    /// How long commits have failed to reach PostgreSQL, if they do.
    pub db_down_for: Option<Duration>,
    /// Push maintenance mode.
    pub maintenance: bool,
    /// Pop maintenance mode.
    pub pop_maintenance: bool,
    /// Live partition actors.
    pub partition_actors: usize,
    /// Partition actors evicted since start (idle too long, or the registry full).
    pub partition_evictions: u64,
    /// `host:port` of the database host the broker writes to now.
    pub database_host: String,
    /// Switches to another database host since start.
    pub database_switches: u64,
    /// Leases claimed ahead of a consumer's next pop since start: claimed, taken by a pop,
    /// released unused (`storage::consume::ahead`).
    pub leases_ahead: [u64; 3],
    /// Segments pops took from the segment cache and read from PostgreSQL since start.
    pub cache_reads: [u64; 2],
    /// Of the segments read from PostgreSQL, those the cache had evicted lately.
    pub cache_rereads: u64,
    /// The segment cache's byte budget now.
    pub cache_budget: usize,
    /// Request bytes held by the write path.
    pub inflight_bytes: usize,
    /// Items handed to committers and not yet committed.
    pub commit_backlog: usize,
    /// Live leases in the database (every broker's), when it answered.
    pub leases: Option<i64>,
    /// The history's newest (queue, group, backlog, oldest unconsumed seconds) pairs.
    pub backlogs: Vec<(String, String, i64, f64)>,
    /// The 2.x state as the history's newest sample read it, if it did.
    pub state: Option<StateGauges>,
}

/// The 2.x state's figures for the scrape (bounded: at most ten rows each).
#[derive(Debug, Default, Clone)]
pub struct StateGauges {
    /// (namespace, live keys, bytes).
    pub namespaces: Vec<(String, i64, i64)>,
    /// Live lock permits.
    pub locks_held: i64,
    /// (queue, pending timers, seconds the earliest is late).
    pub timers: Vec<(String, i64, f64)>,
    /// (query, state keys, state bytes).
    pub streams: Vec<(String, i64, i64)>,
}

/// Gauges, set from [`Gauges`] at each scrape.
struct GaugeSet {
    uptime: IntGauge,
    pool_size: IntGaugeVec,
    pool_idle: IntGaugeVec,
    pool_active: IntGaugeVec,
    spool_pending: IntGauge,
    spool_bytes: IntGauge,
    spool_oldest: prometheus::Gauge,
    replayed: IntCounter,
    db_healthy: IntGauge,
    db_unreachable: IntGauge,
    quarantined: IntGauge,
    maintenance: IntGauge,
    pop_maintenance: IntGauge,
    partition_actors: IntGauge,
    partition_evictions: IntCounter,
    database_host: IntGaugeVec,
    database_switches: IntCounter,
    leases_ahead: IntCounterVec,
    cache_reads: IntCounterVec,
    cache_rereads: IntCounter,
    cache_budget: IntGauge,
    inflight_bytes: IntGauge,
    commit_backlog: IntGauge,
    leases: IntGaugeVec,
    backlog: IntGaugeVec,
    oldest: prometheus::GaugeVec,
    kv_keys: IntGaugeVec,
    kv_bytes: IntGaugeVec,
    locks_held: IntGaugeVec,
    timers_pending: IntGaugeVec,
    timers_late: prometheus::GaugeVec,
    stream_keys: IntGaugeVec,
    stream_bytes: IntGaugeVec,
}

fn float_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::GaugeVec {
    let g = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

/// The rates of `GET /metrics`, computed between two calls at least a second apart.
#[derive(Default)]
struct Rates {
    at: Option<Instant>,
    requests: f64,
    messages: f64,
    request_rate: f64,
    message_rate: f64,
}

/// One broker's metrics; see the module docs.
pub struct Metrics {
    enabled: bool,
    started: Instant,
    registry: Registry,
    push_by_verdict: [IntCounter; 4],
    pop_messages: IntCounter,
    undecryptable: IntCounter,
    acks: IntCounterVec,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    commit_ok: Histogram,
    commit_failed: Histogram,
    commit_items: Histogram,
    commit_partitions: Histogram,
    pop_duration: HistogramVec,
    pop_age: Histogram,
    gauges: Mutex<GaugeSet>,
    rates: Mutex<Rates>,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric");
    c
}

fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("valid metric");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric");
    h
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    register(registry, c.clone());
    c
}

/// Moves a counter that mirrors a total kept elsewhere up to `total` (never down).
fn catch_up(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric");
    g
}

fn register(registry: &Registry, c: impl Collector + 'static) {
    registry.register(Box::new(c)).expect("unique metric");
}

/// Microseconds since the Unix epoch.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl Metrics {
    /// A fresh registry with every family; `enabled: false` records nothing (gauges are still
    /// read at scrape time).
    pub fn new(enabled: bool) -> Self {
        let r = Registry::new();
        let push = counter_vec(
            &r,
            "queen_push_messages_total",
            "items answered by POST /api/v1/push, by verdict",
            &["verdict"],
        );
        let push_by_verdict = VERDICTS.map(|v| push.with_label_values(&[v]));
        let pop_messages = IntCounter::new(
            "queen_pop_messages_total",
            "messages handed out by the pop routes",
        )
        .expect("valid metric");
        register(&r, pop_messages.clone());
        let undecryptable = counter(
            &r,
            "queen_undecryptable_stops_total",
            "pops that stopped a partition in front of a message this broker's key cannot open",
        );
        let acks = counter_vec(
            &r,
            "queen_ack_total",
            "acknowledgements of /ack and /ack/batch, by requested status and result",
            &["status", "result"],
        );
        let http_requests = counter_vec(
            &r,
            "queen_http_requests_total",
            "HTTP requests answered, by route pattern, method and status class",
            &["route", "method", "status"],
        );
        let http_duration = histogram_vec(
            &r,
            "queen_http_request_duration_seconds",
            "time from request to response, by route pattern and method",
            &["route", "method"],
            LATENCY,
        );
        let commit = histogram_vec(
            &r,
            "queen_commit_duration_seconds",
            "duration of one committer transaction, by result",
            &["result"],
            LATENCY,
        );
        let commit_items = histogram(
            &r,
            "queen_commit_batch_items",
            "items per committer transaction",
            prometheus::exponential_buckets(1.0, 2.0, 16).expect("valid buckets"),
        );
        let commit_partitions = histogram(
            &r,
            "queen_commit_batch_partitions",
            "partitions (segments) per committer transaction",
            prometheus::exponential_buckets(1.0, 2.0, 11).expect("valid buckets"),
        );
        let pop_duration = histogram_vec(
            &r,
            "queen_pop_duration_seconds",
            "pop requests from arrival to answer (long-polls included), by result",
            &["result"],
            POP_LATENCY,
        );
        let pop_age = histogram(
            &r,
            "queen_pop_message_age_seconds",
            "end-to-end age of popped messages: from arrival at the broker to being popped",
            AGE.to_vec(),
        );
        let gauges = GaugeSet {
            uptime: gauge(
                &r,
                "queen_uptime_seconds",
                "seconds since the broker started",
            ),
            pool_size: gauge_vec(
                &r,
                "queen_db_pool_size",
                "connections of a PostgreSQL pool",
                &["pool"],
            ),
            pool_idle: gauge_vec(
                &r,
                "queen_db_pool_idle",
                "idle connections of a PostgreSQL pool",
                &["pool"],
            ),
            pool_active: gauge_vec(
                &r,
                "queen_db_pool_active",
                "connections of a PostgreSQL pool in use",
                &["pool"],
            ),
            spool_pending: gauge(
                &r,
                "queen_file_buffer_pending",
                "items in the spool not yet replayed",
            ),
            spool_bytes: gauge(
                &r,
                "queen_file_buffer_bytes",
                "bytes of spool files on disk",
            ),
            spool_oldest: {
                let g = prometheus::Gauge::new(
                    "queen_file_buffer_oldest_seconds",
                    "age of the oldest spool file holding items not yet replayed (0 when empty)",
                )
                .expect("valid metric");
                register(&r, g.clone());
                g
            },
            replayed: {
                let c = IntCounter::new(
                    "queen_file_buffer_replayed_total",
                    "items replayed from the spool since start",
                )
                .expect("valid metric");
                register(&r, c.clone());
                c
            },
            db_healthy: gauge(
                &r,
                "queen_file_buffer_db_healthy",
                "1 unless commits currently fail to reach PostgreSQL",
            ),
            db_unreachable: gauge(
                &r,
                "queen_db_unreachable_seconds",
                "how long commits have failed to reach PostgreSQL",
            ),
            quarantined: gauge(
                &r,
                "queen_spool_quarantined_records",
                "spooled records PostgreSQL refused, kept in the quarantine file (GET /api/v1/system/quarantine)",
            ),
            maintenance: gauge(
                &r,
                "queen_maintenance_mode_enabled",
                "1 while push maintenance mode is on",
            ),
            pop_maintenance: gauge(
                &r,
                "queen_pop_maintenance_mode_enabled",
                "1 while pop maintenance mode is on",
            ),
            partition_actors: gauge(&r, "queen_partition_actors", "live partition actors"),
            partition_evictions: counter(
                &r,
                "queen_partition_actor_evictions_total",
                "partition actors stopped since start (idle too long, or QUEEN_PARTITION_ACTORS_MAX reached)",
            ),
            database_host: gauge_vec(
                &r,
                "queen_database_primary",
                "1 for the database host this broker writes to now",
                &["host"],
            ),
            database_switches: counter(
                &r,
                "queen_database_primary_switches_total",
                "switches to another database host since start",
            ),
            leases_ahead: counter_vec(
                &r,
                "queen_pop_leases_ahead_total",
                "leases claimed ahead of a consumer's next pop while its ack committed (QUEEN_POP_AHEAD_MS)",
                &["outcome"],
            ),
            cache_reads: counter_vec(
                &r,
                "queen_segment_cache_reads_total",
                "segments pops took from the segment cache (hit) or read from PostgreSQL (miss)",
                &["result"],
            ),
            cache_rereads: counter(
                &r,
                "queen_segment_cache_rereads_total",
                "segments pops read from PostgreSQL again after the segment cache evicted them (each grew its budget)",
            ),
            cache_budget: gauge(
                &r,
                "queen_segment_cache_budget_bytes",
                "the segment cache's byte budget now (QUEEN_SEGMENT_CACHE_BYTES up to QUEEN_SEGMENT_CACHE_MAX_BYTES)",
            ),
            inflight_bytes: gauge(
                &r,
                "queen_inflight_bytes",
                "request bytes held by the write path",
            ),
            commit_backlog: gauge(
                &r,
                "queen_commit_backlog_items",
                "items handed to committers and not yet committed",
            ),
            leases: gauge_vec(
                &r,
                "queen_leases_held",
                "live leases in the database (all brokers)",
                &["scope"],
            ),
            backlog: gauge_vec(
                &r,
                "queen_queue_backlog_messages",
                "messages past the group's cursor, for the QUEEN_HISTORY_QUEUES (queue, group) pairs with the largest backlog (newest history sample)",
                &["queue", "consumer_group"],
            ),
            oldest: float_gauge_vec(
                &r,
                "queen_queue_oldest_unconsumed_seconds",
                "age of the oldest unconsumed message of the same pairs",
                &["queue", "consumer_group"],
            ),
            kv_keys: gauge_vec(
                &r,
                "queen_kv_keys",
                "live KV keys of the ten namespaces with the most",
                &["namespace"],
            ),
            kv_bytes: gauge_vec(
                &r,
                "queen_kv_bytes",
                "bytes of keys and values (JSON text) of the same namespaces",
                &["namespace"],
            ),
            locks_held: gauge_vec(
                &r,
                "queen_locks_held",
                "live lock and semaphore permits (all brokers)",
                &["scope"],
            ),
            timers_pending: gauge_vec(
                &r,
                "queen_timers_pending",
                "timers not yet fired, of the ten queues with timers due first",
                &["queue"],
            ),
            timers_late: float_gauge_vec(
                &r,
                "queen_timers_late_seconds",
                "how far past due the earliest timer of the same queues is",
                &["queue"],
            ),
            stream_keys: gauge_vec(
                &r,
                "queen_stream_state_keys",
                "state keys of a stream query over its partitions (ten queries by name)",
                &["query"],
            ),
            stream_bytes: gauge_vec(
                &r,
                "queen_stream_state_bytes",
                "state bytes of the same stream queries",
                &["query"],
            ),
        };
        #[cfg(target_os = "linux")]
        register(
            &r,
            prometheus::process_collector::ProcessCollector::for_self(),
        );
        Self {
            enabled,
            started: Instant::now(),
            registry: r,
            push_by_verdict,
            pop_messages,
            undecryptable,
            acks,
            http_requests,
            http_duration,
            commit_ok: commit.with_label_values(&["ok"]),
            commit_failed: commit.with_label_values(&["error"]),
            commit_items,
            commit_partitions,
            pop_duration,
            pop_age,
            gauges: Mutex::new(gauges),
            rates: Mutex::new(Rates::default()),
        }
    }

    /// Whether counters and histograms are recorded (`QUEEN_METRICS`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The verdicts a push answered (`queued`, `duplicate`, `buffered`, `failed`).
    pub fn pushed<'a>(&self, verdicts: impl Iterator<Item = &'a str>) {
        if !self.enabled {
            return;
        }
        let mut counts = [0u64; 4];
        for verdict in verdicts {
            if let Some(i) = VERDICTS.iter().position(|v| *v == verdict) {
                counts[i] += 1;
            }
        }
        for (counter, n) in self.push_by_verdict.iter().zip(counts) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
    }

    /// A pop stopped a partition in front of a message it cannot open
    /// (`storage::queues::undecryptable`).
    pub fn undecryptable(&self) {
        if self.enabled {
            self.undecryptable.inc();
        }
    }

    /// The messages a pop hands out (`messages`), and how old each one is, from the creation
    /// times of the frames the answer was written from (decoded once, by the pop route).
    pub fn popped(&self, messages: u64, created_at_micros: impl IntoIterator<Item = i64>) {
        if !self.enabled {
            return;
        }
        let now = now_micros();
        let age = self.pop_age.local();
        for created in created_at_micros {
            age.observe((now - created).max(0) as f64 / 1e6);
        }
        age.flush();
        self.pop_messages.inc_by(messages);
    }

    /// The outcome of each ack of a request: counted per (status, result) first, then added
    /// once per label pair (a batch carries hundreds of acks).
    pub fn acked(&self, acks: &[Ack], outcomes: &[AckOutcome]) {
        if !self.enabled {
            return;
        }
        self.count_acks(
            outcomes
                .iter()
                .map(|o| (acks.get(o.index).map(|a| a.status), o.success)),
        );
    }

    /// `n` acks of status `completed`, every one applied (the fast path's answer).
    pub fn acked_completed(&self, n: usize) {
        if self.enabled {
            self.count_acks(std::iter::repeat_n((Some(AckStatus::Completed), true), n));
        }
    }

    fn count_acks(&self, outcomes: impl Iterator<Item = (Option<AckStatus>, bool)>) {
        const STATUSES: [&str; 5] = ["completed", "failed", "dlq", "retry", "other"];
        let mut counts = [[0u64; 2]; 5];
        for (status, success) in outcomes {
            let s = match status {
                Some(AckStatus::Completed) => 0,
                Some(AckStatus::Failed) => 1,
                Some(AckStatus::Dlq) => 2,
                Some(AckStatus::Retry) => 3,
                Some(AckStatus::Unknown) | None => 4,
            };
            counts[s][usize::from(!success)] += 1;
        }
        for (status, [ok, err]) in STATUSES.iter().zip(counts) {
            for (result, n) in [("success", ok), ("error", err)] {
                if n > 0 {
                    self.acks.with_label_values(&[status, result]).inc_by(n);
                }
            }
        }
    }

    /// One answered HTTP request: `route` is the route's pattern (`unmatched` for none).
    /// Every label set is bounded whatever a client sends: the method is folded by
    /// [`method_label`], and the route is a pattern of the route table or `unmatched`.
    pub fn request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let method = method_label(method);
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_requests
            .with_label_values(&[route, method, class])
            .inc();
        let secs = elapsed.as_secs_f64();
        self.http_duration
            .with_label_values(&[route, method])
            .observe(secs);
        if route.starts_with("/api/v1/pop") {
            let result = match status {
                200 => "messages",
                204 => "empty",
                _ => "error",
            };
            self.pop_duration.with_label_values(&[result]).observe(secs);
        }
    }

    /// The totals since start (all zero when recording is off).
    pub fn totals(&self) -> Totals {
        use prometheus::core::Metric as _;
        let acks = self.acks.collect();
        let commits = self.commit_ok.metric();
        Totals {
            pushed: self.push_by_verdict[0].get() + self.push_by_verdict[2].get(),
            popped: self.pop_messages.get(),
            acked: sum_of(&acks, "queen_ack_total", &[("result", "success")]) as u64,
            commit_buckets: commits
                .get_histogram()
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count()))
                .collect(),
            commit_count: commits.get_histogram().get_sample_count(),
        }
    }

    /// The registry's families with the gauges set from `g`.
    fn gather(&self, g: &Gauges) -> Vec<MetricFamily> {
        let set = self.gauges.lock().expect("metrics gauge lock poisoned");
        set.uptime.set(self.started.elapsed().as_secs() as i64);
        for (pool, size, idle) in [
            ("shared", g.pool_size, g.pool_idle),
            ("lease", g.lease_pool_size, g.lease_pool_idle),
            ("claims", g.claim_pool_size, g.claim_pool_idle),
            ("acks", g.ack_pool_size, g.ack_pool_idle),
        ] {
            set.pool_size
                .with_label_values(&[pool])
                .set(i64::from(size));
            set.pool_idle.with_label_values(&[pool]).set(idle as i64);
            set.pool_active
                .with_label_values(&[pool])
                .set((i64::from(size) - idle as i64).max(0));
        }
        set.spool_pending.set(g.spool_records as i64);
        set.spool_bytes.set(g.spool_bytes as i64);
        set.spool_oldest.set(g.spool_oldest_secs);
        catch_up(&set.replayed, g.replayed);
        set.db_healthy.set(i64::from(g.db_down_for.is_none()));
        set.db_unreachable
            .set(g.db_down_for.map_or(0, |d| d.as_secs() as i64));
        set.quarantined.set(g.quarantined as i64);
        set.maintenance.set(i64::from(g.maintenance));
        set.pop_maintenance.set(i64::from(g.pop_maintenance));
        set.partition_actors.set(g.partition_actors as i64);
        catch_up(&set.partition_evictions, g.partition_evictions);
        catch_up(&set.database_switches, g.database_switches);
        for (outcome, total) in ["claimed", "taken", "released"]
            .into_iter()
            .zip(g.leases_ahead)
        {
            catch_up(&set.leases_ahead.with_label_values(&[outcome]), total);
        }
        for (result, total) in ["hit", "miss"].into_iter().zip(g.cache_reads) {
            catch_up(&set.cache_reads.with_label_values(&[result]), total);
        }
        catch_up(&set.cache_rereads, g.cache_rereads);
        set.cache_budget.set(g.cache_budget as i64);
        if !g.database_host.is_empty() {
            set.database_host.reset();
            set.database_host
                .with_label_values(&[g.database_host.as_str()])
                .set(1);
        }
        set.inflight_bytes.set(g.inflight_bytes as i64);
        set.commit_backlog.set(g.commit_backlog as i64);
        match g.leases {
            Some(n) => set.leases.with_label_values(&["cluster"]).set(n),
            None => {
                let _ = set.leases.remove_label_values(&["cluster"]);
            }
        }
        // The bounded families name only what the newest sample holds.
        set.backlog.reset();
        set.oldest.reset();
        for (queue, group, backlog, oldest) in &g.backlogs {
            set.backlog.with_label_values(&[queue, group]).set(*backlog);
            set.oldest.with_label_values(&[queue, group]).set(*oldest);
        }
        if let Some(state) = &g.state {
            for family in [
                &set.kv_keys,
                &set.kv_bytes,
                &set.timers_pending,
                &set.stream_keys,
                &set.stream_bytes,
            ] {
                family.reset();
            }
            set.timers_late.reset();
            for (ns, keys, bytes) in &state.namespaces {
                set.kv_keys.with_label_values(&[ns]).set(*keys);
                set.kv_bytes.with_label_values(&[ns]).set(*bytes);
            }
            set.locks_held
                .with_label_values(&["cluster"])
                .set(state.locks_held);
            for (queue, pending, late) in &state.timers {
                set.timers_pending.with_label_values(&[queue]).set(*pending);
                set.timers_late.with_label_values(&[queue]).set(*late);
            }
            for (query, keys, bytes) in &state.streams {
                set.stream_keys.with_label_values(&[query]).set(*keys);
                set.stream_bytes.with_label_values(&[query]).set(*bytes);
            }
        }
        self.registry.gather()
    }

    /// The text exposition (`text/plain; version=0.0.4`).
    ///
    /// # Errors
    ///
    /// The encoder's error (never expected: every family is well-formed).
    pub fn prometheus_text(&self, g: &Gauges) -> Result<Vec<u8>, prometheus::Error> {
        let mut body = Vec::new();
        TextEncoder::new().encode(&self.gather(g), &mut body)?;
        Ok(body)
    }

    /// Queen's `GET /metrics` JSON, read from the same families.
    pub fn json(&self, g: &Gauges) -> serde_json::Value {
        let families = self.gather(g);
        let sum = |name: &str| sum_of(&families, name, &[]);
        let requests = sum("queen_http_requests_total");
        let messages = sum_of(
            &families,
            "queen_push_messages_total",
            &[("verdict", "queued"), ("verdict", "buffered")],
        );
        let (request_rate, message_rate) = {
            let mut rates = self.rates.lock().expect("metrics rate lock poisoned");
            let now = Instant::now();
            match rates.at {
                Some(at) if now.duration_since(at) < Duration::from_secs(1) => {}
                Some(at) => {
                    let secs = now.duration_since(at).as_secs_f64();
                    rates.request_rate = (requests - rates.requests) / secs;
                    rates.message_rate = (messages - rates.messages) / secs;
                    rates.at = Some(now);
                    rates.requests = requests;
                    rates.messages = messages;
                }
                None => {
                    let secs = self.started.elapsed().as_secs_f64().max(1.0);
                    rates.request_rate = requests / secs;
                    rates.message_rate = messages / secs;
                    rates.at = Some(now);
                    rates.requests = requests;
                    rates.messages = messages;
                }
            }
            (rates.request_rate, rates.message_rate)
        };
        let cpu_secs = sum("process_cpu_seconds_total");
        serde_json::json!({
            "uptime": self.started.elapsed().as_secs(),
            "requests": { "total": requests as u64, "rate": round2(request_rate) },
            "messages": {
                "total": messages as u64,
                "rate": round2(message_rate),
                "pushed": sum("queen_push_messages_total") as u64,
                "popped": sum("queen_pop_messages_total") as u64,
                "acked": sum("queen_ack_total") as u64,
            },
            // One `database` object (a second key would replace the first for most JSON
            // readers: the dashboard's pool tile showed "—").
            "database": {
                "poolSize": g.pool_size,
                "idleConnections": g.pool_idle,
                "waitingRequests": 0,
                "host": g.database_host,
                "switches": g.database_switches,
                // Every pool of this broker (the dashboard's database tile shows them).
                "pools": {
                    "shared": { "size": g.pool_size, "idle": g.pool_idle },
                    "lease": { "size": g.lease_pool_size, "idle": g.lease_pool_idle },
                    "claims": { "size": g.claim_pool_size, "idle": g.claim_pool_idle },
                    "acks": { "size": g.ack_pool_size, "idle": g.ack_pool_idle },
                },
            },
            "memory": {
                "rss": sum("process_resident_memory_bytes") as u64,
                "heapTotal": 0, "heapUsed": 0, "external": 0, "arrayBuffers": 0,
            },
            // Node reports microseconds; the process collector has user + system together.
            "cpu": { "user": (cpu_secs * 1e6) as u64, "system": 0 },
            "spool": {
                "records": g.spool_records,
                "bytes": g.spool_bytes,
                "oldestSeconds": g.spool_oldest_secs,
                "replayed": g.replayed,
                "quarantined": g.quarantined,
                "dbUnreachableSeconds": g.db_down_for.map_or(0, |d| d.as_secs()),
                "maintenanceMode": g.maintenance,
                "popMaintenanceMode": g.pop_maintenance,
            },
            "partitionActors": g.partition_actors,
            "partitionActorEvictions": g.partition_evictions,
            "inflightBytes": g.inflight_bytes,
            "commitBacklogItems": g.commit_backlog,
        })
    }
}

/// Running totals the history sampler (`crate::history`) turns into rates and percentiles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Items answered `queued` or `buffered`.
    pub pushed: u64,
    /// Messages handed out by pops.
    pub popped: u64,
    /// Acknowledgements that succeeded.
    pub acked: u64,
    /// Successful commits: (upper bound in seconds, cumulative count) per finite bucket.
    pub commit_buckets: Vec<(f64, u64)>,
    /// Successful commits.
    pub commit_count: u64,
}

/// An HTTP method as a metric label: the standard methods as they are, anything else `other`
/// (a client may send any token as a method; each would be a series of its own).
pub fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        "-" => "-",
        _ => "other",
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The sum of a family's samples (counter, gauge, or histogram count) whose labels include
/// any of `only` (every sample when `only` is empty).
pub fn sum_of(families: &[MetricFamily], name: &str, only: &[(&str, &str)]) -> f64 {
    families
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter().map(move |m| (f.get_field_type(), m)))
        .filter(|(_, m)| {
            only.is_empty()
                || m.get_label()
                    .iter()
                    .any(|l| only.iter().any(|(k, v)| l.name() == *k && l.value() == *v))
        })
        .map(|(kind, m)| match kind {
            MetricType::COUNTER => m.get_counter().get_value(),
            MetricType::GAUGE => m.get_gauge().get_value(),
            MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
            _ => 0.0,
        })
        .sum()
}

impl CommitObserver for Metrics {
    fn committed(&self, report: &CommitReport) {
        if !self.enabled {
            return;
        }
        let secs = report.elapsed.as_secs_f64();
        if report.committed {
            self.commit_ok.observe(secs);
            self.commit_items.observe(report.items as f64);
            self.commit_partitions.observe(report.segments as f64);
        } else {
            self.commit_failed.observe(secs);
        }
    }
}

// ---- Ephemeral queues ----------------------------------------------------------------------
// Kept apart from the families above: the ephemeral store (`crate::ephemeral`) holds these
// handles and sets them as its rings change, so nothing is read at the scrape.

/// The ephemeral queues' families (`queen_ephemeral_*`).
#[derive(Clone)]
pub struct EphemeralMetrics {
    /// Ephemeral queues this broker holds.
    pub queues: IntGauge,
    /// Messages in their rings.
    pub messages: IntGauge,
    /// Bytes they hold (payloads plus a fixed overhead per message).
    pub bytes: IntGauge,
    /// `QUEEN_EPHEMERAL_MAX_BYTES`.
    pub budget_bytes: IntGauge,
    /// Messages dropped, by reason (`ttl`, `policy`, `retries`).
    pub dropped: IntCounterVec,
}

impl Metrics {
    /// Registers the ephemeral queues' families on this registry; call once per registry.
    pub fn ephemeral(&self) -> EphemeralMetrics {
        let r = &self.registry;
        EphemeralMetrics {
            queues: gauge(
                r,
                "queen_ephemeral_queues",
                "ephemeral queues held by this broker",
            ),
            messages: gauge(
                r,
                "queen_ephemeral_messages",
                "messages in this broker's ephemeral rings",
            ),
            bytes: gauge(
                r,
                "queen_ephemeral_bytes",
                "bytes held by this broker's ephemeral rings (payload plus per-message overhead)",
            ),
            budget_bytes: gauge(
                r,
                "queen_ephemeral_budget_bytes",
                "QUEEN_EPHEMERAL_MAX_BYTES: the ephemeral rings' memory budget",
            ),
            dropped: counter_vec(
                r,
                "queen_ephemeral_dropped_total",
                "ephemeral messages dropped unconsumed, by reason",
                &["reason"],
            ),
        }
    }
}

/// The Kafka listener's families (docs/kafka.md, "Metrics"): label sets bounded by the Kafka
/// API names and two directions.
#[derive(Clone)]
pub struct KafkaMetrics {
    enabled: bool,
    /// Open Kafka connections.
    pub connections: IntGauge,
    /// Requests answered, by API and result (`ok`; `closed`: the connection was closed instead).
    requests: IntCounterVec,
    /// Time to answer, by API (a fetch's long poll included).
    seconds: HistogramVec,
    /// Records produced and fetched.
    records: IntCounterVec,
}

impl KafkaMetrics {
    /// One request of `api` answered (`ok`) or ending its connection, in `elapsed`.
    pub fn request(&self, api: &str, ok: bool, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let result = if ok { "ok" } else { "closed" };
        self.requests.with_label_values(&[api, result]).inc();
        self.seconds
            .with_label_values(&[api])
            .observe(elapsed.as_secs_f64());
    }

    /// `n` records stored by a produce.
    pub fn produced(&self, n: u64) {
        if self.enabled {
            self.records.with_label_values(&["produced"]).inc_by(n);
        }
    }

    /// `n` records answered to a fetch.
    pub fn fetched(&self, n: u64) {
        if self.enabled {
            self.records.with_label_values(&["fetched"]).inc_by(n);
        }
    }
}

impl Metrics {
    /// Registers the Kafka listener's families on this registry; call once per registry.
    pub fn kafka(&self) -> KafkaMetrics {
        let r = &self.registry;
        KafkaMetrics {
            enabled: self.enabled(),
            connections: gauge(r, "queen_kafka_connections", "open Kafka connections"),
            requests: counter_vec(
                r,
                "queen_kafka_requests_total",
                "Kafka requests, by API and result (ok, or closed: the connection was closed instead of answering)",
                &["api", "result"],
            ),
            seconds: histogram_vec(
                r,
                "queen_kafka_request_duration_seconds",
                "time to answer a Kafka request, by API (a fetch's long poll included)",
                &["api"],
                POP_LATENCY,
            ),
            records: counter_vec(
                r,
                "queen_kafka_records_total",
                "records produced and fetched over the Kafka listener",
                &["direction"],
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_exposed_and_gauges_follow_the_state() {
        let m = Metrics::new(true);
        m.request("/api/v1/push", "POST", 201, Duration::from_millis(3));
        m.request(
            "/api/v1/pop/queue/{queue}",
            "GET",
            204,
            Duration::from_millis(1),
        );
        m.committed(&CommitReport {
            segments: 3,
            items: 7,
            elapsed: Duration::from_millis(2),
            committed: true,
        });
        let g = Gauges {
            spool_records: 5,
            replayed: 9,
            partition_actors: 2,
            partition_evictions: 12,
            database_host: "db2:5433".into(),
            database_switches: 1,
            leases: Some(4),
            claim_pool_size: 2,
            claim_pool_idle: 1,
            ack_pool_size: 1,
            ack_pool_idle: 1,
            leases_ahead: [7, 5, 2],
            cache_reads: [30, 4],
            cache_rereads: 3,
            cache_budget: 1 << 20,
            ..Gauges::default()
        };
        let text = String::from_utf8(m.prometheus_text(&g).unwrap()).unwrap();
        for line in [
            "queen_http_requests_total{method=\"POST\",route=\"/api/v1/push\",status=\"2xx\"} 1",
            "queen_pop_duration_seconds_count{result=\"empty\"} 1",
            "queen_commit_batch_items_sum 7",
            "queen_commit_batch_partitions_sum 3",
            "queen_file_buffer_pending 5",
            "queen_file_buffer_replayed_total 9",
            "# TYPE queen_file_buffer_replayed_total counter",
            "queen_partition_actors 2",
            "queen_partition_actor_evictions_total 12",
            "queen_database_primary{host=\"db2:5433\"} 1",
            "queen_database_primary_switches_total 1",
            "queen_leases_held{scope=\"cluster\"} 4",
            "queen_db_pool_active{pool=\"claims\"} 1",
            "queen_db_pool_active{pool=\"acks\"} 0",
            "queen_pop_leases_ahead_total{outcome=\"taken\"} 5",
            "queen_pop_leases_ahead_total{outcome=\"released\"} 2",
            "queen_segment_cache_reads_total{result=\"hit\"} 30",
            "queen_segment_cache_reads_total{result=\"miss\"} 4",
            "queen_segment_cache_rereads_total 3",
            "queen_segment_cache_budget_bytes 1048576",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // A second scrape with the same replay count does not count again.
        let text = String::from_utf8(m.prometheus_text(&g).unwrap()).unwrap();
        assert!(
            text.contains("queen_file_buffer_replayed_total 9"),
            "{text}"
        );
        let json = m.json(&g);
        assert_eq!(json["requests"]["total"], 2);
        assert_eq!(json["spool"]["records"], 5);
    }

    #[test]
    fn switched_off_nothing_is_recorded() {
        let m = Metrics::new(false);
        m.request("/api/v1/push", "POST", 201, Duration::from_millis(3));
        m.committed(&CommitReport {
            segments: 1,
            items: 1,
            elapsed: Duration::from_millis(2),
            committed: true,
        });
        let json = m.json(&Gauges::default());
        assert_eq!(json["requests"]["total"], 0);
        let text = String::from_utf8(m.prometheus_text(&Gauges::default()).unwrap()).unwrap();
        assert!(text.contains("queen_commit_batch_items_count 0"), "{text}");
    }
}
