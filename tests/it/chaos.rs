//! The broker's own chaos run (issue 38). Three real broker processes under libfaketime on one
//! database served by a durable primary and its synchronous standby (both made by the test);
//! each broker reaches the two nodes through TCP proxies of its own (a multi-host URL with
//! `target_session_attrs=read-write`), and every client reaches each broker through a proxy in
//! front of it. Producers with deterministic transactionIds retry every batch until all of it
//! is accepted; acking consumers pop from the brokers in turn; beside them, clients of the
//! state primitives (KV puts and an incremented counter, a mutex with fencing tokens, timers:
//! `tests/it/chaos_state.rs`). While they work, faults are injected in turn:
//!
//! - every broker connection terminated (`pg_terminate_backend`);
//! - maintenance mode on and off again;
//! - the primary restarted with an immediate stop (a crash: recovery from the WAL), and with a
//!   fast stop;
//! - one broker's proxies to PostgreSQL cut (its connections dropped, new ones refused);
//! - one broker killed with SIGKILL and started again on the same port and spool directory;
//! - a full spool disk: the first broker's spool lives on a small tmpfs mounted by the test;
//!   with maintenance on (everything spools) the tmpfs is filled up, then freed again. Without
//!   the right to mount (not root, or no `mount`) this fault is skipped, and the run says why;
//! - network faults through the proxies: 150 ms added to every chunk between every broker and
//!   PostgreSQL for 2 s; a 2 s partition of every broker from PostgreSQL; five 100 ms cuts of
//!   every client↔broker connection 200 ms apart (requests in flight lose their answers; the
//!   clients retry, and dedup stores a retried push once); with `QUEEN_CHAOS_HALF_OPEN=1` also
//!   a 4 s black hole between the brokers and PostgreSQL (half-open connections);
//! - one broker's wall clock jumped an hour ahead or behind (libfaketime's offset file; the
//!   monotonic clock is left alone, as an NTP step leaves it) for 2.5 s, then back;
//! - a failover: the primary crashes (`pg_ctl stop -m immediate`), the standby is promoted at
//!   once and the brokers follow; then the old primary is rewound (`pg_rewind`) and started as
//!   the new primary's synchronous standby, so the next failover goes the other way.
//!
//! After each fault a probe pushes one message through every broker (through its client proxy)
//! and pops it back: the time from the fault's end until every broker did is the fault's
//! **recovery**. The checker then reads PostgreSQL: per partition every produced key is stored
//! (lost = 0), once (twice = 0), in production order (order = 0); no message is delivered again
//! after its ack succeeded (after-ack = 0); and the state primitives' invariants hold. Each
//! accepted key is counted against the fault kind last begun when it was accepted, and the run
//! prints a table per fault kind: faults, accepted, lost, twice, order, the longest recovery.
//! Each producer stays with one broker: order is promised per broker (a `buffered` batch
//! replays from that broker's spool; another would not wait).
//!
//! CI size by default (6 partitions, 6 000 messages, every fault at least once: about a
//! minute). The long form (docs/operations.md, "The chaos run"):
//! `QUEEN_CHAOS_LONG=1 cargo test --release --test it chaos:: -- --nocapture` (10 M messages,
//! 108 faults: nine rounds of the twelve kinds; 117 with the half-open kind); `QUEEN_CHAOS_MESSAGES=N` and
//! `QUEEN_CHAOS_FAULTS=N` set other counts, either form. libfaketime is needed for the clock
//! fault (`QUEEN_REQUIRE_FAKETIME=1`, set by `.ci/run`, makes its absence a failure).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use queen_broker::pg::free_port;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::chaos_state::{self, State};
use crate::support::ha_pair::{off_thread, HaPair};
use crate::support::proxy::Proxy;
use crate::support::TestDb;

pub(super) const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");
const QUEUE: &str = "chaos";
const PROBE_QUEUE: &str = "chaos-probe";
const BROKERS: usize = 3;

/// The run's size: messages, partitions, items per push, the spool tmpfs size, faults.
struct Size {
    messages: usize,
    partitions: usize,
    batch: usize,
    tmpfs: &'static str,
    /// Faults to inject at least (production is spread over them).
    faults: usize,
    long: bool,
}

fn size(kinds: usize) -> Size {
    let long = std::env::var("QUEEN_CHAOS_LONG").is_ok_and(|v| v == "1");
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    Size {
        messages: env("QUEEN_CHAOS_MESSAGES").unwrap_or(if long { 10_000_000 } else { 6_000 }),
        partitions: if long { 12 } else { 6 },
        batch: if long { 100 } else { 10 },
        tmpfs: if long { "256m" } else { "16m" },
        faults: env("QUEEN_CHAOS_FAULTS").unwrap_or(if long { 9 * kinds } else { kinds }),
        long,
    }
}

/// One broker process, restartable on the same port and spool directory (`chaos_locks` runs
/// them too).
pub(super) struct Node {
    pub(super) port: u16,
    pub(super) env: Vec<(String, String)>,
    pub(super) log: PathBuf,
    pub(super) child: Option<Child>,
}

