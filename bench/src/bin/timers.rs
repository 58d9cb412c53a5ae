//! `timers`: how fast due timers fire and how late, against a running broker (docs/timers.md).
//!
//! Schedules `TIMERS` timers (10 000) on a fresh queue through `POST /api/v1/timers`, in two
//! phases: *spread* (due evenly over `SPREAD_MS` after a lead time, so about 10 000 are pending
//! when the first comes due) and *burst* (all due at the same instant). It waits until the
//! queue has no pending timer, then reads the fired messages back from PostgreSQL: each frame's
//! arrival time (stamped by the fire) minus the `deliverAt` its schedule answered is the
//! lateness. Prints timers fired per second and lateness p50/p99/max.
//!
//! Beside them, in the same run on the same database, the same two phases as plain SQL: rows of
//! a plain table with a due time (`bench_timers_plain`, index on the due time) moved by the bench
//! itself, every 50 ms (the broker's poll), 500 a statement, into a plain table of fired rows
//! (`DELETE … RETURNING` into `INSERT`, `SKIP LOCKED`) — what firing costs without the broker's
//! segments, dedup keys, wake-ups and exactly-once bookkeeping.
//!
//!   QUEEN_URL=http://127.0.0.1:6632 DATABASE_URL=postgres://… \
//!     cargo run --release -p queen-bench --bin timers
//!
//! `DATABASE_URL` is the broker's database (read only: segments and the timers table).

#[path = "../http.rs"]
#[allow(dead_code, reason = "the shared client has more than this tool uses")]
mod http;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

/// base64 of `{"t":1}`.
const PAYLOAD: &str = "eyJ0IjoxfQ==";

type BoxError = Box<dyn std::error::Error>;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Schedules `n` timers on `queue`, the i-th due at `due + i * spread / n`; returns message id
/// → promised deliverAt.
async fn schedule(
    conn: &mut http::HttpConn,
    queue: &str,
    n: usize,
    due: Instant,
    spread: Duration,
) -> Result<HashMap<Uuid, DateTime<Utc>>, BoxError> {
    let mut promised = HashMap::with_capacity(n);
    for start in (0..n).step_by(1000) {
        let ops: Vec<Value> = (start..(start + 1000).min(n))
            .map(|i| {
                let at = due + spread.mul_f64(i as f64 / n as f64);
                let delay = at.saturating_duration_since(Instant::now()).as_millis() as i64;
                json!({ "op": "schedule", "queue": queue, "timerKey": format!("k{i:06}"),
                        "payload": PAYLOAD, "delayMs": delay, "txn": format!("{queue}-{i}") })
            })
            .collect();
        let body = serde_json::to_vec(&json!({ "operations": ops }))?;
        let res = conn.request("POST", "/api/v1/timers", &body).await?;
        if res.status != 200 {
            return Err(format!(
                "schedule: {} {}",
                res.status,
                String::from_utf8_lossy(&res.body)
            )
            .into());
        }
        let answer: Value = serde_json::from_slice(&res.body)?;
        for r in answer["results"].as_array().ok_or("no results")? {
            let id: Uuid = r["messageId"].as_str().ok_or("messageId")?.parse()?;
            let at: DateTime<Utc> = r["deliverAt"].as_str().ok_or("deliverAt")?.parse()?;
            promised.insert(id, at);
        }
    }
    Ok(promised)
}

