//! PostgreSQL going away under load, with producers and an acking consumer running through it:
//!
//! - `a_primary_switchover_loses_nothing`: two brokers on a multi-host URL (a primary and its
//!   streaming standby made by `pg_basebackup -R` in the test; one broker lists the standby
//!   first, so it must pick the primary at start). Mid-load the primary is made
//!   read-only (writes fail with SQLSTATE 25006) and its sessions are ended, the standby
//!   catches up and is promoted (`pg_ctl promote`), the old primary is stopped. The brokers
//!   spool what arrives meanwhile (`buffered`), find the new primary among the hosts, replay,
//!   and the consumer goes on.
//! - `a_failover_with_synchronous_replication_loses_nothing`: the same pair with synchronous
//!   replication; mid-load the primary crashes (`pg_ctl stop -m immediate`, nothing fenced
//!   gracefully, no catch-up awaited) and the standby is promoted with what it has, as an HA
//!   engine does. Every commit answered `queued` had reached the standby: lost = 0.
//! - `a_failover_with_asynchronous_replication_is_measured`: the same crash with asynchronous
//!   replication, the case docs/reliability.md does not promise: it prints how many accepted
//!   messages and acks the promotion lost (the window) and asserts only what still holds
//!   (nothing twice, nothing out of order, the brokers carry on).
//! - `three_brokers_ride_through_a_postgresql_restart`: three brokers on one cluster that is
//!   crash-stopped (`pg_ctl stop -m immediate`) and started again mid-load.
//!
//! Both check on PostgreSQL at the end: per partition every produced key is stored (lost = 0),
//! once (twice = 0), in production order (order = 0); every message was acked, no message was
//! delivered again after its ack succeeded, and per partition acks came in key order. Producers
//! use deterministic transactionIds and retry a batch until every item is accepted (`queued`,
//! `buffered` or `duplicate`); each producer stays with one broker (order is promised per
//! broker: a `buffered` batch replays from that broker's spool). Each test prints its numbers
//! (`cargo test --test it switchover:: -- --nocapture`); each takes well under a minute.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use queen_broker::pg::{free_port, PrivateCluster};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::replica::ReplicaPair;
use crate::support::{eventually, spawn_app_with, test_settings, TestApp, TestDb};

const QUEUE: &str = "switch";
const BATCH: usize = 10;
/// Pause between a producer's batches: keeps the load steady and within what the consumer
/// drains on two cores, so the run measures the switchover, not a backlog.
const PACE: Duration = Duration::from_millis(20);
/// The queue's lease: a message whose claim was lost (the lease pool commits asynchronously,
/// so a crash may lose a claim) or whose ack never got through is handed out again after it.
const LEASE_SECS: u64 = 5;

/// What producers and the consumer saw.
#[derive(Default)]
struct Tally {
    /// Items accepted (`queued`, `buffered` or `duplicate`).
    accepted: usize,
    /// Items answered `buffered`.
    buffered: usize,
    /// Push requests that were not accepted whole and were sent again.
    push_retries: usize,
    /// Pops answered neither 200 nor 204.
    pop_errors: usize,
    /// Set by the test: from then on, the first `queued` answer and the first delivery are
    /// recorded.
    watch_from: Option<Instant>,
    pushes_resumed_at: Option<Instant>,
    pops_resumed_at: Option<Instant>,
    /// Per partition, every delivery (key, delivered after its ack succeeded).
    deliveries: usize,
    after_ack: usize,
    acked: HashSet<String>,
    /// Acks that came for a key not above the partition's last acked key.
    ack_order: usize,
    /// Acks answered `success: false`: a lease lost with the session that claimed it (the
    /// message is handed out again once the lease has expired), or a retried ack whose first
    /// attempt did commit but whose answer was lost with the connection.
    acks_refused: usize,
    /// Keys of the second kind's candidates: refused on a retry after a failed attempt.
    ack_unknown: HashSet<String>,
    last_acked: HashMap<String, String>,
}

type Shared = Rc<RefCell<Tally>>;

fn key(partition: usize, seq: usize) -> String {
    format!("p{partition}-{seq:09}")
}