impl Node {
    pub(super) fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("broker log file");
        let mut cmd = Command::new(BROKER);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("broker process starts"));
    }

    pub(super) fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    pub(super) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Everything the run started, stopped and removed however the test ends.
struct World {
    dir: PathBuf,
    ha: HaPair,
    nodes: Vec<RefCell<Node>>,
    tmpfs: Option<PathBuf>,
    /// Each broker's libfaketime offset file (none without libfaketime).
    clocks: Vec<PathBuf>,
    /// Per broker, its proxies to the two PostgreSQL nodes.
    pg_proxies: Vec<[Proxy; 2]>,
    /// Per broker, the proxy its clients reach it through.
    client_proxies: Vec<Proxy>,
}

impl World {
    /// The URL of the database on the node taking writes.
    fn db(&self) -> TestDb {
        TestDb {
            url: self.ha.primary_url("postgres"),
        }
    }

    /// Every proxy between the brokers and PostgreSQL.
    fn all_pg_proxies(&self) -> impl Iterator<Item = &Proxy> {
        self.pg_proxies.iter().flatten()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.borrow_mut().sigkill();
        }
        self.ha.stop();
        if let Some(mount) = &self.tmpfs {
            let _ = Command::new("umount").arg(mount).status();
        }
        if std::thread::panicking() {
            for node in &self.nodes {
                let log = std::fs::read_to_string(&node.borrow().log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                eprintln!(
                    "--- broker {} log (last lines, newest first):\n{}",
                    node.borrow().port,
                    tail.join("\n")
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Proxies to `targets` (one each, in order), on a thread and runtime of their own, so they
/// keep forwarding while the test's single thread is busy. They stop when the returned sender
/// is dropped.
fn proxies_on_own_thread(targets: Vec<u16>) -> (Vec<Proxy>, tokio::sync::oneshot::Sender<()>) {
    let (give, take) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("proxy runtime");
        rt.block_on(async move {
            let mut proxies = Vec::new();
            for target in targets {
                proxies.push(Proxy::start(target).await);
            }
            give.send(proxies).expect("proxies handed over");
            let _ = stopped.await;
        });
    });
    (take.recv().expect("proxies started"), stop)
}

/// Mounts a tmpfs of `size` on `dir`; `Err` says why not.
fn mount_tmpfs(dir: &Path, size: &str) -> Result<(), String> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount -t tmpfs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Fills the file system of `dir` up with one file; returns its path and size.
fn fill(dir: &Path) -> (PathBuf, u64) {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler file");
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    // The last bytes a partial write left: fill them one at a time.
    while f.write(&[0]).is_ok_and(|n| n == 1) {
        written += 1;
    }
    (path, written)
}

/// The HTTP side: a client that never panics on a refused or cut connection.
#[derive(Clone)]
pub(super) struct Http(pub(super) awc::Client);

impl Http {
    async fn send(&self, req: awc::ClientRequest, body: Option<&Value>) -> Option<(u16, Value)> {
        let sent = match body {
            Some(b) => req.send_json(b).await,
            None => req.send().await,
        };
        let mut res = sent.ok()?;
        let bytes = res.body().limit(64 * 1024 * 1024).await.ok()?;
        Some((
            res.status().as_u16(),
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    pub(super) async fn post(&self, base: &str, path: &str, body: &Value) -> Option<(u16, Value)> {
        self.send(self.0.post(format!("{base}{path}")), Some(body))
            .await
    }

    pub(super) async fn get(&self, base: &str, path: &str) -> Option<(u16, Value)> {
        self.send(self.0.get(format!("{base}{path}")), None).await
    }

    /// Waits until `/health` is 200 (the broker is up and reaches PostgreSQL).
    pub(super) async fn healthy(&self, base: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !matches!(self.get(base, "/health").await, Some((200, _))) {
            assert!(
                Instant::now() < deadline,
                "{base} not healthy within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the run counted as it went.
#[derive(Default)]
struct Tally {
    retries: Cell<usize>,
    /// Items answered `failed` (refused: e.g. a full spool disk), per broker.
    failed_items: RefCell<[usize; BROKERS]>,
    /// Items answered `duplicate` (a retry of a push whose answer was lost, or a replay).
    duplicates: Cell<usize>,
    deliveries: Cell<usize>,
    after_ack: Cell<usize>,
    acked_count: Cell<usize>,
    /// Acked flags (the ack answered `success: true`), per partition and sequence number.
    acked: RefCell<Vec<Vec<bool>>>,
    /// Delivered flags, per partition and sequence number.
    delivered: RefCell<Vec<Vec<bool>>>,
    /// Per partition and sequence number, the window it was accepted in: 0 before the first
    /// fault, else 1 + the index (in the run's kinds) of the fault begun last.
    accepted_in: RefCell<Vec<Vec<u8>>>,
    /// 1 + the index of the fault kind begun last (0: none yet).
    window: Cell<u8>,
    faults_started: Cell<usize>,
    /// Per fault kind: each fault's recovery (`None`: not within the bound).
    recoveries: RefCell<BTreeMap<usize, Vec<Option<Duration>>>>,
    /// Failovers: (crash → promoted, rebuild of the standby, by pg_rewind).
    failovers: RefCell<Vec<(Duration, Duration, bool)>>,
    /// Acks answered `success: false`, by error (and whether on a first attempt or a retry).
    ack_refused: RefCell<BTreeMap<String, usize>>,
}

fn key(partition: usize, seq: usize) -> String {
    format!("p{partition}-{seq:09}")
}

fn parse_key(key: &str) -> Option<(usize, usize)> {
    let (p, s) = key.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// Pushes one partition's keys in order, each batch retried until every item is accepted.
/// Production is spread over the planned faults: the k-th of `stretches` stretches of the
/// keys waits until the k-th fault has begun, so every fault meets producers at work.
#[expect(
    clippy::too_many_arguments,
    reason = "the run's shared cells, each named"
)]
async fn produce(
    http: Http,
    base: String,
    broker: usize,
    partition: usize,
    count: usize,
    batch: usize,
    stretches: usize,
    tally: Rc<Tally>,
) {
    let mut seq = 0;
    while seq < count {
        while seq * stretches / count > tally.faults_started.get() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let end = (seq + batch).min(count);
        let items: Vec<Value> = (seq..end)
            .map(|s| {
                json!({"queue": QUEUE, "partition": format!("p{partition}"),
                       "transactionId": key(partition, s), "payload": {"s": s}})
            })
            .collect();
        let reply = http
            .post(&base, "/api/v1/push", &json!({ "items": items }))
            .await;
        let mut accepted = false;
        // 201, or 500 in maintenance mode when the spool write failed (its items `failed`).
        if let Some((status, Value::Array(results))) = reply {
            let failed = results.iter().filter(|r| r["status"] == "failed").count();
            tally.failed_items.borrow_mut()[broker] += failed;
            let duplicates = results
                .iter()
                .filter(|r| r["status"] == "duplicate")
                .count();
            tally.duplicates.set(tally.duplicates.get() + duplicates);
            accepted = status == 201
                && results.len() == end - seq
                && results.iter().all(|r| {
                    matches!(
                        r["status"].as_str(),
                        Some("queued" | "duplicate" | "buffered")
                    )
                });
        }
        if accepted {
            let window = tally.window.get();
            tally.accepted_in.borrow_mut()[partition][seq..end].fill(window);
            seq = end;
        } else {
            tally.retries.set(tally.retries.get() + 1);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Pops and acks, one batch at a time, until every message is consumed or `deadline` passes
/// (pushed on by two minutes at each ack once production is over). Several consumers run at
/// once: an ack naming its lease succeeds only while that lease is live, when no other
/// consumer can hold the message, so a delivery seen after an ack's success came after it.
/// An ack whose answer was lost and whose retry is refused (`Invalid or expired lease`: the
/// first attempt had released it) has an unknown outcome; so the consumer stops once
/// PostgreSQL says every stored message is consumed, not on its own count.
#[expect(
    clippy::too_many_arguments,
    reason = "the run's shared cells, each named"
)]
async fn consume(
    http: Http,
    bases: Vec<String>,
    world: Rc<World>,
    total: usize,
    producing: Rc<Cell<bool>>,
    deadline: Rc<Cell<Instant>>,
    tally: Rc<Tally>,
    first: usize,
) {
    let mut turn = first;
    while Instant::now() < deadline.get() {
        turn += 1;
        let base = &bases[turn % bases.len()];
        let messages = match http
            .get(base, &format!("/api/v1/pop/queue/{QUEUE}?batch=100"))
            .await
        {
            Some((200, body)) => body["messages"].as_array().cloned().unwrap_or_default(),
            _ => Vec::new(),
        };
        if messages.is_empty() {
            if !producing.get() && all_consumed(&world.db().url, total).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        }
        let mut acks = Vec::new();
        for m in &messages {
            let k = m["transactionId"].as_str().unwrap_or_default();
            let (p, s) =
                parse_key(k).unwrap_or_else(|| panic!("a delivery we never produced: {m}"));
            tally.deliveries.set(tally.deliveries.get() + 1);
            tally.delivered.borrow_mut()[p][s] = true;
            if tally.acked.borrow()[p][s] {
                tally.after_ack.set(tally.after_ack.get() + 1);
            }
            acks.push(json!({"transactionId": k, "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "status": "completed"}));
        }
        // An ack that did not get through is retried, on the next broker too; the lease keeps
        // the messages ours meanwhile (and when it ends, they are delivered again: not a fault).
        let body = json!({ "acknowledgments": acks });
        for attempt in 0..200 {
            let base = &bases[(turn + attempt) % bases.len()];
            if let Some((200, Value::Array(outcomes))) =
                http.post(base, "/api/v1/ack/batch", &body).await
            {
                for o in outcomes.iter().filter(|o| o["success"] != true) {
                    let why = format!("attempt {}: {}", attempt.min(1), o["error"]);
                    *tally.ack_refused.borrow_mut().entry(why).or_default() += 1;
                }
                for o in outcomes.iter().filter(|o| o["success"] == true) {
                    if let Some((p, s)) = o["transactionId"].as_str().and_then(parse_key) {
                        let mut acked = tally.acked.borrow_mut();
                        if !acked[p][s] {
                            acked[p][s] = true;
                            tally.acked_count.set(tally.acked_count.get() + 1);
                            if !producing.get() {
                                let later = Instant::now() + Duration::from_secs(120);
                                deadline.set(deadline.get().max(later));
                            }
                        }
                    }
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether all `total` messages are stored and consumed (queue mode), as PostgreSQL says (a
/// spool may still be replaying after production ended).
async fn all_consumed(db_url: &str, total: usize) -> bool {
    use sqlx::Connection;
    let Ok(mut conn) = sqlx::PgConnection::connect(db_url).await else {
        return false;
    };
    let row: Result<(i64, i64), _> = sqlx::query_as(
        "SELECT (SELECT COALESCE(SUM(s.msg_count), 0)::bigint FROM queen.segments s
                   JOIN queen.partitions p ON p.id = s.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = $1),
                (SELECT COALESCE(SUM(c.committed_offset), 0)::bigint
                   FROM queen.partition_consumers c
                   JOIN queen.partitions p ON p.id = c.partition_id
                   JOIN queen.queues q ON q.id = p.queue_id
                  WHERE q.name = $1 AND c.consumer_group = '__QUEUE_MODE__')",
    )
    .bind(QUEUE)
    .fetch_one(&mut conn)
    .await;
    row.is_ok_and(|(stored, consumed)| stored == total as i64 && consumed == total as i64)
}

/// The fault kinds, injected in turn until production is over and enough ran.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Terminate,
    Maintenance,
    PgImmediate,
    ProxyCut,
    Delay,
    BrokerKill,
    ClientCuts,
    PgFast,
    Partition,
    SpoolFull,
    ClockJump,
    Failover,
    HalfOpen,
}

/// The kinds of this run: every kind but the half-open one, which `QUEEN_CHAOS_HALF_OPEN=1`
/// adds (the broker's bound on a half-open PostgreSQL connection is being fixed).
fn kinds() -> Vec<Fault> {
    let mut kinds = vec![
        Fault::Terminate,
        Fault::Maintenance,
        Fault::PgImmediate,
        Fault::ProxyCut,
        Fault::Delay,
        Fault::BrokerKill,
        Fault::ClientCuts,
        Fault::PgFast,
        Fault::Partition,
        Fault::SpoolFull,
        Fault::ClockJump,
        Fault::Failover,
    ];
    if std::env::var("QUEEN_CHAOS_HALF_OPEN").is_ok_and(|v| v == "1") {
        kinds.push(Fault::HalfOpen);
    }
    kinds
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Terminate => "backends terminated",
            Fault::Maintenance => "maintenance toggle",
            Fault::PgImmediate => "PostgreSQL immediate restart",
            Fault::ProxyCut => "one broker cut from PostgreSQL, 1 s",
            Fault::Delay => "broker↔PostgreSQL delay 150 ms, 2 s",
            Fault::BrokerKill => "broker SIGKILL + restart",
            Fault::ClientCuts => "client↔broker cuts (5 × 100 ms)",
            Fault::PgFast => "PostgreSQL fast restart",
            Fault::Partition => "all brokers cut from PostgreSQL, 2 s",
            Fault::SpoolFull => "spool disk full",
            Fault::ClockJump => "broker clock ±1 h, 2.5 s",
            Fault::Failover => "primary crash + failover",
            Fault::HalfOpen => "broker↔PostgreSQL half-open, 4 s",
        }
    }
}

async fn maintenance(http: &Http, world: &World, on: bool) {
    // Any broker will do (the flag is the database's); retried until one answers.
    for attempt in 0..400 {
        let base = world.nodes[attempt % BROKERS].borrow().base();
        if let Some((200, _)) = http
            .post(
                &base,
                "/api/v1/system/maintenance",
                &json!({ "enabled": on }),
            )
            .await
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no broker switched maintenance mode {}",
        if on { "on" } else { "off" }
    );
}

/// After a fault ended: pushes one message through every broker (`bases`: through their client
/// proxies) and pops it back there; how long until every broker did, or `None` past `bound`.
async fn probe(http: &Http, bases: &[String], n: usize, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    let one = |b: usize| {
        let base = bases[b].clone();
        async move {
            let txn = format!("probe-{n}-{b}");
            let partition = format!("b{b}");
            let item = json!({"items": [{"queue": PROBE_QUEUE, "partition": partition,
                                         "transactionId": txn, "payload": {"n": n}}]});
            loop {
                if let Some((201, Value::Array(r))) = http.post(&base, "/api/v1/push", &item).await
                {
                    if matches!(
                        r[0]["status"].as_str(),
                        Some("queued" | "buffered" | "duplicate")
                    ) {
                        break;
                    }
                }
                if start.elapsed() > bound {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let pop = format!(
                "/api/v1/pop/queue/{PROBE_QUEUE}/partition/{partition}?batch=50&wait=false"
            );
            loop {
                if let Some((200, body)) = http.get(&base, &pop).await {
                    let messages = body["messages"].as_array().cloned().unwrap_or_default();
                    let acks: Vec<Value> = messages
                        .iter()
                        .map(|m| {
                            json!({"transactionId": m["transactionId"],
                                   "partitionId": m["partitionId"],
                                   "leaseId": m["leaseId"], "status": "completed"})
                        })
                        .collect();
                    if !acks.is_empty() {
                        let _ = http
                            .post(
                                &base,
                                "/api/v1/ack/batch",
                                &json!({ "acknowledgments": acks }),
                            )
                            .await;
                    }
                    if messages.iter().any(|m| m["transactionId"] == txn.as_str()) {
                        return true;
                    }
                }
                if start.elapsed() > bound {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let done = futures_util::future::join_all((0..bases.len()).map(one)).await;
    done.iter().all(|d| *d).then(|| start.elapsed())
}

/// Sets a broker's wall-clock offset (libfaketime reads the file at most a second later).
fn set_clock(file: &Path, offset_secs: i64) {
    std::fs::write(file, format!("{offset_secs:+}\n")).expect("offset file written");
}

#[expect(
    clippy::too_many_arguments,
    reason = "the run's shared cells, each named"
)]
async fn inject(
    http: Http,
    world: Rc<World>,
    kinds: Vec<Fault>,
    planned: usize,
    client_bases: Vec<String>,
    producing: Rc<Cell<bool>>,
    tally: Rc<Tally>,
    long: bool,
) {
    use sqlx::Connection;
    let bound = Duration::from_secs(if long { 120 } else { 60 });
    let mut round = 0usize;
    loop {
        let k = round % kinds.len();
        let fault = kinds[k];
        if !producing.get() && round >= planned {
            break;
        }
        round += 1;
        let victim = round % BROKERS;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The fault is in force from here: the next stretch of keys may be pushed.
        let begun = || {
            tally.window.set(u8::try_from(k + 1).expect("few kinds"));
            tally.faults_started.set(tally.faults_started.get() + 1);
        };
        let mut failover = None;
        match fault {
            Fault::Terminate => {
                let mut conn = sqlx::PgConnection::connect(&world.db().url)
                    .await
                    .expect("admin connection");
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                .execute(&mut conn)
                .await
                .expect("terminate");
                begun();
            }
            Fault::Maintenance => {
                maintenance(&http, &world, true).await;
                begun();
                tokio::time::sleep(Duration::from_millis(500)).await;
                maintenance(&http, &world, false).await;
            }
            Fault::PgImmediate | Fault::PgFast => {
                let primary = world.ha.primary().clone();
                let immediate = fault == Fault::PgImmediate;
                let stopping = primary.clone();
                off_thread(move || stopping.stop(immediate))
                    .await
                    .expect("pg_ctl stop");
                begun();
                tokio::time::sleep(Duration::from_millis(700)).await;
                off_thread(move || primary.start(true))
                    .await
                    .expect("pg_ctl start");
            }
            Fault::ProxyCut => {
                world.pg_proxies[victim].iter().for_each(Proxy::cut);
                begun();
                tokio::time::sleep(Duration::from_millis(1000)).await;
                world.pg_proxies[victim].iter().for_each(Proxy::restore);
            }
            Fault::Partition => {
                world.all_pg_proxies().for_each(Proxy::cut);
                begun();
                tokio::time::sleep(Duration::from_millis(2000)).await;
                world.all_pg_proxies().for_each(Proxy::restore);
            }
            Fault::Delay => {
                world
                    .all_pg_proxies()
                    .for_each(|p| p.set_delay(Duration::from_millis(150)));
                begun();
                tokio::time::sleep(Duration::from_millis(2000)).await;
                world
                    .all_pg_proxies()
                    .for_each(|p| p.set_delay(Duration::ZERO));
            }
            Fault::HalfOpen => {
                world.all_pg_proxies().for_each(Proxy::black_hole);
                begun();
                tokio::time::sleep(Duration::from_millis(4000)).await;
                world.all_pg_proxies().for_each(Proxy::heal);
            }
            Fault::ClientCuts => {
                begun();
                for cut in 0..5 {
                    if cut > 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    world.client_proxies.iter().for_each(Proxy::cut);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    world.client_proxies.iter().for_each(Proxy::restore);
                }
            }
            Fault::BrokerKill => {
                world.nodes[victim].borrow_mut().sigkill();
                begun();
                tokio::time::sleep(Duration::from_millis(300)).await;
                world.nodes[victim].borrow_mut().spawn();
                let base = world.nodes[victim].borrow().base();
                http.healthy(&base, Duration::from_secs(60)).await;
            }
            Fault::SpoolFull => {
                let Some(mount) = &world.tmpfs else {
                    begun();
                    continue;
                };
                // Everything spools; the first broker's spool disk then fills up.
                maintenance(&http, &world, true).await;
                let (filler, bytes) = fill(mount);
                assert!(bytes > 0, "the filler wrote something");
                begun();
                tokio::time::sleep(Duration::from_millis(1000)).await;
                std::fs::remove_file(&filler).expect("filler removed");
                tokio::time::sleep(Duration::from_millis(300)).await;
                maintenance(&http, &world, false).await;
            }
            Fault::ClockJump => {
                let Some(file) = world.clocks.get(victim) else {
                    begun();
                    continue;
                };
                // Ahead on odd rounds, behind on even ones.
                set_clock(file, if round % 2 == 1 { 3600 } else { -3600 });
                begun();
                tokio::time::sleep(Duration::from_millis(2500)).await;
                set_clock(file, 0);
                // libfaketime rereads the file within a second.
                tokio::time::sleep(Duration::from_millis(1100)).await;
            }
            Fault::Failover => {
                let promoted = world.ha.crash_and_promote(begun).await;
                failover = Some(promoted);
            }
        }
        let n = tally.faults_started.get();
        let recovery = probe(&http, &client_bases, n, bound).await;
        if recovery.is_none() {
            eprintln!(
                "chaos: after fault {n} ({}), a broker did not take and deliver a probe \
                 within {bound:?}",
                fault.name()
            );
        }
        tally
            .recoveries
            .borrow_mut()
            .entry(k)
            .or_default()
            .push(recovery);
        if let Some(promoted) = failover {
            // The crashed node becomes the new primary's synchronous standby, under load.
            let (rebuilt, rewound) = world.ha.rebuild_standby().await;
            tally
                .failovers
                .borrow_mut()
                .push((promoted, rebuilt, rewound));
        }
    }
}

/// Per fault kind: faults, keys accepted in its windows, lost, twice, order, recoveries.
struct Row {
    faults: usize,
    accepted: usize,
    lost: usize,
    twice: usize,
    order: usize,
}

#[actix_web::test]
async fn chaos_nothing_lost_nothing_twice_order_kept() {
    let kinds = kinds();
    let size = size(kinds.len());
    // At least the count asked for: every partition gets the same share, rounded up.
    let per_partition = size.messages.div_ceil(size.partitions);
    let total = per_partition * size.partitions;
    let dir = std::env::temp_dir().join(format!("queen-chaos-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let faketime = crate::chaos_clock::faketime_lib();
    if faketime.is_none() {
        assert!(
            !std::env::var("QUEEN_REQUIRE_FAKETIME").is_ok_and(|v| v == "1"),
            "QUEEN_REQUIRE_FAKETIME=1 but libfaketime is not installed (apt-get install faketime)"
        );
        eprintln!("chaos: libfaketime not installed (apt-get install faketime): the clock fault is skipped");
    }
    // Durable clusters: an immediate stop must not lose a commit PostgreSQL acknowledged.
    let ha = HaPair::start(&dir).await;

    // The proxies run on a runtime of their own thread, so they keep forwarding while this
    // test's single thread is busy: per broker two to PostgreSQL (one per node), then one in
    // front of each broker for its clients.
    let ports: Vec<u16> = (0..BROKERS).map(|_| free_port().unwrap()).collect();
    let mut targets = Vec::new();
    for _ in 0..BROKERS {
        targets.extend([ha.nodes[0].port, ha.nodes[1].port]);
    }
    targets.extend(ports.iter().copied());
    let (mut proxies, proxy_thread) = proxies_on_own_thread(targets);
    let client_proxies: Vec<Proxy> = proxies.split_off(2 * BROKERS);
    let mut pg_proxies = Vec::new();
    let mut rest = proxies.into_iter();
    while let (Some(a), Some(b)) = (rest.next(), rest.next()) {
        pg_proxies.push([a, b]);
    }
    let spool0 = dir.join("spool0");
    std::fs::create_dir_all(&spool0).unwrap();
    let tmpfs = match mount_tmpfs(&spool0, size.tmpfs) {
        Ok(()) => Some(spool0.clone()),
        Err(why) => {
            eprintln!("chaos: the full-spool-disk fault is skipped: {why}");
            None
        }
    };
    let mut nodes = Vec::new();
    let mut clocks = Vec::new();
    for (n, pair) in pg_proxies.iter().enumerate() {
        let port = ports[n];
        let spool = dir.join(format!("spool{n}"));
        let url = format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            pair[0].port, pair[1].port
        );
        let mut env: Vec<(String, String)> = [
            ("DATABASE_URL", url.as_str()),
            ("HOST", "127.0.0.1"),
            ("PORT", &port.to_string()),
            ("FILE_BUFFER_DIR", &spool.display().to_string()),
            ("QUEEN_CONFIG", ""),
            ("NUM_WORKERS", "1"),
            ("DB_POOL_SIZE", "4"),
            ("QUEEN_FLAG_POLL_MS", "100"),
            ("DB_CONNECTION_TIMEOUT", "1000"),
            ("QUEEN_PRIMARY_CHECK_MS", "200"),
            ("QUEEN_REPLAY_BACKOFF_MS", "50"),
            ("QUEEN_COMMIT_TIMEOUT_MS", "5000"),
            ("LOG_LEVEL", "warn"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(lib) = &faketime {
            let file = dir.join(format!("clock{n}.faketime"));
            set_clock(&file, 0);
            env.extend(
                [
                    ("LD_PRELOAD", lib.display().to_string()),
                    ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
                    ("FAKETIME_CACHE_DURATION", "1".into()),
                    ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
                ]
                .map(|(k, v)| (k.to_string(), v)),
            );
            clocks.push(file);
        }
        nodes.push(RefCell::new(Node {
            port,
            env,
            log: dir.join(format!("broker{n}.log")),
            child: None,
        }));
    }
    let world = Rc::new(World {
        dir: dir.clone(),
        ha,
        nodes,
        tmpfs,
        clocks,
        pg_proxies,
        client_proxies,
    });
    let http = Http(
        awc::Client::builder()
            .connector(awc::Connector::new().conn_keep_alive(Duration::from_secs(1)))
            .timeout(Duration::from_secs(20))
            .finish(),
    );
    // The first broker migrates the database; the others start once it did.
    for node in &world.nodes {
        node.borrow_mut().spawn();
        let base = node.borrow().base();
        http.healthy(&base, Duration::from_secs(60)).await;
    }
    let bases: Vec<String> = world.nodes.iter().map(|n| n.borrow().base()).collect();
    let client_bases: Vec<String> = world
        .client_proxies
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.port))
        .collect();
    for (queue, lease) in [(QUEUE, 10), (PROBE_QUEUE, 5)] {
        let (status, body) = http
            .post(
                &bases[0],
                "/api/v1/configure",
                &json!({"queue": queue, "options": {"leaseTime": lease}}),
            )
            .await
            .expect("configure answered");
        assert!(status < 300, "configure: {status} {body}");
    }

    let started = Instant::now();
    let tally = Rc::new(Tally {
        acked: RefCell::new(vec![vec![false; per_partition]; size.partitions]),
        delivered: RefCell::new(vec![vec![false; per_partition]; size.partitions]),
        accepted_in: RefCell::new(vec![vec![0; per_partition]; size.partitions]),
        ..Tally::default()
    });
    let producing = Rc::new(Cell::new(true));
    let faults = actix_web::rt::spawn(inject(
        http.clone(),
        world.clone(),
        kinds.clone(),
        size.faults,
        client_bases.clone(),
        producing.clone(),
        tally.clone(),
        size.long,
    ));
    let state = Rc::new(State::new(http.clone(), client_bases.clone()));
    let mut workers = Vec::new();
    for w in 0..BROKERS {
        workers.push(actix_web::rt::spawn(chaos_state::kv_worker(
            state.clone(),
            w,
        )));
        workers.push(actix_web::rt::spawn(chaos_state::lock_worker(
            state.clone(),
            w,
        )));
        workers.push(actix_web::rt::spawn(chaos_state::timer_worker(
            state.clone(),
            w,
        )));
    }
    let far = Rc::new(Cell::new(started + Duration::from_secs(365 * 24 * 3600)));
    let consumers: Vec<_> = (0..BROKERS)
        .map(|first| {
            actix_web::rt::spawn(consume(
                http.clone(),
                client_bases.clone(),
                world.clone(),
                total,
                producing.clone(),
                far.clone(),
                tally.clone(),
                first,
            ))
        })
        .collect();
    let producers: Vec<_> = (0..size.partitions)
        .map(|p| {
            let broker = p % BROKERS;
            actix_web::rt::spawn(produce(
                http.clone(),
                client_bases[broker].clone(),
                broker,
                p,
                per_partition,
                size.batch,
                size.faults + 1,
                tally.clone(),
            ))
        })
        .collect();
    for p in producers {
        p.await.unwrap();
    }
    let produced_in = started.elapsed();
    producing.set(false);
    faults.await.unwrap();
    let faults_over = started.elapsed();
    state.stop.set(true);
    for w in workers {
        w.await.unwrap();
    }
    // Faults over: maintenance off for good; the consumers go on while they make progress.
    maintenance(&http, &world, false).await;
    far.set(Instant::now() + Duration::from_secs(120));
    for c in consumers {
        c.await.unwrap();
    }
    // Every spool drained before PostgreSQL is read.
    let deadline = Instant::now() + Duration::from_secs(60);
    for base in &bases {
        loop {
            let records = http
                .get(base, "/metrics")
                .await
                .and_then(|(_, m)| m["spool"]["records"].as_u64());
            if records == Some(0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{base}: the spool did not drain: {records:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let db = world.db();
    let mut rows: Vec<Row> = (0..=kinds.len())
        .map(|_| Row {
            faults: 0,
            accepted: 0,
            lost: 0,
            twice: 0,
            order: 0,
        })
        .collect();
    {
        for p in 0..size.partitions {
            let stored = db.stored(QUEUE, &format!("p{p}")).await;
            let accepted_in = tally.accepted_in.borrow();
            let mut seen = vec![false; per_partition];
            let mut last: Option<usize> = None;
            for s in &stored {
                let (sp, seq) = parse_key(&s.transaction_id).expect("a key we produced");
                assert_eq!(sp, p, "a key of another partition stored here");
                let row = &mut rows[usize::from(accepted_in[p][seq])];
                if seen[seq] {
                    row.twice += 1;
                }
                seen[seq] = true;
                if let Some(l) = last.filter(|l| *l >= seq) {
                    row.order += 1;
                    eprintln!(
                        "chaos: p{p}: key {seq} (accepted in window {}) stored at offset {} after key {l}",
                        accepted_in[p][seq], s.offset
                    );
                }
                last = Some(seq);
            }
            for (seq, window) in accepted_in[p].iter().enumerate() {
                let row = &mut rows[usize::from(*window)];
                row.accepted += 1;
                if !seen[seq] {
                    row.lost += 1;
                }
            }
        }
    }
    let recoveries = tally.recoveries.borrow().clone();
    for (k, r) in &recoveries {
        rows[k + 1].faults = r.len();
    }
    let state_report = chaos_state::check(&state, &db).await;
    let (lost, twice, order) = rows.iter().fold((0, 0, 0), |(l, t, o), r| {
        (l + r.lost, t + r.twice, o + r.order)
    });
    let faults_injected = tally.faults_started.get();
    eprintln!(
        "chaos{}: {total} messages in {} partitions, {BROKERS} brokers, produced in {:.1} s, \
         faults over at {:.1} s; {faults_injected} faults; {} producer retries, {} items \
         answered duplicate, {:?} items refused per broker; {} deliveries, {} acked; lost \
         {lost}, twice {twice}, order {order}, delivered after ack {}; {:.1} s",
        if size.long { " (long)" } else { "" },
        size.partitions,
        produced_in.as_secs_f64(),
        faults_over.as_secs_f64(),
        tally.retries.get(),
        tally.duplicates.get(),
        tally.failed_items.borrow(),
        tally.deliveries.get(),
        tally.acked_count.get(),
        tally.after_ack.get(),
        started.elapsed().as_secs_f64()
    );
    eprintln!("chaos: | fault kind | faults | accepted | lost | twice | order | max recovery |");
    eprintln!("chaos: | --- | --- | --- | --- | --- | --- | --- |");
    for (i, row) in rows.iter().enumerate() {
        let (name, max) = if i == 0 {
            ("(before the first fault)", String::from("—"))
        } else {
            let r = recoveries.get(&(i - 1)).cloned().unwrap_or_default();
            let max = if r.iter().any(Option::is_none) {
                String::from("NOT RECOVERED")
            } else {
                r.iter()
                    .flatten()
                    .max()
                    .map_or(String::from("—"), |d| format!("{:.2} s", d.as_secs_f64()))
            };
            (kinds[i - 1].name(), max)
        };
        eprintln!(
            "chaos: | {name} | {} | {} | {} | {} | {} | {max} |",
            row.faults, row.accepted, row.lost, row.twice, row.order
        );
    }
    {
        let failovers = tally.failovers.borrow();
        let promoted_max = failovers.iter().map(|f| f.0).max().unwrap_or_default();
        let rebuilt_max = failovers.iter().map(|f| f.1).max().unwrap_or_default();
        eprintln!(
            "chaos: failovers {}: crash → promoted ≤ {:.2} s, standby rebuilt ≤ {:.1} s ({} by pg_rewind)",
            failovers.len(),
            promoted_max.as_secs_f64(),
            rebuilt_max.as_secs_f64(),
            failovers.iter().filter(|f| f.2).count()
        );
    }
    for line in &state_report.lines {
        eprintln!("chaos: {line}");
    }
    // An ack retried after a lost answer is refused when the first attempt went through: its
    // outcome is unknown to the consumer (all_consumed() above is what counts).
    eprintln!(
        "chaos: acks answered success: false: {:?}",
        tally.ack_refused.borrow()
    );
    for (k, f) in kinds.iter().enumerate() {
        if (*f == Fault::SpoolFull && world.tmpfs.is_none())
            || (*f == Fault::ClockJump && world.clocks.is_empty())
        {
            continue;
        }
        assert!(
            recoveries.get(&k).is_some_and(|r| !r.is_empty()),
            "{}: injected",
            f.name()
        );
    }
    assert!(faults_injected >= size.faults, "{faults_injected} faults");
    if world.tmpfs.is_some() {
        assert!(
            tally.failed_items.borrow()[0] > 0,
            "the full spool disk refused pushes to the first broker"
        );
    }
    assert_eq!((lost, twice, order), (0, 0, 0), "lost, twice, order");
    assert_eq!(
        tally.after_ack.get(),
        0,
        "no message is delivered again after its ack"
    );
    let undelivered = tally
        .delivered
        .borrow()
        .iter()
        .flatten()
        .filter(|d| !**d)
        .count();
    assert_eq!(undelivered, 0, "every message delivered");
    assert!(
        all_consumed(&db.url, total).await,
        "every stored message consumed (acked)"
    );
    assert!(
        state_report.violations.is_empty(),
        "state invariants: {:?}",
        state_report.violations
    );
    for (k, r) in &recoveries {
        assert!(
            r.iter().all(Option::is_some),
            "{}: every fault recovered (a probe through every broker) within the bound",
            kinds[*k].name()
        );
    }
    drop(proxy_thread);
}