/// Waits until `queue` has no pending timer; returns when that was seen.
async fn drained(
    db: &mut PgConnection,
    queue: &str,
    within: Duration,
) -> Result<Instant, BoxError> {
    let deadline = Instant::now() + within;
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.timers WHERE queue = $1")
            .bind(queue)
            .fetch_one(&mut *db)
            .await?;
        if left == 0 {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(format!("{left} timers of {queue} still pending after {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Arrival time (µs) of every message stored in `queue`, by id.
async fn arrivals(db: &mut PgConnection, queue: &str) -> Result<HashMap<Uuid, i64>, BoxError> {
    let rows: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT s.frames
           FROM queen.segments s
           JOIN queen.partitions p ON p.id = s.partition_id
           JOIN queen.queues q ON q.id = p.queue_id
          WHERE q.name = $1",
    )
    .bind(queue)
    .fetch_all(&mut *db)
    .await?;
    let mut out = HashMap::new();
    for bytes in &rows {
        for f in
            queen_broker::storage::segments::frames::decode(bytes).map_err(|e| format!("{e:?}"))?
        {
            out.insert(f.id, f.created_at_micros);
        }
    }
    Ok(out)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn phase(
    name: &str,
    port: u16,
    db: &mut PgConnection,
    n: usize,
    lead: Duration,
    spread: Duration,
) -> Result<(), BoxError> {
    let queue = format!(
        "bench-timers-{name}-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let mut conn = http::HttpConn::new(port);
    let due = Instant::now() + lead;
    let started = Instant::now();
    let promised = schedule(&mut conn, &queue, n, due, spread).await?;
    let scheduling = started.elapsed();
    if Instant::now() > due {
        eprintln!(
            "{name}: scheduling took {scheduling:?}, past the lead time; lateness includes it"
        );
    }
    let done = drained(db, &queue, lead + spread + Duration::from_secs(120)).await?;
    let stored = arrivals(db, &queue).await?;
    let mut late: Vec<f64> = Vec::with_capacity(n);
    let mut missing = 0;
    for (id, at) in &promised {
        match stored.get(id) {
            Some(arrived) => late.push((arrived - at.timestamp_micros()) as f64 / 1000.0),
            None => missing += 1,
        }
    }
    late.sort_by(f64::total_cmp);
    let firing = done.saturating_duration_since(due).max(spread);
    println!(
        "{name:>6}: {n} timers (scheduled in {:.2} s, due over {} ms): fired {} ({} missing, {} stored) \
         in {:.2} s = {:.0} timers/s; lateness ms p50 {:.1} p99 {:.1} max {:.1}",
        scheduling.as_secs_f64(),
        spread.as_millis(),
        late.len(),
        missing,
        stored.len(),
        firing.as_secs_f64(),
        late.len() as f64 / firing.as_secs_f64(),
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}

/// The plain-SQL baseline of one phase: `n` rows due like the timers of [`phase`], moved from
/// `bench_timers_plain` to `bench_timers_plain_fired` by a poll every 50 ms, 500 rows a
/// statement; lateness is the fired row's `clock_timestamp()` minus its due time.
async fn plain_phase(
    name: &str,
    db: &mut PgConnection,
    n: usize,
    lead: Duration,
    spread: Duration,
) -> Result<(), BoxError> {
    sqlx::query("TRUNCATE bench_timers_plain, bench_timers_plain_fired")
        .execute(&mut *db)
        .await?;
    let due = Instant::now() + lead;
    let due_wall = Utc::now() + chrono::Duration::from_std(lead)?;
    let started = Instant::now();
    for start in (0..n).step_by(1000) {
        let end = (start + 1000).min(n);
        let offsets: Vec<i64> = (start..end)
            .map(|i| spread.mul_f64(i as f64 / n as f64).as_micros() as i64)
            .collect();
        sqlx::query(
            "INSERT INTO bench_timers_plain (id, due_at, payload)
             SELECT gen_random_uuid(), $1 + make_interval(secs => o / 1e6), $2
               FROM unnest($3::int8[]) AS o",
        )
        .bind(due_wall)
        .bind(PAYLOAD.as_bytes())
        .bind(&offsets)
        .execute(&mut *db)
        .await?;
    }
    let scheduling = started.elapsed();
    let deadline = due + spread + Duration::from_secs(120);
    loop {
        let moved = sqlx::query(
            "WITH due AS (
                 DELETE FROM bench_timers_plain
                  WHERE id IN (SELECT id FROM bench_timers_plain
                                WHERE due_at <= clock_timestamp()
                                ORDER BY due_at LIMIT 500 FOR UPDATE SKIP LOCKED)
              RETURNING id, due_at, payload)
             INSERT INTO bench_timers_plain_fired (id, due_at, payload, fired_at)
             SELECT id, due_at, payload, clock_timestamp() FROM due",
        )
        .execute(&mut *db)
        .await?
        .rows_affected();
        if moved == 500 {
            continue; // a full statement: more may be due already
        }
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_timers_plain")
            .fetch_one(&mut *db)
            .await?;
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("plain {name}: {left} rows still due after the deadline").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = Instant::now();
    let mut late: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM fired_at - due_at) * 1000)::float8 FROM bench_timers_plain_fired",
    )
    .fetch_all(&mut *db)
    .await?;
    late.sort_by(f64::total_cmp);
    let firing = done.saturating_duration_since(due).max(spread);
    println!(
        "{:>6}: {n} rows (inserted in {:.2} s, due over {} ms): fired {} in {:.2} s = {:.0} rows/s; \
         lateness ms p50 {:.1} p99 {:.1} max {:.1}",
        format!("plain {name}"),
        scheduling.as_secs_f64(),
        spread.as_millis(),
        late.len(),
        firing.as_secs_f64(),
        late.len() as f64 / firing.as_secs_f64(),
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}

async fn run() -> Result<(), BoxError> {
    let url = env_or("QUEEN_URL", "http://127.0.0.1:6632");
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or("QUEEN_URL must be http://127.0.0.1:PORT")?;
    let database =
        std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL (the broker's database)")?;
    let n: usize = env_or("TIMERS", "10000").parse()?;
    let spread = Duration::from_millis(env_or("SPREAD_MS", "2000").parse()?);
    let lead = Duration::from_millis(env_or("LEAD_MS", "8000").parse()?);
    let mut db = PgConnection::connect(&database).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_timers_plain
             (id uuid PRIMARY KEY, due_at timestamptz NOT NULL, payload bytea NOT NULL)",
    )
    .execute(&mut db)
    .await?;
    sqlx::query("CREATE INDEX IF NOT EXISTS bench_timers_plain_due ON bench_timers_plain (due_at)")
        .execute(&mut db)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_timers_plain_fired (id uuid PRIMARY KEY,
             due_at timestamptz NOT NULL, payload bytea NOT NULL, fired_at timestamptz NOT NULL)",
    )
    .execute(&mut db)
    .await?;
    phase("spread", port, &mut db, n, lead, spread).await?;
    plain_phase("spread", &mut db, n, lead, spread).await?;
    phase("burst", port, &mut db, n, lead, Duration::ZERO).await?;
    plain_phase("burst", &mut db, n, lead, Duration::ZERO).await?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("timers bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
