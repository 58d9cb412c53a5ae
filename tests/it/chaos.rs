//! The broker's own chaos run. Three real broker processes on one database (their own durable
//! PostgreSQL cluster, each broker reaching it through its own TCP proxy); producers with
//! deterministic transactionIds that retry every batch until all of it is accepted; acking
//! consumers (one per broker to start with) that pop from the brokers in turn. While they work, faults are injected in turn:
//!
//! - every broker connection terminated (`pg_terminate_backend`);
//! - maintenance mode on and off again;
//! - PostgreSQL restarted with an immediate stop (a crash: recovery from the WAL);
//! - PostgreSQL restarted with a fast stop;
//! - one broker's TCP proxy cut (its connections dropped, new ones refused) and restored;
//! - one broker killed with SIGKILL and started again on the same port and spool directory;
//! - a full spool disk: the first broker's spool lives on a small tmpfs mounted by the test;
//!   with maintenance on (everything spools) the tmpfs is filled up, then freed again. Without
//!   the right to mount (not root, or no `mount`) this fault is skipped, and the run says why.
//!
//! The checker then reads PostgreSQL: per partition every produced key is stored (lost = 0),
//! once (twice = 0), in production order (order = 0); and no message is delivered again after
//! its ack succeeded (after-ack = 0). Each producer stays with one broker: order is promised
//! per broker (a `buffered` batch replays from that broker's spool; another would not wait).
//!
//! CI size by default (6 partitions, 6 000 messages, every fault at least once: about a
//! minute). The long form (docs/operations.md, "The chaos suite"):
//! `QUEEN_CHAOS_LONG=1 cargo test --release --test it chaos:: -- --nocapture` (10 M messages;
//! `QUEEN_CHAOS_MESSAGES=N` sets another count, either form).

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use queen_broker::pg::{free_port, PrivateCluster};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::proxy::Proxy;
use crate::support::TestDb;

pub(super) const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");
const QUEUE: &str = "chaos";
const BROKERS: usize = 3;

/// The run's size: messages, partitions, items per push, the spool tmpfs size.
struct Size {
    messages: usize,
    partitions: usize,
    batch: usize,
    tmpfs: &'static str,
    long: bool,
}

