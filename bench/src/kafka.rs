//! The Kafka suite (`--suites kafka`): the same messages moved three ways on one PostgreSQL, in
//! one run — produced and consumed by librdkafka (the `rdkafka` crate, which builds it) through
//! the broker's Kafka listener, pushed and popped+acked over HTTP by the bench's own client, and
//! produced and consumed by librdkafka through Tansu (a Kafka broker on PostgreSQL; built by
//! `bench/tansu/setup.sh` into a cache outside the repository, skipped when absent). Every
//! variant runs on a fresh database with its own server process, the order rotated per round.
//!
//! Reported per variant: msg/s, the server's and PostgreSQL's CPU µs per message (the server is
//! the broker or Tansu), produce latency (send → delivery report) or the pop+ack cycle; per
//! round the ratio against the HTTP variant of the same direction. The librdkafka clients keep
//! their defaults (`acks=all`, `linger.ms=5`, no compression, a queue of up to 100 000
//! messages; consumers commit automatically every 5 s) except where a row says otherwise
//! (`enable.idempotence=true`) and what a group needs to read a filled topic from its start
//! (`auto.offset.reset=earliest`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use serde::Serialize;
use sqlx::{Connection, PgConnection};

use crate::broker::BrokerProcess;
use crate::data::{self, Rng};
use crate::db::{self, Server};
use crate::measure::{CpuTargets, CpuUse, Window, WorkerStats};
use crate::scenario::{trace, Params, POP_BATCH};
use crate::wire::{self, cpu_between, PopOptions, PushBody, Spread, PARTITIONS, PUSH_BATCH};
use crate::{load, traffic, BoxError};

/// The topic (and queue) every variant writes.
pub const TOPIC: &str = data::QUEUE;
/// Consumers of the consuming variants (librdkafka group members, or HTTP consumers).
pub const CONSUMERS: usize = 4;

/// Where Tansu lives once `bench/tansu/setup.sh` built it.
pub fn default_tansu_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/queen-bench/tansu-0.6.0"))
}

/// One way of moving the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// `POST /api/v1/push`, JSON, 100 items a request (the bench's own HTTP client).
    HttpPush,
    /// librdkafka producing through the broker's Kafka listener, defaults.
    KafkaProduce,
    /// The same with `enable.idempotence=true` (the broker's exact dedup per producer id and
    /// sequence, as the HTTP push's `transactionId` dedup).
    KafkaProduceIdempotent,
    /// librdkafka producing through Tansu on the same PostgreSQL, defaults.
    TansuProduce,
    /// Pops of 100 in a consumer group + `/ack/batch`, JSON.
    HttpPopAck,
    /// A librdkafka consumer group reading the filled topic through the broker.
    KafkaConsume,
    /// The same through Tansu.
    TansuConsume,
}

impl Variant {
    /// Every variant, in the order of the first round.
    pub const ALL: [Variant; 7] = [
        Variant::HttpPush,
        Variant::KafkaProduce,
        Variant::KafkaProduceIdempotent,
        Variant::TansuProduce,
        Variant::HttpPopAck,
        Variant::KafkaConsume,
        Variant::TansuConsume,
    ];

    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            Variant::HttpPush => "HTTP push (JSON, batch 100)",
            Variant::KafkaProduce => "Kafka produce (librdkafka)",
            Variant::KafkaProduceIdempotent => "Kafka produce, idempotent",
            Variant::TansuProduce => "Tansu produce (librdkafka)",
            Variant::HttpPopAck => "HTTP pop+ack (group, batch 100)",
            Variant::KafkaConsume => "Kafka group consume",
            Variant::TansuConsume => "Tansu group consume",
        }
    }

    /// The HTTP variant this one is compared with.
    pub fn baseline(self) -> Variant {
        if self.is_produce() {
            Variant::HttpPush
        } else {
            Variant::HttpPopAck
        }
    }

    fn is_produce(self) -> bool {
        matches!(
            self,
            Variant::HttpPush
                | Variant::KafkaProduce
                | Variant::KafkaProduceIdempotent
                | Variant::TansuProduce
        )
    }

    fn on_tansu(self) -> bool {
        matches!(self, Variant::TansuProduce | Variant::TansuConsume)
    }

    fn over_http(self) -> bool {
        matches!(self, Variant::HttpPush | Variant::HttpPopAck)
    }
}

