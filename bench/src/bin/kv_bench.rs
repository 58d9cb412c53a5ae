//! `kv_bench`: ops/s and p99 of the KV store's storage layer (`queen_broker::storage::kv`:
//! get, put, incr on one hot key and on many keys; lock acquire+release) next to the same
//! operation as plain SQL on a plain table, measured in the same run on the same database, so
//! the ratio says what versions, expiry predicates and key locks cost on a noisy machine.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/kvbench \
//!   cargo run --release -p queen-bench --bin kv_bench -- [SECS] [WORKERS]
//! ```
//!
//! The database is migrated (it gains the broker's schema) and a table `bench_kv_plain` is
//! created in it. Only the given database is touched.

use std::time::{Duration, Instant};

use queen_broker::storage::kv::locks::{self, LockOp};
use queen_broker::storage::kv::{run_batch, Expiry, Op};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One operation of a scenario, given the worker and the op's sequence number.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    GetHot,
    PutHot,
    IncrHot,
    PutMany,
    GetMany,
    LockMany,
}

const NS: &str = "bench";

fn key(s: Scenario, worker: usize, n: u64) -> String {
    match s {
        Scenario::GetHot | Scenario::PutHot | Scenario::IncrHot => "hot".into(),
        _ => format!("k{worker}:{}", n % 1000),
    }
}

async fn broker_op(
    conn: &mut PgConnection,
    s: Scenario,
    worker: usize,
    n: u64,
) -> Result<(), BoxError> {
    let key = key(s, worker, n);
    let ttl = Expiry::Ttl(3600);
    let op = match s {
        Scenario::GetHot | Scenario::GetMany => Op::Get { ns: NS.into(), key },
        Scenario::PutHot | Scenario::PutMany => Op::Put {
            ns: NS.into(),
            key,
            value: format!("{{\"n\":{n}}}"),
            expiry: ttl,
            expect: None,
            required: false,
        },
        Scenario::IncrHot => Op::Incr {
            ns: NS.into(),
            key,
            delta: 1.into(),
            min: None,
            max: None,
            expiry: ttl,
            required: false,
        },
        Scenario::LockMany => {
            let name = format!("lock-{worker}-{}", n % 16);
            let got = locks::apply(
                conn,
                &LockOp::Acquire {
                    name: name.clone(),
                    ttl_seconds: 30,
                    owner: format!("w{worker}"),
                    limit: 1,
                },
            )
            .await?;
            if let locks::LockOutcome::Acquired { token, slot, .. } = got {
                locks::apply(
                    conn,
                    &LockOp::Release {
                        name,
                        token,
                        slot: Some(slot),
                    },
                )
                .await?;
            }
            return Ok(());
        }
    };
    run_batch(conn, &[op]).await?;
    Ok(())
}

async fn plain_op(
    conn: &mut PgConnection,
    s: Scenario,
    worker: usize,
    n: u64,
) -> Result<(), BoxError> {
    let key = key(s, worker, n);
    match s {
        Scenario::GetHot | Scenario::GetMany => {
            sqlx::query("SELECT v FROM bench_kv_plain WHERE k = $1")
                .bind(&key)
                .fetch_optional(&mut *conn)
                .await?;
        }
        Scenario::PutHot | Scenario::PutMany => {
            sqlx::query(
                "INSERT INTO bench_kv_plain (k, v, n) VALUES ($1, $2, 0)
                 ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            )
            .bind(&key)
            .bind(format!("{{\"n\":{n}}}"))
            .execute(&mut *conn)
            .await?;
        }
        Scenario::IncrHot => {
            sqlx::query(
                "INSERT INTO bench_kv_plain (k, v, n) VALUES ($1, '', 1)
                 ON CONFLICT (k) DO UPDATE SET n = bench_kv_plain.n + 1",
            )
            .bind(&key)
            .execute(&mut *conn)
            .await?;
        }
        Scenario::LockMany => {
            let name = format!("lock-{worker}-{}", n % 16);
            sqlx::query(
                "INSERT INTO bench_kv_plain (k, v, n) VALUES ($1, '', 0) ON CONFLICT DO NOTHING",
            )
            .bind(&name)
            .execute(&mut *conn)
            .await?;
            sqlx::query("DELETE FROM bench_kv_plain WHERE k = $1")
                .bind(&name)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// Runs `workers` loops of the scenario for `secs`; (ops/s, p99 ms).
async fn measure(
    pool: &PgPool,
    s: Scenario,
    plain: bool,
    workers: usize,
    secs: f64,
) -> Result<(f64, f64), BoxError> {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut conn = pool.acquire().await?;
                let mut lat = Vec::new();
                let mut n = 0u64;
                while Instant::now() < end {
                    let t = Instant::now();
                    if plain {
                        plain_op(&mut conn, s, w, n).await?;
                    } else {
                        broker_op(&mut conn, s, w, n).await?;
                    }
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    n += 1;
                }
                Ok::<_, BoxError>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort_by(f64::total_cmp);
    let p99 = all
        .get(all.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0.0);
    Ok((all.len() as f64 / secs, p99))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let url =
        std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to a database of your own")?;
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().map_or(Ok(2.0), |a| a.parse())?;
    let workers: usize = args.next().map_or(Ok(8), |a| a.parse())?;
    let pool = PgPoolOptions::new()
        .max_connections(workers as u32)
        .connect(&url)
        .await?;
    queen_broker::storage::migrate(&pool).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS bench_kv_plain (k text PRIMARY KEY, v text NOT NULL, n bigint NOT NULL)")
        .execute(&pool)
        .await?;
    println!(
        "{workers} workers, {secs} s each; broker = storage::kv, plain = the same op as plain SQL"
    );
    println!(
        "{:<10} {:>12} {:>9} {:>12} {:>9} {:>7}",
        "op", "broker op/s", "p99 ms", "plain op/s", "p99 ms", "ratio"
    );
    for s in [
        Scenario::PutHot,
        Scenario::GetHot,
        Scenario::IncrHot,
        Scenario::PutMany,
        Scenario::GetMany,
        Scenario::LockMany,
    ] {
        let (plain, plain_p99) = measure(&pool, s, true, workers, secs).await?;
        let (ours, ours_p99) = measure(&pool, s, false, workers, secs).await?;
        println!(
            "{:<10} {:>12.0} {:>9.2} {:>12.0} {:>9.2} {:>7.2}",
            format!("{s:?}"),
            ours,
            ours_p99,
            plain,
            plain_p99,
            ours / plain.max(1.0)
        );
    }
    Ok(())
}
