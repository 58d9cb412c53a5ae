//! Clock jumps on the broker (part of the chaos suite): PostgreSQL's clock is the authority.
//!
//! Two real broker processes share one database under Debian's libfaketime: one whose wall
//! clock is an hour behind PostgreSQL's, one whose clock starts an hour ahead and jumps to an
//! hour behind mid-run (libfaketime reads its offset from a file; the monotonic clock is left
//! alone, as an NTP step leaves it). What must hold whatever the brokers' clocks say:
//!
//! - **delays**: a message of a queue with delayed processing is held for its delay, counted
//!   from its commit — not handed out at once by the broker behind, not held for an hour by
//!   the broker ahead;
//! - **leases**: a lease held by a consumer is not taken over by the broker that thinks it
//!   expired an hour ago, and is taken over once it really expired;
//! - **KV expiry**: a key lives for its TTL, neither shorter nor longer;
//! - **timers**: a timer fires after its delay, not at once and not an hour late;
//! - **retention**: a message is removed once its queue's retention passed by PostgreSQL's
//!   clock — not at once by a sweep on the broker an hour ahead, nor kept by the one behind.
//!
//! Runs when libfaketime is installed (`apt-get install faketime`); without it the test says so
//! and passes, unless `QUEEN_REQUIRE_FAKETIME=1` (set by `.ci/run`), which makes a missing
//! library a failure. `QUEEN_FAKETIME_LIB` names the library when it is elsewhere.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use queen_broker::pg::free_port;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::chaos::{Http, Node};
use crate::support::fresh_db;

/// The delay of the delayed queue and the lease of the leased one, in seconds.
const DELAY_SECS: u64 = 3;
const LEASE_SECS: u64 = 2;
/// A key's TTL and a timer's delay.
const TTL_SECS: u64 = 2;
const TIMER_MS: u64 = 2_000;
/// The retention of the retained queue, in seconds, and how often each broker sweeps.
const RETAIN_SECS: u64 = 4;
const SWEEP_MS: u64 = 300;