fn size() -> Size {
    let long = std::env::var("QUEEN_CHAOS_LONG").is_ok_and(|v| v == "1");
    let default = if long { 10_000_000 } else { 6_000 };
    Size {
        messages: std::env::var("QUEEN_CHAOS_MESSAGES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
        partitions: if long { 12 } else { 6 },
        batch: if long { 100 } else { 10 },
        tmpfs: if long { "256m" } else { "16m" },
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
    cluster: PrivateCluster,
    nodes: Vec<RefCell<Node>>,
    tmpfs: Option<PathBuf>,
}

impl Drop for World {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.borrow_mut().sigkill();
        }
        let _ = self.cluster.stop(true);
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

/// One proxy per broker, on a thread and runtime of their own, so they keep forwarding while
/// the test's single thread is busy. They stop when the returned sender is dropped.
fn proxies_on_own_thread(target: u16) -> (Vec<Proxy>, tokio::sync::oneshot::Sender<()>) {
    let (give, take) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("proxy runtime");
        rt.block_on(async move {
            let mut proxies = Vec::new();
            for _ in 0..BROKERS {
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
    deliveries: Cell<usize>,
    after_ack: Cell<usize>,
    acked_count: Cell<usize>,
    /// Acked flags (the ack answered `success: true`), per partition and sequence number.
    acked: RefCell<Vec<Vec<bool>>>,
    /// Delivered flags, per partition and sequence number.
    delivered: RefCell<Vec<Vec<bool>>>,
    faults: RefCell<std::collections::BTreeMap<&'static str, usize>>,
    faults_started: Cell<usize>,
    /// Acks answered `success: false`, by error (and whether on a first attempt or a retry).
    ack_refused: RefCell<std::collections::BTreeMap<String, usize>>,
}

fn key(partition: usize, seq: usize) -> String {
    format!("p{partition}-{seq:09}")
}

fn parse_key(key: &str) -> Option<(usize, usize)> {
    let (p, s) = key.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// Pushes one partition's keys in order, each batch retried until every item is accepted.
async fn produce(
    http: Http,
    base: String,
    broker: usize,
    partition: usize,
    count: usize,
    batch: usize,
    tally: Rc<Tally>,
) {
    let mut seq = 0;
    while seq < count {
        // Production is spread over the first round of faults: the k-th of FAULTS.len() + 1
        // stretches of the keys waits until the k-th fault has started, so every fault meets
        // producers at work.
        while seq * (FAULTS.len() + 1) / count > tally.faults_started.get() {
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
    db_url: String,
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
            if !producing.get() && all_consumed(&db_url, total).await {
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
        "SELECT (SELECT COALESCE(SUM(msg_count), 0)::bigint FROM queen.segments),
                (SELECT COALESCE(SUM(committed_offset), 0)::bigint FROM queen.partition_consumers
                  WHERE consumer_group = '__QUEUE_MODE__')",
    )
    .fetch_one(&mut conn)
    .await;
    row.is_ok_and(|(stored, consumed)| stored == total as i64 && consumed == total as i64)
}

/// The faults, injected in turn until production is over and each ran at least once.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Terminate,
    Maintenance,
    PgImmediate,
    ProxyCut,
    BrokerKill,
    PgFast,
    SpoolFull,
}

const FAULTS: [Fault; 7] = [
    Fault::Terminate,
    Fault::Maintenance,
    Fault::PgImmediate,
    Fault::ProxyCut,
    Fault::BrokerKill,
    Fault::PgFast,
    Fault::SpoolFull,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Terminate => "backends terminated",
            Fault::Maintenance => "maintenance toggles",
            Fault::PgImmediate => "PostgreSQL immediate restarts",
            Fault::ProxyCut => "proxy cuts",
            Fault::BrokerKill => "broker SIGKILL+restart",
            Fault::PgFast => "PostgreSQL fast restarts",
            Fault::SpoolFull => "spool disk full",
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

async fn inject(
    http: Http,
    world: Rc<World>,
    proxies: Rc<Vec<Proxy>>,
    producing: Rc<Cell<bool>>,
    tally: Rc<Tally>,
) {
    use sqlx::Connection;
    let mut round = 0usize;
    loop {
        let fault = FAULTS[round % FAULTS.len()];
        if !producing.get() && round >= FAULTS.len() {
            break;
        }
        round += 1;
        let victim = round % BROKERS;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The fault is in force from here: the next stretch of keys may be pushed.
        let begun = || tally.faults_started.set(tally.faults_started.get() + 1);
        match fault {
            Fault::Terminate => {
                let mut conn = sqlx::PgConnection::connect(&world.cluster.url("postgres"))
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
                world
                    .cluster
                    .stop(fault == Fault::PgImmediate)
                    .expect("pg_ctl stop");
                begun();
                tokio::time::sleep(Duration::from_millis(700)).await;
                world.cluster.start(true).expect("pg_ctl start");
            }
            Fault::ProxyCut => {
                proxies[victim].cut();
                begun();
                tokio::time::sleep(Duration::from_millis(1000)).await;
                proxies[victim].restore();
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
        }
        *tally.faults.borrow_mut().entry(fault.name()).or_default() += 1;
    }
}

#[actix_web::test]
async fn chaos_nothing_lost_nothing_twice_order_kept() {
    let size = size();
    // At least the count asked for: every partition gets the same share, rounded up.
    let per_partition = size.messages.div_ceil(size.partitions);
    let total = per_partition * size.partitions;
    let dir = std::env::temp_dir().join(format!("queen-chaos-{}", Uuid::new_v4().simple()));
    // A durable cluster: an immediate stop must not lose a commit PostgreSQL acknowledged.
    let cluster =
        PrivateCluster::new(&dir.join("pg"), free_port().unwrap()).expect("server binaries");
    cluster.start(true).expect("cluster starts");
    let db = TestDb {
        url: cluster.url("postgres"),
    };

    // The proxies run on a runtime of their own thread, so they keep forwarding while this
    // test's single thread is busy.
    let (proxies, proxy_thread) = proxies_on_own_thread(cluster.port);
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
    for (n, proxy) in proxies.iter().enumerate() {
        let port = free_port().unwrap();
        let spool = dir.join(format!("spool{n}"));
        let url = proxy.url(&db);
        let env: Vec<(String, String)> = [
            ("DATABASE_URL", url.as_str()),
            ("HOST", "127.0.0.1"),
            ("PORT", &port.to_string()),
            ("FILE_BUFFER_DIR", &spool.display().to_string()),
            ("QUEEN_CONFIG", ""),
            ("NUM_WORKERS", "1"),
            ("DB_POOL_SIZE", "4"),
            ("QUEEN_FLAG_POLL_MS", "100"),
            ("DB_CONNECTION_TIMEOUT", "1000"),
            ("LOG_LEVEL", "warn"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        nodes.push(RefCell::new(Node {
            port,
            env,
            log: dir.join(format!("broker{n}.log")),
            child: None,
        }));
    }
    let world = Rc::new(World {
        dir: dir.clone(),
        cluster: cluster.clone(),
        nodes,
        tmpfs,
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
    let (status, body) = http
        .post(
            &bases[0],
            "/api/v1/configure",
            &json!({"queue": QUEUE, "options": {"leaseTime": 10}}),
        )
        .await
        .expect("configure answered");
    assert!(status < 300, "configure: {status} {body}");

    let started = Instant::now();
    let proxies = Rc::new(proxies);
    let tally = Rc::new(Tally {
        acked: RefCell::new(vec![vec![false; per_partition]; size.partitions]),
        delivered: RefCell::new(vec![vec![false; per_partition]; size.partitions]),
        ..Tally::default()
    });
    let producing = Rc::new(Cell::new(true));
    let faults = actix_web::rt::spawn(inject(
        http.clone(),
        world.clone(),
        proxies.clone(),
        producing.clone(),
        tally.clone(),
    ));
    let far = Rc::new(Cell::new(started + Duration::from_secs(365 * 24 * 3600)));
    let consumers: Vec<_> = (0..BROKERS)
        .map(|first| {
            actix_web::rt::spawn(consume(
                http.clone(),
                bases.clone(),
                db.url.clone(),
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
                bases[broker].clone(),
                broker,
                p,
                per_partition,
                size.batch,
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

    let (mut lost, mut twice, mut order) = (0, 0, 0);
    for p in 0..size.partitions {
        let stored = db.stored(QUEUE, &format!("p{p}")).await;
        let mut seen = vec![false; per_partition];
        let mut last: Option<usize> = None;
        for s in &stored {
            let (sp, seq) = parse_key(&s.transaction_id).expect("a key we produced");
            assert_eq!(sp, p, "a key of another partition stored here");
            if seen[seq] {
                twice += 1;
            }
            seen[seq] = true;
            if last.is_some_and(|l| l >= seq) {
                order += 1;
            }
            last = Some(seq);
        }
        lost += seen.iter().filter(|s| !**s).count();
    }
    let faults = tally.faults.borrow().clone();
    let fault_line: Vec<String> = faults.iter().map(|(k, v)| format!("{v} {k}")).collect();
    eprintln!(
        "chaos{}: {total} messages in {} partitions, {BROKERS} brokers, produced in {:.1} s; faults: {}; \
         {} producer retries, {:?} items refused per broker; {} deliveries, {} acked; \
         lost {lost}, twice {twice}, order {order}, delivered after ack {}; {:.1} s",
        if size.long { " (long)" } else { "" },
        size.partitions,
        produced_in.as_secs_f64(),
        fault_line.join(", "),
        tally.retries.get(),
        tally.failed_items.borrow(),
        tally.deliveries.get(),
        tally.acked_count.get(),
        tally.after_ack.get(),
        started.elapsed().as_secs_f64()
    );
    // An ack retried after a lost answer is refused when the first attempt went through: its
    // outcome is unknown to the consumer (all_consumed() above is what counts).
    eprintln!(
        "chaos: acks answered success: false: {:?}",
        tally.ack_refused.borrow()
    );
    for f in FAULTS {
        if f == Fault::SpoolFull && world.tmpfs.is_none() {
            continue;
        }
        assert!(
            faults.get(f.name()).is_some_and(|n| *n > 0),
            "{}: injected",
            f.name()
        );
    }
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
    drop(proxies);
    drop(proxy_thread);
}
