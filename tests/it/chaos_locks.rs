//! Locks and semaphores through a broker SIGKILL (issue 31, part of the chaos suite): three
//! real broker processes on one database, many client tasks spread over them doing acquire →
//! guarded steps → release on a mutex and on a semaphore of [`LIMIT`]; mid-run one broker is
//! killed with SIGKILL. The clients of the dead broker lose their answers: a client that held a
//! permit through it abandons the permit (no release: it must expire by its TTL), fails over to
//! a live broker and, once the permit is gone, sends one more guarded step with its stale guard
//! (a "zombie" that must commit nothing). A client's first hold and every fifth after it also
//! send a step with the guard just released (it must commit nothing either).
//!
//! A guarded step is a KV-only transaction `[guard, put step:<name>:<n> {token, slot, owner},
//! incr count:<name>]`. KV versions and lock tokens come from one sequence, so each committed
//! step's row version places it on the same axis as the grants. Checked afterwards:
//!
//! - **fencing** (from the database): every committed step of token `t` on a permit key has a
//!   version between `t` and the next token granted on that key (a stale step committed late
//!   would land above it); every step answered committed is stored, every refused one is not,
//!   and `count:<name>` equals the stored steps (nothing of a refused bundle applied); the
//!   after-release and zombie steps are all refused;
//! - **monotonic tokens** (from the answers): for two grants (acquire or renew) on one key with
//!   tokens `t < t'`, the answer of `t'` came after the request of `t` was sent (the later grant
//!   is never the lower token); tokens are never handed out twice;
//! - **the bound**, three ways: (1) client side, a holder counts from its acquire answer until
//!   it lets go (sends its release, or is refused), and never past its last grant's request time + TTL − [`MARGIN`]
//!   (until then the permit is surely live in the database, abandoned or not): at no instant
//!   more than `LIMIT` (1 for the mutex) such intervals overlap — this also says an abandoned
//!   permit was not handed out again before its TTL; (2) server side, on the version axis: a
//!   hold spans its grant's token to its last committed step, and at no version do more than
//!   `LIMIT` holds overlap; (3) a sampler reading the live permit rows of PostgreSQL every
//!   20 ms never sees more than `LIMIT` of them nor a slot at or above it; and every step sent
//!   and answered inside its holder's sure window commits (a refusal there means someone else
//!   was granted the same permit);
//! - the kill happened while a client of the victim held the mutex and one held a semaphore
//!   permit; every abandoned permit's key was granted again, with a higher token.
//!
//! Default: 6 s of run, one kill, about 10 s with the brokers' start. Long form:
//! `QUEEN_CHAOS_LONG=1 cargo test --test it chaos_locks:: -- --nocapture` (120 s, a broker
//! killed every 15 s in turn and started again); `QUEEN_CHAOS_LOCK_SECONDS=N` sets the run's
//! length in either form.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use queen_broker::pg::free_port;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::chaos::{Http, Node};
use crate::support::fresh_db;

const BROKERS: usize = 3;
const NS: &str = "chaos-locks";
const MUTEX: &str = "chaos-mutex";
const SEM: &str = "chaos-sem";
/// The semaphore's permits.
const LIMIT: i64 = 3;
/// Every permit's TTL.
const TTL: Duration = Duration::from_secs(2);
/// Taken off a permit's sure lifetime as the client sees it: the database's clock against this
/// process's, and slack.
const MARGIN: Duration = Duration::from_millis(250);
const MUTEX_CLIENTS: usize = 6;
const SEM_CLIENTS: usize = 9;

/// The run's length and its kills.
struct Plan {
    run: Duration,
    first_kill: Duration,
    /// `None`: one kill, the broker stays dead.
    kill_every: Option<Duration>,
    long: bool,
}

