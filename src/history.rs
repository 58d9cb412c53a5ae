//! The broker's recent history, for the dashboard's charts: a sampler task that every
//! `QUEEN_HISTORY_INTERVAL_MS` (10 s) records pushed, popped and acked messages per second,
//! spool bytes, commit latency p50/p99 and the backlog and oldest-unconsumed age of the
//! `QUEEN_HISTORY_QUEUES` (queue, consumer group) pairs with the largest backlog, into a ring
//! of [`CAPACITY`] samples (an hour at the default interval), so a page opened now shows the
//! last hour, not only what it saw since it opened. `GET /api/v1/system/history` serves it.
//!
//! Memory is bounded by the ring: a sample is about 100 bytes plus 48 per (queue, group) entry
//! (names are shared between samples), so 360 samples of 10 pairs hold about 210 KB, 100 pairs
//! about 1.8 MB, plus the names of the pairs seen in the hour. The rates and percentiles come
//! from the metrics registry (nothing is counted twice on the hot path); the backlog is one
//! statement on the admin pool per sample, bounded by [`QUERY_TIMEOUT`] and the pool's
//! statement timeout. A sample whose read failed says so (`queuesError`), it never blocks the
//! others. No lock is held across I/O.
//!
//! Each sample also reads the 2.x state's figures ([`StateFigures`]: the ten KV namespaces
//! with the most keys, live lock permits, the ten queues with timers due first, ten stream
//! queries); the newest are kept (not a history) and `/metrics/prometheus` exposes them with
//! the newest backlogs, so those families' label sets stay bounded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker_actors::spool::SpoolState;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::metrics::{Metrics, Totals};
use crate::storage::observe::features::{self, Namespace, QueueTimers, StreamQuery};
use crate::storage::queues::groups::{self, PairBacklog};
use crate::storage::queues::lag;

/// Samples kept: an hour at the default 10 s interval.
pub const CAPACITY: usize = 360;

/// Longest the backlog read of one sample may take (also bounded by the interval).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// One (queue, group) entry of a sample.
#[derive(Debug, Clone)]
struct Pair {
    queue: Arc<str>,
    group: Arc<str>,
    backlog: i64,
    oldest_seconds: f64,
}

/// One sample.
#[derive(Debug, Clone)]
struct Sample {
    /// Milliseconds since the Unix epoch.
    at_ms: i64,
    /// Per second since the previous sample (`None` for the first, or recording off).
    pushed: Option<f64>,
    popped: Option<f64>,
    acked: Option<f64>,
    spool_bytes: u64,
    /// Seconds; `None` without a successful commit in the interval.
    commit_p50: Option<f64>,
    commit_p99: Option<f64>,
    /// `None`: the backlog could not be read for this sample.
    pairs: Option<Vec<Pair>>,
}

#[derive(Default)]
struct Inner {
    samples: VecDeque<Sample>,
    last: Option<(Instant, Totals)>,
    queues_error: Option<String>,
    state: Option<StateFigures>,
}

/// Rows of each 2.x state summary kept for `/metrics/prometheus` (bounded label sets).
pub const STATE_ROWS: i64 = 10;

/// The 2.x state as the newest sample read it: the [`STATE_ROWS`] namespaces with the most
/// keys, queues with timers due first and stream queries by name, and the live lock permits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateFigures {
    /// KV namespaces.
    pub namespaces: Vec<Namespace>,
    /// Live lock permits.
    pub permits: i64,
    /// Pending timers per queue.
    pub timers: Vec<QueueTimers>,
    /// Stream queries.
    pub streams: Vec<StreamQuery>,
}

/// What the newest sample says, for the scrape: (queue, group, backlog, oldest seconds) of
/// each pair kept, and the 2.x state figures when they were read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latest {
    /// The pairs of the newest sample that read them.
    pub pairs: Vec<(String, String, i64, f64)>,
    /// The 2.x state figures, when the newest read of them succeeded.
    pub state: Option<StateFigures>,
}

/// The ring of samples; see the module docs.
pub struct History {
    interval: Duration,
    queues: usize,
    recording: bool,
    inner: Mutex<Inner>,
}

/// The `q` quantile of the observations between two cumulative bucket snapshots, as
/// PromQL's `histogram_quantile` computes it (linear inside a bucket; the highest finite bound
/// when it falls in `+Inf`). `None` when nothing was observed in between.
fn quantile(q: f64, before: &Totals, now: &Totals) -> Option<f64> {
    let total = now.commit_count.checked_sub(before.commit_count)?;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = 0.0;
    let mut below = 0u64;
    for (i, &(bound, cumulative)) in now.commit_buckets.iter().enumerate() {
        let earlier = before.commit_buckets.get(i).map_or(0, |b| b.1);
        let count = cumulative.saturating_sub(earlier);
        if count as f64 >= rank {
            let inside = (count - below) as f64;
            if inside <= 0.0 {
                return Some(bound);
            }
            return Some(lower + (bound - lower) * (rank - below as f64) / inside);
        }
        lower = bound;
        below = count;
    }
    now.commit_buckets.last().map(|b| b.0)
}

