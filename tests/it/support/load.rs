//! The workload of the failover tests (tests/it/switchover.rs, tests/it/ha_failover.rs):
//! producers that push one partition's keys in order, each batch retried until every item is
//! accepted, and a consumer that pops and acks over all brokers; then the checks on what
//! PostgreSQL stores (lost, twice, order) and on what the consumer saw (every accepted message
//! delivered and acked, nothing delivered again after its ack, acks in key order).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{eventually, spawn_app_with, test_settings, TestApp, TestDb};

pub const QUEUE: &str = "switch";
pub const BATCH: usize = 10;
/// Pause between a producer's batches: keeps the load steady and within what the consumer
/// drains on two cores, so the run measures the switchover, not a backlog.
pub const PACE: Duration = Duration::from_millis(20);
/// The queue's lease: a message whose claim was lost (the lease pool commits asynchronously,
/// so a crash may lose a claim) or whose ack never got through is handed out again after it.
pub const LEASE_SECS: u64 = 5;

/// What producers and the consumer saw.
#[derive(Default)]
pub struct Tally {
    /// Items accepted (`queued`, `buffered` or `duplicate`).
    pub accepted: usize,
    /// Items answered `buffered`.
    pub buffered: usize,
    /// Push requests that were not accepted whole and were sent again.
    pub push_retries: usize,
    /// Pops answered neither 200 nor 204.
    pub pop_errors: usize,
    /// Set by the test: from then on, the first `queued` answer and the first delivery are
    /// recorded.
    pub watch_from: Option<Instant>,
    pub pushes_resumed_at: Option<Instant>,
    pub pops_resumed_at: Option<Instant>,
    /// Per partition, every delivery (key, delivered after its ack succeeded).
    pub deliveries: usize,
    pub after_ack: usize,
    pub acked: HashSet<String>,
    /// Acks that came for a key not above the partition's last acked key.
    pub ack_order: usize,
    /// Acks answered `success: false`: a lease lost with the session that claimed it (the
    /// message is handed out again once the lease has expired), or a retried ack whose first
    /// attempt did commit but whose answer was lost with the connection.
    pub acks_refused: usize,
    /// Keys of the second kind's candidates: refused on a retry after a failed attempt.
    pub ack_unknown: HashSet<String>,
    pub last_acked: HashMap<String, String>,
}

pub type Shared = Rc<RefCell<Tally>>;

pub fn key(partition: usize, seq: usize) -> String {
    format!("p{partition}-{seq:09}")
}

/// Pushes one partition's keys in order until `stop`, each batch retried until every item is
/// accepted; returns how many keys it produced.
pub async fn produce(
    app: Rc<TestApp>,
    partition: usize,
    stop: Rc<Cell<bool>>,
    tally: Shared,
) -> usize {
    let mut seq = 0;
    while !stop.get() {
        let items: Vec<Value> = (seq..seq + BATCH)
            .map(|s| {
                json!({"queue": QUEUE, "partition": format!("p{partition}"),
                       "transactionId": key(partition, s), "payload": {"s": s}})
            })
            .collect();
        let reply = app.push(json!(items)).await;
        let statuses: Vec<&str> = reply
            .body
            .as_array()
            .map(|r| r.iter().filter_map(|i| i["status"].as_str()).collect())
            .unwrap_or_default();
        let accepted = reply.status == 201
            && statuses.len() == BATCH
            && statuses
                .iter()
                .all(|s| matches!(*s, "queued" | "duplicate" | "buffered"));
        {
            let mut t = tally.borrow_mut();
            if accepted {
                seq += BATCH;
                t.accepted += BATCH;
                t.buffered += statuses.iter().filter(|s| **s == "buffered").count();
                if statuses.contains(&"queued") && t.pushes_resumed_at.is_none() {
                    if let Some(from) = t.watch_from {
                        t.pushes_resumed_at = Some(Instant::now().max(from));
                    }
                }
            } else {
                t.push_retries += 1;
            }
        }
        tokio::time::sleep(PACE).await;
    }
    seq
}