fn plan() -> Plan {
    let long = std::env::var("QUEEN_CHAOS_LONG").is_ok_and(|v| v == "1");
    let secs = std::env::var("QUEEN_CHAOS_LOCK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if long { 120 } else { 6 });
    Plan {
        run: Duration::from_secs(secs),
        first_kill: Duration::from_secs(2),
        kill_every: long.then_some(Duration::from_secs(15)),
        long,
    }
}

/// The broker processes, killed and removed however the test ends.
struct Brokers {
    dir: PathBuf,
    nodes: Vec<RefCell<Node>>,
}

impl Drop for Brokers {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.borrow_mut().sigkill();
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

/// xorshift64: the clients' pauses and choices, reproducible per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Enter,
    Work,
    Leave,
    /// With the guard just released.
    AfterRelease,
    /// With the guard of an abandoned permit, once it is gone.
    Zombie,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Committed,
    /// `kv_precondition` on the guard.
    Refused,
    /// No answer (or an error answer): it may or may not have applied.
    Unknown,
}

struct Step {
    hold: usize,
    token: i64,
    phase: Phase,
    outcome: Outcome,
}

/// One grant answered: an acquire or a renew.
struct Grant {
    name: &'static str,
    slot: i64,
    token: i64,
    sent: Instant,
    answered: Instant,
}

/// One permit as its client saw it.
struct Hold {
    name: &'static str,
    client: usize,
    owner: String,
    broker: usize,
    slot: i64,
    first_token: i64,
    token: i64,
    guard: Value,
    /// The acquire's answer.
    answered: Instant,
    /// The last grant's request time + TTL: the permit is live at least until then.
    sure_until: Instant,
    /// When the client stopped counting on it: it sent its release, or a step, renew or
    /// release of it was refused.
    let_go: Option<Instant>,
    /// When the client lost its broker while holding.
    abandoned: Option<Instant>,
}

/// What a call got back.
enum Answer {
    /// 200 and its body.
    Verdict(Value),
    /// No answer: the broker is gone (or the call timed out).
    Silence,
    /// Another status.
    Error(u16, Value),
}

/// What the run shares and records.
struct Run {
    http: Http,
    bases: Vec<String>,
    alive: RefCell<[bool; BROKERS]>,
    stop: Cell<Instant>,
    holds: RefCell<Vec<Hold>>,
    grants: RefCell<Vec<Grant>>,
    steps: RefCell<BTreeMap<String, Step>>,
    next_step: Cell<usize>,
    /// Client → (lock name, broker), while it holds a permit and has not begun to leave.
    holding: RefCell<HashMap<usize, (&'static str, usize)>>,
    violations: RefCell<Vec<String>>,
    errors: RefCell<Vec<String>>,
    tally: RefCell<BTreeMap<&'static str, usize>>,
    /// (victim, when, whether both kinds were held through it).
    kills: RefCell<Vec<(usize, Instant, bool)>>,
    /// Most live permit rows the sampler saw, per name.
    sampled_max: RefCell<BTreeMap<&'static str, i64>>,
}

impl Run {
    fn count(&self, what: &'static str) {
        *self.tally.borrow_mut().entry(what).or_default() += 1;
    }

    fn violation(&self, what: String) {
        eprintln!("chaos_locks VIOLATION: {what}");
        self.violations.borrow_mut().push(what);
    }

    /// The client's home broker when alive, else the next live one.
    fn route(&self, home: usize) -> usize {
        let alive = self.alive.borrow();
        (0..BROKERS)
            .map(|i| (home + i) % BROKERS)
            .find(|b| alive[*b])
            .unwrap_or(home)
    }

    async fn post(&self, broker: usize, path: &str, body: &Value) -> Answer {
        match self.http.post(&self.bases[broker], path, body).await {
            None => Answer::Silence,
            Some((200, v)) => Answer::Verdict(v),
            Some((status, v)) => Answer::Error(status, v),
        }
    }

    async fn lock_op(&self, broker: usize, op: Value) -> Answer {
        match self
            .post(broker, "/api/v1/locks", &json!({ "operations": [op] }))
            .await
        {
            Answer::Verdict(v) => Answer::Verdict(v["results"][0].clone()),
            other => other,
        }
    }

    fn held_through(&self, broker: usize, name: &str) -> bool {
        self.holding
            .borrow()
            .values()
            .any(|(n, b)| *n == name && *b == broker)
    }

    /// Every abandoned permit's key was granted again with a higher token.
    fn all_regranted(&self) -> bool {
        let grants = self.grants.borrow();
        self.holds
            .borrow()
            .iter()
            .filter(|h| h.abandoned.is_some())
            .all(|h| {
                grants
                    .iter()
                    .any(|g| g.name == h.name && g.slot == h.slot && g.token > h.token)
            })
    }
}

/// One guarded step of hold `h` through its broker, recorded.
async fn step(run: &Run, h: usize, phase: Phase) -> Outcome {
    let (name, broker, slot, token, owner, guard) = {
        let hold = &run.holds.borrow()[h];
        (
            hold.name,
            hold.broker,
            hold.slot,
            hold.token,
            hold.owner.clone(),
            hold.guard.clone(),
        )
    };
    let n = run.next_step.get();
    run.next_step.set(n + 1);
    let key = format!("step:{name}:{n:07}");
    let body = json!({
        "operations": [],
        "kv": [
            guard,
            {"op": "put", "ns": NS, "key": key, "forever": true,
             "value": {"token": token, "slot": slot, "owner": owner}},
            {"op": "incr", "ns": NS, "key": format!("count:{name}"), "delta": 1, "forever": true},
        ],
    });
    let answer = run.post(broker, "/api/v1/transaction", &body).await;
    let answered = Instant::now();
    let outcome = match answer {
        Answer::Verdict(b) if b["success"] == true => Outcome::Committed,
        Answer::Verdict(b) if b["reason"] == "kv_precondition" && b["failedIndex"] == 0 => {
            Outcome::Refused
        }
        Answer::Silence => Outcome::Unknown,
        Answer::Verdict(b) | Answer::Error(_, b) => {
            run.errors.borrow_mut().push(format!("step: {b}"));
            Outcome::Unknown
        }
    };
    let sure_until = run.holds.borrow()[h].sure_until;
    match (phase, outcome) {
        (Phase::Enter | Phase::Work | Phase::Leave, Outcome::Refused) => {
            if answered + MARGIN < sure_until {
                run.violation(format!(
                    "{name}: a step of token {token} (slot {slot}) was refused while its permit \
                     was surely live ({:?} before its TTL)",
                    sure_until - answered
                ));
            } else {
                run.count("permits lost to a slow step");
            }
        }
        (Phase::AfterRelease | Phase::Zombie, Outcome::Committed) => run.violation(format!(
            "{name}: a {phase:?} step with the stale token {token} (slot {slot}) committed"
        )),
        _ => {}
    }
    run.steps.borrow_mut().insert(
        key,
        Step {
            hold: h,
            token,
            phase,
            outcome,
        },
    );
    outcome
}

/// How a hold ended.
enum Flow {
    Released,
    /// The permit was refused to a step: not the client's any more.
    Lost,
    /// No answer from the broker: the permit is left to its TTL.
    Abandoned,
}

/// Steps, maybe a renew, steps, release, and maybe a step with the released guard.
async fn use_permit(run: &Run, h: usize, rng: &mut Rng, probe_released: bool) -> Flow {
    let (name, client, broker) = {
        let hold = &run.holds.borrow()[h];
        (hold.name, hold.client, hold.broker)
    };
    let go_on = |o: Outcome| match o {
        Outcome::Committed => None,
        Outcome::Refused => Some(Flow::Lost),
        Outcome::Unknown => Some(Flow::Abandoned),
    };
    if let Some(end) = go_on(step(run, h, Phase::Enter).await) {
        return end;
    }
    tokio::time::sleep(rng.ms(20, 80)).await;
    if rng.one_in(2) {
        let (token, slot, owner) = {
            let hold = &run.holds.borrow()[h];
            (hold.token, hold.slot, hold.owner.clone())
        };
        let sent = Instant::now();
        let op = json!({"op": "renew", "name": name, "token": token, "slot": slot,
                        "owner": owner, "ttlSeconds": TTL.as_secs()});
        match run.lock_op(broker, op).await {
            Answer::Verdict(r) if r["renewed"] == true => {
                let answered = Instant::now();
                let new = r["token"].as_i64().expect("renew token");
                if r["slot"].as_i64() != Some(slot) || r["guard"]["expect"].as_i64() != Some(new) {
                    run.violation(format!("{name}: renew answered {r}"));
                }
                run.grants.borrow_mut().push(Grant {
                    name,
                    slot,
                    token: new,
                    sent,
                    answered,
                });
                let mut holds = run.holds.borrow_mut();
                let hold = &mut holds[h];
                hold.token = new;
                hold.guard = r["guard"].clone();
                hold.sure_until = sent + TTL;
                run.count("renews");
            }
            Answer::Verdict(r) => {
                let sure_until = run.holds.borrow()[h].sure_until;
                if Instant::now() + MARGIN < sure_until {
                    run.violation(format!(
                        "{name}: the owner's renew of a surely live permit answered {r}"
                    ));
                }
                return Flow::Lost;
            }
            Answer::Silence => return Flow::Abandoned,
            Answer::Error(status, b) => {
                run.errors.borrow_mut().push(format!("renew: {status} {b}"));
                return Flow::Abandoned;
            }
        }
    }
    if let Some(end) = go_on(step(run, h, Phase::Work).await) {
        return end;
    }
    tokio::time::sleep(rng.ms(20, 80)).await;
    run.holding.borrow_mut().remove(&client);
    if let Some(end) = go_on(step(run, h, Phase::Leave).await) {
        return end;
    }
    let (token, slot, sure_until) = {
        let mut holds = run.holds.borrow_mut();
        let hold = &mut holds[h];
        hold.let_go = Some(Instant::now());
        (hold.token, hold.slot, hold.sure_until)
    };
    let op = json!({"op": "release", "name": name, "token": token, "slot": slot});
    match run.lock_op(broker, op).await {
        Answer::Verdict(r) if r["released"] == true => {}
        Answer::Verdict(r) => {
            if Instant::now() + MARGIN < sure_until {
                run.violation(format!(
                    "{name}: the release of a surely live permit answered {r}"
                ));
            }
            return Flow::Lost;
        }
        Answer::Silence => return Flow::Abandoned,
        Answer::Error(status, b) => {
            run.errors
                .borrow_mut()
                .push(format!("release: {status} {b}"));
            return Flow::Abandoned;
        }
    }
    if probe_released {
        step(run, h, Phase::AfterRelease).await;
        run.count("after-release steps");
    }
    Flow::Released
}

/// An abandoned permit: waits until it is gone (expired, or already granted again), then
/// sends a step with its stale guard through a live broker.
async fn zombie(run: &Run, h: usize, home: usize) {
    let at = Instant::now();
    let (name, slot, token) = {
        let mut holds = run.holds.borrow_mut();
        let hold = &mut holds[h];
        hold.abandoned = Some(at);
        (hold.name, hold.slot, hold.token)
    };
    run.count("permits abandoned");
    tokio::time::sleep(TTL + Duration::from_millis(300)).await;
    // The row must no longer carry this token: versions never come back, so from then on the
    // guard can never hold again.
    let key = format!("{name}#{slot}");
    loop {
        let broker = run.route(home);
        let get = json!({"operations": [{"op": "get", "ns": "queen-locks", "key": key}]});
        if let Answer::Verdict(b) = run.post(broker, "/api/v1/kv", &get).await {
            let row = &b["results"][0];
            if row["found"] == false || row["version"].as_i64() != Some(token) {
                break;
            }
        }
        if at.elapsed() > TTL + Duration::from_secs(15) {
            run.violation(format!(
                "{name}: the abandoned permit {key} (token {token}) is still live {:?} later",
                at.elapsed()
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    run.holds.borrow_mut()[h].broker = run.route(home);
    if step(run, h, Phase::Zombie).await == Outcome::Refused {
        run.count("zombie steps refused");
    }
}

/// One client: acquire (polling while held) → use → release, over and over, through its home
/// broker while that one lives.
async fn client(run: Rc<Run>, id: usize, name: &'static str, limit: i64, home: usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut attempt = 0;
    let mut held = 0;
    while Instant::now() < run.stop.get() {
        let broker = run.route(home);
        attempt += 1;
        let owner = format!("c{id}-a{attempt}");
        let mut op = json!({"op": "acquire", "name": name, "owner": owner,
                            "ttlSeconds": TTL.as_secs()});
        if limit > 1 {
            op["limit"] = limit.into();
        }
        let sent = Instant::now();
        let r = match run.lock_op(broker, op).await {
            Answer::Verdict(r) => r,
            Answer::Silence => {
                run.count("acquires without an answer");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Answer::Error(status, b) => {
                run.errors
                    .borrow_mut()
                    .push(format!("acquire: {status} {b}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let answered = Instant::now();
        if r["acquired"] != true {
            if r["reason"] != "held" {
                run.violation(format!("{name}: acquire answered {r}"));
            }
            run.count("acquires refused (held)");
            tokio::time::sleep(rng.ms(20, 60)).await;
            continue;
        }
        let (Some(slot), Some(token)) = (r["slot"].as_i64(), r["token"].as_i64()) else {
            run.violation(format!("{name}: acquire answered {r}"));
            continue;
        };
        if !(0..limit).contains(&slot) {
            run.violation(format!("{name}: slot {slot} granted with limit {limit}"));
        }
        let guard = json!({"op": "check", "ns": "queen-locks", "key": format!("{name}#{slot}"),
                           "expect": token, "required": true});
        if r["guard"] != guard || r["owner"] != owner.as_str() || r.get("already").is_some() {
            run.violation(format!("{name}: acquire answered {r}"));
        }
        run.grants.borrow_mut().push(Grant {
            name,
            slot,
            token,
            sent,
            answered,
        });
        let h = {
            let mut holds = run.holds.borrow_mut();
            holds.push(Hold {
                name,
                client: id,
                owner,
                broker,
                slot,
                first_token: token,
                token,
                guard: r["guard"].clone(),
                answered,
                sure_until: sent + TTL,
                let_go: None,
                abandoned: None,
            });
            holds.len() - 1
        };
        run.holding.borrow_mut().insert(id, (name, broker));
        held += 1;
        let flow = use_permit(&run, h, &mut rng, held % 5 == 1).await;
        run.holding.borrow_mut().remove(&id);
        match flow {
            Flow::Released => run.count("holds released"),
            Flow::Lost => {
                let mut holds = run.holds.borrow_mut();
                let hold = &mut holds[h];
                hold.let_go = hold.let_go.or(Some(Instant::now()));
                run.count("holds lost");
            }
            Flow::Abandoned => zombie(&run, h, home).await,
        }
        tokio::time::sleep(rng.ms(0, 20)).await;
    }
}

/// Reads the live permit rows every 20 ms: never more than the limit, never a slot at or above
/// it.
async fn sampler(run: Rc<Run>, url: String) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("sampler connection");
    while Instant::now() < run.stop.get() {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT key FROM queen.kv
              WHERE namespace = 'queen-locks'
                AND (expires_at IS NULL OR expires_at > statement_timestamp())",
        )
        .fetch_all(&mut conn)
        .await
        .expect("sampler query");
        for (name, limit) in [(MUTEX, 1), (SEM, LIMIT)] {
            let slots: Vec<i64> = rows
                .iter()
                .filter_map(|(k,)| k.strip_prefix(name)?.strip_prefix('#')?.parse().ok())
                .collect();
            let live = slots.len() as i64;
            let mut max = run.sampled_max.borrow_mut();
            let seen = max.entry(name).or_default();
            *seen = (*seen).max(live);
            if live > limit || slots.iter().any(|s| *s >= limit) {
                drop(max);
                run.violation(format!(
                    "{name}: live permit slots {slots:?} (limit {limit})"
                ));
            }
        }
        run.count("sampler reads");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kills a broker with SIGKILL while a client holds the mutex through it and one holds a
/// semaphore permit through it; in the long form it starts it again and kills the next.
async fn killer(run: Rc<Run>, brokers: Rc<Brokers>, plan: Rc<Plan>, started: Instant) {
    let mut round: u32 = 0;
    loop {
        let at = started + plan.first_kill + plan.kill_every.unwrap_or_default() * round;
        if round > 0 && at + TTL >= started + plan.run {
            return;
        }
        tokio::time::sleep_until(at.into()).await;
        let victim = (1 + round as usize) % BROKERS;
        let waiting = Instant::now();
        let both = loop {
            if run.held_through(victim, MUTEX) && run.held_through(victim, SEM) {
                break true;
            }
            if waiting.elapsed() > Duration::from_secs(15) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        run.alive.borrow_mut()[victim] = false;
        brokers.nodes[victim].borrow_mut().sigkill();
        run.kills.borrow_mut().push((victim, Instant::now(), both));
        eprintln!(
            "chaos_locks: broker {victim} killed at {:.1} s (mutex and semaphore held through it: {both})",
            started.elapsed().as_secs_f64()
        );
        let Some(_) = plan.kill_every else {
            return;
        };
        tokio::time::sleep(TTL + Duration::from_secs(1)).await;
        brokers.nodes[victim].borrow_mut().spawn();
        let base = brokers.nodes[victim].borrow().base();
        run.http.healthy(&base, Duration::from_secs(60)).await;
        run.alive.borrow_mut()[victim] = true;
        round += 1;
    }
}

/// The most of `intervals` (inclusive at both ends) that overlap at one instant.
fn most_at_once<T: Ord + Copy>(intervals: &[(T, T)]) -> usize {
    let mut events: Vec<(T, i8)> = Vec::new();
    for &(from, to) in intervals {
        events.push((from, 1));
        events.push((to, -1));
    }
    // At one instant, starts before ends: touching intervals count as overlapping (the
    // stricter reading).
    events.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in events {
        now += i64::from(d);
        most = most.max(now);
    }
    most as usize
}

#[actix_web::test]
async fn chaos_locks_fencing_tokens_rise_and_the_semaphore_bound_holds_through_a_broker_sigkill() {
    let plan = Rc::new(plan());
    let db = fresh_db().await;
    let dir = std::env::temp_dir().join(format!("queen-chaos-locks-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = (0..BROKERS)
        .map(|n| {
            let port = free_port().unwrap();
            let env: Vec<(String, String)> = [
                ("DATABASE_URL", db.url.as_str()),
                ("HOST", "127.0.0.1"),
                ("PORT", &port.to_string()),
                (
                    "FILE_BUFFER_DIR",
                    &dir.join(format!("spool{n}")).display().to_string(),
                ),
                ("QUEEN_CONFIG", ""),
                ("NUM_WORKERS", "1"),
                ("DB_POOL_SIZE", "4"),
                ("LOG_LEVEL", "warn"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            RefCell::new(Node {
                port,
                env,
                log: dir.join(format!("broker{n}.log")),
                child: None,
            })
        })
        .collect();
    let brokers = Rc::new(Brokers {
        dir: dir.clone(),
        nodes,
    });
    let http = Http(
        awc::Client::builder()
            .connector(awc::Connector::new().conn_keep_alive(Duration::from_secs(1)))
            .timeout(Duration::from_secs(10))
            .finish(),
    );
    // The database is migrated already: the three start at once.
    for node in &brokers.nodes {
        node.borrow_mut().spawn();
    }
    let bases: Vec<String> = brokers.nodes.iter().map(|n| n.borrow().base()).collect();
    for base in &bases {
        http.healthy(base, Duration::from_secs(60)).await;
    }

    let started = Instant::now();
    let run = Rc::new(Run {
        http,
        bases,
        alive: RefCell::new([true; BROKERS]),
        stop: Cell::new(started + Duration::from_secs(3600)),
        holds: RefCell::default(),
        grants: RefCell::default(),
        steps: RefCell::default(),
        next_step: Cell::new(0),
        holding: RefCell::default(),
        violations: RefCell::default(),
        errors: RefCell::default(),
        tally: RefCell::default(),
        kills: RefCell::default(),
        sampled_max: RefCell::default(),
    });
    let sampling = actix_web::rt::spawn(sampler(run.clone(), db.url.clone()));
    let killing = actix_web::rt::spawn(killer(run.clone(), brokers.clone(), plan.clone(), started));
    let mut clients = Vec::new();
    for i in 0..MUTEX_CLIENTS {
        clients.push(actix_web::rt::spawn(client(
            run.clone(),
            i,
            MUTEX,
            1,
            i % BROKERS,
        )));
    }
    for i in 0..SEM_CLIENTS {
        clients.push(actix_web::rt::spawn(client(
            run.clone(),
            100 + i,
            SEM,
            LIMIT,
            i % BROKERS,
        )));
    }
    tokio::time::sleep_until((started + plan.run).into()).await;
    killing.await.unwrap();
    // The kill's permits expire and are granted again before the clients stop.
    let last_kill = run.kills.borrow().last().map(|k| k.1).unwrap_or(started);
    tokio::time::sleep_until((last_kill + TTL + Duration::from_millis(1500)).into()).await;
    let waiting = Instant::now();
    while !run.all_regranted() && waiting.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran = started.elapsed();
    run.stop.set(Instant::now());
    for c in clients {
        c.await.unwrap();
    }
    sampling.await.unwrap();

    // What PostgreSQL kept: the step rows (version, token) and the counters.
    let mut conn = db.conn().await;
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT key, value, version FROM queen.kv WHERE namespace = $1")
            .bind(NS)
            .fetch_all(&mut conn)
            .await
            .expect("kv rows");
    let mut stored: HashMap<String, i64> = HashMap::new();
    let mut counters: HashMap<String, i64> = HashMap::new();
    for (key, value, version) in rows {
        if let Some(name) = key.strip_prefix("count:") {
            counters.insert(name.to_string(), value.parse().expect("a counter"));
        } else {
            let v: Value = serde_json::from_str(&value).unwrap();
            let recorded = run.steps.borrow().get(&key).map(|s| s.token);
            assert_eq!(
                recorded,
                v["token"].as_i64(),
                "{key}: a stored step the clients sent"
            );
            stored.insert(key, version);
        }
    }

    let holds = run.holds.borrow();
    let grants = run.grants.borrow();
    let steps = run.steps.borrow();
    let mut report = Vec::new();
    for (name, limit) in [(MUTEX, 1i64), (SEM, LIMIT)] {
        let my_holds: Vec<usize> = (0..holds.len())
            .filter(|h| holds[*h].name == name)
            .collect();
        let my_grants: Vec<&Grant> = grants.iter().filter(|g| g.name == name).collect();

        // Monotonic tokens per permit key, and never one token twice.
        let mut tokens: Vec<i64> = my_grants.iter().map(|g| g.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        if tokens.len() != my_grants.len() {
            run.violation(format!("{name}: a token was granted twice"));
        }
        let mut by_slot: BTreeMap<i64, Vec<&Grant>> = BTreeMap::new();
        for g in &my_grants {
            by_slot.entry(g.slot).or_default().push(g);
        }
        for (slot, list) in &mut by_slot {
            list.sort_by_key(|g| g.token);
            let mut lower_sent: Option<(Instant, i64)> = None;
            for g in list.iter() {
                if let Some((sent, t)) = lower_sent {
                    if g.answered <= sent {
                        run.violation(format!(
                            "{name}#{slot}: token {} was answered before token {t} was even asked for",
                            g.token
                        ));
                    }
                }
                if lower_sent.is_none_or(|(s, _)| g.sent > s) {
                    lower_sent = Some((g.sent, g.token));
                }
            }
        }

        // Fencing: each stored step lies between its token and the key's next token.
        let mut committed = 0;
        let mut refused = 0;
        let mut unknown = 0;
        let mut stored_here = 0;
        let mut last_version: HashMap<usize, i64> = HashMap::new();
        for (key, s) in steps.iter().filter(|(_, s)| holds[s.hold].name == name) {
            match s.outcome {
                Outcome::Committed => committed += 1,
                Outcome::Refused => refused += 1,
                Outcome::Unknown => unknown += 1,
            }
            let slot = holds[s.hold].slot;
            match (stored.get(key), s.outcome) {
                (None, Outcome::Committed) => {
                    run.violation(format!("{key}: answered committed, not stored"))
                }
                (Some(_), Outcome::Refused) => {
                    run.violation(format!("{key}: answered refused, yet stored"))
                }
                (Some(&v), _) => {
                    stored_here += 1;
                    let next = by_slot[&slot]
                        .iter()
                        .map(|g| g.token)
                        .find(|t| *t > s.token);
                    if v <= s.token || next.is_some_and(|n| v >= n) {
                        run.violation(format!(
                            "{key}: a {:?} step of token {} committed at version {v}, outside \
                             [token, next token {next:?}) of {name}#{slot}",
                            s.phase, s.token
                        ));
                    }
                    if matches!(s.phase, Phase::Enter | Phase::Work | Phase::Leave) {
                        let e = last_version.entry(s.hold).or_default();
                        *e = (*e).max(v);
                    }
                }
                (None, _) => {}
            }
        }
        let counted = counters.get(name).copied().unwrap_or(0);
        if counted != stored_here {
            run.violation(format!(
                "{name}: count {counted} but {stored_here} steps stored"
            ));
        }

        // The bound, client side: answer → release sent, within the sure lifetime.
        let sure: Vec<(Instant, Instant)> = my_holds
            .iter()
            .map(|h| &holds[*h])
            .filter_map(|h| {
                let mut to = h.sure_until - MARGIN;
                if let Some(r) = h.let_go {
                    to = to.min(r);
                }
                (to > h.answered).then_some((h.answered, to))
            })
            .collect();
        let client_most = most_at_once(&sure);
        // The bound, server side: grant token → last committed step, on the version axis.
        let versions: Vec<(i64, i64)> = my_holds
            .iter()
            .map(|h| {
                let hold = &holds[*h];
                let last = last_version.get(h).copied().unwrap_or(0);
                (hold.first_token, last.max(hold.token))
            })
            .collect();
        let server_most = most_at_once(&versions);
        for (side, most) in [("client", client_most), ("server", server_most)] {
            if most as i64 > limit {
                run.violation(format!(
                    "{name}: {most} holders at once ({side} side), limit {limit}"
                ));
            }
        }

        // The kill: permits abandoned, zombies refused, keys granted again higher.
        let abandoned: Vec<&Hold> = my_holds
            .iter()
            .map(|h| &holds[*h])
            .filter(|h| h.abandoned.is_some())
            .collect();
        for h in &abandoned {
            if !my_grants
                .iter()
                .any(|g| g.slot == h.slot && g.token > h.token)
            {
                run.violation(format!(
                    "{name}#{}: the abandoned token {} was never followed by a higher one",
                    h.slot, h.token
                ));
            }
        }
        let zombies = steps
            .values()
            .filter(|s| holds[s.hold].name == name && s.phase == Phase::Zombie)
            .count();
        let after_release = steps
            .values()
            .filter(|s| holds[s.hold].name == name && s.phase == Phase::AfterRelease)
            .count();
        let killed_at = run.kills.borrow().first().map(|k| k.1);
        let grants_after_kill = my_grants
            .iter()
            .filter(|g| killed_at.is_some_and(|k| g.sent > k))
            .count();
        report.push(format!(
            "{name} (limit {limit}): {} holds, {} grants ({grants_after_kill} after the kill), \
             {} slots; steps {committed} committed / {refused} refused / {unknown} unknown, \
             {stored_here} stored; {after_release} after-release and {zombies} zombie steps; \
             {} permits abandoned; most at once {client_most} (client), {server_most} \
             (versions), {} (sampler)",
            my_holds.len(),
            my_grants.len(),
            by_slot.len(),
            abandoned.len(),
            run.sampled_max.borrow().get(name).copied().unwrap_or(0),
        ));
        // The run did what it is for.
        assert!(
            !abandoned.is_empty(),
            "{name}: a permit was held through the killed broker"
        );
        assert!(
            zombies > 0,
            "{name}: an abandoned permit's stale guard was tried"
        );
        assert!(after_release > 0, "{name}: a released guard was tried");
        assert!(
            grants_after_kill >= 2,
            "{name}: the run went on after the kill"
        );
        assert!(committed >= 10, "{name}: steps committed ({committed})");
    }
    eprintln!(
        "chaos_locks{}: {BROKERS} brokers, {} clients, {:.1} s run; kills {:?}; {}; tally {:?}",
        if plan.long { " (long)" } else { "" },
        MUTEX_CLIENTS + SEM_CLIENTS,
        ran.as_secs_f64(),
        run.kills
            .borrow()
            .iter()
            .map(|(v, at, both)| format!(
                "broker {v} at {:.1} s (both held: {both})",
                (*at - started).as_secs_f64()
            ))
            .collect::<Vec<_>>(),
        report.join("; "),
        run.tally.borrow(),
    );
    let errors = run.errors.borrow();
    if !errors.is_empty() {
        eprintln!(
            "chaos_locks: {} error answers, e.g. {:?}",
            errors.len(),
            &errors[..errors.len().min(5)]
        );
    }
    assert!(
        run.kills.borrow().first().is_some_and(|k| k.2),
        "the first kill met a mutex and a semaphore permit held through its broker"
    );
    let violations = run.violations.borrow();
    assert!(
        violations.is_empty(),
        "{} violations: {:#?}",
        violations.len(),
        &violations[..violations.len().min(20)]
    );
}
