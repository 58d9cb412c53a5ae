//! `--profile`: where the time goes, read while a measurement runs (it costs a little, so the
//! reference figures come from runs without it).
//!
//! - PostgreSQL statements (pg_stat_statements, reset at the window's start): calls, mean and
//!   total execution time, per statement of the scenario's database; `COMMIT` includes the WAL
//!   flush wait.
//! - PostgreSQL backends (pg_stat_activity sampled every 10 ms): the share of backend-time that
//!   is running, waiting for the WAL flush or a lock, or idle waiting for its client (inside a
//!   transaction: a round trip to the client; outside: no work sent).
//! - The broker's commits (its committer's trace log): transactions per second, segments and
//!   items per transaction, commit latency as the committer saw it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::{Connection, PgConnection};
use tokio::task::JoinHandle;

use crate::measure::median;
use crate::BoxError;

/// One statement's totals.
#[derive(Clone, Debug, Serialize)]
pub struct Statement {
    /// The normalized query text (shortened).
    pub query: String,
    /// Executions.
    pub calls: i64,
    /// Total execution time, ms.
    pub total_ms: f64,
    /// Mean execution time, ms.
    pub mean_ms: f64,
    /// Shared buffers touched per call (hit + read): a scan that grows with the table shows.
    pub blocks_per_call: f64,
    /// Rows returned or affected per call.
    pub rows_per_call: f64,
    /// Times it was planned (= calls: planned afresh at every call, no cached plan; 0 when
    /// the server does not track planning).
    pub plans: i64,
    /// Mean planning time per plan, ms.
    pub mean_plan_ms: f64,
}

/// The broker's commit transactions, from its trace log (warm-up included).
#[derive(Clone, Debug, Serialize)]
pub struct Commits {
    /// Transactions logged.
    pub count: usize,
    /// Mean segments per transaction.
    pub segments_per_commit: f64,
    /// Mean items per transaction.
    pub items_per_commit: f64,
    /// Median commit latency (committer's view: all round trips), ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Failed transactions.
    pub failed: usize,
}

/// What a profiled measurement found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Profile {
    /// Top statements by total time.
    pub statements: Vec<Statement>,
    /// Share of sampled backend-time per state, largest first.
    pub backend_states: Vec<(String, f64)>,
    /// Mean number of backends of the scenario's database.
    pub backends: f64,
    /// The broker's commits.
    pub commits: Option<Commits>,
}

/// Sampled backend states (state → count) and the number of samples taken.
type BackendSamples = (BTreeMap<String, u64>, u64);

/// Samples pg_stat_activity for one database until `end`.
pub fn sample_backends(
    admin_url: String,
    database: String,
    end: Instant,
) -> JoinHandle<Result<BackendSamples, String>> {
    tokio::spawn(async move {
        let mut conn = PgConnection::connect(&admin_url)
            .await
            .map_err(|e| e.to_string())?;
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut samples = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while Instant::now() < end {
            tick.tick().await;
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT CASE
                          WHEN state = 'idle' THEN 'idle: no work from the client'
                          WHEN state LIKE 'idle in transaction%' THEN 'idle in transaction: waiting for the client'
                          WHEN wait_event IS NULL THEN 'active: running (CPU or run queue)'
                          ELSE 'active: waiting ' || wait_event_type || ':' || wait_event
                        END
                   FROM pg_stat_activity
                  WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(&database)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
            samples += 1;
            for (state,) in rows {
                *counts.entry(state).or_default() += 1;
            }
        }
        let _ = conn.close().await;
        Ok((counts, samples))
    })
}

/// Turns sampled counts into shares, largest first, and the mean number of backends.
pub fn shares(counts: BTreeMap<String, u64>, samples: u64) -> (Vec<(String, f64)>, f64) {
    let total: u64 = counts.values().sum();
    let mut v: Vec<(String, f64)> = counts
        .into_iter()
        .map(|(k, n)| (k, n as f64 / total.max(1) as f64))
        .collect();
    v.sort_by(|a, b| b.1.partial_cmp(&a.1).expect("finite"));
    (v, total as f64 / samples.max(1) as f64)
}

/// Resets pg_stat_statements (all databases).
///
/// # Errors
///
/// Any database error.
pub async fn reset_statements(admin: &mut PgConnection) -> Result<(), BoxError> {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(admin)
        .await?;
    Ok(())
}

/// The top statements of `database` by total execution time.
///
/// # Errors
///
/// Any database error.
pub async fn top_statements(
    admin: &mut PgConnection,
    database: &str,
) -> Result<Vec<Statement>, BoxError> {
    type Row = (String, i64, f64, f64, f64, f64, i64, f64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT left(regexp_replace(s.query, '\\s+', ' ', 'g'), 110), s.calls,
                s.total_exec_time, s.mean_exec_time,
                (s.shared_blks_hit + s.shared_blks_read)::float8 / greatest(s.calls, 1),
                s.rows::float8 / greatest(s.calls, 1), s.plans, s.mean_plan_time
           FROM pg_stat_statements s
           JOIN pg_database d ON d.oid = s.dbid
          WHERE d.datname = $1
          ORDER BY s.total_exec_time DESC
          LIMIT 12",
    )
    .bind(database)
    .fetch_all(admin)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                query,
                calls,
                total_ms,
                mean_ms,
                blocks_per_call,
                rows_per_call,
                plans,
                mean_plan_ms,
            )| {
                Statement {
                    query,
                    calls,
                    total_ms,
                    mean_ms,
                    blocks_per_call,
                    rows_per_call,
                    plans,
                    mean_plan_ms,
                }
            },
        )
        .collect())
}