/// Pops (rotating over the brokers) and acks each batch until `done` names how many keys were
/// produced and all of them are acked (or nothing came for [`LEASE_SECS`] + 10 s after that,
/// and the test then reports the shortfall).
pub async fn consume(apps: Rc<Vec<Rc<TestApp>>>, done: Rc<Cell<Option<usize>>>, tally: Shared) {
    let mut turn = 0usize;
    let mut idle_since: Option<Instant> = None;
    loop {
        if let Some(total) = done.get() {
            if tally.borrow().acked.len() >= total {
                return;
            }
        }
        turn += 1;
        let app = &apps[turn % apps.len()];
        // A pop whose answer did not arrive whole (once, with seven failover tests and a build
        // sharing two cores) is a pop error like a 5xx: what it claimed is handed out again
        // when its lease runs out. Said on stderr, so a run shows it.
        let reply = match app
            .try_get(&format!("/api/v1/pop/queue/{QUEUE}?batch=50"))
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                eprintln!("consumer: {e}");
                tally.borrow_mut().pop_errors += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let messages: Vec<Value> = match reply.status {
            200 => reply.body["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            204 => Vec::new(),
            _ => {
                tally.borrow_mut().pop_errors += 1;
                Vec::new()
            }
        };
        if messages.is_empty() {
            if done.get().is_some() {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(LEASE_SECS + 10) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        idle_since = None;
        {
            let mut t = tally.borrow_mut();
            if t.pops_resumed_at.is_none() {
                if let Some(from) = t.watch_from {
                    t.pops_resumed_at = Some(Instant::now().max(from));
                }
            }
            for m in &messages {
                let k = m["transactionId"].as_str().unwrap_or_default();
                t.deliveries += 1;
                if t.acked.contains(k) {
                    t.after_ack += 1;
                }
            }
        }
        let acks: Vec<Value> = messages
            .iter()
            .map(|m| {
                json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                       "leaseId": m["leaseId"], "status": "completed"})
            })
            .collect();
        // An ack that did not get through (503 while PostgreSQL is away) is sent again; the
        // lease keeps the messages ours meanwhile.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut failed_before = false;
        loop {
            let r = app
                .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
                .await;
            if r.status == 200 {
                let results = r.body.as_array().cloned().unwrap_or_default();
                let mut t = tally.borrow_mut();
                for (m, result) in messages.iter().zip(&results) {
                    let k = m["transactionId"].as_str().unwrap_or_default().to_string();
                    if result["success"] != true {
                        t.acks_refused += 1;
                        if failed_before {
                            t.ack_unknown.insert(k);
                        }
                        continue;
                    }
                    let partition = k.split('-').next().unwrap_or_default().to_string();
                    if let Some(last) = t.last_acked.get(&partition) {
                        if *last >= k {
                            t.ack_order += 1;
                        }
                    }
                    t.last_acked.insert(partition, k.clone());
                    t.acked.insert(k);
                }
                break;
            }
            failed_before = true;
            assert!(
                Instant::now() < deadline,
                "acks not accepted within 30 s: {} {:?}",
                r.status,
                r.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Producers (one per partition, partition p on broker p mod n) and one consumer over all
/// brokers, running until [`Load::finish`].
pub struct Load {
    pub apps: Rc<Vec<Rc<TestApp>>>,
    pub stop: Rc<Cell<bool>>,
    pub done: Rc<Cell<Option<usize>>>,
    pub tally: Shared,
    pub producers: Vec<tokio::task::JoinHandle<usize>>,
    pub consumer: tokio::task::JoinHandle<()>,
    pub started: Instant,
}

impl Load {
    pub async fn start(apps: Vec<TestApp>, partitions: usize) -> Self {
        let apps: Rc<Vec<Rc<TestApp>>> = Rc::new(apps.into_iter().map(Rc::new).collect());
        // A short lease: a message whose ack never got through is handed out again soon.
        let configured = apps[0]
            .post(
                "/api/v1/configure",
                &json!({"queue": QUEUE, "options": {"leaseTime": LEASE_SECS}}),
            )
            .await;
        assert_eq!(configured.status, 200, "{:?}", configured.body);
        let stop = Rc::new(Cell::new(false));
        let done = Rc::new(Cell::new(None));
        let tally = Shared::default();
        let producers = (0..partitions)
            .map(|p| {
                actix_web::rt::spawn(produce(
                    apps[p % apps.len()].clone(),
                    p,
                    stop.clone(),
                    tally.clone(),
                ))
            })
            .collect();
        let consumer = actix_web::rt::spawn(consume(apps.clone(), done.clone(), tally.clone()));
        Self {
            apps,
            stop,
            done,
            tally,
            producers,
            consumer,
            started: Instant::now(),
        }
    }

    /// Waits until `n` more items were accepted than now.
    pub async fn accepted_more(&self, n: usize) {
        let goal = self.tally.borrow().accepted + n;
        let tally = &self.tally;
        eventually(
            Duration::from_secs(30),
            "producers make progress",
            || async move { (tally.borrow().accepted >= goal).then_some(()) },
        )
        .await;
    }

    /// Records from now on when pushes are queued and pops deliver again.
    pub fn watch_resume(&self) -> Instant {
        let now = Instant::now();
        let mut t = self.tally.borrow_mut();
        t.watch_from = Some(now);
        t.pushes_resumed_at = None;
        t.pops_resumed_at = None;
        now
    }

    /// Waits until every broker writes to `host` (`host:port`), bounded by `within`.
    pub async fn all_on(&self, host: &str, within: Duration) {
        for app in self.apps.iter() {
            let primary = &app.broker.primary;
            eventually(
                within,
                "the broker switches to the new primary",
                || async move { (primary.current_host() == host).then_some(()) },
            )
            .await;
        }
    }

    /// Waits until, after `from`, a push was answered `queued` and a pop delivered (20 s).
    pub async fn resumed_after(&self, from: Instant) {
        let tally = &self.tally;
        eventually(
            Duration::from_secs(20),
            "pushes are queued and pops deliver again",
            || async move {
                let t = tally.borrow();
                (t.pushes_resumed_at.is_some_and(|at| at > from)
                    && t.pops_resumed_at.is_some_and(|at| at > from))
                .then_some(())
            },
        )
        .await;
    }

    /// Stops the producers, waits for every spool to drain and the consumer to run dry;
    /// returns the keys produced per partition.
    pub async fn finish(self) -> (Vec<usize>, Shared, Duration) {
        self.stop.set(true);
        let mut produced = Vec::new();
        for p in self.producers {
            produced.push(p.await.expect("producer"));
        }
        for app in self.apps.iter() {
            app.drained().await;
        }
        self.done.set(Some(produced.iter().sum()));
        self.consumer.await.expect("consumer");
        (produced, self.tally, self.started.elapsed())
    }
}

/// What a run left behind, as [`Load::finish_checked`] found it.
pub struct Outcome {
    /// Keys produced, all partitions.
    pub total: usize,
    /// From the start of the load to the consumer running dry.
    pub elapsed: Duration,
    /// [`check_stored`]'s counts.
    pub lost: usize,
    pub twice: usize,
    pub order: usize,
    /// What producers and the consumer saw.
    pub tally: Tally,
    /// [`not_acked`]'s counts: acks whose answer was lost, keys never acked unexplained.
    pub lost_answers: usize,
    pub unexplained: Vec<String>,
}

impl Load {
    /// [`Load::finish`], then the checks on what `db` stores ([`check_stored`], [`not_acked`]).
    pub async fn finish_checked(self, db: &TestDb) -> Outcome {
        let (produced, tally, elapsed) = self.finish().await;
        let (lost, twice, order) = check_stored(db, &produced).await;
        let tally = std::mem::take(&mut *tally.borrow_mut());
        let (lost_answers, unexplained) = not_acked(&tally, &produced, db).await;
        Outcome {
            total: produced.iter().sum(),
            elapsed,
            lost,
            twice,
            order,
            tally,
            lost_answers,
            unexplained,
        }
    }
}

/// What the failover tests give their brokers: the primary checked every 200 ms, connects and
/// commits that give up soon, the spool replayed without a long back-off.
pub const FAILOVER_SETTINGS: [(&str, &str); 4] = [
    ("QUEEN_PRIMARY_CHECK_MS", "200"),
    ("DB_CONNECTION_TIMEOUT", "1000"),
    ("QUEEN_REPLAY_BACKOFF_MS", "50"),
    ("QUEEN_COMMIT_TIMEOUT_MS", "5000"),
];

/// `n` brokers on the (multi-host) `url` with [`FAILOVER_SETTINGS`].
pub async fn failover_brokers(url: &str, n: usize) -> Vec<TestApp> {
    let mut apps = Vec::new();
    for _ in 0..n {
        let db = TestDb {
            url: url.to_string(),
        };
        apps.push(spawn_app_with(test_settings(&db, &FAILOVER_SETTINGS)).await);
    }
    apps
}

/// Per partition, compares what PostgreSQL stores with what was produced: (lost, twice,
/// out of order).
pub async fn check_stored(db: &TestDb, produced: &[usize]) -> (usize, usize, usize) {
    let (mut lost, mut twice, mut order) = (0, 0, 0);
    for (p, &count) in produced.iter().enumerate() {
        let stored = db.stored(QUEUE, &format!("p{p}")).await;
        let keys: Vec<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
        let unique: HashSet<&str> = keys.iter().copied().collect();
        twice += keys.len() - unique.len();
        lost += (0..count)
            .filter(|&s| !unique.contains(key(p, s).as_str()))
            .count();
        order += keys.windows(2).filter(|w| w[0] >= w[1]).count();
    }
    (lost, twice, order)
}

/// The keys the consumer never saw acked, split into those acked by an attempt whose answer
/// was lost (counted; see below) and the unexplained ones (a failure).
pub async fn not_acked(tally: &Tally, produced: &[usize], db: &TestDb) -> (usize, Vec<String>) {
    // Every message is acked by the consumer, with one exception that is not a loss: an ack
    // that committed while PostgreSQL went away, so that its answer was lost, and whose retry
    // was then refused (the lease was already released). Such a message must be consumed in
    // PostgreSQL: below its partition's committed offset.
    let (mut lost_answers, mut unexplained) = (0, Vec::new());
    for (p, &count) in produced.iter().enumerate() {
        let not_acked: Vec<String> = (0..count)
            .map(|s| key(p, s))
            .filter(|k| !tally.acked.contains(k))
            .collect();
        if not_acked.is_empty() {
            continue;
        }
        let partition = format!("p{p}");
        let stored = db.stored(QUEUE, &partition).await;
        let committed: i64 = sqlx::query_scalar(
            "SELECT c.committed_offset
               FROM queen.partition_consumers c
               JOIN queen.partitions p ON p.id = c.partition_id
               JOIN queen.queues q ON q.id = p.queue_id
              WHERE q.name = $1
                AND p.name = $2
                AND c.consumer_group = $3",
        )
        .bind(QUEUE)
        .bind(&partition)
        .bind(queen_broker::storage::consume::QUEUE_MODE)
        .fetch_one(&mut db.conn().await)
        .await
        .expect("the partition's cursor");
        for k in not_acked {
            let offset = stored
                .iter()
                .find(|s| s.transaction_id == k)
                .map(|s| s.offset);
            if tally.ack_unknown.contains(&k) && offset.is_some_and(|o| o < committed) {
                lost_answers += 1;
            } else {
                unexplained.push(k);
            }
        }
    }
    (lost_answers, unexplained)
}

/// The consumer-side checks shared by both tests.
pub fn check_consumed(tally: &Tally, unexplained: &[String]) {
    assert_eq!(
        tally.after_ack, 0,
        "no message is delivered again after its ack"
    );
    assert_eq!(tally.ack_order, 0, "per partition, acks follow key order");
    assert!(
        unexplained.is_empty(),
        "every accepted message was delivered and acked: {} were not (first: {:?}); \
         {} acks were refused",
        unexplained.len(),
        &unexplained[..unexplained.len().min(10)],
        tally.acks_refused
    );
}

/// Runs a `pg_ctl` step off the test's thread, which also runs the producers, the consumer and
/// the brokers' background tasks (so they go on while it runs).
pub async fn blocking(
    step: impl FnOnce() -> Result<(), queen_broker::pg::ClusterError> + Send + 'static,
) {
    tokio::task::spawn_blocking(step)
        .await
        .expect("pg_ctl step ran")
        .expect("pg_ctl step succeeded");
}

pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// What a failover under an HA engine measured ([`engine_failover`]).
pub struct EngineFailover {
    /// What the load left behind, checked on the promoted node.
    pub outcome: Outcome,
    /// From the kill to both brokers writing to the promoted node.
    pub switched: Duration,
    /// From then to the first push answered `queued` and to the first delivery.
    pub pushes_after: Duration,
    pub pops_after: Duration,
}

/// The run of the HA engine tests (tests/it/ha_failover.rs, tests/it/ha_patroni.rs): two
/// brokers on the multi-host `url`, both first on `old` (`host:port`), four producers and the
/// consumer. Once 1 000 items were accepted, `kill` makes the primary's machine die; then both
/// brokers must write to `new` within 60 s, pushes be `queued` and pops deliver again, and
/// 1 000 more items be accepted. The load is finished and checked on `promoted` (the new
/// primary's URL of the broker's database). Asserts that the spools drained and that what
/// arrived while no node took writes was spooled.
pub async fn engine_failover(
    url: &str,
    old: &str,
    new: &str,
    kill: impl FnOnce(),
    promoted: String,
) -> EngineFailover {
    let apps = failover_brokers(url, 2).await;
    for app in &apps {
        assert_eq!(app.broker.primary.current_host(), old);
    }
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    let died_at = Instant::now();
    // A few milliseconds of kill(1) and pkill(1): run on the test's thread.
    kill();
    load.all_on(new, Duration::from_secs(60)).await;
    let switched = died_at.elapsed();
    // From here on: the first push answered `queued` and the first delivery (answers to
    // commits made on the old primary before it died may still arrive just after the kill).
    let watch_from = load.watch_resume();
    load.resumed_after(watch_from).await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let outcome = load.finish_checked(&TestDb { url: promoted }).await;
    for app in apps.iter() {
        assert_eq!(app.broker.state.spool.state.records(), 0, "spools drained");
    }
    let t = &outcome.tally;
    assert!(
        t.buffered > 0,
        "pushes while no node took writes were spooled (answered buffered)"
    );
    let since_watch =
        |at: Option<Instant>| at.expect("resumed").saturating_duration_since(watch_from);
    EngineFailover {
        switched,
        pushes_after: since_watch(t.pushes_resumed_at),
        pops_after: since_watch(t.pops_resumed_at),
        outcome,
    }
}

impl EngineFailover {
    /// The run's numbers, one line.
    pub fn describe(&self) -> String {
        let Outcome {
            total,
            elapsed,
            lost,
            twice,
            order,
            tally: t,
            lost_answers,
            ..
        } = &self.outcome;
        format!(
            "{total} messages through 2 brokers in {:.1} s; primary killed to both brokers on \
             the promoted node {} ms; pushes queued again {} ms and pops delivering {} ms after \
             that; {} items buffered, {} push retries, {} pop errors; {} deliveries, {} acked, \
             {} acks refused ({lost_answers} after their first attempt had committed); lost \
             {lost}, twice {twice}, order {order}, delivered after ack {}",
            elapsed.as_secs_f64(),
            ms(self.switched),
            ms(self.pushes_after),
            ms(self.pops_after),
            t.buffered,
            t.push_retries,
            t.pop_errors,
            t.deliveries,
            t.acked.len(),
            t.acks_refused,
            t.after_ack,
        )
    }
}

/// What a failover with a synchronous standby promises: nothing lost, twice or out of order,
/// every accepted message consumed and nothing delivered after its ack.
pub fn assert_nothing_lost(run: &Outcome) {
    assert_eq!((run.lost, run.twice, run.order), (0, 0, 0));
    check_consumed(&run.tally, &run.unexplained);
}

/// What a failover with an asynchronous standby still promises (the brokers carrying on is
/// checked inside the run; the number lost is the window, printed): each message stored at
/// most once and in order, acks in key order per partition.
pub fn assert_at_most_once_in_order(run: &Outcome) {
    assert_eq!((run.twice, run.order), (0, 0));
    assert_eq!(
        run.tally.ack_order, 0,
        "per partition, acks follow key order"
    );
}
