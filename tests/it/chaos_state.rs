//! The state primitives beside the mixed chaos run's messages (`tests/it/chaos.rs`): KV puts,
//! a mutex with fencing tokens, and timers, each worked by one client per broker (through the
//! client-side proxies, so every fault of the run meets them), with their invariants checked on
//! PostgreSQL at the end:
//!
//! - **KV**: each worker writes keys of its own (`put`, value `{"n": n}` with `n` rising per
//!   key), retrying a put until it is answered; the version of each acknowledged put is higher
//!   than the key's previous acknowledged one; a `get` after an acknowledged put (every fourth
//!   put) and the row at the end carry at least that version and that `n` (no acknowledged
//!   write lost or undone). A counter all workers `incr`: its final value lies between the
//!   increments acknowledged and the increments sent (a retried increment whose first answer
//!   was lost may count twice; an acknowledged one never counts zero times).
//! - **Locks**: acquire (fresh owner each time, TTL [`LOCK_TTL`]) → a guarded step (a KV-only
//!   transaction `[guard, put step-…, incr count]`) → release → the same step again with the
//!   released guard, which must commit nothing; a permit whose release went unanswered is left
//!   to its TTL and its stale guard tried once it expired. Checked: tokens are never handed out
//!   twice and rise in grant order (a grant answered before another was requested has the
//!   lower token); every stored step's row version lies between its token and the next token
//!   granted (a stale guard committing late would land above it); no step with a released or
//!   expired guard committed; the step counter equals the stored steps.
//! - **Timers**: schedules with delays of 0.3–2.3 s, each retried until answered
//!   (`txn` = timer key, so a retry replaces it or fires as a duplicate). Checked once no timer
//!   is pending: each acknowledged timer's message is stored exactly once, and committed (by
//!   PostgreSQL's clock: `pg_xact_commit_timestamp`, `track_commit_timestamp = on`) no earlier
//!   than its due time: the `deliverAt` answered when one attempt was sent, else the time of
//!   the first attempt plus the delay (the test and PostgreSQL share this machine's clock; the
//!   brokers' clocks are the ones the run shifts).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use chrono::{DateTime, Utc};
use queen_broker::storage::segments::frames;
use serde_json::{json, Value};

use crate::chaos::Http;
use crate::support::TestDb;

const KV_NS: &str = "chaos-kv";
const LOCK_NS: &str = "chaos-lockstep";
const MUTEX: &str = "chaos-mutex";
pub(super) const TIMER_QUEUE: &str = "chaos-timers";
const KEYS_PER_WORKER: usize = 4;
/// A permit's TTL.
const LOCK_TTL: Duration = Duration::from_secs(3);

/// One acknowledged put: its value's `n` and the version answered.
#[derive(Clone, Copy, Default)]
struct Put {
    n: i64,
    version: i64,
}

/// One grant answered.
struct Grant {
    token: i64,
    sent: Instant,
    answered: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StepKind {
    /// With a live permit.
    Held,
    /// With the guard just released, or of a permit left to expire.
    Stale,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Committed,
    Refused,
    Unknown,
}

/// One acknowledged timer.
struct Timer {
    key: String,
    /// The first attempt's time plus the delay: no fire may commit before.
    not_before: DateTime<Utc>,
    /// `deliverAt` of the answer, when there was one attempt only.
    deliver_at: Option<DateTime<Utc>>,
}

/// What the workers share and record.
pub(super) struct State {
    http: Http,
    bases: Vec<String>,
    /// The workers stop once this is set.
    pub(super) stop: Cell<bool>,
    last_put: RefCell<HashMap<String, Put>>,
    incr_sent: Cell<i64>,
    incr_acked: Cell<i64>,
    puts: Cell<usize>,
    gets: Cell<usize>,
    grants: RefCell<Vec<Grant>>,
    /// Step key → (token, kind, outcome).
    steps: RefCell<BTreeMap<String, (i64, StepKind, Outcome)>>,
    timers: RefCell<Vec<Timer>>,
    /// Calls retried (no answer, or an error answer), per primitive.
    retries: RefCell<BTreeMap<&'static str, usize>>,
    pub(super) violations: RefCell<Vec<String>>,
}

/// What the check found, for the run's summary.
pub(super) struct Report {
    pub(super) lines: Vec<String>,
    pub(super) violations: Vec<String>,
}

impl State {
    pub(super) fn new(http: Http, bases: Vec<String>) -> State {
        State {
            http,
            bases,
            stop: Cell::new(false),
            last_put: RefCell::default(),
            incr_sent: Cell::new(0),
            incr_acked: Cell::new(0),
            puts: Cell::new(0),
            gets: Cell::new(0),
            grants: RefCell::default(),
            steps: RefCell::default(),
            timers: RefCell::default(),
            retries: RefCell::default(),
            violations: RefCell::default(),
        }
    }