/// The variants of round `round` (without Tansu's when it is not built), rotated by the round.
pub fn round_order(round: usize, tansu: bool) -> Vec<Variant> {
    let mut v: Vec<Variant> = Variant::ALL
        .iter()
        .copied()
        .filter(|v| tansu || !v.on_tansu())
        .collect();
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// Tansu as built by `bench/tansu/setup.sh`: its binary and the PostgreSQL schema it needs
/// (Tansu's postgres engine does not create its tables).
#[derive(Clone, Debug)]
pub struct Tansu {
    /// `bin/tansu`.
    pub bin: PathBuf,
    /// `schema.sql`.
    pub schema: PathBuf,
}

impl Tansu {
    /// Tansu under `dir`, when it was built there.
    pub fn find(dir: &Path) -> Option<Self> {
        let t = Self {
            bin: dir.join("bin/tansu"),
            schema: dir.join("schema.sql"),
        };
        (t.bin.exists() && t.schema.exists()).then_some(t)
    }
}

/// A running Tansu broker; killed on drop.
struct TansuProcess {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TansuProcess {
    async fn start(tansu: &Tansu, database_url: &str) -> Result<Self, BoxError> {
        let port = queen_broker::pg::free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "queen-bench-tansu-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::File::create(dir.join("tansu.log"))?;
        let listener = format!("tcp://127.0.0.1:{port}");
        // Tansu's PostgreSQL client tries TLS unless told not to, and the bench's server is
        // on loopback without a certificate for its address.
        let storage = if database_url.contains("sslmode=") {
            database_url.to_string()
        } else if database_url.contains('?') {
            format!("{database_url}&sslmode=disable")
        } else {
            format!("{database_url}?sslmode=disable")
        };
        let child = Command::new(&tansu.bin)
            .current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .args([
                "broker",
                "--listener-url",
                &listener,
                "--advertised-listener-url",
                &listener,
                "--storage-engine",
                &storage,
                "--silent",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut t = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = t.child.try_wait()? {
                return Err(format!("tansu exited at start ({status}): {}", t.log_tail()).into());
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(t);
            }
            if Instant::now() > deadline {
                return Err(format!("tansu not listening after 30 s: {}", t.log_tail()).into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("tansu.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    fn log_problems(&self, max: usize) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join("tansu.log")).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(max)
            .map(|l| format!("tansu: {l}"))
            .collect()
    }
}

impl Drop for TansuProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server a variant talks to.
enum ServerProcess {
    Broker(BrokerProcess, u16),
    Tansu(TansuProcess),
}

impl ServerProcess {
    fn pid(&self) -> u32 {
        match self {
            ServerProcess::Broker(b, _) => b.pid(),
            ServerProcess::Tansu(t) => t.child.id(),
        }
    }

    fn bootstrap(&self) -> String {
        match self {
            ServerProcess::Broker(_, kafka) => format!("127.0.0.1:{kafka}"),
            ServerProcess::Tansu(t) => format!("127.0.0.1:{}", t.port),
        }
    }

    fn problems(self) -> Vec<String> {
        match self {
            ServerProcess::Broker(b, _) => {
                let p = b.log_problems(3);
                b.stop();
                p
            }
            ServerProcess::Tansu(t) => t.log_problems(3),
        }
    }
}

/// One variant measured once.
#[derive(Clone, Debug, Serialize)]
pub struct KafkaMeasurement {
    /// What.
    pub variant: Variant,
    /// Round (from 0).
    pub round: usize,
    /// Messages produced (acknowledged) or consumed per second in the window.
    pub msgs_per_sec: f64,
    /// Produce latency (send → delivery report; HTTP: the request), or the HTTP pop+ack
    /// cycle, p50, ms (NaN for Kafka consumers: a poll is not a request).
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// Cores used in the window.
    pub cpu: CpuUse,
    /// The server's (broker's or Tansu's) CPU per message, µs.
    pub server_us_per_msg: f64,
    /// PostgreSQL's CPU per message, µs.
    pub postgres_us_per_msg: f64,
    /// Failed sends, deliveries or requests.
    pub errors: u64,
    /// What went wrong.
    pub problems: Vec<String>,
}

/// What librdkafka's delivery reports said, counted by the producer's context.
struct Deliveries {
    window: Window,
    delivered: AtomicU64,
    in_window: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    latencies_us: Mutex<Vec<u32>>,
}

/// The producer's context: hands every delivery report to the shared [`Deliveries`].
struct Reports(Arc<Deliveries>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<Instant>;

    fn delivery(&self, result: &DeliveryResult<'_>, sent: Self::DeliveryOpaque) {
        let d = &self.0;
        let now = Instant::now();
        match result {
            Ok(_) => {
                d.delivered.fetch_add(1, Ordering::Relaxed);
                if d.window.contains(now) {
                    d.in_window.fetch_add(1, Ordering::Relaxed);
                    let us = (now - *sent).as_micros().min(u128::from(u32::MAX)) as u32;
                    if let Ok(mut l) = d.latencies_us.lock() {
                        l.push(us);
                    }
                }
            }
            Err((e, _)) => {
                d.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = d.first_error.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
}

/// Produces with librdkafka to `partitions` random partitions of [`TOPIC`] until `window`
/// ends, or (with `count`) until that many messages were delivered. The producer is flat out:
/// up to librdkafka's `queue.buffering.max.messages` (100 000 by default) wait in its queue, so
/// the produce latency it reports is mostly that queue. Runs on a thread of its own
/// (librdkafka's calls block).
fn produce(
    bootstrap: &str,
    idempotent: bool,
    window: Window,
    count: Option<u64>,
    seed: u64,
) -> Result<(WorkerStats, u64), BoxError> {
    let deliveries = Arc::new(Deliveries {
        window,
        delivered: AtomicU64::new(0),
        in_window: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
        latencies_us: Mutex::new(Vec::new()),
    });
    let producer: ThreadedProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "enable.idempotence",
            if idempotent { "true" } else { "false" },
        )
        .create_with_context(Reports(deliveries.clone()))?;
    // A pool of payloads, generated before the window (as the HTTP client's are per request).
    let mut rng = Rng::new(seed);
    let payloads: Vec<String> = (0..1024).map(|_| data::payload(&mut rng)).collect();
    let mut stats = WorkerStats::default();
    let mut sent = 0u64;
    loop {
        let now = Instant::now();
        match count {
            Some(n) if deliveries.delivered.load(Ordering::Relaxed) >= n => break,
            Some(n) if sent >= n => {
                // Waits for reports; a timeout only means some are still on their way.
                let _ = producer.flush(Duration::from_millis(100));
                if now > window.end {
                    return Err(format!(
                        "fill: {} of {n} delivered",
                        deliveries.delivered.load(Ordering::Relaxed)
                    )
                    .into());
                }
                if deliveries.failed.load(Ordering::Relaxed) > 0 {
                    // Resend what failed (the fill only needs the count).
                    sent = deliveries.delivered.load(Ordering::Relaxed);
                    deliveries.failed.store(0, Ordering::Relaxed);
                }
                continue;
            }
            None if now >= window.end => break,
            _ => {}
        }
        let partition = rng.below(PARTITIONS) as i32;
        let payload = &payloads[(sent % payloads.len() as u64) as usize];
        let record: BaseRecord<'_, (), [u8], Box<Instant>> =
            BaseRecord::with_opaque_to(TOPIC, Box::new(Instant::now()))
                .partition(partition)
                .payload(payload.as_bytes());
        match producer.send(record) {
            Ok(()) => sent += 1,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => {
                stats.error(format!("send: {e}"));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    producer.flush(Duration::from_secs(30))?;
    stats.msgs = deliveries.in_window.load(Ordering::Relaxed);
    stats.total_msgs = deliveries.delivered.load(Ordering::Relaxed);
    stats.latencies_us =
        std::mem::take(&mut *deliveries.latencies_us.lock().map_err(|_| "poisoned")?);
    stats.latencies_us.sort_unstable();
    stats.ops = stats.latencies_us.len() as u64;
    let failed = deliveries.failed.load(Ordering::Relaxed);
    if failed > 0 && count.is_none() {
        stats.errors += failed;
        if stats.first_error.is_none() {
            stats.first_error = deliveries
                .first_error
                .lock()
                .map_err(|_| "poisoned")?
                .clone();
        }
    }
    Ok((stats, sent))
}

/// Creates [`TOPIC`] with [`PARTITIONS`] partitions through the Kafka protocol (CreateTopics).
async fn create_topic(bootstrap: &str) -> Result<(), BoxError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let topic = NewTopic::new(TOPIC, PARTITIONS as i32, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await?;
    for r in results {
        if let Err((name, code)) = r {
            if code != RDKafkaErrorCode::TopicAlreadyExists {
                return Err(format!("CreateTopics {name}: {code}").into());
            }
        }
    }
    Ok(())
}

/// What the consumers of one consuming variant saw.
struct Consumed {
    in_window: AtomicU64,
    total: AtomicU64,
    assigned: AtomicUsize,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

/// Starts [`CONSUMERS`] librdkafka consumers in one group on threads of their own; they count
/// messages until `stop`, those inside the window once `window` is set.
fn consume(
    bootstrap: &str,
    window: Arc<OnceLock<Window>>,
    stop: Arc<AtomicBool>,
    seen: Arc<Consumed>,
) -> Result<Vec<std::thread::JoinHandle<()>>, BoxError> {
    let mut threads = Vec::new();
    for _ in 0..CONSUMERS {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "bench-kafka")
            .set("auto.offset.reset", "earliest")
            .create()?;
        consumer.subscribe(&[TOPIC])?;
        let (window, stop, seen) = (window.clone(), stop.clone(), seen.clone());
        threads.push(std::thread::spawn(move || {
            let mut assigned = 0usize;
            let mut checked = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(_)) => {
                        seen.total.fetch_add(1, Ordering::Relaxed);
                        if window.get().is_some_and(|w| w.contains(Instant::now())) {
                            seen.in_window.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(Err(e)) => {
                        seen.errors.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut first) = seen.first_error.lock() {
                            first.get_or_insert_with(|| e.to_string());
                        }
                    }
                    None => {}
                }
                if window.get().is_none() && checked.elapsed() > Duration::from_millis(200) {
                    checked = Instant::now();
                    let now = consumer.assignment().map_or(0, |a| a.count());
                    if now != assigned {
                        seen.assigned.fetch_add(now, Ordering::Relaxed);
                        seen.assigned.fetch_sub(assigned, Ordering::Relaxed);
                        assigned = now;
                    }
                }
            }
            consumer.unsubscribe();
        }));
    }
    Ok(threads)
}

/// Measures `variant` once, on a fresh database with its own server.
///
/// # Errors
///
/// When setup fails (failures inside the window are counted, not fatal).
pub async fn measure(
    server: &mut Server,
    params: &Params,
    tansu: Option<&Tansu>,
    variant: Variant,
    round: usize,
) -> Result<KafkaMeasurement, BoxError> {
    let name = server.create_database().await?;
    let url = server.url(&name);
    let result = measure_in(server, params, tansu, variant, round, &url).await;
    server.drop_database(&name).await?;
    result
}

async fn start_server(
    params: &Params,
    tansu: Option<&Tansu>,
    variant: Variant,
    url: &str,
) -> Result<ServerProcess, BoxError> {
    if variant.on_tansu() {
        let tansu = tansu.ok_or("Tansu is not built (bench/tansu/setup.sh)")?;
        let schema = std::fs::read_to_string(&tansu.schema)?;
        let mut conn = PgConnection::connect(url).await?;
        sqlx::raw_sql(&schema).execute(&mut conn).await?;
        conn.close().await?;
        return Ok(ServerProcess::Tansu(TansuProcess::start(tansu, url).await?));
    }
    let kafka = queen_broker::pg::free_port()?;
    let mut env = params.broker_env.clone();
    env.push(("QUEEN_KAFKA_PORT".into(), kafka.to_string()));
    let broker = BrokerProcess::start(&params.broker_bin, url, &env).await?;
    Ok(ServerProcess::Broker(broker, kafka))
}

async fn measure_in(
    server: &mut Server,
    params: &Params,
    tansu: Option<&Tansu>,
    variant: Variant,
    round: usize,
    url: &str,
) -> Result<KafkaMeasurement, BoxError> {
    if variant.over_http() {
        let mut conn = PgConnection::connect(url).await?;
        db::setup_queue(&mut conn, PARTITIONS, true).await?;
        conn.close().await?;
    }
    let t = Instant::now();
    let process = start_server(params, tansu, variant, url).await?;
    trace(params, "server start", t);
    let bootstrap = process.bootstrap();
    let http_port = match &process {
        ServerProcess::Broker(b, _) => Some(b.port),
        ServerProcess::Tansu(_) => None,
    };
    let tag = data::fresh_seed();
    let mut problems = Vec::new();
    if variant.over_http() {
        let port = http_port.ok_or("HTTP variant without a broker")?;
        load::prime(port, PARTITIONS, params.connections).await?;
    } else {
        create_topic(&bootstrap).await?;
    }
    let mut prefilled = 0;
    if !variant.is_produce() {
        let t = Instant::now();
        prefilled = if let Some(port) = http_port.filter(|_| variant.over_http()) {
            traffic::fill(
                port,
                params.connections,
                PUSH_BATCH,
                PARTITIONS,
                tag,
                params.prefill,
            )
            .await
            .iter()
            .flat_map(|l| &l.requests)
            .map(|r| u64::from(r.queued))
            .sum::<u64>()
        } else {
            let (b, n) = (bootstrap.clone(), params.prefill);
            let deadline = Window::after(Duration::ZERO, Duration::from_secs(600));
            tokio::task::spawn_blocking(move || produce(&b, false, deadline, Some(n), tag))
                .await??
                .0
                .total_msgs
        };
        trace(params, "fill", t);
    }
    server.checkpoint().await?;
    let targets = CpuTargets {
        broker: Some(process.pid()),
        postmaster: server.postmaster,
    };
    let (stats, cpu) = match variant {
        Variant::HttpPush => {
            let window = Window::after(params.warmup, params.duration);
            let port = http_port.ok_or("HTTP variant without a broker")?;
            let workers = wire::push_workers(
                port,
                params.connections,
                PushBody::Json,
                PUSH_BATCH,
                window,
                tag,
                Arc::new(AtomicU64::new(0)),
            );
            let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
            let mut all = Vec::new();
            for w in workers {
                all.push(w.await?);
            }
            let stats = WorkerStats::merge(all);
            if stats.not_queued > 0 {
                problems.push(format!("{} items not queued", stats.not_queued));
            }
            (stats, cpu)
        }
        Variant::KafkaProduce | Variant::KafkaProduceIdempotent | Variant::TansuProduce => {
            let window = Window::after(params.warmup, params.duration);
            let idempotent = variant == Variant::KafkaProduceIdempotent;
            let b = bootstrap.clone();
            let producer =
                tokio::task::spawn_blocking(move || produce(&b, idempotent, window, None, tag));
            let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
            (producer.await??.0, cpu)
        }
        Variant::HttpPopAck => {
            let window = Window::after(params.warmup, params.duration);
            let port = http_port.ok_or("HTTP variant without a broker")?;
            let opts = PopOptions {
                framed: false,
                group: Some("bench-http".into()),
                wait: false,
                batch: POP_BATCH,
                autopilot: false,
            };
            let stop = Arc::new(AtomicBool::new(false));
            let delivered = Arc::new(AtomicU64::new(0));
            let workers = wire::consumers(
                port,
                CONSUMERS,
                &opts,
                window,
                stop.clone(),
                delivered.clone(),
            );
            let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
            stop.store(true, Ordering::Relaxed);
            let mut all = Vec::new();
            for w in workers {
                all.push(w.await?.window);
            }
            if delivered.load(Ordering::Relaxed) + 1_000 >= prefilled {
                problems.push(format!(
                    "the queue ran dry ({} of {prefilled} consumed): raise --prefill",
                    delivered.load(Ordering::Relaxed)
                ));
            }
            (WorkerStats::merge(all), cpu)
        }
        Variant::KafkaConsume | Variant::TansuConsume => {
            let seen = Arc::new(Consumed {
                in_window: AtomicU64::new(0),
                total: AtomicU64::new(0),
                assigned: AtomicUsize::new(0),
                errors: AtomicU64::new(0),
                first_error: Mutex::new(None),
            });
            let window_cell = Arc::new(OnceLock::new());
            let stop = Arc::new(AtomicBool::new(false));
            let threads = consume(&bootstrap, window_cell.clone(), stop.clone(), seen.clone())?;
            // The window opens once the group holds every partition and messages flow.
            let t = Instant::now();
            let deadline = Instant::now() + Duration::from_secs(60);
            while (seen.assigned.load(Ordering::Relaxed) < PARTITIONS as usize
                || seen.total.load(Ordering::Relaxed) == 0)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            trace(params, "group joined", t);
            if seen.assigned.load(Ordering::Relaxed) < PARTITIONS as usize {
                problems.push(format!(
                    "the group held {} of {PARTITIONS} partitions after 60 s",
                    seen.assigned.load(Ordering::Relaxed)
                ));
            }
            let window = Window::after(params.warmup, params.duration);
            let _ = window_cell.set(window);
            let cpu = cpu_between(targets, window, params.ticks_per_sec).await;
            stop.store(true, Ordering::Relaxed);
            for t in threads {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            let mut stats = WorkerStats {
                msgs: seen.in_window.load(Ordering::Relaxed),
                total_msgs: seen.total.load(Ordering::Relaxed),
                errors: seen.errors.load(Ordering::Relaxed),
                ..WorkerStats::default()
            };
            stats.first_error = seen.first_error.lock().map_err(|_| "poisoned")?.clone();
            if stats.total_msgs + 1_000 >= prefilled {
                problems.push(format!(
                    "the topic ran dry ({} of {prefilled} consumed): raise --prefill",
                    stats.total_msgs
                ));
            }
            (stats, cpu)
        }
    };
    problems.extend(process.problems());
    let secs = params.duration.as_secs_f64();
    let msgs_per_sec = stats.msgs as f64 / secs;
    if let Some(e) = &stats.first_error {
        problems.push(format!("{} errors, first: {e}", stats.errors));
    }
    let per_msg = |cores: f64| cores * 1e6 / msgs_per_sec;
    Ok(KafkaMeasurement {
        variant,
        round,
        msgs_per_sec,
        p50_ms: stats.percentile_ms(50.0),
        p99_ms: stats.percentile_ms(99.0),
        cpu,
        server_us_per_msg: per_msg(cpu.broker),
        postgres_us_per_msg: per_msg(cpu.postgres),
        errors: stats.errors,
        problems,
    })
}

/// The suite's rounds: every variant each round, the order rotated; Tansu's variants only when
/// `tansu` is given.
///
/// # Errors
///
/// When a measurement's setup fails.
pub async fn run(
    server: &mut Server,
    params: &Params,
    rounds: usize,
    tansu: Option<&Tansu>,
    started: Instant,
) -> Result<Vec<KafkaMeasurement>, BoxError> {
    let mut all = Vec::new();
    for round in 0..rounds {
        for variant in round_order(round, tansu.is_some()) {
            let m = measure(server, params, tansu, variant, round).await?;
            eprintln!(
                "[kafka {:>4.0}s] round {} {:<32} {:>9.0} msg/s  p50 {:>6.1} ms  p99 {:>6.1} ms  server {:>6.1} µs/msg  pg {:>6.1} µs/msg  cpu s{:.2} pg{:.2} load{:.2} other{:.2}{}",
                started.elapsed().as_secs_f64(),
                round + 1,
                variant.label(),
                m.msgs_per_sec,
                m.p50_ms,
                m.p99_ms,
                m.server_us_per_msg,
                m.postgres_us_per_msg,
                m.cpu.broker,
                m.cpu.postgres,
                m.cpu.load,
                m.cpu.other,
                crate::report::problems_suffix(&m.problems)
            );
            all.push(m);
        }
    }
    Ok(all)
}

/// One variant over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct KafkaRow {
    /// What.
    pub variant: Variant,
    /// Rounds measured.
    pub rounds: usize,
    /// msg/s.
    pub msgs_per_sec: Spread,
    /// The server's CPU µs per message.
    pub server_us_per_msg: Spread,
    /// PostgreSQL's CPU µs per message.
    pub postgres_us_per_msg: Spread,
    /// Server and PostgreSQL together, µs per message.
    pub total_us_per_msg: Spread,
    /// p50 / p99 of produce latency or the pop+ack cycle, ms.
    pub p50_ms: Spread,
    /// See `p50_ms`.
    pub p99_ms: Spread,
    /// Per-round msg/s against the HTTP variant of the same direction and round.
    pub rate_ratio: Spread,
    /// Per-round server+PostgreSQL CPU per message against the same HTTP variant.
    pub cpu_ratio: Spread,
}

/// The rows of every variant measured, with per-round ratios.
pub fn rows(all: &[KafkaMeasurement]) -> Vec<KafkaRow> {
    let total = |m: &KafkaMeasurement| m.server_us_per_msg + m.postgres_us_per_msg;
    Variant::ALL
        .iter()
        .filter_map(|&v| {
            let mine: Vec<&KafkaMeasurement> = all.iter().filter(|m| m.variant == v).collect();
            if mine.is_empty() {
                return None;
            }
            let of = |f: &dyn Fn(&KafkaMeasurement) -> f64| {
                Spread::of(&mine.iter().map(|m| f(m)).collect::<Vec<_>>())
            };
            let ratio = |f: &dyn Fn(&KafkaMeasurement) -> f64| {
                let r: Vec<f64> = mine
                    .iter()
                    .filter_map(|m| {
                        all.iter()
                            .find(|b| b.variant == v.baseline() && b.round == m.round)
                            .map(|b| f(m) / f(b))
                    })
                    .collect();
                Spread::of(&r)
            };
            Some(KafkaRow {
                variant: v,
                rounds: mine.len(),
                msgs_per_sec: of(&|m| m.msgs_per_sec),
                server_us_per_msg: of(&|m| m.server_us_per_msg),
                postgres_us_per_msg: of(&|m| m.postgres_us_per_msg),
                total_us_per_msg: of(&total),
                p50_ms: of(&|m| m.p50_ms),
                p99_ms: of(&|m| m.p99_ms),
                rate_ratio: ratio(&|m| m.msgs_per_sec),
                cpu_ratio: ratio(&total),
            })
        })
        .collect()
}

/// Issue 33's goal read from the rows: (what, median ratio, met).
pub fn goals(rows: &[KafkaRow]) -> Vec<(String, f64, bool)> {
    rows.iter()
        .filter(|r| r.variant == Variant::KafkaProduce)
        .map(|r| {
            let x = r.rate_ratio.median;
            (
                "Kafka produce msg/s ≥ 1.0× the HTTP push of the same round".to_string(),
                x,
                x >= 1.0,
            )
        })
        .collect()
}

/// The suite's table, medians with (min–max) over the rounds.
pub fn table(rows: &[KafkaRow]) -> String {
    let mut out = String::from(
        "| variant | msg/s | × HTTP (rate) | server µs/msg | PostgreSQL µs/msg | × HTTP (CPU/msg) | p50 / p99 ms |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let p = if r.p50_ms.median.is_finite() {
            format!("{:.1} / {:.1}", r.p50_ms.median, r.p99_ms.median)
        } else {
            "—".to_string()
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {p} |\n",
            r.variant.label(),
            r.msgs_per_sec.text(0),
            r.rate_ratio.text(2),
            r.server_us_per_msg.text(1),
            r.postgres_us_per_msg.text(1),
            r.cpu_ratio.text(2),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_and_leave_tansu_out_when_not_built() {
        assert_eq!(round_order(0, true), Variant::ALL.to_vec());
        assert_eq!(round_order(1, true)[0], Variant::KafkaProduce);
        let without = round_order(0, false);
        assert_eq!(without.len(), 5);
        assert!(without.iter().all(|v| !v.on_tansu()));
    }

    #[test]
    fn ratios_are_per_round_against_the_http_variant_of_the_same_direction() {
        let m = |variant, round, rate: f64, us: f64| KafkaMeasurement {
            variant,
            round,
            msgs_per_sec: rate,
            p50_ms: 1.0,
            p99_ms: 2.0,
            cpu: CpuUse::default(),
            server_us_per_msg: us,
            postgres_us_per_msg: us,
            errors: 0,
            problems: Vec::new(),
        };
        let all = vec![
            m(Variant::HttpPush, 0, 100.0, 2.0),
            m(Variant::KafkaProduce, 0, 150.0, 1.0),
            m(Variant::HttpPush, 1, 200.0, 2.0),
            m(Variant::KafkaProduce, 1, 200.0, 1.0),
            m(Variant::HttpPopAck, 0, 400.0, 1.0),
            m(Variant::KafkaConsume, 0, 800.0, 1.0),
        ];
        let rows = rows(&all);
        let kafka = rows
            .iter()
            .find(|r| r.variant == Variant::KafkaProduce)
            .expect("a Kafka row");
        assert_eq!(kafka.rate_ratio.median, 1.25);
        assert_eq!(kafka.cpu_ratio.median, 0.5);
        let consume = rows
            .iter()
            .find(|r| r.variant == Variant::KafkaConsume)
            .expect("a consume row");
        assert_eq!(consume.rate_ratio.median, 2.0);
        let goals = goals(&rows);
        assert_eq!(goals.len(), 1);
        assert!(goals[0].2);
    }
}
