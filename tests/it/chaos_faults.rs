//! Issue 38's fault kinds, one test each, with the same workload and checker (docs/reliability.md):
//!
//! - producers push one partition each, in batches of deterministic transactionIds, and retry a
//!   batch until every item of it is accepted (`queued`, `buffered` or `duplicate`); an item
//!   answered `failed` (or a push that got no answer) counts as refused and is retried;
//! - one consumer pops the queue and acks while the faults run;
//! - the checker reads PostgreSQL: every accepted key stored (lost), once (twice), in its
//!   partition's production order (order); every accepted key delivered to the consumer, and how
//!   long after the last fault ended the last one was (recovery; bounded).
//!
//! The faults:
//!
//! - **spool disk full** while PostgreSQL is away (the spool on a small tmpfs the test mounts;
//!   skipped, saying why, when mounting is not permitted): pushes spool, the disk fills, the
//!   refused items must be `failed` and never stored as accepted, space is freed, the disk fills
//!   again and PostgreSQL comes back while it is full;
//! - **network**, through the project's TCP fault proxy between broker and PostgreSQL: a
//!   partition (every connection dropped, new ones refused) for 2 s, 150 ms added to every chunk
//!   for 2 s, and a half-open black hole (every connection stays open but forwards nothing,
//!   never again) for 4 s.
//!
//! CI size by default (a few seconds each); `QUEEN_CHAOS_LONG=1` multiplies the messages by 20
//! and repeats the network faults five times (docs/operations.md, "The chaos run").

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::chaos::Http;
use crate::support::consuming::{ack_all, ns, pop, push_n};
use crate::support::proxy::Proxy;
use crate::support::{fresh_db, pg, spawn_app_with, test_settings, TestApp, TestDb};
use queen_broker::wake::WakeKey;

const QUEUE: &str = "faults";
/// Once the faults stop, every accepted message is delivered within this (the long form's
/// producers go on for a while after the last fault: 2 minutes there).
fn recovery_bound() -> Duration {
    Duration::from_secs(if long() { 120 } else { 30 })
}

fn long() -> bool {
    std::env::var("QUEEN_CHAOS_LONG").is_ok_and(|v| v == "1")
}

fn key(p: usize, s: usize) -> String {
    format!("p{p}-{s:08}")
}