pub(super) fn faketime_lib() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("QUEEN_FAKETIME_LIB") {
        return Some(PathBuf::from(path));
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// One broker whose wall clock libfaketime offsets by what `offset_file` says (re-read at most
/// every second).
fn skewed_node(db_url: &str, dir: &Path, n: usize, lib: &Path, offset_file: &Path) -> Node {
    let port = free_port().unwrap();
    let env = [
        ("DATABASE_URL", db_url.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", port.to_string()),
        (
            "FILE_BUFFER_DIR",
            dir.join(format!("spool{n}")).display().to_string(),
        ),
        ("QUEEN_CONFIG", String::new()),
        ("NUM_WORKERS", "1".into()),
        ("DB_POOL_SIZE", "4".into()),
        ("LOG_LEVEL", "warn".into()),
        ("RETENTION_INTERVAL", SWEEP_MS.to_string()),
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        ("FAKETIME_CACHE_DURATION", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Node {
        port,
        env,
        log: dir.join(format!("broker{n}.log")),
        child: None,
    }
}

/// The brokers and their directory, removed however the test ends.
struct Brokers {
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl Drop for Brokers {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.sigkill();
        }
        if std::thread::panicking() {
            for node in &self.nodes {
                let log = std::fs::read_to_string(&node.log).unwrap_or_default();
                eprintln!("--- broker {} log:\n{log}", node.port);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn ok(http: &Http, base: &str, path: &str, body: &Value) -> Value {
    match http.post(base, path, body).await {
        Some((status, answer)) if (200..300).contains(&status) => answer,
        other => panic!("POST {base}{path} {body}: {other:?}"),
    }
}

/// One pop without waiting: the messages' payloads (an empty list on 204).
async fn pop_now(http: &Http, base: &str, queue: &str) -> Vec<Value> {
    match http
        .get(
            base,
            &format!("/api/v1/pop/queue/{queue}?batch=10&wait=false"),
        )
        .await
    {
        Some((200, body)) => body["messages"].as_array().cloned().unwrap_or_default(),
        Some((204, _)) => Vec::new(),
        other => panic!("pop {queue} at {base}: {other:?}"),
    }
}

/// Pops at `base` until something comes or `within` passes; how long it took.
async fn pop_within(
    http: &Http,
    base: &str,
    queue: &str,
    within: Duration,
) -> (Vec<Value>, Duration) {
    let start = Instant::now();
    loop {
        let got = pop_now(http, base, queue).await;
        if !got.is_empty() || start.elapsed() > within {
            return (got, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn payloads(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["data"]["n"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Pushes `{"n": n}` to partition `n` of `queue` (a partition each: the pops leave their leases
/// unacked).
async fn push(http: &Http, base: &str, queue: &str, n: &str) {
    ok(
        http,
        base,
        "/api/v1/push",
        &json!({"items": [{"queue": queue, "partition": n, "payload": {"n": n}}]}),
    )
    .await;
}

async fn kv_get(http: &Http, base: &str, key: &str) -> Value {
    let answer = ok(
        http,
        base,
        "/api/v1/kv",
        &json!({"operations": [{"op": "get", "ns": "clock", "key": key}]}),
    )
    .await;
    answer["results"][0].clone()
}

#[actix_web::test]
async fn chaos_clock_postgresql_decides_delays_leases_expiry_and_timers_whatever_the_brokers_clocks_say(
) {
    let Some(lib) = faketime_lib() else {
        assert!(
            !std::env::var("QUEEN_REQUIRE_FAKETIME").is_ok_and(|v| v == "1"),
            "QUEEN_REQUIRE_FAKETIME=1 but libfaketime is not installed (apt-get install faketime)"
        );
        eprintln!("chaos_clock: libfaketime not installed (apt-get install faketime); skipped");
        return;
    };
    let db = fresh_db().await;
    let dir = std::env::temp_dir().join(format!("queen-chaos-clock-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let behind_file = dir.join("behind.faketime");
    let ahead_file = dir.join("ahead.faketime");
    std::fs::write(&behind_file, "-3600\n").unwrap();
    std::fs::write(&ahead_file, "+3600\n").unwrap();
    let mut brokers = Brokers {
        nodes: vec![
            skewed_node(&db.url, &dir, 0, &lib, &behind_file),
            skewed_node(&db.url, &dir, 1, &lib, &ahead_file),
        ],
        dir: dir.clone(),
    };
    for node in &mut brokers.nodes {
        node.spawn();
    }
    let (behind, ahead) = (brokers.nodes[0].base(), brokers.nodes[1].base());
    let http = Http(
        awc::Client::builder()
            .timeout(Duration::from_secs(20))
            .finish(),
    );
    for base in [&behind, &ahead] {
        http.healthy(base, Duration::from_secs(60)).await;
    }
    // The fake clocks are in force: each broker's overview carries its wall clock.
    for (base, offset) in [(&behind, -3600), (&ahead, 3600)] {
        let (_, overview) = http.get(base, "/api/v1/status").await.expect("status");
        let said = overview["timestamp"].as_str().expect("timestamp");
        let at = chrono::DateTime::parse_from_rfc3339(said).expect("an RFC 3339 time");
        let skew = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
        assert!(
            (skew - offset).abs() < 60,
            "{base} is {skew} s off, meant {offset} s"
        );
    }

    for (queue, options) in [
        (
            "delayed",
            json!({"delayedProcessing": DELAY_SECS, "leaseTime": 30}),
        ),
        ("leased", json!({"leaseTime": LEASE_SECS})),
    ] {
        ok(
            &http,
            &behind,
            "/api/v1/configure",
            &json!({"queue": queue, "options": options}),
        )
        .await;
    }

    // Delays. Stamped by the broker an hour behind, the message would look an hour old.
    push(&http, &behind, "delayed", "from-behind").await;
    assert!(
        pop_now(&http, &behind, "delayed").await.is_empty(),
        "the broker behind handed out a message inside its delay"
    );
    assert!(
        pop_now(&http, &ahead, "delayed").await.is_empty(),
        "the broker ahead handed out a message inside its delay"
    );
    let (got, waited) = pop_within(&http, &ahead, "delayed", Duration::from_secs(20)).await;
    assert_eq!(payloads(&got), ["from-behind"], "delivered after its delay");
    eprintln!("delay {DELAY_SECS} s pushed behind, popped ahead after {waited:?}");
    assert!(
        waited >= Duration::from_millis(DELAY_SECS * 1000 - 1000),
        "{waited:?}"
    );
    // Stamped by the broker an hour ahead, it would be held for an hour.
    push(&http, &ahead, "delayed", "from-ahead").await;
    assert!(pop_now(&http, &behind, "delayed").await.is_empty());
    let (got, waited) = pop_within(&http, &behind, "delayed", Duration::from_secs(20)).await;
    assert_eq!(
        payloads(&got),
        ["from-ahead"],
        "delivered after its delay, not an hour later"
    );
    eprintln!("delay {DELAY_SECS} s pushed ahead, popped behind after {waited:?}");

    // Leases: taken at the broker ahead (its clock says the lease ends in an hour and two
    // seconds), looked at by the broker behind (its clock says it ended an hour ago).
    push(&http, &ahead, "leased", "leased-1").await;
    let first = pop_now(&http, &ahead, "leased").await;
    assert_eq!(payloads(&first), ["leased-1"]);
    let leased_at = Instant::now();
    assert!(
        pop_now(&http, &behind, "leased").await.is_empty(),
        "a live lease was taken over by the broker whose clock is behind"
    );
    let (again, waited) = pop_within(&http, &behind, "leased", Duration::from_secs(20)).await;
    assert_eq!(
        payloads(&again),
        ["leased-1"],
        "redelivered once the lease expired"
    );
    let held = leased_at.elapsed();
    eprintln!("lease {LEASE_SECS} s redelivered after {held:?} (polled {waited:?})");
    assert!(
        held >= Duration::from_millis(LEASE_SECS * 1000 - 500),
        "{held:?}"
    );

    // The broker ahead jumps an hour back (two hours) while the KV key and the timer are live.
    ok(
        &http,
        &ahead,
        "/api/v1/kv",
        &json!({"operations": [
            {"op": "put", "ns": "clock", "key": "short", "value": 1, "ttlSeconds": TTL_SECS}
        ]}),
    )
    .await;
    let put_at = Instant::now();
    ok(
        &http,
        &behind,
        "/api/v1/timers",
        &json!({"operations": [{"op": "schedule", "queue": "reminders", "timerKey": "t1",
            "payload": "eyJuIjoidGltZXIifQ==", "delayMs": TIMER_MS, "txn": "timer-1"}]}),
    )
    .await;
    let scheduled_at = Instant::now();
    std::fs::write(&ahead_file, "-3600\n").unwrap();
    assert_eq!(kv_get(&http, &behind, "short").await["found"], true);
    assert_eq!(
        kv_get(&http, &ahead, "short").await["found"],
        true,
        "a live key read as expired"
    );
    assert!(
        pop_now(&http, &ahead, "reminders").await.is_empty(),
        "a timer fired before its delay"
    );
    // The key is gone for both once its TTL passed by PostgreSQL's clock.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (a, b) = (
            kv_get(&http, &ahead, "short").await,
            kv_get(&http, &behind, "short").await,
        );
        if a["found"] == false && b["found"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the key outlived its TTL: {a} {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lived = put_at.elapsed();
    eprintln!("key of {TTL_SECS} s TTL gone after {lived:?}");
    assert!(
        lived >= Duration::from_millis(TTL_SECS * 1000 - 500),
        "{lived:?}"
    );
    let (fired, _) = pop_within(&http, &ahead, "reminders", Duration::from_secs(20)).await;
    let late = scheduled_at.elapsed();
    assert_eq!(fired.len(), 1, "the timer fired once: {fired:?}");
    assert_eq!(fired[0]["transactionId"], "timer-1");
    eprintln!("timer of {TIMER_MS} ms fired and popped after {late:?}");
    assert!(late >= Duration::from_millis(TIMER_MS - 500), "{late:?}");

    // Retention, both brokers sweeping every SWEEP_MS: one an hour behind, one an hour ahead
    // again (a message would look an hour old to it at once).
    std::fs::write(&ahead_file, "+3600\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // libfaketime re-reads each second
    ok(
        &http,
        &behind,
        "/api/v1/configure",
        &json!({"queue": "retained",
                "options": {"retentionEnabled": true, "retentionSeconds": RETAIN_SECS}}),
    )
    .await;
    push(&http, &behind, "retained", "p").await;
    let pushed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(RETAIN_SECS * 1000 / 2)).await;
    assert_eq!(
        db.stored("retained", "p").await.len(),
        1,
        "removed inside its retention by a sweep that read a broker's clock"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !db.stored("retained", "p").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "kept past its retention of {RETAIN_SECS} s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = pushed_at.elapsed();
    eprintln!("retention {RETAIN_SECS} s: removed after {kept:?}");
    assert!(
        kept >= Duration::from_millis(RETAIN_SECS * 1000 - 500),
        "{kept:?}"
    );
}