    fn violation(&self, what: String) {
        eprintln!("chaos state VIOLATION: {what}");
        self.violations.borrow_mut().push(what);
    }

    fn retried(&self, what: &'static str) {
        *self.retries.borrow_mut().entry(what).or_default() += 1;
    }

    /// POSTs `body` to broker `home`, then the next ones, until one answers 200; `None` once
    /// the workers are told to stop.
    async fn call(
        &self,
        what: &'static str,
        home: usize,
        path: &str,
        body: &Value,
    ) -> Option<Value> {
        for attempt in 0.. {
            let base = &self.bases[(home + attempt) % self.bases.len()];
            if let Some((200, answer)) = self.http.post(base, path, body).await {
                return Some(answer);
            }
            self.retried(what);
            if self.stop.get() && attempt > 200 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!()
    }

    /// One POST to broker `home`: its answer when 200, else `None` (no answer or an error).
    async fn once(&self, home: usize, path: &str, body: &Value) -> Option<Value> {
        match self.http.post(&self.bases[home], path, body).await {
            Some((200, answer)) => Some(answer),
            _ => None,
        }
    }
}

/// Puts to the worker's own keys, reads them back, increments the shared counter.
pub(super) async fn kv_worker(st: Rc<State>, w: usize) {
    let mut n = 0i64;
    while !st.stop.get() {
        n += 1;
        let key = format!("w{w}-k{}", n as usize % KEYS_PER_WORKER);
        let put = json!({"operations": [{"op": "put", "ns": KV_NS, "key": key,
                                         "value": {"n": n}, "forever": true}]});
        let Some(answer) = st.call("kv", w, "/api/v1/kv", &put).await else {
            return;
        };
        let r = &answer["results"][0];
        let Some(version) = r["version"].as_i64().filter(|_| r["applied"] == true) else {
            st.violation(format!("put {key} answered {answer}"));
            continue;
        };
        st.puts.set(st.puts.get() + 1);
        let last = st.last_put.borrow().get(&key).copied().unwrap_or_default();
        if version <= last.version {
            st.violation(format!(
                "{key}: put answered version {version}, not above the previous acknowledged {}",
                last.version
            ));
        }
        st.last_put
            .borrow_mut()
            .insert(key.clone(), Put { n, version });
        if n % 4 == 0 {
            let get = json!({"operations": [{"op": "get", "ns": KV_NS, "key": key}]});
            if let Some(answer) = st.call("kv", w + 1, "/api/v1/kv", &get).await {
                let r = &answer["results"][0];
                let (got_n, got_v) = (r["value"]["n"].as_i64(), r["version"].as_i64());
                if r["found"] != true
                    || got_v.is_none_or(|v| v < version)
                    || got_n.is_none_or(|g| g < n)
                {
                    st.violation(format!(
                        "{key}: read {r} after the put of n {n} answered version {version}"
                    ));
                }
                st.gets.set(st.gets.get() + 1);
            }
        }
        let incr = json!({"operations": [{"op": "incr", "ns": KV_NS, "key": "counter",
                                          "delta": 1, "forever": true}]});
        // Sent once per attempt: a retry after a lost answer may count twice.
        for attempt in 0.. {
            st.incr_sent.set(st.incr_sent.get() + 1);
            if let Some(answer) = st
                .once((w + attempt) % st.bases.len(), "/api/v1/kv", &incr)
                .await
            {
                if answer["results"][0]["value"].is_i64() {
                    st.incr_acked.set(st.incr_acked.get() + 1);
                } else {
                    st.violation(format!("incr answered {answer}"));
                }
                break;
            }
            st.retried("kv");
            if st.stop.get() && attempt > 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One guarded step with `guard` through broker `home`, recorded.
async fn step(
    st: &State,
    home: usize,
    guard: &Value,
    token: i64,
    kind: StepKind,
    n: &mut usize,
) -> Outcome {
    *n += 1;
    let key = format!("step-{home}-{n:07}");
    let body = json!({
        "operations": [],
        "kv": [
            guard,
            {"op": "put", "ns": LOCK_NS, "key": key, "value": {"token": token}, "forever": true},
            {"op": "incr", "ns": LOCK_NS, "key": "count", "delta": 1, "forever": true},
        ],
    });
    let outcome = match st.once(home, "/api/v1/transaction", &body).await {
        Some(b) if b["success"] == true => Outcome::Committed,
        Some(b) if b["reason"] == "kv_precondition" && b["failedIndex"] == 0 => Outcome::Refused,
        _ => Outcome::Unknown,
    };
    if kind == StepKind::Stale && outcome == Outcome::Committed {
        st.violation(format!(
            "{key}: a step with the stale guard of token {token} committed"
        ));
    }
    st.steps.borrow_mut().insert(key, (token, kind, outcome));
    outcome
}

/// Acquire → guarded step → release → the step again with the released guard.
pub(super) async fn lock_worker(st: Rc<State>, w: usize) {
    let mut attempt = 0usize;
    let mut n = 0usize;
    while !st.stop.get() {
        attempt += 1;
        let owner = format!("l{w}-{attempt}");
        let acquire = json!({"operations": [{"op": "acquire", "name": MUTEX, "owner": owner,
                                             "ttlSeconds": LOCK_TTL.as_secs()}]});
        let sent = Instant::now();
        let Some(answer) = st.once(w, "/api/v1/locks", &acquire).await else {
            // Perhaps granted: left to its TTL.
            st.retried("locks");
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let answered = Instant::now();
        let r = &answer["results"][0];
        if r["acquired"] != true {
            if r["reason"] != "held" {
                st.violation(format!("acquire answered {r}"));
            }
            tokio::time::sleep(Duration::from_millis(20 + (attempt as u64 * 7) % 40)).await;
            continue;
        }
        let (Some(token), Some(slot)) = (r["token"].as_i64(), r["slot"].as_i64()) else {
            st.violation(format!("acquire answered {r}"));
            continue;
        };
        let guard = r["guard"].clone();
        st.grants.borrow_mut().push(Grant {
            token,
            sent,
            answered,
        });
        step(&st, w, &guard, token, StepKind::Held, &mut n).await;
        let release = json!({"operations": [{"op": "release", "name": MUTEX, "token": token,
                                             "slot": slot}]});
        match st.once(w, "/api/v1/locks", &release).await {
            Some(a) if a["results"][0]["released"] == true => {}
            Some(_) => {} // lost already (expired during a fault): nothing to release
            None => {
                // Unanswered: left to its TTL; its guard must be dead once it expired.
                st.retried("locks");
                tokio::time::sleep(LOCK_TTL + Duration::from_millis(500)).await;
            }
        }
        step(&st, w, &guard, token, StepKind::Stale, &mut n).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Schedules timers, each retried until answered.
pub(super) async fn timer_worker(st: Rc<State>, w: usize) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut n = 0u64;
    while !st.stop.get() {
        n += 1;
        let key = format!("t{w}-{n:07}");
        let delay = 300 + (n * 7919 + w as u64 * 104_729) % 2_000;
        let payload = b64.encode(json!({ "k": key }).to_string());
        let body = json!({"operations": [{"op": "schedule", "queue": TIMER_QUEUE,
                                          "timerKey": key, "txn": key, "payload": payload,
                                          "delayMs": delay}]});
        let not_before: DateTime<Utc> = (SystemTime::now() + Duration::from_millis(delay)).into();
        let mut attempts = 0;
        let answer = loop {
            attempts += 1;
            if let Some(a) = st
                .once((w + attempts) % st.bases.len(), "/api/v1/timers", &body)
                .await
            {
                break Some(a);
            }
            st.retried("timers");
            if st.stop.get() && attempts > 200 {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let Some(answer) = answer else { return };
        let r = &answer["results"][0];
        if r["ok"] != true {
            st.violation(format!("schedule {key} answered {answer}"));
            continue;
        }
        let deliver_at = r["deliverAt"]
            .as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc));
        st.timers.borrow_mut().push(Timer {
            key,
            not_before,
            deliver_at: deliver_at.filter(|_| attempts == 1),
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Checks the invariants on PostgreSQL at `db` (the primary), once the workers stopped.
pub(super) async fn check(st: &State, db: &TestDb) -> Report {
    let mut conn = db.conn().await;
    let mut lines = Vec::new();

    // KV: every acknowledged put readable (or superseded by a later version of the same n or
    // a higher n); the counter between acknowledged and sent increments.
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT key, value, version FROM queen.kv WHERE namespace = $1")
            .bind(KV_NS)
            .fetch_all(&mut conn)
            .await
            .expect("kv rows");
    let stored: HashMap<String, (Value, i64)> = rows
        .into_iter()
        .map(|(k, v, ver)| (k, (serde_json::from_str(&v).unwrap_or(Value::Null), ver)))
        .collect();
    let mut kv_lost = 0;
    for (key, put) in st.last_put.borrow().iter() {
        let ok = stored.get(key).is_some_and(|(v, ver)| {
            *ver >= put.version && v["n"].as_i64().is_some_and(|n| n >= put.n)
        });
        if !ok {
            kv_lost += 1;
            st.violation(format!(
                "{key}: the acknowledged put of n {} (version {}) is not stored: {:?}",
                put.n,
                put.version,
                stored.get(key)
            ));
        }
    }
    let counter = stored
        .get("counter")
        .and_then(|(v, _)| v.as_i64())
        .unwrap_or(0);
    let (acked, sent) = (st.incr_acked.get(), st.incr_sent.get());
    if counter < acked || counter > sent {
        st.violation(format!(
            "counter {counter}: not between {acked} increments acknowledged and {sent} sent"
        ));
    }
    lines.push(format!(
        "KV: {} puts acknowledged on {} keys, {} read back; acknowledged puts lost {kv_lost}; \
         counter {counter} (increments acknowledged {acked}, sent {sent})",
        st.puts.get(),
        st.last_put.borrow().len(),
        st.gets.get(),
    ));

    // Locks: tokens unique and rising in grant order; fencing on the version axis.
    let mut grants = std::mem::take(&mut *st.grants.borrow_mut());
    grants.sort_by_key(|g| g.token);
    let mut sent_max: Option<Instant> = None;
    for pair in grants.windows(2) {
        if pair[0].token == pair[1].token {
            st.violation(format!("token {} granted twice", pair[0].token));
        }
    }
    for g in grants.iter() {
        if let Some(sent) = sent_max {
            if g.answered < sent {
                st.violation(format!(
                    "token {} was answered before a grant of a lower token was requested",
                    g.token
                ));
            }
        }
        sent_max = Some(sent_max.map_or(g.sent, |s| s.max(g.sent)));
    }
    let tokens: Vec<i64> = grants.iter().map(|g| g.token).collect();
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT key, value, version FROM queen.kv WHERE namespace = $1")
            .bind(LOCK_NS)
            .fetch_all(&mut conn)
            .await
            .expect("lock step rows");
    let steps = st.steps.borrow().clone();
    let (mut stored_steps, mut count) = (0i64, 0i64);
    let mut fenced_late = 0;
    for (key, value, version) in &rows {
        let value: Value = serde_json::from_str(value).unwrap_or(Value::Null);
        if key == "count" {
            count = value.as_i64().unwrap_or(-1);
            continue;
        }
        stored_steps += 1;
        let token = value["token"].as_i64().unwrap_or(-1);
        match steps.get(key) {
            Some((t, StepKind::Stale, _)) => st.violation(format!(
                "{key}: the step with the stale guard of token {t} is stored"
            )),
            Some((_, _, Outcome::Refused)) => {
                st.violation(format!("{key}: a refused step is stored"))
            }
            None => st.violation(format!("{key}: a step nobody sent is stored")),
            _ => {}
        }
        let next = tokens.iter().find(|t| **t > token);
        if *version <= token || next.is_some_and(|next| version > next) {
            fenced_late += 1;
            st.violation(format!(
                "{key}: step of token {token} stored at version {version}, outside \
                 ({token}, next grant {next:?})"
            ));
        }
    }
    for (key, (_, kind, outcome)) in steps.iter() {
        if *kind == StepKind::Held
            && *outcome == Outcome::Committed
            && !rows.iter().any(|(k, _, _)| k == key)
        {
            st.violation(format!("{key}: a step answered committed is not stored"));
        }
    }
    if count != stored_steps {
        st.violation(format!(
            "lock step count {count}, but {stored_steps} steps stored"
        ));
    }
    let by = |kind: StepKind, outcome: Outcome| {
        steps
            .values()
            .filter(|(_, k, o)| *k == kind && *o == outcome)
            .count()
    };
    lines.push(format!(
        "locks: {} grants (tokens unique, rising in grant order), {} steps stored, \
         {} outside their token's range; held steps committed {} / refused {} / unanswered {}; \
         stale-guard steps refused {} / committed {} / unanswered {}",
        grants.len(),
        stored_steps,
        fenced_late,
        by(StepKind::Held, Outcome::Committed),
        by(StepKind::Held, Outcome::Refused),
        by(StepKind::Held, Outcome::Unknown),
        by(StepKind::Stale, Outcome::Refused),
        by(StepKind::Stale, Outcome::Committed),
        by(StepKind::Stale, Outcome::Unknown),
    ));

    // Timers: none pending, each acknowledged one stored once, not before its time.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.timers WHERE queue = $1")
            .bind(TIMER_QUEUE)
            .fetch_one(&mut conn)
            .await
            .expect("pending timers");
        if pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            st.violation(format!(
                "{pending} timers still pending 120 s after the run"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let segments: Vec<(Vec<u8>, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT s.frames, pg_xact_commit_timestamp(s.xmin)
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1",
    )
    .bind(TIMER_QUEUE)
    .fetch_all(&mut conn)
    .await
    .expect("timer segments");
    let mut fired: HashMap<String, Vec<Option<DateTime<Utc>>>> = HashMap::new();
    for (bytes, committed) in &segments {
        for f in frames::decode(bytes).expect("frames decode") {
            fired
                .entry(f.transaction_id.to_string())
                .or_default()
                .push(*committed);
        }
    }
    let (mut lost, mut twice, mut early) = (0, 0, 0);
    let mut latest_late = 0f64;
    for t in st.timers.borrow().iter() {
        match fired.get(&t.key).map(Vec::as_slice) {
            None | Some([]) => {
                lost += 1;
                st.violation(format!("timer {}: acknowledged, never fired", t.key));
            }
            Some([at]) => {
                let Some(at) = at else {
                    st.violation(format!("timer {}: no commit time", t.key));
                    continue;
                };
                let due = t.deliver_at.unwrap_or(t.not_before).max(t.not_before);
                if *at < due {
                    early += 1;
                    st.violation(format!(
                        "timer {}: fired at {at}, before its time {due}",
                        t.key
                    ));
                }
                latest_late = latest_late.max((*at - due).num_milliseconds() as f64 / 1000.0);
            }
            Some(more) => {
                twice += 1;
                st.violation(format!("timer {}: fired {} times", t.key, more.len()));
            }
        }
    }
    lines.push(format!(
        "timers: {} acknowledged, lost {lost}, fired twice {twice}, fired early {early}; \
         latest fire {latest_late:.1} s after its time",
        st.timers.borrow().len()
    ));
    lines.push(format!("state calls retried: {:?}", st.retries.borrow()));
    Report {
        lines,
        violations: st.violations.borrow().clone(),
    }
}