/// Pushes one partition's keys in order until `stop`, each batch retried until every item is
/// accepted; returns how many keys it produced.
async fn produce(app: Rc<TestApp>, partition: usize, stop: Rc<Cell<bool>>, tally: Shared) -> usize {
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
async fn consume(apps: Rc<Vec<Rc<TestApp>>>, done: Rc<Cell<Option<usize>>>, tally: Shared) {
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
        let reply = app
            .get(&format!("/api/v1/pop/queue/{QUEUE}?batch=50"))
            .await;
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
struct Load {
    apps: Rc<Vec<Rc<TestApp>>>,
    stop: Rc<Cell<bool>>,
    done: Rc<Cell<Option<usize>>>,
    tally: Shared,
    producers: Vec<tokio::task::JoinHandle<usize>>,
    consumer: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Load {
    async fn start(apps: Vec<TestApp>, partitions: usize) -> Self {
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
    async fn accepted_more(&self, n: usize) {
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
    fn watch_resume(&self) -> Instant {
        let now = Instant::now();
        let mut t = self.tally.borrow_mut();
        t.watch_from = Some(now);
        t.pushes_resumed_at = None;
        t.pops_resumed_at = None;
        now
    }

    /// Stops the producers, waits for every spool to drain and the consumer to run dry;
    /// returns the keys produced per partition.
    async fn finish(self) -> (Vec<usize>, Shared, Duration) {
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

/// Per partition, compares what PostgreSQL stores with what was produced: (lost, twice,
/// out of order).
async fn check_stored(db: &TestDb, produced: &[usize]) -> (usize, usize, usize) {
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
async fn not_acked(tally: &Tally, produced: &[usize], db: &TestDb) -> (usize, Vec<String>) {
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
fn check_consumed(tally: &Tally, unexplained: &[String]) {
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
async fn blocking(
    step: impl FnOnce() -> Result<(), queen_broker::pg::ClusterError> + Send + 'static,
) {
    tokio::task::spawn_blocking(step)
        .await
        .expect("pg_ctl step ran")
        .expect("pg_ctl step succeeded");
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

#[actix_web::test]
async fn a_primary_switchover_loses_nothing() {
    let pair = ReplicaPair::start();
    let extra = [
        ("QUEEN_PRIMARY_CHECK_MS", "200"),
        ("DB_CONNECTION_TIMEOUT", "1000"),
        ("QUEEN_REPLAY_BACKOFF_MS", "50"),
        ("QUEEN_COMMIT_TIMEOUT_MS", "5000"),
    ];
    let mut apps = Vec::new();
    // The second broker lists the standby first: it must start on the primary all the same.
    for url in [pair.url("postgres"), pair.url_standby_first("postgres")] {
        apps.push(spawn_app_with(test_settings(&TestDb { url }, &extra)).await);
    }
    let old = format!("127.0.0.1:{}", pair.primary.port);
    let new = format!("127.0.0.1:{}", pair.standby.port);
    for app in &apps {
        assert_eq!(app.broker.primary.current_host(), old);
    }
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    // The switchover: the old primary stops taking writes, the standby catches up and is
    // promoted, the old primary goes away.
    let before = load.tally.borrow().accepted;
    let gap_start = Instant::now();
    pair.make_primary_read_only().await;
    pair.standby_caught_up().await;
    // Writes are refused for a while (as while an operator or Patroni promotes): pushes
    // meanwhile must be answered `buffered`.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let promote_start = Instant::now();
    let standby = pair.standby.clone();
    blocking(move || standby.promote()).await;
    let promoted = load.watch_resume();
    let old_primary = pair.primary.clone();
    blocking(move || old_primary.stop(false)).await;
    let during_gap = load.tally.borrow().accepted - before;

    for app in load.apps.iter() {
        let (primary, new) = (&app.broker.primary, &new);
        eventually(
            Duration::from_secs(20),
            "the broker switches to the promoted standby",
            || async move { (primary.current_host() == *new).then_some(()) },
        )
        .await;
        // An operator sees it in the metrics: the host written to now, and one switch more.
        let (status, text) = app.get_text("/metrics/prometheus").await;
        assert_eq!(status, 200);
        assert!(
            text.contains(&format!("queen_database_primary{{host=\"{new}\"}} 1")),
            "{text}"
        );
        assert!(
            !text.contains("queen_database_primary_switches_total 0\n"),
            "no switch counted: {text}"
        );
    }
    let tally = &load.tally;
    eventually(
        Duration::from_secs(20),
        "pushes are queued and pops deliver again",
        || async move {
            let t = tally.borrow();
            (t.pushes_resumed_at.is_some_and(|at| at > promoted)
                && t.pops_resumed_at.is_some_and(|at| at > promoted))
            .then_some(())
        },
    )
    .await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let (produced, tally, elapsed) = load.finish().await;
    let total: usize = produced.iter().sum();
    let db = TestDb {
        url: pair.standby.url("postgres"),
    };
    let (lost, twice, order) = check_stored(&db, &produced).await;
    let t = std::mem::take(&mut *tally.borrow_mut());
    let (lost_answers, unexplained) = not_acked(&t, &produced, &db).await;
    let pushes_resumed = t.pushes_resumed_at.expect("pushes resumed");
    let pops_resumed = t.pops_resumed_at.expect("pops resumed");
    eprintln!(
        "switchover: {total} messages through 2 brokers in {:.1} s; writes refused for {} ms \
         (read-only to promoted, promote took {} ms); pushes queued again {} ms after the \
         promotion ({} ms after writes stopped), pops delivering {} ms after the promotion; \
         {} items buffered, {} accepted during the gap, {} push retries, {} pop errors; \
         {} deliveries, {} acked, {} acks refused ({} after their first attempt had committed); lost {lost}, twice {twice}, order {order}, delivered after \
         ack {}, switches {:?}",
        elapsed.as_secs_f64(),
        ms(promoted - gap_start),
        ms(promoted - promote_start),
        ms(pushes_resumed.saturating_duration_since(promoted)),
        ms(pushes_resumed - gap_start),
        ms(pops_resumed.saturating_duration_since(promoted)),
        t.buffered,
        during_gap,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        t.after_ack,
        apps.iter()
            .map(|a| a.broker.primary.switches())
            .collect::<Vec<_>>(),
    );
    assert_eq!((lost, twice, order), (0, 0, 0));
    check_consumed(&t, &unexplained);
    assert!(
        t.buffered > 0,
        "pushes during the gap were spooled (answered buffered)"
    );
    // One switch each at the switchover; the broker that listed the standby first also
    // switched once at start.
    let switches: Vec<u64> = apps.iter().map(|a| a.broker.primary.switches()).collect();
    assert_eq!(switches, [1, 2]);
    for app in apps.iter() {
        assert_eq!(app.broker.state.spool.state.records(), 0);
    }
}

/// What a failover run saw (see [`failover`]).
struct Failover {
    lost: usize,
    twice: usize,
    order: usize,
    tally: Tally,
    unexplained: Vec<String>,
    total: usize,
}

/// Two brokers on the pair under load; the primary crashes and the standby is promoted at once.
/// Prints the run's numbers.
async fn failover(synchronous: bool) -> Failover {
    use queen_broker::storage::cluster::durability::{self, Level};
    let pair = ReplicaPair::start();
    pair.streaming().await;
    if synchronous {
        pair.make_synchronous().await;
    }
    // What the broker logs at start about these settings: the asynchronous standby is named
    // as a risk, the synchronous one is not.
    let settings = durability::read(
        &mut TestDb {
            url: pair.primary.url("postgres"),
        }
        .conn()
        .await,
    )
    .await
    .expect("durability settings");
    assert_eq!(settings.standbys, 1, "{settings:?}");
    assert_eq!(
        settings.sync_standbys,
        i64::from(synchronous),
        "{settings:?}"
    );
    let warned = settings
        .findings()
        .iter()
        .any(|(level, text)| *level == Level::Warn && text.contains("replicate asynchronously"));
    assert_eq!(warned, !synchronous, "{:?}", settings.findings());

    let extra = [
        ("QUEEN_PRIMARY_CHECK_MS", "200"),
        ("DB_CONNECTION_TIMEOUT", "1000"),
        ("QUEEN_REPLAY_BACKOFF_MS", "50"),
        ("QUEEN_COMMIT_TIMEOUT_MS", "5000"),
    ];
    let mut apps = Vec::new();
    for _ in 0..2 {
        apps.push(
            spawn_app_with(test_settings(
                &TestDb {
                    url: pair.url("postgres"),
                },
                &extra,
            ))
            .await,
        );
    }
    let new = format!("127.0.0.1:{}", pair.standby.port);
    let load = Load::start(apps, 4).await;
    load.accepted_more(1_000).await;

    // The failure: the primary dies mid-commit; the standby is promoted with what it has.
    let crash_at = Instant::now();
    let old_primary = pair.primary.clone();
    blocking(move || old_primary.stop(true)).await;
    let standby = pair.standby.clone();
    blocking(move || standby.promote()).await;
    let promoted = load.watch_resume();
    for app in load.apps.iter() {
        let (primary, new) = (&app.broker.primary, &new);
        eventually(
            Duration::from_secs(20),
            "the broker switches to the promoted standby",
            || async move { (primary.current_host() == *new).then_some(()) },
        )
        .await;
    }
    let tally = &load.tally;
    eventually(
        Duration::from_secs(20),
        "pushes are queued and pops deliver again",
        || async move {
            let t = tally.borrow();
            (t.pushes_resumed_at.is_some_and(|at| at > promoted)
                && t.pops_resumed_at.is_some_and(|at| at > promoted))
            .then_some(())
        },
    )
    .await;
    load.accepted_more(1_000).await;
    let apps = load.apps.clone();
    let (produced, tally, elapsed) = load.finish().await;
    let total: usize = produced.iter().sum();
    let db = TestDb {
        url: pair.standby.url("postgres"),
    };
    let (lost, twice, order) = check_stored(&db, &produced).await;
    let t = std::mem::take(&mut *tally.borrow_mut());
    let (lost_answers, unexplained) = not_acked(&t, &produced, &db).await;
    let pushes_resumed = t.pushes_resumed_at.expect("pushes resumed");
    eprintln!(
        "failover ({} replication): {total} messages through 2 brokers in {:.1} s; crash to \
         promoted {} ms; pushes queued again {} ms after the promotion, pops delivering {} ms \
         after it; {} items buffered, {} push retries, {} pop errors; {} deliveries, {} acked, \
         {} acks refused ({} after their first attempt had committed); lost {lost}, twice \
         {twice}, order {order}, not delivered and acked {}, delivered after ack {}",
        if synchronous {
            "synchronous"
        } else {
            "asynchronous"
        },
        elapsed.as_secs_f64(),
        ms(promoted - crash_at),
        ms(pushes_resumed.saturating_duration_since(promoted)),
        ms(t.pops_resumed_at
            .expect("pops resumed")
            .saturating_duration_since(promoted)),
        t.buffered,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        unexplained.len(),
        t.after_ack,
    );
    for app in apps.iter() {
        assert_eq!(app.broker.state.spool.state.records(), 0, "spools drained");
    }
    Failover {
        lost,
        twice,
        order,
        tally: t,
        unexplained,
        total,
    }
}

#[actix_web::test]
async fn a_failover_with_synchronous_replication_loses_nothing() {
    let run = failover(true).await;
    assert!(run.total >= 2_000);
    assert_eq!((run.lost, run.twice, run.order), (0, 0, 0));
    check_consumed(&run.tally, &run.unexplained);
}

#[actix_web::test]
async fn a_failover_with_asynchronous_replication_is_measured() {
    // What asynchronous replication still promises: a message is stored at most once and in
    // order, and the brokers go on with the promoted standby (checked inside). How many
    // accepted messages the promotion lost is printed, not asserted: that is the window.
    let run = failover(false).await;
    assert!(run.total >= 2_000);
    assert_eq!((run.twice, run.order), (0, 0));
    assert_eq!(
        run.tally.ack_order, 0,
        "per partition, acks follow key order"
    );
}

#[actix_web::test]
async fn three_brokers_ride_through_a_postgresql_restart() {
    let dir = std::env::temp_dir().join(format!("queen-restart-{}", Uuid::new_v4().simple()));
    let cluster =
        PrivateCluster::new(&dir.join("pg"), free_port().expect("port")).expect("server binaries");
    cluster.start(true).expect("cluster starts");
    struct Cleanup(PrivateCluster, std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = self.0.stop(true);
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _cleanup = Cleanup(cluster.clone(), dir);
    let db = TestDb {
        url: cluster.url("postgres"),
    };
    let extra = [
        ("DB_CONNECTION_TIMEOUT", "1000"),
        ("QUEEN_REPLAY_BACKOFF_MS", "50"),
        ("QUEEN_COMMIT_TIMEOUT_MS", "5000"),
    ];
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(spawn_app_with(test_settings(&db, &extra)).await);
    }
    let load = Load::start(apps, 6).await;
    load.accepted_more(1_000).await;

    let down_at = Instant::now();
    let pg = cluster.clone();
    blocking(move || pg.stop(true)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let pg = cluster.clone();
    blocking(move || pg.start(true)).await;
    let restarted = load.watch_resume();
    let tally = &load.tally;
    eventually(
        Duration::from_secs(20),
        "pushes are queued and pops deliver again",
        || async move {
            let t = tally.borrow();
            (t.pushes_resumed_at.is_some_and(|at| at > restarted)
                && t.pops_resumed_at.is_some_and(|at| at > restarted))
            .then_some(())
        },
    )
    .await;
    load.accepted_more(1_000).await;
    let (produced, tally, elapsed) = load.finish().await;
    let total: usize = produced.iter().sum();
    let (lost, twice, order) = check_stored(&db, &produced).await;
    let t = std::mem::take(&mut *tally.borrow_mut());
    let (lost_answers, unexplained) = not_acked(&t, &produced, &db).await;
    eprintln!(
        "restart: {total} messages through 3 brokers in {:.1} s; PostgreSQL down {} ms; pushes \
         queued again {} ms after the restart; {} items buffered, {} push retries, {} pop errors; \
         {} deliveries, {} acked, {} acks refused ({} after their first attempt had committed); lost {lost}, twice {twice}, order {order}, \
         delivered after ack {}",
        elapsed.as_secs_f64(),
        ms(restarted - down_at),
        ms(t.pushes_resumed_at
            .expect("resumed")
            .saturating_duration_since(restarted)),
        t.buffered,
        t.push_retries,
        t.pop_errors,
        t.deliveries,
        t.acked.len(),
        t.acks_refused,
        lost_answers,
        t.after_ack,
    );
    assert_eq!((lost, twice, order), (0, 0, 0));
    check_consumed(&t, &unexplained);
    assert!(
        t.buffered > 0,
        "pushes while PostgreSQL was down were spooled"
    );
}