/// A profile being collected over a window (statements reset, backends sampled until `end`).
pub struct Collecting {
    database: String,
    sampler: JoinHandle<Result<BackendSamples, String>>,
}

/// Starts collecting a profile of `database` until `end`.
///
/// # Errors
///
/// Any database error.
pub async fn begin(
    server: &mut crate::db::Server,
    database: &str,
    end: Instant,
) -> Result<Collecting, BoxError> {
    reset_statements(&mut server.admin).await?;
    Ok(Collecting {
        database: database.to_string(),
        sampler: sample_backends(server.admin_url().to_string(), database.to_string(), end),
    })
}

/// Ends a collection started by [`begin`] (after its `end`).
///
/// # Errors
///
/// Any database error.
pub async fn finish(
    server: &mut crate::db::Server,
    collecting: Collecting,
) -> Result<Profile, BoxError> {
    let statements = top_statements(&mut server.admin, &collecting.database).await?;
    let (counts, samples) = collecting.sampler.await??;
    let (backend_states, backends) = shares(counts, samples);
    Ok(Profile {
        statements,
        backend_states,
        backends,
        commits: None,
    })
}

/// Reads the committer's trace lines (`commit committer=0 segments=16 items=16 elapsed_us=…
/// ok=true`) from a broker log.
pub fn commits_from_log(log: &str) -> Option<Commits> {
    let mut segments = 0u64;
    let mut items = 0u64;
    let mut latencies = Vec::new();
    let mut failed = 0;
    for line in log
        .lines()
        .filter(|l| l.contains("commit") && l.contains("elapsed_us="))
    {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(|v| v.trim_matches(|c: char| !c.is_alphanumeric()))
                .map(str::to_string)
        };
        let num = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
        segments += num("segments=").unwrap_or(0);
        items += num("items=").unwrap_or(0);
        latencies.push(num("elapsed_us=").unwrap_or(0) as f64 / 1000.0);
        if field("ok=").as_deref() == Some("false") {
            failed += 1;
        }
    }
    if latencies.is_empty() {
        return None;
    }
    let n = latencies.len();
    let mut sorted = latencies.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    Some(Commits {
        count: n,
        segments_per_commit: segments as f64 / n as f64,
        items_per_commit: items as f64 / n as f64,
        p50_ms: median(&latencies),
        p99_ms: sorted[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1],
        failed,
    })
}

/// The profile as indented text lines.
pub fn text(p: &Profile) -> String {
    let mut out = String::new();
    if let Some(c) = &p.commits {
        out.push_str(&format!(
            "      broker commits (warm-up included): {} transactions, {:.1} segments and {:.1} items each, latency p50 {:.1} ms p99 {:.1} ms{}\n",
            c.count,
            c.segments_per_commit,
            c.items_per_commit,
            c.p50_ms,
            c.p99_ms,
            if c.failed > 0 { format!(", {} failed", c.failed) } else { String::new() }
        ));
    }
    if !p.backend_states.is_empty() {
        out.push_str(&format!(
            "      postgres backends (mean {:.1}), share of sampled time:\n",
            p.backends
        ));
        for (state, share) in &p.backend_states {
            out.push_str(&format!("        {:>5.1}%  {state}\n", share * 100.0));
        }
    }
    if !p.statements.is_empty() {
        out.push_str(
            "      statements by total time (calls, mean ms, total ms, buffers/call, rows/call, plans, mean plan ms):\n",
        );
        for s in &p.statements {
            out.push_str(&format!(
                "        {:>8} {:>8.3} {:>9.0} {:>9.1} {:>8.1} {:>8} {:>7.3}  {}\n",
                s.calls,
                s.mean_ms,
                s.total_ms,
                s.blocks_per_call,
                s.rows_per_call,
                s.plans,
                s.mean_plan_ms,
                s.query
            ));
        }
    }
    out
}

/// Waits until the window ends; with `--perf` (`dir`), `perf record` samples the whole machine
/// meanwhile into `dir/<label>-r<round>.data`.
///
/// # Errors
///
/// When `perf` cannot be started or its folder made.
pub async fn sleep_through(
    window: &crate::measure::Window,
    dir: Option<&std::path::Path>,
    label: &str,
    round: usize,
) -> Result<(), BoxError> {
    let Some(dir) = dir else {
        tokio::time::sleep_until(window.end.into()).await;
        return Ok(());
    };
    std::fs::create_dir_all(dir)?;
    let name: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut perf = tokio::process::Command::new("perf")
        .args(["record", "-a", "-g", "-F", "499", "-q", "-o"])
        .arg(dir.join(format!("{name}-r{round}.data")))
        .args(["--", "sleep", &format!("{:.2}", window.secs())])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("perf record: {e}"))?;
    tokio::time::sleep_until(window.end.into()).await;
    perf.wait().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_lines_are_read() {
        let log = "[2026-01-01T00:00:00Z TRACE broker_actors::committer] commit committer=0 segments=4 items=40 elapsed_us=2000 ok=true\n\
                   [2026-01-01T00:00:00Z TRACE broker_actors::committer] commit committer=1 segments=2 items=20 elapsed_us=4000 ok=false\n";
        let c = commits_from_log(log).expect("commits");
        assert_eq!(c.count, 2);
        assert_eq!(c.segments_per_commit, 3.0);
        assert_eq!(c.items_per_commit, 30.0);
        assert_eq!(c.p50_ms, 3.0);
        assert_eq!(c.failed, 1);
    }
}