impl History {
    /// An empty history for samples every `interval` (zero: the sampler is off) keeping
    /// `queues` pairs each; `recording` is `QUEEN_METRICS` (off: no rates or latencies).
    pub fn new(interval: Duration, queues: usize, recording: bool) -> Self {
        Self {
            interval,
            queues,
            recording,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether the sampler runs.
    pub fn enabled(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Adds one sample taken at `at_ms` (Unix milliseconds) and `now`, dropping the oldest
    /// past [`CAPACITY`].
    pub fn record(
        &self,
        at_ms: i64,
        now: Instant,
        totals: Totals,
        spool_bytes: u64,
        pairs: Result<Vec<PairBacklog>, String>,
    ) {
        let mut inner = self.inner.lock().expect("history lock poisoned");
        let (mut pushed, mut popped, mut acked, mut p50, mut p99) = (None, None, None, None, None);
        if let Some((then, before)) = inner.last.as_ref().filter(|_| self.recording) {
            let secs = now.duration_since(*then).as_secs_f64();
            if secs > 0.0 {
                let rate = |a: u64, b: u64| Some(a.saturating_sub(b) as f64 / secs);
                pushed = rate(totals.pushed, before.pushed);
                popped = rate(totals.popped, before.popped);
                acked = rate(totals.acked, before.acked);
                p50 = quantile(0.5, before, &totals);
                p99 = quantile(0.99, before, &totals);
            }
        }
        // Names are shared with the newest sample's entries, so an hour of the same pairs
        // holds each name once.
        let pairs = match pairs {
            Ok(rows) => {
                inner.queues_error = None;
                let previous: Vec<Pair> = inner
                    .samples
                    .back()
                    .and_then(|s| s.pairs.clone())
                    .unwrap_or_default();
                let share = |name: &str, pick: fn(&Pair) -> &Arc<str>| -> Arc<str> {
                    previous
                        .iter()
                        .map(pick)
                        .find(|n| n.as_ref() == name)
                        .cloned()
                        .unwrap_or_else(|| Arc::from(name))
                };
                Some(
                    rows.into_iter()
                        .take(self.queues)
                        .map(|r| Pair {
                            queue: share(&r.queue, |p| &p.queue),
                            group: share(&r.consumer_group, |p| &p.group),
                            backlog: r.backlog,
                            oldest_seconds: r.oldest_seconds,
                        })
                        .collect(),
                )
            }
            Err(why) => {
                inner.queues_error = Some(why);
                None
            }
        };
        inner.last = Some((now, totals));
        if inner.samples.len() == CAPACITY {
            inner.samples.pop_front();
        }
        inner.samples.push_back(Sample {
            at_ms,
            pushed,
            popped,
            acked,
            spool_bytes,
            commit_p50: p50,
            commit_p99: p99,
            pairs,
        });
    }

    /// The samples as columns (`at` and one array per series, aligned), with the (queue,
    /// group) series of `queue` only when given. A pair absent from a sample (not among the
    /// largest backlogs then, or caught up) is `null` there.
    pub fn snapshot(&self, queue: Option<&str>) -> Value {
        let inner = self.inner.lock().expect("history lock poisoned");
        let samples = &inner.samples;
        let column =
            |f: &dyn Fn(&Sample) -> Value| -> Vec<Value> { samples.iter().map(f).collect() };
        // Every pair seen, in order of first appearance.
        let mut seen: Vec<(Arc<str>, Arc<str>)> = Vec::new();
        for s in samples {
            for p in s.pairs.iter().flatten() {
                let wanted = queue.is_none_or(|q| q == p.queue.as_ref());
                if wanted && !seen.iter().any(|(q, g)| q == &p.queue && g == &p.group) {
                    seen.push((p.queue.clone(), p.group.clone()));
                }
            }
        }
        let pairs: Vec<Value> = seen
            .iter()
            .map(|(q, g)| {
                let find = |s: &Sample| {
                    s.pairs
                        .iter()
                        .flatten()
                        .find(|p| &p.queue == q && &p.group == g)
                        .cloned()
                };
                json!({
                    "queue": q.as_ref(),
                    "consumerGroup": g.as_ref(),
                    "backlog": column(&|s| find(s).map_or(Value::Null, |p| json!(p.backlog))),
                    "oldestSeconds": column(&|s| find(s).map_or(Value::Null, |p| json!(p.oldest_seconds))),
                })
            })
            .collect();
        json!({
            "enabled": self.enabled(),
            "recording": self.recording,
            "intervalSeconds": self.interval.as_secs_f64(),
            "capacity": CAPACITY,
            "queuesPerSample": self.queues,
            "queuesError": inner.queues_error,
            "at": column(&|s| json!(s.at_ms)),
            "pushedPerSecond": column(&|s| json!(s.pushed)),
            "poppedPerSecond": column(&|s| json!(s.popped)),
            "ackedPerSecond": column(&|s| json!(s.acked)),
            "spoolBytes": column(&|s| json!(s.spool_bytes)),
            "commitP50Seconds": column(&|s| json!(s.commit_p50)),
            "commitP99Seconds": column(&|s| json!(s.commit_p99)),
            "queues": pairs,
        })
    }

    /// Records the 2.x state figures read with a sample (`None`: the read failed).
    pub fn record_state(&self, figures: Option<StateFigures>) {
        self.inner.lock().expect("history lock poisoned").state = figures;
    }

    /// The newest backlogs and state figures (for `/metrics/prometheus`).
    pub fn latest(&self) -> Latest {
        let inner = self.inner.lock().expect("history lock poisoned");
        let pairs = inner
            .samples
            .iter()
            .rev()
            .find_map(|s| s.pairs.as_ref())
            .map(|pairs| {
                pairs
                    .iter()
                    .map(|p| {
                        (
                            p.queue.to_string(),
                            p.group.to_string(),
                            p.backlog,
                            p.oldest_seconds,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Latest {
            pairs,
            state: inner.state.clone(),
        }
    }

    /// Samples kept now.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .expect("history lock poisoned")
            .samples
            .len()
    }

    /// Whether no sample was taken yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads the largest backlogs on `pool` within [`QUERY_TIMEOUT`] (and the interval): measured,
/// or from the last lag pass when the subscribed pairs are past `live_pairs` (src/lag.rs).
async fn read_pairs(
    pool: &PgPool,
    limit: usize,
    within: Duration,
    live_pairs: i64,
) -> Result<Vec<PairBacklog>, String> {
    let read = async {
        let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
        let measured = match lag::source(&mut conn, live_pairs).await {
            Ok(lag::Source::Live) => groups::largest_backlogs(&mut conn, limit as i64).await,
            Ok(lag::Source::Pass(_)) => lag::largest_backlogs(&mut conn, limit as i64).await,
            Err(e) => Err(e),
        };
        measured.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(within.min(QUERY_TIMEOUT), read).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "the backlog read took longer than {} ms",
            within.min(QUERY_TIMEOUT).as_millis()
        )),
    }
}

/// Reads the 2.x state figures on `pool` within [`QUERY_TIMEOUT`] (and the interval).
async fn read_state(pool: &PgPool, within: Duration) -> Option<StateFigures> {
    let read = async {
        let mut conn = pool.acquire().await?;
        Ok::<_, crate::storage::error::StorageError>(StateFigures {
            namespaces: features::namespaces(&mut conn, STATE_ROWS).await?,
            permits: features::permits_held(&mut conn).await?,
            timers: features::timers(&mut conn, STATE_ROWS).await?,
            streams: features::stream_queries(&mut conn, STATE_ROWS).await?,
        })
    };
    match tokio::time::timeout(within.min(QUERY_TIMEOUT), read).await {
        Ok(Ok(figures)) => Some(figures),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "history sample without the 2.x state figures");
            None
        }
        Err(_) => None,
    }
}

/// Takes a sample every interval until the broker stops (returns at once when the sampler
/// is off). The first sample is taken at once, so the page has a point to start from.
pub async fn sample_loop(
    history: Arc<History>,
    metrics: Arc<Metrics>,
    spool: Arc<SpoolState>,
    pool: PgPool,
    live_pairs: i64,
) {
    if !history.enabled() {
        return;
    }
    let mut tick = tokio::time::interval(history.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The counters first: the backlog read may take a while, and what is counted during
        // it belongs to the next interval.
        let at_ms = chrono::Utc::now().timestamp_millis();
        let now = Instant::now();
        let totals = metrics.totals();
        let pairs = read_pairs(&pool, history.queues, history.interval, live_pairs).await;
        if let Err(why) = &pairs {
            tracing::debug!(error = %why, "history sample without backlogs");
        }
        history.record(at_ms, now, totals, spool.bytes(), pairs);
        history.record_state(read_state(&pool, history.interval).await);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(pushed: u64, commits: &[(f64, u64)], count: u64) -> Totals {
        Totals {
            pushed,
            popped: pushed / 2,
            acked: pushed / 4,
            commit_buckets: commits.to_vec(),
            commit_count: count,
        }
    }

    fn pair(queue: &str, backlog: i64) -> PairBacklog {
        PairBacklog {
            queue: queue.into(),
            consumer_group: "g".into(),
            backlog,
            oldest_seconds: backlog as f64,
        }
    }

    #[test]
    fn rates_are_per_second_between_samples_and_latency_comes_from_bucket_deltas() {
        let h = History::new(Duration::from_secs(10), 10, true);
        let t0 = Instant::now();
        let buckets = |a, b, c| vec![(0.001, a), (0.01, b), (0.1, c)];
        h.record(0, t0, totals(100, &buckets(0, 0, 0), 0), 7, Ok(vec![]));
        // 10 s later: 1 000 more pushed; 100 commits, 50 under 1 ms, 99 under 10 ms.
        h.record(
            10_000,
            t0 + Duration::from_secs(10),
            totals(1100, &buckets(50, 99, 100), 100),
            9,
            Ok(vec![pair("q", 5)]),
        );
        let v = h.snapshot(None);
        assert_eq!(v["at"], json!([0, 10_000]));
        assert_eq!(v["pushedPerSecond"], json!([null, 100.0]));
        assert_eq!(v["poppedPerSecond"], json!([null, 50.0]));
        assert_eq!(v["spoolBytes"], json!([7, 9]));
        assert_eq!(v["commitP50Seconds"], json!([null, 0.001]));
        let p99 = v["commitP99Seconds"][1].as_f64().unwrap();
        assert!((p99 - 0.01).abs() < 1e-9, "{p99}");
        // A quiet interval has no latency rather than a made-up one.
        h.record(
            20_000,
            t0 + Duration::from_secs(20),
            totals(1100, &buckets(50, 99, 100), 100),
            9,
            Ok(vec![]),
        );
        let v = h.snapshot(None);
        assert_eq!(v["commitP50Seconds"][2], Value::Null);
        assert_eq!(v["pushedPerSecond"][2], json!(0.0));
    }

    #[test]
    fn the_ring_keeps_the_newest_samples_and_pairs_are_aligned_with_nulls() {
        let h = History::new(Duration::from_secs(10), 2, true);
        let t0 = Instant::now();
        for i in 0..(CAPACITY as i64 + 5) {
            let pairs = if i % 2 == 0 {
                vec![pair("a", i), pair("b", 1), pair("c", 0)]
            } else {
                vec![pair("b", 2)]
            };
            h.record(
                i,
                t0 + Duration::from_secs(i as u64),
                Totals::default(),
                0,
                Ok(pairs),
            );
        }
        assert_eq!(h.len(), CAPACITY);
        // The scrape's bounded families: the newest sample's pairs, two kept.
        let newest = CAPACITY as i64 + 4;
        assert_eq!(
            h.latest().pairs,
            vec![
                ("a".to_string(), "g".to_string(), newest, newest as f64),
                ("b".to_string(), "g".to_string(), 1, 1.0),
            ]
        );
        let v = h.snapshot(None);
        assert_eq!(v["at"][0], json!(5));
        let queues = v["queues"].as_array().unwrap();
        // "c" was never among the two kept per sample.
        let names: Vec<&str> = queues
            .iter()
            .map(|q| q["queue"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b", "a"]);
        let a = &queues[1]["backlog"];
        assert_eq!(a.as_array().unwrap().len(), CAPACITY);
        assert_eq!(a[0], Value::Null); // sample 5 is odd: a absent
        assert_eq!(a[1], json!(6));
        // One queue's page asks for its pairs only.
        let only = h.snapshot(Some("a"));
        assert_eq!(only["queues"].as_array().unwrap().len(), 1);
        assert_eq!(only["at"].as_array().unwrap().len(), CAPACITY);
    }

    #[test]
    fn a_failed_read_is_said_and_recording_off_gives_no_rates() {
        let h = History::new(Duration::from_secs(10), 10, false);
        let t0 = Instant::now();
        h.record(0, t0, Totals::default(), 0, Ok(vec![pair("a", 1)]));
        h.record(
            1,
            t0 + Duration::from_secs(10),
            Totals::default(),
            0,
            Err("database away".into()),
        );
        let v = h.snapshot(None);
        assert_eq!(v["recording"], false);
        assert_eq!(v["pushedPerSecond"], json!([null, null]));
        assert_eq!(v["queuesError"], "database away");
        assert_eq!(v["queues"][0]["backlog"], json!([1, null]));
    }
}