fn parse_key(k: &str) -> Option<(usize, usize)> {
    let (p, s) = k.strip_prefix('p')?.split_once('-')?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// What the workload saw.
struct Run {
    http: Http,
    base: String,
    per_partition: usize,
    /// Per partition, per sequence number: answered accepted.
    accepted: RefCell<Vec<Vec<bool>>>,
    /// Per partition, per sequence number: popped by the consumer.
    delivered: RefCell<Vec<Vec<bool>>>,
    accepted_count: Cell<usize>,
    delivered_count: Cell<usize>,
    /// Items answered `failed`.
    failed: Cell<usize>,
    /// Pushes that got no answer or a status other than 201 (retried).
    unanswered: Cell<usize>,
    /// Items answered accepted while they had been answered `failed` in an earlier attempt:
    /// fine (the retry stored them); kept to show the refusals were retried.
    retried_after_failed: Cell<usize>,
    /// Items answered `duplicate`: a retry of a push whose first answer was lost, which the
    /// broker had stored (dedup answered it with the original).
    duplicates: Cell<usize>,
    /// Deliveries of a key the consumer had seen before (a pop whose answer was lost, or an
    /// ack that came too late: the lease expired and the message came again).
    redelivered: Cell<usize>,
    /// Last time the consumer saw a new key.
    last_new_delivery: Cell<Instant>,
    payload_pad: String,
}

impl Run {
    fn new(app: &TestApp, partitions: usize, per_partition: usize, pad: usize) -> Rc<Self> {
        Self::through(
            &app.base,
            Duration::from_secs(20),
            partitions,
            per_partition,
            pad,
        )
    }

    /// A run whose clients reach the broker at `base` (a proxy in front of it, say) and give
    /// a request up after `timeout`.
    fn through(
        base: &str,
        timeout: Duration,
        partitions: usize,
        per_partition: usize,
        pad: usize,
    ) -> Rc<Self> {
        let http = Http(
            awc::Client::builder()
                .connector(awc::Connector::new().conn_keep_alive(Duration::from_secs(1)))
                .timeout(timeout)
                .finish(),
        );
        Rc::new(Run {
            http,
            base: base.to_string(),
            per_partition,
            accepted: RefCell::new(vec![vec![false; per_partition]; partitions]),
            delivered: RefCell::new(vec![vec![false; per_partition]; partitions]),
            accepted_count: Cell::new(0),
            delivered_count: Cell::new(0),
            failed: Cell::new(0),
            unanswered: Cell::new(0),
            retried_after_failed: Cell::new(0),
            duplicates: Cell::new(0),
            redelivered: Cell::new(0),
            last_new_delivery: Cell::new(Instant::now()),
            payload_pad: "x".repeat(pad),
        })
    }

    fn total(&self) -> usize {
        self.accepted.borrow().len() * self.per_partition
    }
}

async fn produce(run: Rc<Run>, p: usize, batch: usize) {
    let mut seq = 0;
    let mut refused_here = false;
    while seq < run.per_partition {
        let end = (seq + batch).min(run.per_partition);
        let items: Vec<Value> = (seq..end)
            .map(|s| {
                json!({"queue": QUEUE, "partition": format!("p{p}"), "transactionId": key(p, s),
                            "payload": {"s": s, "pad": run.payload_pad}})
            })
            .collect();
        let reply = run
            .http
            .post(&run.base, "/api/v1/push", &json!({ "items": items }))
            .await;
        let mut all = false;
        match reply {
            Some((201, Value::Array(results))) if results.len() == end - seq => {
                let failed = results.iter().filter(|r| r["status"] == "failed").count();
                run.failed.set(run.failed.get() + failed);
                let duplicates = results
                    .iter()
                    .filter(|r| r["status"] == "duplicate")
                    .count();
                run.duplicates.set(run.duplicates.get() + duplicates);
                all = results.iter().all(|r| {
                    matches!(
                        r["status"].as_str(),
                        Some("queued" | "buffered" | "duplicate")
                    )
                });
            }
            _ => run.unanswered.set(run.unanswered.get() + 1),
        }
        if all {
            if refused_here {
                run.retried_after_failed
                    .set(run.retried_after_failed.get() + end - seq);
                refused_here = false;
            }
            let mut accepted = run.accepted.borrow_mut();
            for s in seq..end {
                accepted[p][s] = true;
            }
            run.accepted_count.set(run.accepted_count.get() + end - seq);
            seq = end;
        } else {
            refused_here = true;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Pops and acks until every key was delivered once, or `stop` is set.
async fn consume(run: Rc<Run>, stop: Rc<Cell<bool>>) {
    while !stop.get() && run.delivered_count.get() < run.total() {
        let messages = match run
            .http
            .get(&run.base, &format!("/api/v1/pop/queue/{QUEUE}?batch=100"))
            .await
        {
            Some((200, body)) => body["messages"].as_array().cloned().unwrap_or_default(),
            _ => Vec::new(),
        };
        if messages.is_empty() {
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        }
        let mut acks = Vec::new();
        for m in &messages {
            let k = m["transactionId"].as_str().unwrap_or_default();
            let (p, s) = parse_key(k).unwrap_or_else(|| panic!("a delivery never produced: {m}"));
            let mut delivered = run.delivered.borrow_mut();
            if delivered[p][s] {
                run.redelivered.set(run.redelivered.get() + 1);
            } else {
                delivered[p][s] = true;
                run.delivered_count.set(run.delivered_count.get() + 1);
                run.last_new_delivery.set(Instant::now());
            }
            acks.push(json!({"transactionId": k, "partitionId": m["partitionId"],
                             "leaseId": m["leaseId"], "status": "completed"}));
        }
        // Retried until answered: the lease keeps them ours meanwhile.
        let body = json!({ "acknowledgments": acks });
        for _ in 0..100 {
            if let Some((200, _)) = run.http.post(&run.base, "/api/v1/ack/batch", &body).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The checker's verdict.
#[derive(Debug, PartialEq)]
struct Verdict {
    lost: usize,
    twice: usize,
    order: usize,
    undelivered: usize,
}

async fn check(db: &TestDb, run: &Run) -> Verdict {
    let (mut lost, mut twice, mut order) = (0, 0, 0);
    let accepted = run.accepted.borrow().clone();
    for (p, accepted) in accepted.iter().enumerate() {
        let mut seen = vec![false; run.per_partition];
        let mut last: Option<usize> = None;
        for s in db.stored(QUEUE, &format!("p{p}")).await {
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
        lost += (0..run.per_partition)
            .filter(|&s| accepted[s] && !seen[s])
            .count();
    }
    let undelivered = run.total() - run.delivered_count.get();
    Verdict {
        lost,
        twice,
        order,
        undelivered,
    }
}

/// Waits (bounded by [`recovery_bound`]) until every key was delivered; returns how long after
/// `healed` the last new delivery came.
async fn recovery(run: &Run, healed: Instant) -> Duration {
    let deadline = healed + recovery_bound();
    while run.delivered_count.get() < run.total() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.last_new_delivery
        .get()
        .saturating_duration_since(healed)
}

/// The producers and the consumer of a fault run, started together.
struct Workload {
    run: Rc<Run>,
    stop: Rc<Cell<bool>>,
    started: Instant,
    producers: Vec<actix_web::rt::task::JoinHandle<()>>,
    consumer: actix_web::rt::task::JoinHandle<()>,
    /// Per fault: how long after it healed the consumer got a new key again.
    recoveries: Vec<(&'static str, Duration)>,
}

impl Workload {
    /// One producer per partition (batches of 10) and one consumer.
    fn start(run: &Rc<Run>, partitions: usize) -> Self {
        let stop = Rc::new(Cell::new(false));
        Workload {
            run: run.clone(),
            stop: stop.clone(),
            started: Instant::now(),
            producers: (0..partitions)
                .map(|p| actix_web::rt::spawn(produce(run.clone(), p, 10)))
                .collect(),
            consumer: actix_web::rt::spawn(consume(run.clone(), stop)),
            recoveries: Vec::new(),
        }
    }

    /// After `fault` healed: waits (bounded) until the consumer gets a new key again.
    async fn resumed_after(&mut self, fault: &'static str) {
        let healed = Instant::now();
        let at = self.run.delivered_count.get();
        let deadline = healed + recovery_bound();
        while self.run.delivered_count.get() == at
            && self.run.delivered_count.get() < self.run.total()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.recoveries.push((fault, healed.elapsed()));
    }

    /// After the last fault: lets the producers finish and every key be delivered (bounded),
    /// checks the database, prints one line for `what`, and asserts 0 lost / twice / out of
    /// order / undelivered and a resumption within the bound after every fault.
    async fn finish(self, what: &str, db: &TestDb, app: &TestApp) {
        let healed = Instant::now();
        for p in self.producers {
            p.await.unwrap();
        }
        let run = &self.run;
        let drained_in = recovery(run, healed).await;
        self.stop.set(true);
        self.consumer.await.unwrap();
        app.drained().await;
        let verdict = check(db, run).await;
        let worst = self
            .recoveries
            .iter()
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default();
        eprintln!(
            "chaos {what}: {} accepted, {} items refused, {} pushes unanswered (retried), {} \
             items answered duplicate on a retry, {} keys delivered, {} delivered again; \
             {verdict:?}; deliveries resumed after each fault: {:?}; last delivery {:.2} s after \
             the last fault; {:.1} s in all",
            run.accepted_count.get(),
            run.failed.get(),
            run.unanswered.get(),
            run.duplicates.get(),
            run.delivered_count.get(),
            run.redelivered.get(),
            self.recoveries
                .iter()
                .map(|(f, d)| format!("{f} {:.2} s", d.as_secs_f64()))
                .collect::<Vec<_>>(),
            drained_in.as_secs_f64(),
            self.started.elapsed().as_secs_f64()
        );
        assert_eq!(
            verdict,
            Verdict {
                lost: 0,
                twice: 0,
                order: 0,
                undelivered: 0
            }
        );
        assert!(
            worst < recovery_bound(),
            "deliveries resumed after every fault"
        );
    }
}

/// One of the proxy's faults, then healed: `partition` (every connection cut, new ones
/// refused) for 2 s, `delay` (150 ms on every chunk) for 2 s, else a half-open black hole for
/// `black_hole_for`.
async fn proxy_fault(proxy: &Proxy, fault: &str, black_hole_for: Duration) {
    match fault {
        "partition" => {
            proxy.cut();
            tokio::time::sleep(Duration::from_secs(2)).await;
            proxy.restore();
        }
        "delay" => {
            proxy.set_delay(Duration::from_millis(150));
            tokio::time::sleep(Duration::from_secs(2)).await;
            proxy.set_delay(Duration::ZERO);
        }
        _ => {
            proxy.black_hole();
            tokio::time::sleep(black_hole_for).await;
            proxy.heal();
        }
    }
}

/// A small tmpfs, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(kib: usize) -> Result<Self, String> {
        let dir =
            std::env::temp_dir().join(format!("queen-chaos-disk-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self(dir))
    }

    /// Writes a file until the disk refuses more.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).expect("filler file");
        let block = vec![0u8; 4096];
        while f.write_all(&block).and_then(|()| f.sync_data()).is_ok() {}
        while f.write_all(&[0]).and_then(|()| f.sync_data()).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("filler removed");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits until `cond` holds (bounded), sleeping a little between looks.
async fn until(within: Duration, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix_web::test]
async fn chaos_spool_disk_fills_while_postgresql_is_away() {
    let disk = match SmallDisk::mount(1024) {
        Ok(disk) => disk,
        Err(why) => {
            eprintln!("SKIPPED: the full-spool-disk fault needs a tmpfs: {why}");
            return;
        }
    };
    let db = fresh_db().await;
    let proxy = Proxy::start(pg().port()).await;
    let mut settings = test_settings(
        &db,
        &[
            ("DATABASE_URL", &proxy.url(&db)),
            ("DB_CONNECTION_TIMEOUT", "1000"),
        ],
    );
    settings.file_buffer_dir = disk.0.join("spool");
    let app = spawn_app_with(settings).await;
    let (partitions, per_partition) = (4, if long() { 20_000 } else { 1_000 });
    // ~600 bytes a record: 1 MiB holds well under the run, so the disk fills by itself too.
    let run = Run::new(&app, partitions, per_partition, 400);
    let stop = Rc::new(Cell::new(false));
    let started = Instant::now();

    proxy.cut();
    let producers: Vec<_> = (0..partitions)
        .map(|p| actix_web::rt::spawn(produce(run.clone(), p, 10)))
        .collect();
    let consumer = actix_web::rt::spawn(consume(run.clone(), stop.clone()));
    until(Duration::from_secs(30), "pushes spool", || {
        run.accepted_count.get() >= 200
    })
    .await;
    // Full while PostgreSQL is away: refusals, then space again.
    disk.fill();
    let before = run.failed.get();
    until(Duration::from_secs(30), "the full disk refuses", || {
        run.failed.get() > before
    })
    .await;
    let accepted_while_full = run.accepted_count.get();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let full_refusals = run.failed.get() - before;
    disk.free();
    until(Duration::from_secs(30), "pushes spool again", || {
        run.accepted_count.get() > accepted_while_full + 100
    })
    .await;
    // Full again, and PostgreSQL comes back while it is: replay must make room.
    disk.fill();
    let before = run.failed.get();
    until(
        Duration::from_secs(30),
        "the full disk refuses again",
        || run.failed.get() > before,
    )
    .await;
    proxy.restore();
    let healed = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    disk.free();
    for p in producers {
        p.await.unwrap();
    }
    let recovered_in = recovery(&run, healed).await;
    stop.set(true);
    consumer.await.unwrap();
    app.drained().await;
    let verdict = check(&db, &run).await;
    eprintln!(
        "chaos spool disk full: {} accepted of {} pushed keys, {} items refused `failed` \
         ({full_refusals} in the first 0.5 s full), {} pushes unanswered, {} keys delivered; \
         {verdict:?}; last delivery {:.2} s after PostgreSQL returned; {:.1} s in all",
        run.accepted_count.get(),
        run.total(),
        run.failed.get(),
        run.unanswered.get(),
        run.delivered_count.get(),
        recovered_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(full_refusals > 0, "the full disk refused items");
    assert_eq!(
        verdict,
        Verdict {
            lost: 0,
            twice: 0,
            order: 0,
            undelivered: 0
        }
    );
    assert!(recovered_in < recovery_bound());
    assert!(app.spool_files().is_empty(), "the spool drained");
}

async fn select(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(conn).await.map(|_| ())
}

/// Why the half-open fault stalled the pools (docs/reliability.md): sqlx gives a connection
/// back to its pool only after a round trip (a `Sync`), with no time limit. On a link that went
/// silent without a reset that round trip never ends, so the connection's slot stayed taken for
/// good: whether its step was dropped mid-statement by a time limit, or it was given back just
/// as the link died. Once every slot was lost so, every acquire timed out. With the way back
/// bounded by the pool's acquire timeout (vendor/README.md), the pool opens new connections.
#[actix_web::test]
async fn pool_connections_given_up_on_a_black_holed_link_free_their_slots() {
    let db = fresh_db().await;
    let proxy = Proxy::start(pg().port()).await;
    let settings = test_settings(
        &db,
        &[("DB_CONNECTION_TIMEOUT", "500"), ("DB_POOL_SIZE", "2")],
    );
    let primary = queen_broker::storage::primary(&proxy.url(&db), &settings).expect("the URL");
    // The pool of the pops: it does not ping a connection before handing it out.
    let pool = queen_broker::storage::lease_pool(&primary, &settings);
    let mut idle = pool.acquire().await.expect("a connection");
    let mut held = pool.acquire().await.expect("a second connection");
    select(&mut idle).await.expect("answered");
    select(&mut held).await.expect("answered");
    drop(idle);
    while pool.num_idle() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Both open connections go silent; new ones work again at once.
    proxy.black_hole();
    proxy.heal();
    // One is given back just after the link died (its statement had been answered)...
    drop(held);
    // ...the other, idle, is handed to a step whose time limit drops it mid-statement.
    let step = async {
        let mut conn = pool.acquire().await?;
        select(&mut conn).await
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(300), step)
            .await
            .is_err(),
        "a statement on a black-holed connection is never answered"
    );

    // Both slots are held by connections on their way back; the pool must free them.
    let started = Instant::now();
    let answered = loop {
        let attempt = async {
            let mut conn = pool.acquire().await?;
            select(&mut conn).await
        };
        match attempt.await {
            Ok(()) => break started.elapsed(),
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(5),
                "the pool still gives no connection after {:?}: {e}",
                started.elapsed()
            ),
        }
    };
    eprintln!("pool answering again {answered:?} after its connections were given up");
    assert!(answered < Duration::from_secs(2), "{answered:?}");
    drop(proxy);
}

/// The LISTEN connection through a half-open link: it delivers no notification and reports no
/// error, ever. While it is up, this broker's pushes leave the waking of its own long-polling
/// pops to it, so a waiting pop got a pushed message only at its next re-read
/// (`QUEEN_POP_RECHECK_MS`, 20 s here). A LISTEN connection silent for 2 s is now probed with a
/// round trip and, unanswered within 1 s, made again.
#[actix_web::test]
async fn a_half_open_listen_connection_is_found_and_made_again() {
    let db = fresh_db().await;
    let proxy = Proxy::start(pg().port()).await;
    let settings = test_settings(
        &db,
        &[
            ("DATABASE_URL", &proxy.url(&db)),
            ("DB_CONNECTION_TIMEOUT", "500"),
            ("DB_STATEMENT_TIMEOUT", "1000"),
            ("QUEEN_COMMIT_TIMEOUT_MS", "1000"),
            ("QUEEN_POP_RECHECK_MS", "20000"),
        ],
    );
    let app = spawn_app_with(settings).await;
    let wake = &app.broker.state.wake;
    push_n(&app, "lq", "first", 0, 1).await; // the queue exists
    let first = pop(&app, "lq", "").await;
    ack_all(&app, &first, "completed", None).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !wake.listening() {
        assert!(Instant::now() < deadline, "LISTEN never connected");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    proxy.black_hole();
    proxy.heal();
    let healed = Instant::now();
    // Found silent and given up...
    while wake.listening() {
        assert!(
            healed.elapsed() < Duration::from_secs(6),
            "the half-open LISTEN connection is never given up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let given_up = healed.elapsed();
    // ...and made again through the healed link.
    while !wake.listening() {
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "LISTEN never connected again"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let listening_again = healed.elapsed();
    // Pushes are `queued` and pops answered again (the committers' and the pools' black-holed
    // connections were given up too); on a queue of their own, what a spooled try leaves
    // behind is not in the way.
    loop {
        let reply = app
            .push(json!([{"queue": "warm", "partition": "w", "payload": {"n": 0}}]))
            .await;
        if reply.status == 201 && reply.body[0]["status"] == "queued" {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(20),
            "{:?}",
            reply.body
        );
        // Until the spooled tries are replayed, the partition's pushes are spooled too.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    loop {
        let reply = pop(&app, "warm", "").await;
        if reply.status < 300 {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(20),
            "{:?}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A push wakes a waiting pop at once again: well before its 20 s re-read.
    let key = WakeKey::Queue("lq".into());
    let waiting = async {
        let reply = pop(&app, "lq", "wait=true&timeout=10000").await;
        (reply, Instant::now())
    };
    let pushing = async {
        while wake.waiting(&key) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        push_n(&app, "lq", "p", 7, 1).await;
        Instant::now()
    };
    let ((reply, popped_at), pushed_at) = futures_util::join!(waiting, pushing);
    assert_eq!(ns(&reply), vec![7]);
    let late = popped_at.saturating_duration_since(pushed_at);
    eprintln!(
        "LISTEN given up {given_up:?} after the black hole, listening again after \
         {listening_again:?}; a waiting pop answered {late:?} after the push"
    );
    assert!(
        late < Duration::from_secs(2),
        "pop answered {late:?} after the push"
    );
    drop(proxy);
}

#[actix_web::test]
async fn chaos_network_partition_delay_and_half_open_connections() {
    let db = fresh_db().await;
    let proxy = Proxy::start(pg().port()).await;
    let settings = test_settings(
        &db,
        &[
            ("DATABASE_URL", &proxy.url(&db)),
            ("DB_CONNECTION_TIMEOUT", "1000"),
            // A black-holed commit is given up (and its items spooled) after this.
            ("QUEEN_COMMIT_TIMEOUT_MS", "2000"),
            // And a black-holed grouped claim or ack after this plus 1 s.
            ("DB_STATEMENT_TIMEOUT", "2000"),
        ],
    );
    let app = spawn_app_with(settings).await;
    // The queue's default lease time (300 s) unless `QUEEN_CHAOS_LEASE_SECS` says otherwise: a
    // claim whose answer a fault lost leaves a lease delivered to nobody, which held its
    // partition for that long before such leases were released (docs/reliability.md).
    if let Ok(lease) = std::env::var("QUEEN_CHAOS_LEASE_SECS") {
        let options = json!({"leaseTime": lease.parse::<u64>().expect("seconds")});
        let configured = app
            .post(
                "/api/v1/configure",
                &json!({"queue": QUEUE, "options": options}),
            )
            .await;
        assert!(configured.status < 300, "configure: {}", configured.body);
    }
    let rounds = if long() { 5 } else { 1 };
    let (partitions, per_partition) = (4, if long() { 20_000 } else { 1_500 });
    let run = Run::new(&app, partitions, per_partition, 20);
    let mut load = Workload::start(&run, partitions);
    for _ in 0..rounds {
        for fault in ["partition", "delay", "half-open"] {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy_fault(&proxy, fault, Duration::from_secs(4)).await;
            load.resumed_after(fault).await;
        }
    }
    load.finish("network", &db, &app).await;
    drop(proxy);
}

/// Faults between the clients and the broker (the broker reaches PostgreSQL directly): every
/// producer and the consumer talk to the broker through the fault proxy, which cuts every
/// connection (answers in flight are lost: a push the broker stored is retried and answered
/// `duplicate`, a pop's messages stay leased to nobody until the lease ends), delays every
/// chunk, and black-holes connections (the client gives the request up after its timeout).
/// The queue's lease is 3 s, so a message whose pop answer was lost comes again within the
/// recovery bound.
#[actix_web::test]
async fn chaos_network_faults_between_clients_and_the_broker() {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[])).await;
    let configured = app
        .post(
            "/api/v1/configure",
            &json!({"queue": QUEUE, "options": {"leaseTime": 3}}),
        )
        .await;
    assert!(configured.status < 300, "configure: {}", configured.body);
    let port: u16 = app
        .base
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the broker's base URL names its port");
    let proxy = Proxy::start(port).await;
    let rounds = if long() { 5 } else { 1 };
    let (partitions, per_partition) = (4, if long() { 20_000 } else { 1_500 });
    let run = Run::through(
        &format!("http://127.0.0.1:{}", proxy.port),
        Duration::from_secs(3),
        partitions,
        per_partition,
        20,
    );
    let mut load = Workload::start(&run, partitions);
    for _ in 0..rounds {
        for fault in ["cuts", "partition", "delay", "half-open"] {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match fault {
                // Short cuts while requests are in flight: their answers are lost.
                "cuts" => {
                    for _ in 0..5 {
                        proxy.cut();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        proxy.restore();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                _ => proxy_fault(&proxy, fault, Duration::from_secs(2)).await,
            }
            load.resumed_after(fault).await;
        }
    }
    load.finish("client network", &db, &app).await;
    assert!(
        run.unanswered.get() > 0,
        "the faults cut requests in flight (else this run tested nothing)"
    );
    drop(proxy);
}

/// The firewall of the network namespace this test runs in, driven with `nft`: drop rules on
/// loopback ports make a real partition (packets vanish; the kernel's TCP retransmits, and an
/// open connection carries on once the rules are gone), unlike the proxy's cut (connections
/// reset). Only ever inside a namespace of its own, which `tests/netns/run.sh` makes.
struct Firewall;

impl Firewall {
    const TABLE: &'static str = "queen_chaos";

    /// The rules' table, in this process's namespace, which must be the one `QUEEN_NETNS`
    /// names (`ip netns identify`), never the host's. `Err` (the test is skipped) only when
    /// `QUEEN_NETNS` is unset; with it set, anything amiss fails the test.
    fn inside_own_namespace() -> Result<Firewall, String> {
        let Ok(expected) = std::env::var("QUEEN_NETNS") else {
            return Err("QUEEN_NETNS is not set: run it through tests/netns/run.sh".into());
        };
        let out = Command::new("ip")
            .args(["netns", "identify", &std::process::id().to_string()])
            .output()
            .expect("ip netns identify runs");
        let here = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success() && !expected.is_empty() && here == expected,
            "refusing to change a firewall: this process is in namespace {here:?}, not {expected:?}"
        );
        let fw = Firewall;
        fw.nft(&format!("add table inet {}", Self::TABLE));
        fw.nft(&format!(
            "add chain inet {} out {{ type filter hook output priority 0 ; policy accept ; }}",
            Self::TABLE
        ));
        Ok(fw)
    }

    fn nft(&self, command: &str) {
        let out = Command::new("nft")
            .args(command.split_whitespace())
            .output()
            .unwrap_or_else(|e| panic!("nft {command}: {e}"));
        assert!(
            out.status.success(),
            "nft {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Drops every packet to and from `port` (both ends are on loopback, so each packet passes
    /// the output hook once).
    fn drop_port(&self, port: u16) {
        for dir in ["dport", "sport"] {
            self.nft(&format!(
                "add rule inet {} out tcp {dir} {port} counter drop",
                Self::TABLE
            ));
        }
    }

    /// Removes the rules; the packets they dropped meanwhile.
    fn heal(&self) -> u64 {
        let out = Command::new("nft")
            .args(["list", "chain", "inet", Self::TABLE, "out"])
            .output()
            .expect("nft list runs");
        let listing = String::from_utf8_lossy(&out.stdout);
        let dropped = listing
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "packets")
            .filter_map(|w| w[1].parse::<u64>().ok())
            .sum();
        self.nft(&format!("flush chain inet {} out", Self::TABLE));
        dropped
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", Self::TABLE])
            .status();
    }
}

/// Partitions made by nftables drop rules in a network namespace of the test's own
/// (`tests/netns/run.sh` runs it there; elsewhere it says it was skipped): between the broker
/// and PostgreSQL, between the clients and the broker, and both at once, 3 s each. Commits in
/// flight are given up after `QUEEN_COMMIT_TIMEOUT_MS` and spooled; requests in flight are
/// given up by the clients after 3 s and retried (dedup answers a stored one `duplicate`); a
/// pop whose answer vanished comes again after the queue's 3 s lease.
#[actix_web::test]
async fn chaos_netns_partitions_by_nftables() {
    let firewall = match Firewall::inside_own_namespace() {
        Ok(fw) => fw,
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let db = fresh_db().await;
    let settings = test_settings(
        &db,
        &[
            ("DB_CONNECTION_TIMEOUT", "1000"),
            ("QUEEN_COMMIT_TIMEOUT_MS", "2000"),
            ("DB_STATEMENT_TIMEOUT", "2000"),
        ],
    );
    let app = spawn_app_with(settings).await;
    let configured = app
        .post(
            "/api/v1/configure",
            &json!({"queue": QUEUE, "options": {"leaseTime": 3}}),
        )
        .await;
    assert!(configured.status < 300, "configure: {}", configured.body);
    let broker_port: u16 = app
        .base
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the broker's base URL names its port");
    let pg_port = pg().port();
    let rounds = if long() { 5 } else { 1 };
    let (partitions, per_partition) = (4, if long() { 20_000 } else { 1_500 });
    let run = Run::through(
        &app.base,
        Duration::from_secs(3),
        partitions,
        per_partition,
        20,
    );
    let mut load = Workload::start(&run, partitions);
    let mut dropped = 0;
    for _ in 0..rounds {
        for fault in ["broker-postgresql", "clients-broker", "both"] {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match fault {
                "broker-postgresql" => firewall.drop_port(pg_port),
                "clients-broker" => firewall.drop_port(broker_port),
                _ => {
                    firewall.drop_port(pg_port);
                    firewall.drop_port(broker_port);
                }
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            dropped += firewall.heal();
            load.resumed_after(fault).await;
        }
    }
    load.finish("netns", &db, &app).await;
    eprintln!("chaos netns: the drop rules dropped {dropped} packets");
    // The broker talks to PostgreSQL all the time (pops, commits, the LISTEN): the first
    // partition always drops some; the clients may have finished before the second.
    assert!(
        dropped > 0,
        "the partitions dropped packets (else this run tested nothing)"
    );
}
