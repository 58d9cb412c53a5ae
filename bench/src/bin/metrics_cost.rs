//! `metrics_cost`: what the metrics a push request records cost, in CPU time per request,
//! measured in-process on the broker's own registry (`queen_broker::metrics::Metrics`): the
//! middleware's request count and latency observation (with the route pattern it allocates),
//! the handler's verdict count, and the committer's three observations. Printed next to the
//! broker's CPU per push request measured by `bench/metrics-cost.sh`, it gives the share of
//! the push path that metrics take, without the noise of a shared machine's throughput.
//!
//!   cargo run --release -p queen-bench --bin metrics_cost

use std::time::{Duration, Instant};

use broker_actors::observe::{CommitObserver, CommitReport};
use queen_broker::metrics::Metrics;

fn per_request_ns(metrics: &Metrics, items: usize, n: u32) -> f64 {
    let verdicts = vec!["queued"; items];
    let report = CommitReport {
        segments: 1,
        items,
        elapsed: Duration::from_micros(900),
        committed: true,
    };
    let started = Instant::now();
    for i in 0..n {
        // What http::observe does per request (the pattern is a fresh String there too).
        let route = String::from("/api/v1/push");
        metrics.request(
            std::hint::black_box(&route),
            "POST",
            201,
            Duration::from_micros(800 + u64::from(i % 64)),
        );
        metrics.pushed(verdicts.iter().copied());
        // One commit per request: the most a request can cause (group commit shares them).
        metrics.committed(std::hint::black_box(&report));
    }
    started.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let n = 1_000_000;
    for items in [1, 100] {
        let mut on = Vec::new();
        let mut off = Vec::new();
        for _ in 0..7 {
            on.push(per_request_ns(&Metrics::new(true), items, n));
            off.push(per_request_ns(&Metrics::new(false), items, n));
        }
        on.sort_by(f64::total_cmp);
        off.sort_by(f64::total_cmp);
        println!(
            "batch {items}: recording costs {:.0} ns per push request (median of 7 × {n}; switched off: {:.0} ns)",
            on[3], off[3]
        );
    }
}
