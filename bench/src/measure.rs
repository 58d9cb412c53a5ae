//! What one measurement records: per-worker counts and latencies inside the window, and CPU
//! time read from /proc for the broker process, the PostgreSQL server's processes, the load
//! generator itself and the whole machine (to show how much the other tenants took).

use std::time::{Duration, Instant};

/// The timed part of a run: warm-up until `start`, counted until `end`.
#[derive(Clone, Copy)]
pub struct Window {
    /// When counting starts.
    pub start: Instant,
    /// When counting stops (and workers stop issuing work).
    pub end: Instant,
}

impl Window {
    /// A window that opens `warmup` from now and lasts `duration`.
    pub fn after(warmup: Duration, duration: Duration) -> Self {
        let start = Instant::now() + warmup;
        Self {
            start,
            end: start + duration,
        }
    }

    /// Whether `t` falls inside.
    pub fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }

    /// Length in seconds.
    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// What one worker (connection) saw.
#[derive(Default)]
pub struct WorkerStats {
    /// Messages stored by requests that completed inside the window.
    pub msgs: u64,
    /// Requests (or transactions) completed inside the window.
    pub ops: u64,
    /// Latency of each of those, in microseconds.
    pub latencies_us: Vec<u32>,
    /// Messages stored over the whole run (warm-up and drain included), for verification.
    pub total_msgs: u64,
    /// Items answered with a verdict other than `queued`.
    pub not_queued: u64,
    /// Requests that failed (non-201 status, I/O or SQL error).
    pub errors: u64,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
}

impl WorkerStats {
    /// Records one finished operation that stored `msgs` messages.
    pub fn record(&mut self, window: &Window, started: Instant, msgs: u64) {
        let done = Instant::now();
        self.total_msgs += msgs;
        if window.contains(done) {
            self.msgs += msgs;
            self.ops += 1;
            let us = (done - started).as_micros().min(u32::MAX as u128) as u32;
            self.latencies_us.push(us);
        }
    }

    /// Records a failure.
    pub fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }

    /// Merges the stats of all workers.
    pub fn merge(all: Vec<WorkerStats>) -> WorkerStats {
        let mut total = WorkerStats::default();
        for s in all {
            total.msgs += s.msgs;
            total.ops += s.ops;
            total.latencies_us.extend(s.latencies_us);
            total.total_msgs += s.total_msgs;
            total.not_queued += s.not_queued;
            total.errors += s.errors;
            if total.first_error.is_none() {
                total.first_error = s.first_error;
            }
        }
        total.latencies_us.sort_unstable();
        total
    }

    /// The `pct` percentile latency in milliseconds (latencies must be sorted: see [`merge`]).
    ///
    /// [`merge`]: WorkerStats::merge
    pub fn percentile_ms(&self, pct: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let n = self.latencies_us.len();
        let at = ((n as f64 * pct / 100.0).ceil() as usize).clamp(1, n) - 1;
        f64::from(self.latencies_us[at]) / 1000.0
    }
}

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Fields of `/proc/<pid>/stat` that matter here, in clock ticks.
struct ProcStat {
    ppid: u32,
    own: u64,
    children: u64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(ProcStat {
        ppid: num(1)? as u32,
        own: num(11)? + num(12)?,
        children: num(13)? + num(14)?,
    })
}

/// The parent of `pid`.
pub fn parent_of(pid: u32) -> Option<u32> {
    proc_stat(pid).map(|s| s.ppid)
}

/// CPU ticks of the process `pid` (all threads).
pub fn process_ticks(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|s| s.own)
}

/// CPU ticks of a PostgreSQL server: the postmaster with its reaped children, plus every live
/// child (backends, walwriter, checkpointer, ...). A backend that exits moves its time into
/// the postmaster's children total, so differences of this sum stay correct.
pub fn server_ticks(postmaster: u32) -> u64 {
    let mut total = proc_stat(postmaster).map_or(0, |s| s.own + s.children);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(s) = proc_stat(pid) {
                if s.ppid == postmaster {
                    total += s.own;
                }
            }
        }
    }
    total
}

/// Busy and total ticks of the whole machine (all cores), from /proc/stat.
pub fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let idle = get(3) + get(4);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    (busy, busy + idle)
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 when that fails).
pub fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The broker's peak resident set (VmHWM) in bytes.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:").map(|kb| kb * 1024)
}

/// The broker's resident set now (VmRSS) in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:").map(|kb| kb * 1024)
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU counters at one instant.
#[derive(Clone, Copy, Default)]
pub struct CpuSnapshot {
    broker: u64,
    postgres: u64,
    load: u64,
    machine_busy: u64,
    machine_total: u64,
}

/// Who to account CPU to.
#[derive(Clone, Copy)]
pub struct CpuTargets {
    /// The broker process, when one runs.
    pub broker: Option<u32>,
    /// The postmaster, when it is on this machine and visible.
    pub postmaster: Option<u32>,
}

impl CpuTargets {
    /// Reads every counter now.
    pub fn snapshot(&self) -> CpuSnapshot {
        let (machine_busy, machine_total) = machine_ticks();
        CpuSnapshot {
            broker: self.broker.and_then(process_ticks).unwrap_or(0),
            postgres: self.postmaster.map_or(0, server_ticks),
            load: process_ticks(std::process::id()).unwrap_or(0),
            machine_busy,
            machine_total,
        }
    }
}

/// Cores used on average over a window, by party.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CpuUse {
    /// The broker process.
    pub broker: f64,
    /// The PostgreSQL server (all its processes).
    pub postgres: f64,
    /// This load generator.
    pub load: f64,
    /// Everything else on the machine (other tenants).
    pub other: f64,
    /// Cores the machine has, as /proc/stat counts them.
    pub cores: f64,
}

impl CpuUse {
    /// Cores used by the parties of the benchmark (broker, PostgreSQL, load generator).
    pub fn ours(&self) -> f64 {
        self.broker + self.postgres + self.load
    }

    /// Average cores used between two snapshots taken `secs` apart.
    pub fn between(a: &CpuSnapshot, b: &CpuSnapshot, secs: f64, ticks_per_sec: f64) -> Self {
        let per = |x: u64, y: u64| y.saturating_sub(x) as f64 / ticks_per_sec / secs;
        let broker = per(a.broker, b.broker);
        let postgres = per(a.postgres, b.postgres);
        let load = per(a.load, b.load);
        let busy = per(a.machine_busy, b.machine_busy);
        let total = per(a.machine_total, b.machine_total);
        Self {
            broker,
            postgres,
            load,
            other: (busy - broker - postgres - load).max(0.0),
            cores: total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let mut s = WorkerStats {
            latencies_us: (1..=100).map(|v| v * 1000).collect(),
            ..WorkerStats::default()
        };
        s = WorkerStats::merge(vec![s]);
        assert_eq!(s.percentile_ms(50.0), 50.0);
        assert_eq!(s.percentile_ms(99.0), 99.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn own_process_is_readable() {
        assert!(process_ticks(std::process::id()).is_some());
        assert!(peak_rss_bytes(std::process::id()).unwrap_or(0) > 0);
        let (busy, total) = machine_ticks();
        assert!(total >= busy && total > 0);
    }
}
